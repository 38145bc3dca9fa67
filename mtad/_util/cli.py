"""Command-line arguments checked while they are parsed: :class:`ArgumentParser` ends every error in one line,
and the argument types the entry points share refuse a bad value before any work (a model load, a decode):

- :func:`count` (:data:`positive_int`, :data:`nonnegative_int`): whole numbers with a lower bound;
- :func:`real`: a finite number within a range (``nan`` and ``inf`` refused);
- :func:`existing_file`, :func:`json_file`, :func:`rows_file`, :func:`pickle_file`: an input file that exists,
  can be read and has the format the command reads;
- :func:`folder_with`: an existing folder holding the files the command reads;
- :func:`comma_list`: ``a,b,c`` names, each one of the choices;
- :func:`check_or_exit`: a check run after parsing (an output folder), its ValueError ended as the same line.

Each message names the value, what is wrong and what to give instead; argparse puts ``argument --x:`` before it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

Value = TypeVar("Value")
ARGPARSE_OWN = ("unrecognized arguments", "the following arguments are required", "ambiguous option")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, ``<program>: error: <message>`` on stderr with exit status
    2, without the usage block (``python -m `` dropped from the program's name); argparse's own messages (an
    unknown option, a missing argument) point to ``--help``."""

    def error(self, message: str) -> NoReturn:
        name = self.prog.removeprefix("python -m ").strip()
        text = " ".join(message.split())
        if text.startswith(ARGPARSE_OWN) or "expected " in text:
            text += " (--help lists the options)"
        self.exit(2, f"{name}: error: {text}\n")


def check_or_exit(parser: argparse.ArgumentParser, check: Callable[..., Value], *args) -> Value:
    """``check(*args)`` (e.g. :func:`mtad._util.io.writable_dir`, or one of the types below on a value that is not
    an argument's own), its ValueError or ArgumentTypeError ended as the parser's one-line error."""
    try:
        return check(*args)
    except (ValueError, argparse.ArgumentTypeError) as err:
        parser.error(str(err))


def _named(name: str, convert: Callable[[str], Value]) -> Callable[[str], Value]:
    convert.__name__ = name  # argparse names a type by it when a conversion raises something unexpected
    return convert


def count(minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum`` (prompts, tokens, threads, repeats: ``0`` and ``-1`` are
    refused, not read as "all" or "default")."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: give an integer >= {minimum}") \
                from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is out of range: give an integer >= {minimum}")
        return value

    return _named(f"integer >= {minimum}", convert)


positive_int = count(1)
nonnegative_int = count(0)


def real(low: float | None = None, high: float | None = None, *, low_open: bool = False,
         high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number within [low, high] (an end None is unbounded; ``low_open`` /
    ``high_open`` exclude that end). ``nan`` and ``inf`` are refused."""
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    allowed = "a finite number" + (" " + " and ".join(parts) if parts else "")

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give {allowed}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not finite: give {allowed}")
        inside = (
            low is None or (value > low if low_open else value >= low)) and (
            high is None or (value < high if high_open else value <= high))
        if not inside:
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {allowed}")
        return value

    return _named(allowed, convert)


def _readable(text: str, fix: str) -> Path:
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} is not a file (no such path): {fix}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file: {fix}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} cannot be read (permission denied): {fix}")
    return path


def existing_file(fix: str) -> Callable[[str], Path]:
    """An argparse type: a readable file (``fix`` says which file to give instead)."""
    return _named("file", lambda text: _readable(text, fix))


def json_file(fix: str) -> Callable[[str], Path]:
    """An argparse type: a readable file holding one JSON object."""
    def convert(text: str) -> Path:
        path = _readable(text, fix)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            data = None
        if not isinstance(data, dict):
            raise argparse.ArgumentTypeError(f"{text} is not a JSON object: {fix}")
        return path

    return _named("JSON file", convert)


def rows_file(fix: str = "give a results .jsonl (one result row per line)") -> Callable[[str], Path]:
    """An argparse type: a results file: one JSON object with ``model`` and ``decoder`` per non-blank line,
    at least one."""
    def convert(text: str) -> Path:
        path = _readable(text, fix)
        rows = 0
        try:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except ValueError:
                        row = None
                    if not (isinstance(row, dict) and "model" in row and "decoder" in row):
                        raise argparse.ArgumentTypeError(f"{text}:{n} is not a result row: {fix}")
                    rows += 1
        except UnicodeDecodeError:
            raise argparse.ArgumentTypeError(f"{text} is not text: {fix}") from None
        if not rows:
            raise argparse.ArgumentTypeError(f"{text} holds no rows: {fix}")
        return path

    return _named("results file", convert)


def pickle_file(fix: str) -> Callable[[str], Path]:
    """An argparse type: a complete pickle (protocol 2 or later: it opens with PROTO and ends with STOP); the
    file is not unpickled here."""
    def convert(text: str) -> Path:
        path = _readable(text, fix)
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(end - 1, 0))
            tail = f.read(1)
        if len(head) < 2 or head[0] != 0x80 or head[1] < 2 or tail != b".":
            raise argparse.ArgumentTypeError(f"{text} is not a complete pickle: {fix}")
        return path

    return _named("pickle file", convert)


def folder_with(*names: str, fix: str) -> Callable[[str], Path]:
    """An argparse type: an existing folder that holds each of ``names``."""
    def convert(text: str) -> Path:
        path = Path(text).expanduser()
        if not path.exists():
            raise argparse.ArgumentTypeError(f"{text} is not a folder (no such path): {fix}")
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is not a folder: {fix}")
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise argparse.ArgumentTypeError(f"{text} holds no {' or '.join(missing)}: {fix}")
        return path

    return _named("folder", convert)


def comma_list(choices: Sequence[str] | None = None) -> Callable[[str], list[str]]:
    """An argparse type: ``a,b,c`` as a list of non-empty names (each one of ``choices`` when given)."""
    def convert(text: str) -> list[str]:
        items = text.split(",")
        if not all(item.strip() for item in items):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty name: give names separated by commas")
        bad = [item for item in items if choices is not None and item not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}: choose from {', '.join(choices)}")
        return items

    return _named("comma-separated list", convert)

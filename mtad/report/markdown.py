"""The one Markdown table writer and the one interval formatter: every table the package and ``experiments/``
print is written by :func:`table`, every ``point [low, high]`` cell by :func:`interval`."""
from __future__ import annotations

from collections.abc import Sequence

DASH = "—"  # a cell without a figure


def table(header: Sequence[str], rows: Sequence[Sequence[str]] = (), *, escape: bool = False,
          compact: bool = False) -> list[str]:
    """The lines of a Markdown table: the header, its rule (``| --- |``, or ``|---|`` when ``compact``), one line a
    row. Cells are written as ``str`` gives them; ``escape`` writes a ``|`` inside a cell as ``\\|``."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") if escape else str(c) for c in cells) + " |"

    rule = "|" + ("---|" if compact else " --- |") * len(header)
    return [line(header), rule, *(line(r) for r in rows)]


def interval(v: Sequence | None, digits: int = 2, *, unit: str = "", signed: bool = False, minus: str = "-",
             bare: str = "") -> str:
    """``point[unit] [low, high]`` of ``v = (point, low, high, ...)``, each at ``digits`` decimals (``signed``:
    with a ``+``; ``minus``: the sign written for ``-``, e.g. ``−``); without an interval the point, ``unit`` and
    ``bare`` (``†``, `` [—]``); :data:`DASH` without a point."""
    if v is None or v[0] is None:
        return DASH

    def f(x: float) -> str:
        text = f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
        return text.replace("-", minus) if minus != "-" else text

    if len(v) < 3 or v[1] is None or v[2] is None:
        return f"{f(v[0])}{unit}{bare}"
    return f"{f(v[0])}{unit} [{f(v[1])}, {f(v[2])}]"

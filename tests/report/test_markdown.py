"""The one Markdown table writer and the one interval formatter (``mtad/report/markdown.py``): their output in
every variant the tables print, and a scan that no other module of the package or ``experiments/`` writes a
table's rule row itself (control: a planted writer is caught)."""
from __future__ import annotations

import re

from mtad._util.paths import REPO_ROOT
from mtad.report.markdown import interval, table

RULE = re.compile(r"""["'][^"'\n]*(?:\| ?---|--- ?\|)""")  # a string literal holding a Markdown rule cell
WRITER = REPO_ROOT / "mtad" / "report" / "markdown.py"


def test_table_lines_rule_and_escaping():
    assert table(["a", "b"], [["1", "x|y"]]) == ["| a | b |", "| --- | --- |", "| 1 | x|y |"]
    assert table(["a|b"], [[2.5]], escape=True) == ["| a\\|b |", "| --- |", "| 2.5 |"]
    assert table(["a", "b"], compact=True) == ["| a | b |", "|---|---|"]


def test_interval_variants():
    v = (1.234, -0.5, 2.0)
    assert interval(v) == "1.23 [-0.50, 2.00]"
    assert interval(v, 1, unit=" %", signed=True) == "+1.2 % [-0.5, +2.0]"
    assert interval(v, 3, signed=True, minus="−") == "+1.234 [−0.500, +2.000]"
    assert interval((1.5, None, None), unit="×", bare="†") == "1.50×†"
    assert interval((1.5, 1.0, None), bare=" [—]") == "1.50 [—]"
    assert interval((1.5,)) == "1.50"
    assert interval(None) == interval((None, 1.0, 2.0)) == "—"


def writers(paths) -> list[str]:
    """``file:line`` of every string literal that writes a Markdown rule row, outside the one writer."""
    return [f"{p}:{i}" for p in paths if p != WRITER
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if RULE.search(line)]


def test_no_other_module_writes_a_table_rule(tmp_path):
    paths = sorted((REPO_ROOT / "mtad").rglob("*.py")) + sorted((REPO_ROOT / "experiments").glob("*.py"))
    assert writers(paths) == []
    planted = tmp_path / "planted.py"  # control: a writer of its own, in both rule styles
    planted.write_text('lines = ["| a |", "|" + " --- |" * 1]\nrule = "|---|---|"\n')
    assert writers([planted]) == [f"{planted}:1", f"{planted}:2"]

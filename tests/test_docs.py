"""The repository describes itself: every document the code cites exists, and the README's commands are real.

- every ``NAME.md`` cited under ``mtad/`` (upper-case names: our documents, not ``<experiment>.md`` patterns)
  is a file in ``docs/``, or is ``README.md`` / ``MODEL_CARD.md``;
- every ``NAME.md §N`` (also ``§N-M``, ``§N, §M``, and a bare ``§N`` after a citation of ``NAME.md`` in the same
  file) is a numbered heading ``N.`` of ``docs/NAME.md``, and every ``NAME.md, "Title"`` a heading holding Title;
- README.md is at most ``README_MAX_LINES`` lines, and every ``make <target>`` it (or docs/) shows in code is a
  Makefile target.

Each check is a function of text, run on the repository and on planted text that must fail (negative controls).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150
NOT_IN_DOCS = {"README.md", "MODEL_CARD.md"}  # cited documents that live elsewhere (the root, models/*/)
DOC = re.compile(r"\b([A-Z][A-Z0-9_]*\.md)\b")
SECTIONS = re.compile(r"§ ?(\d+)(?:\s*[-–]\s*(\d+))?")
TITLE = re.compile(r"\b([A-Z][A-Z0-9_]*\.md),\s*\"([^\"]+)\"")
HEADING = re.compile(r"^#+\s+(.*?)\s*$", re.M)


def citations(root: Path) -> list[tuple[str, str, str | None]]:
    """(where, document, section) for every citation in ``root``'s .py files; section None (a document),
    "N" (a numbered section) or '"Title"' (a named section)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        last = None  # the document a bare § refers to
        pieces = sorted([(m.start(), "doc", m) for m in DOC.finditer(text)]
                        + [(m.start(), "sec", m) for m in SECTIONS.finditer(text)]
                        + [(m.start(), "title", m) for m in TITLE.finditer(text)], key=lambda x: x[0])
        for pos, kind, m in pieces:
            where = f"{path.relative_to(root.parent)}:{text.count(chr(10), 0, pos) + 1}"
            if kind == "doc":
                last = m[1]
                out.append((where, m[1], None))
            elif kind == "title":
                out.append((where, m[1], f'"{m[2]}"'))
            else:
                first, end = int(m[1]), int(m[2] or m[1])
                out += [(where, last or "?", str(n)) for n in range(first, end + 1)]
    return out


def headings(doc: Path) -> list[str]:
    return HEADING.findall(doc.read_text()) if doc.is_file() else []


def citation_problems(root: Path, docs: Path) -> list[str]:
    found = []
    for where, name, section in citations(root):
        path = docs / name
        if section is None:
            if name not in NOT_IN_DOCS and not path.is_file():
                found.append(f"{where} cites {name}, which is not in {docs.name}/")
        elif section.startswith('"'):
            title = section.strip('"').lower()
            if name not in NOT_IN_DOCS and not any(title in h.lower() for h in headings(path)):
                found.append(f"{where} cites {name}, {section}: no such heading")
        elif not any(re.match(rf"§?{section}\.?\s", h) for h in headings(path)):
            found.append(f"{where} cites {name} §{section}: no heading numbered {section}")
    return found


def make_targets(makefile: str) -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, re.M))


def make_commands(markdown: str) -> list[str]:
    """The target of every ``make ...`` inside code (fenced blocks and `inline spans`, which may wrap a line);
    ``make`` alone is help."""
    fence = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.M | re.S)
    code = fence.findall(markdown)
    span = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)  # closed by a run of as many backticks
    code += [m[2].replace("\n", " ") for m in span.finditer(fence.sub("", markdown))]
    out = []
    for block in code:
        for m in re.finditer(r"(?:^|[\s;&|(])make((?:[ \t]+[^\s#;&|)]+)*)", block, re.M):
            words = [w for w in m[1].split() if not w.startswith("-") and "=" not in w]
            out.append(words[0].strip("`\"'") if words else "help")
    return out


def make_problems(markdown: str, makefile: str, where: str) -> list[str]:
    targets = make_targets(makefile)
    return [f"{where} shows `make {t}`, which the Makefile lacks" for t in make_commands(markdown)
            if t not in targets]


def readme_problems(text: str) -> list[str]:
    n = len(text.splitlines())
    return [f"README.md has {n} lines (at most {README_MAX_LINES})"] if n > README_MAX_LINES else []


# ------------------------------------------------------------------------------------------- the repository
def test_every_cited_document_and_section_exists():
    assert citation_problems(REPO / "mtad", REPO / "docs") == []


def test_the_code_cites_the_numbered_algorithms():
    """The scan finds what the decoders cite (a scan that finds nothing passes anything)."""
    cited = {(name, section) for _, name, section in citations(REPO / "mtad")}
    assert {("ALGORITHMS.md", str(n)) for n in range(1, 8)} <= cited
    assert {("STYLE.md", None), ("DRAFT.md", None), ("PAPER.md", None), ("DESIGN.md", None)} <= cited


def test_readme_is_short():
    assert readme_problems((REPO / "README.md").read_text()) == []


def test_every_make_command_in_the_docs_is_a_target():
    makefile = (REPO / "Makefile").read_text()
    docs = [REPO / "README.md", REPO / "results" / "published" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = [p for d in docs for p in make_problems(d.read_text(), makefile, d.name)]
    assert found == []
    assert {"run", "test"} <= set(make_commands((REPO / "README.md").read_text()))


# ------------------------------------------------------------------------------------------- negative controls
def _plant(tmp_path: Path, code: str, docs: dict[str, str]) -> tuple[Path, Path]:
    (tmp_path / "mtad").mkdir()
    (tmp_path / "mtad" / "mod.py").write_text(code)
    (tmp_path / "docs").mkdir()
    for name, text in docs.items():
        (tmp_path / "docs" / name).write_text(text)
    return tmp_path / "mtad", tmp_path / "docs"


ALGO = "# Algorithms\n## Notation\n## 1. greedy\n## 2. sampling\n## 3. speculative\n"


def test_planted_clean_citations_pass(tmp_path):
    code = '"""See ALGORITHMS.md §1-2 and §3; ALGORITHMS.md, "Notation"; MODEL_CARD.md; experiment.md."""\n'
    assert citation_problems(*_plant(tmp_path, code, {"ALGORITHMS.md": ALGO})) == []


@pytest.mark.parametrize("code, expect", [
    ('"""As GHOST.md says."""\n', "cites GHOST.md, which is not in docs/"),
    ('"""ALGORITHMS.md §4."""\n', "cites ALGORITHMS.md §4: no heading numbered 4"),
    ('"""ALGORITHMS.md §2-4."""\n', "cites ALGORITHMS.md §4: no heading numbered 4"),
    ('"""ALGORITHMS.md §1, §9 variant."""\n', "cites ALGORITHMS.md §9"),
    ('"""ALGORITHMS.md (METRICS)\n\nsee §5 step 1."""\n', "mod.py:3 cites ALGORITHMS.md §5"),
    ('"""ALGORITHMS.md, "Energy"."""\n', 'cites ALGORITHMS.md, "Energy": no such heading'),
])
def test_planted_missing_document_or_section_is_caught(tmp_path, code, expect):
    found = citation_problems(*_plant(tmp_path, code, {"ALGORITHMS.md": ALGO}))
    assert any(expect in f for f in found), found


def test_planted_long_readme_is_caught():
    assert readme_problems("line\n" * README_MAX_LINES) == []
    found = readme_problems("line\n" * (README_MAX_LINES + 1))
    assert found == [f"README.md has {README_MAX_LINES + 1} lines (at most {README_MAX_LINES})"]


MAKEFILE = "PROFILE ?= cpu\n.PHONY: run\nrun: $(STAMP)  ## the job\n\tpython -m mtad\nreproduce-table:\n\ttrue\n"


def test_planted_make_commands():
    text = ("Run `make run ARGS=\"task.n_prompts=4\"`, then:\n```bash\nmake PROFILE=cpu reproduce-table  # table\n"
            "make -j2 run\n```\nTo make sure it works, `make` lists targets; a ```sql fence in prose is no fence,\n"
            "and a span may wrap: `make\nreproduce-table`.\n")
    assert make_commands(text) == ["reproduce-table", "run", "run", "help", "reproduce-table"]
    assert make_problems(text, MAKEFILE + "help:\n", "README.md") == []
    missing = make_problems(text + "```\nmake reproduce\n```\n", MAKEFILE + "help:\n", "README.md")
    assert missing == ["README.md shows `make reproduce`, which the Makefile lacks"]
    assert make_targets(MAKEFILE) == {"run", "reproduce-table", ".PHONY"}  # `PROFILE ?=` is no target

"""One answer everywhere: README.md, docs/PAPER.md and the regime map carry the same "why" paragraph, rendered
from results/regimes/why.json (which is the map's own ``why``); a changed number in any of them fails."""
import copy
import json

import pytest

from mtad._util.paths import REPO_ROOT
from mtad.study.regimes import why

DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "PAPER.md", REPO_ROOT / "results" / "regimes" / "regimes.md"]
FACTS = REPO_ROOT / "results" / "regimes" / "why.json"


def close(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12)
    return a == b


def test_why_json_is_the_maps_own():
    facts = why.load(FACTS)
    assert close(facts, json.loads((REPO_ROOT / "results" / "regimes" / "regimes.json").read_text())["why"])


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_document_carries_the_one_rendered_answer(doc):
    found = why.blocks(doc.read_text())
    assert found == [why.block(why.load(FACTS))], f"{doc}: re-render with python -m mtad.study.regimes"


def test_a_changed_number_in_a_document_or_the_facts_fails(tmp_path):
    facts = why.load(FACTS)
    text = (REPO_ROOT / "README.md").read_text()
    block = why.blocks(text)[0]
    tampered = block.replace(f"{facts['joint_rule'][1]:.2f}×", f"{facts['joint_rule'][1] + 0.05:.2f}×", 1)
    assert tampered != block and tampered != why.block(facts)  # control: the test above would catch it
    other = copy.deepcopy(facts)
    other["joint_rule"][1] += 0.05
    assert why.block(other) != block
    doc = tmp_path / "doc.md"
    doc.write_text("before\n" + why.BEGIN + "\nstale\n" + why.END + "\nafter\n")
    assert why.update(doc, facts) and why.blocks(doc.read_text()) == [why.block(facts)]
    assert doc.read_text().startswith("before\n") and doc.read_text().endswith("\nafter\n")
    plain = tmp_path / "plain.md"
    plain.write_text("no block")
    assert not why.update(plain, facts) and plain.read_text() == "no block"


def test_no_other_why_figure_in_the_documents():
    """The older one-line answers ("why only ≈ …", "why about …") are gone from the prose outside the block."""
    for doc in DOCS:
        text = doc.read_text()
        for b in why.blocks(text):
            text = text.replace(b, "")
        assert "why only" not in text.lower() and "why about" not in text.lower(), doc

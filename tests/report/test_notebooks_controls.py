"""The reviewers' controls in analysis.ipynb (quality against diversity, the fixed-threshold control) run on
``tests/fixtures/controls``: real rows of ``python -m mtad.harness.sweep --experiment quick_controls
results_dir=tests/fixtures/controls decoder.max_new_tokens=8 --no-cost-profile`` with
their run directories (``runs/<hash>/samples.jsonl``), so the plots carry bootstrap error bars."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtad._util.paths import REPO_ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CONTROLS = Path(__file__).parents[1] / "fixtures" / "controls" / "quick_controls.jsonl"


def test_analysis_notebook_plots_the_controls_with_error_bars(tmp_path, monkeypatch):
    out = tmp_path / "tables"
    monkeypatch.setenv("MTAD_RESULTS", str(CONTROLS))
    monkeypatch.setenv("MTAD_TABLES", str(out))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))  # the kernel imports this checkout's mtad
    nb = nbformat.read(REPO_ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    pngs = {p.name for p in out.glob("*.png")}
    assert {"quick_controls_quality_diversity.png", "quick_controls_threshold_control.png"} <= pngs, text
    assert "note: no quality-vs-diversity plot" not in text and "note: no threshold-control plot" not in text
    md = (out / "quick_controls.md").read_text()
    assert "speculative (tau=0.1, accept=threshold)" in md and "sampling (temperature=0.5, top_p=0.9)" in md
    assert "## Quality against sampling" in md and "## Diversity" in md
    assert "] |" in md  # intervals, from the fixture's samples.jsonl

"""The analysis notebooks run headless (nbclient, matplotlib Agg) on result files and write their PNGs;
plots whose columns are missing are skipped with a note instead of failing."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mtad._util.paths import REPO_ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results_small.jsonl"


def _execute(name: str, results: Path, out: Path, workdir: Path, monkeypatch) -> str:
    """Run notebooks/<name>.ipynb in a fresh kernel (cwd ``workdir``); returns its printed text."""
    monkeypatch.setenv("MTAD_RESULTS", str(results))
    monkeypatch.setenv("MTAD_TABLES", str(out))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}}).execute()
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_analysis_notebook_rebuilds_table_and_plots(tmp_path, monkeypatch):
    out = tmp_path / "tables"
    text = _execute("analysis", FIXTURE, out, tmp_path, monkeypatch)
    pngs = {p.name for p in out.glob("*.png")}
    assert {"results_small_tau.png", "results_small_per_position_acceptance.png",
            "results_small_gamma_perplexity.png", "results_small_ms_per_token.png"} <= pngs
    assert all((out / p).stat().st_size > 1000 for p in pngs)
    assert (out / "results_small.md").is_file() and (out / "results_small.tex").is_file()
    # the fixture was measured on a CPU without RAPL: the energy plot is skipped, with its reason
    assert "results_small_energy_per_token.png" not in pngs
    assert "note: no energy plot" in text
    assert not list(tmp_path.glob("*.png"))  # nothing beside the working directory


def test_ablations_notebook_plots_each_sweep(tmp_path, monkeypatch):
    out = tmp_path / "tables"
    _execute("ablations", FIXTURE, out, tmp_path, monkeypatch)
    assert {f"results_small_ablation_{p}.png" for p in ("tau", "gamma", "beam_width")} <= \
        {p.name for p in out.glob("*.png")}


def test_analysis_notebook_copes_with_missing_columns(tmp_path, monkeypatch):
    """Negative control: rows without sweeps or per-position acceptance, but with energy, in a results
    folder that also holds a non-row JSONL file (the speed benchmark's)."""
    rows = []
    for line in FIXTURE.read_text().splitlines():
        r = json.loads(line)
        if r["decoder"]["name"] in ("greedy", "sampling") and r["task"]["name"] == "gsm8k":
            r["metrics"].pop("per_position_acceptance", None)
            r["metrics"]["energy_j_per_token"] = 0.5
            rows.append(r)
    results = tmp_path / "results"
    results.mkdir()
    (results / "cut.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (results / "bench.jsonl").write_text(json.dumps({"bench": "hf", "ratio": 1.1}) + "\n")
    out = tmp_path / "tables"
    text = _execute("analysis", results, out, tmp_path, monkeypatch)
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {"all_energy_per_token.png", "all_ms_per_token.png"}
    assert "note: bench.jsonl skipped" in text
    for plot in ("tau sweep", "per-position acceptance", "gamma sweep"):
        assert f"note: no {plot} plot" in text


@pytest.mark.slow  # jupyter-execute and its kernel, on the notebooks the tests above run: make test-slow, .ci/run
@pytest.mark.parametrize("name", ["analysis", "ablations"])
def test_the_notebooks_run_instruction_works_as_written(tmp_path, name):
    """The header's command (``MTAD_RESULTS=... MTAD_TABLES=... .venv/bin/jupyter-execute notebooks/...``), run
    from the repository root with the fixture's rows: it exits 0 and writes the figures."""
    import re
    import shutil
    import subprocess
    import sys

    header = nbformat.read(REPO_ROOT / "notebooks" / f"{name}.ipynb", as_version=4).cells[0].source
    command = re.search(r"`(MTAD_RESULTS=\S+ MTAD_TABLES=\S+ \.venv/bin/jupyter-execute notebooks/\S+)`", header)
    assert command, "the header gives no jupyter-execute command"
    words = command.group(1).split()
    assert words[-1] == f"notebooks/{name}.ipynb"
    exe = shutil.which("jupyter-execute", path=str(Path(sys.executable).parent))
    assert exe, "jupyter-execute (nbclient) is not installed beside this python"
    env = {**os.environ, "MTAD_RESULTS": str(FIXTURE), "MTAD_TABLES": str(tmp_path / "figs"), "MPLBACKEND": "Agg",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([exe, words[-1]], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert list((tmp_path / "figs").glob("results_small_*.png"))

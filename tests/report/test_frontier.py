"""The accuracy-vs-diversity control (``python -m mtad.report.frontier``): points from synthetic run
directories, the verdict against the sampling frontier with planted above / on / below cases, the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from inprocess import run_module

from mtad._util.paths import REPO_ROOT
from mtad.report import frontier

N = 60


def _run(tmp: Path, name: str, decoder: dict, acc: float, vocab: int, seed: int = 0) -> dict:
    """A row whose samples score ``acc`` of the prompts and whose outputs draw tokens from ``vocab`` ids
    (more ids: higher distinct-2)."""
    rng = np.random.default_rng(hash((name, seed)) % 2**32)
    d = tmp / "runs" / f"{name}-{seed}"
    d.mkdir(parents=True)
    correct = set(rng.choice(N, int(round(acc * N)), replace=False).tolist())
    samples = [{"id": f"q{i}", "turn": 0, "output_ids": rng.integers(0, vocab, 12).tolist(),
                "scores": {"contains": float(i in correct)}} for i in range(N)]
    (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return {"decoder": decoder, "task": {"name": "capitals"}, "model": {"name": "pairX"}, "seed": seed,
            "run_dir": str(d), "device_name": "CPU-Y", "metrics": {"score_name": "contains"}}


def _samp(t: float) -> dict:
    return {"name": "sampling", "temperature": t, "top_p": 0.9}


def _rows(tmp: Path, mtad_acc: float) -> list[dict]:
    # the frontier: cooler sampling is more accurate and less diverse
    rows = [_run(tmp, f"s{t}", _samp(t), acc, vocab)
            for t, acc, vocab in ((0.3, 0.8, 8), (0.6, 0.6, 30), (1.0, 0.4, 200))]
    rows += [_run(tmp, "s1b", _samp(1.0), 0.4, 200, seed=1)]
    rows += [_run(tmp, "m", {"name": "mtad", "tau": 0.5}, mtad_acc, 30)]
    rows += [_run(tmp, "g", {"name": "greedy"}, 0.9, 6)]
    return rows


@pytest.mark.parametrize("mtad_acc, verdict", [(0.95, "above"), (0.6, "on"), (0.15, "below")])
def test_verdict_against_the_sampling_frontier(tmp_path, mtad_acc, verdict):
    pts = frontier.points(_rows(tmp_path, mtad_acc), "capitals", n_resamples=300)["pairX"]
    assert {p.label for p in pts} == {"sampling T=0.3", "sampling T=0.6", "sampling T=1", "MTAD τ=0.5", "greedy"}
    t1 = next(p for p in pts if p.label == "sampling T=1")
    assert t1.n_seeds == 2 and t1.n_prompts == N
    m = next(p for p in pts if p.family == "mtad")
    assert m.accuracy[1] <= m.accuracy[0] <= m.accuracy[2] and abs(m.accuracy[0] - mtad_acc) < 0.02
    (line,) = frontier.frontier_verdict(pts)
    assert line.startswith(f"MTAD τ=0.5: {verdict}"), line


def test_diversity_orders_the_planted_vocabularies(tmp_path):
    pts = {p.label: p for p in frontier.points(_rows(tmp_path, 0.6), "capitals", n_resamples=100)["pairX"]}
    assert pts["sampling T=0.3"].distinct2[0] < pts["sampling T=0.6"].distinct2[0] < pts["sampling T=1"].distinct2[0]
    # negative control: another task has no points
    assert frontier.points(_rows(tmp_path / "b", 0.6), "elements", n_resamples=10) == {}


def test_cli_writes_table_and_figure_and_refuses_bad_input(tmp_path):
    rows = _rows(tmp_path, 0.95)
    res = tmp_path / "r.jsonl"
    res.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = lambda *a: run_module("mtad.report.frontier", *a, cwd=REPO_ROOT)  # noqa: E731 - in this process
    out = subprocess.run([sys.executable, "-m", "mtad.report.frontier", str(res), "--task", "capitals", "--out",
                          str(tmp_path / "o"), "--resamples", "50"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)  # the entry point end to end, in a process of its own
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "o" / "frontier_capitals.png").stat().st_size > 10_000
    assert "above the sampling frontier" in (tmp_path / "o" / "frontier_capitals.md").read_text()
    bad = run(str(res), "--task", "elements")
    assert bad.returncode == 2 and "no rows with samples for task 'elements'" in bad.stderr
    res.write_text(res.read_text() + "42\n")
    bad = run(str(res), "--task", "capitals")
    assert bad.returncode == 2 and f"{res}:{len(rows) + 1}" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("mtad_acc, verdict", [(0.3, "below the sampling frontier"), (0.8, "outside the frontier")])
def test_a_point_less_diverse_than_every_sampling_setting(tmp_path, mtad_acc, verdict):
    """Beyond the frontier's range, the nearest sampling point decides by the paired accuracy difference:
    significantly more accurate and more diverse -> below; equally accurate (the control) -> no verdict."""
    rows = [r for r in _rows(tmp_path, 0.5) if r["decoder"]["name"] != "mtad"]
    rows.append(_run(tmp_path, "low", {"name": "mtad", "tau": 0.5}, mtad_acc, 2))
    pts = frontier.points(rows, "capitals", n_resamples=300)["pairX"]
    (line,) = frontier.frontier_verdict(pts)
    assert verdict in line and "sampling T=0.3" in line, line

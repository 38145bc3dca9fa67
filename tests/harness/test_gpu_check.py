"""``make gpu-check``: its summary selects the rows of the pair ``model=`` resolved to, and its CPU dry run
passes end to end (slow; ``.ci/run`` runs ``make gpu-check ARGS=--cpu-dry-run``)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from inprocess import run_script

from mtad._util.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "experiments" / "gpu_check_rows.py"


def _row(model: str, decoder: str, task: str) -> dict:
    """A real row of the tiny pair (tests/fixtures/results_small.jsonl), renamed."""
    row = json.loads((REPO_ROOT / "tests/fixtures/results_small.jsonl").read_text().splitlines()[0])
    row["model"]["name"], row["model"]["device"] = model, "cpu"
    row["decoder"]["name"], row["task"]["name"] = decoder, task
    row["config_hash"] = f"{row['config_hash']}-{decoder}-{task}"
    return row


def _rows_module():
    spec = importlib.util.spec_from_file_location("gpu_check_rows", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smollm2_resolves_to_the_name_its_rows_carry():
    mod = _rows_module()
    assert mod.resolved_name("smollm2", "cpu") in ("smollm2_feature", "smollm2_bf16_feature")
    assert mod.resolved_name("smollm2", "cuda") == "smollm2_bf16_feature"
    assert mod.resolved_name("tiny", "cpu") == "tiny"


@pytest.mark.parametrize("stored", ["resolved", "other"])
def test_summary_finds_the_resolved_pairs_rows(tmp_path, stored):
    """The rows of a gpu-check sweep carry the resolved pair's name; a summary that looked for "smollm2"
    reported every row missing. Control: rows of another pair are still missing."""
    name = _rows_module().resolved_name("smollm2", "cpu") if stored == "resolved" else "smollm2_token"
    path = tmp_path / "gpu_check.jsonl"
    path.write_text("".join(json.dumps(_row(name, d, t)) + "\n" for d in ("greedy", "mtad") for t in ("gsm8k",)))
    # in this process (:mod:`inprocess`); the CPU dry run below and .ci/run run the script in its own
    out = run_script(SCRIPT, str(path), "cpu", "greedy,mtad", "gsm8k", "smollm2", cwd=REPO_ROOT)
    if stored == "resolved":
        assert out.returncode == 0, out.stderr
        assert f"2 cpu rows of {name} for every decoder x task" in out.stdout
    else:
        assert out.returncode == 1 and "missing rows for" in out.stderr


@pytest.mark.slow
def test_make_gpu_check_cpu_dry_run_passes(tmp_path):
    env = {**os.environ, "GPU_CHECK_DIR": str(tmp_path / "out"), "PY": sys.executable}
    out = subprocess.run(["bash", "experiments/gpu_check.sh", "--cpu-dry-run"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.rstrip().endswith("gpu-check: OK")

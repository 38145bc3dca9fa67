"""A sweep through a real SLURM controller (``make slurm-check``, experiments/slurm_check.sh): where ``sbatch``
exists the whole check runs (marker ``slurm``; skipped elsewhere); its last step, the rows check, is tested
everywhere on rows of the test fixture."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtad._util.paths import REPO_ROOT

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results_small.jsonl"
spec = importlib.util.spec_from_file_location("slurm_check_rows", REPO_ROOT / "experiments" / "slurm_check_rows.py")
rows_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rows_check)
DECODERS = ["greedy", "sampling", "speculative", "mtad"]


@pytest.fixture
def sweep_rows() -> list[dict]:
    """One gsm8k row per decoder of the check's sweep, as the rows check reads them."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    picked = {r["decoder"]["name"]: r for r in rows
              if r["task"]["name"] == "gsm8k" and r["decoder"]["name"] in DECODERS}
    return [rows_check.ResultRow.from_dict(picked[d]).to_dict() for d in DECODERS]


def test_rows_check_accepts_exactly_the_missing_row(sweep_rows):
    before = sweep_rows[1:]  # greedy's job was cancelled
    assert "added exactly the cancelled run's row (greedy)" in rows_check.check(before, before + sweep_rows[:1],
                                                                                DECODERS)


@pytest.mark.parametrize("case", ["nothing new", "a second copy", "pass 1 row changed", "wrong run"])
def test_rows_check_rejects_anything_else(sweep_rows, case):
    before = sweep_rows[1:]
    after = {"nothing new": before, "a second copy": before + sweep_rows[:1] + sweep_rows[:1],
             "pass 1 row changed": [dict(before[0], n_prompts=1), *before[1:], sweep_rows[0]],
             "wrong run": before + [sweep_rows[1]]}[case]
    with pytest.raises(SystemExit):
        rows_check.check(before, after, DECODERS)


def test_rows_check_names_a_line_that_does_not_parse(tmp_path, sweep_rows):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(sweep_rows[0]) + "\n" + '{"config_hash": "abc"\n')
    with pytest.raises(SystemExit, match=r"rows.jsonl:2 does not parse"):
        rows_check.rows(str(path))


@pytest.mark.slurm
@pytest.mark.skipif(shutil.which("sbatch") is None, reason="no sbatch: SLURM is not installed here")
def test_slurm_check_end_to_end(tmp_path):
    """The whole check: on the cluster sinfo answers for, else a local single-node SLURM (needs root)."""
    if shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0 \
            and os.geteuid() != 0:
        pytest.skip("sbatch exists but no cluster answers and starting a local one needs root")
    env = {**os.environ, "PY": sys.executable, "SLURM_CHECK_DIR": str(tmp_path / "check")}
    out = subprocess.run(["bash", str(REPO_ROOT / "experiments" / "slurm_check.sh")], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "pass 2 added exactly the cancelled run's row" in out.stdout and "slurm-check: OK" in out.stdout

"""The main job (``make run`` = ``python -m mtad.harness.compare``): decoders interleaved prompt by
prompt on one loaded pair give the same outputs and rows as separate runs; the table and its reading line say
only what the intervals support; a rerun decodes nothing; bad input is one line, exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from mtad._util.paths import REPO_ROOT
from mtad.harness import compare, runner
from mtad.harness.config import register_configs
from mtad.harness.store import load_results
from mtad.report import stats

register_configs()
PROMPTS = [{"id": f"p{i}", "prompt": f"Question {i}: say hi " + "and more " * i, "answer": "hi"} for i in range(6)]


def _cfg(tmp_path: Path, data_file: Path, name: str, *extra: str):
    overrides = ["model=tiny", "task=jsonl", f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
                 f"name={name}", "decoder.max_new_tokens=8", "warmup=0", "progress=false", *extra]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _outputs(row: dict) -> list:
    lines = (Path(row["run_dir"]) / "samples.jsonl").read_text().splitlines()
    return [json.loads(x)["output_ids"] for x in lines]


def test_interleaved_runs_equal_separate_runs_and_rotate(tmp_path, data_file, monkeypatch):
    decoders = ("sampling", "speculative", "mtad")
    alone = [runner.run(_cfg(tmp_path, data_file, "alone", f"decoder={d}")) for d in decoders]
    order = []
    real = runner.Job.decode
    monkeypatch.setattr(runner.Job, "decode",
                        lambda self, g: (order.extend((s.id, self.dec.name) for s in g), real(self, g)))
    seen = []
    rows = runner.run_interleaved([_cfg(tmp_path, data_file, "inter", f"decoder={d}") for d in decoders],
                                  on_prompt=lambda i, n: seen.append((i, n)))
    # every decoder's own seeded stream: the outputs do not depend on the interleaving
    assert [_outputs(r) for r in rows] == [_outputs(r) for r in alone]
    assert [r["config_hash"] for r in rows] != [r["config_hash"] for r in alone]  # name differs: own rows
    assert seen == [(i, 6) for i in range(1, 7)]
    # prompt-major, and the first decoder of each prompt rotates
    assert [o[0] for o in order] == [f"p{i}" for i in range(6) for _ in decoders]
    assert [order[3 * i][1] for i in range(4)] == ["sampling", "speculative", "mtad", "sampling"]
    # a rerun decodes nothing and returns the stored rows
    order.clear()
    again = runner.run_interleaved([_cfg(tmp_path, data_file, "inter", f"decoder={d}") for d in decoders])
    assert order == [] and [r["config_hash"] for r in again] == [r["config_hash"] for r in rows]
    assert len(load_results(tmp_path / "res" / "inter.jsonl")) == 3


def test_interleaving_refuses_different_pairs_or_prompts(tmp_path, data_file):
    a = _cfg(tmp_path, data_file, "x", "decoder=sampling")
    b = _cfg(tmp_path, data_file, "x", "decoder=mtad", "task.n_prompts=2")  # 2 of the 6 prompts
    with pytest.raises(ValueError, match="one pair and one prompt set"):
        runner.run_interleaved([a, b])


def test_draft_free_proposer_interleaves_on_the_same_target(tmp_path, data_file):
    """decoder=speculative_ngram drops the pair's draft (Job.prepare): it is interleaved with drafted decoders
    on the one loaded target, decodes as it does alone, and its row names no draft."""
    decoders = ("sampling", "speculative_ngram", "mtad")
    alone = [runner.run(_cfg(tmp_path, data_file, "alone", f"decoder={d}")) for d in decoders]
    rows = runner.run_interleaved([_cfg(tmp_path, data_file, "inter", f"decoder={d}") for d in decoders])
    assert [_outputs(r) for r in rows] == [_outputs(r) for r in alone]
    ngram, drafted = rows[1], rows[2]
    assert ngram["metrics"]["draft_forwards"] == 0 < drafted["metrics"]["draft_forwards"]
    assert ngram["model"]["info"]["draft"] is None and ngram["model"]["info"]["draft_params"] == 0
    assert drafted["model"]["info"]["draft_params"] > 0
    # the draft may differ, the target may not
    other = _cfg(tmp_path, data_file, "inter2", "decoder=speculative_ngram", "model.dtype=bfloat16")
    with pytest.raises(ValueError, match="one pair and one prompt set"):
        runner.run_interleaved([_cfg(tmp_path, data_file, "inter2", "decoder=mtad"), other])


def _iv(point, low, high, kind="speedup", n=20):
    return stats.Interval(point, low, high, n, kind)


def test_reading_says_only_what_the_intervals_support():
    decoders = ["sampling", "speculative", "mtad"]
    faster = {"mtad": (_iv(1.2, 1.1, 1.3), _iv(1.1, 1.02, 1.2), _iv(-9.0, -15.0, -3.0, "ppl_change"))}
    text = compare.reading(faster, decoders)
    assert "MTAD is faster than sampling" in text and "faster than speculative" in text
    assert "lower perplexity" in text
    # negative controls: an interval spanning no change claims nothing; a slower MTAD is called slower
    unsure = {"mtad": (_iv(1.05, 0.9, 1.2), _iv(0.8, 0.7, 0.9), _iv(2.0, -4.0, 8.0, "ppl_change"))}
    text = compare.reading(unsure, decoders)
    assert "faster" not in text and "slower than speculative" in text and "lower perplexity" not in text
    assert "no difference the interval can show" in text


def test_table_has_paired_intervals_from_the_records(tmp_path, data_file):
    decoders = ["sampling", "speculative", "mtad"]
    rows = runner.run_interleaved([_cfg(tmp_path, data_file, "t", f"decoder={d}") for d in decoders])
    text = compare.render(rows, decoders, search=[tmp_path / "res"])
    lines = text.splitlines()
    assert lines[0].startswith("| decoder | ms/token | CPU ms/token | speed-up vs sampling | CPU-time speed-up vs "
                               "sampling | speed-up vs speculative | CPU-time speed-up vs speculative")
    assert lines[2].startswith("| sampling |") and "1 (baseline)" in lines[2]
    mt = lines[4]
    assert mt.startswith("| mtad |") and mt.count("[") == 5  # wall and CPU speed-ups vs both, the perplexity change
    assert "Machine: load average " in text and "CPU time / wall time: sampling " in text
    assert "tiny on" in text and "6 paired prompts" in text and text.rstrip().splitlines()[-1].startswith("What")
    # the speed-up printed is the records' ratio of sums (not a mean of per-prompt ratios)
    rec = [stats.samples_for([r["run_dir"]], None, [tmp_path / "res"]) for r in rows]
    t = lambda r: sum(v["time_s"] for v in r.values()) / sum(v["n_tokens"] for v in r.values())  # noqa: E731
    assert f"{t(rec[0]) / t(rec[2]):.2f}×" in mt
    assert not np.isclose(t(rec[0]) / t(rec[2]), 1.0, atol=1e-6)
    c = lambda r: sum(v["cpu_s"] for v in r.values()) / sum(v["n_tokens"] for v in r.values())  # noqa: E731
    assert mt.split(" | ")[2] == f"{1e3 * c(rec[2]):.1f}"  # CPU ms/token from the same records


def _row(decoder: str, load: float, cpu_s: float, wall_s: float, calls: dict | None = None, tokens: int = 100,
         forwards: int = 100, gamma: int = 6) -> dict:
    """A result row with the fields the machine and cost lines read; ``calls``: shape -> (count, CPU seconds)."""
    calls = calls or {}
    return {"decoder": {"name": decoder, "gamma": gamma}, "model": {"name": "smollm2_feature", "dtype": "float32"},
            "timing": {"load_start": [load, 1.0, 1.0], "load_end": [load, 1.0, 1.0], "cpus": 2},
            "metrics": {"total_cpu_s": cpu_s, "total_decode_s": wall_s, "total_tokens": tokens,
                        "target_forwards": forwards, "forward_calls": {k: n for k, (n, _) in calls.items()},
                        "forward_call_cpu_s": {k: c for k, (_, c) in calls.items()}}}


def test_a_busy_machine_is_named_with_its_load_and_cpu_share():
    """Load above the cores: the line says the wall-time ratios measure contention. Control: a quiet machine."""
    busy = compare.machine([_row("sampling", 11.0, 1.0, 2.15), _row("mtad", 10.5, 1.1, 2.3)])
    assert busy.startswith("Machine: load average 10.5–11.0 (1 min, at the runs' start and end) on 2 cores")
    assert "sampling 0.47, mtad 0.48" in busy and "measure contention as much as decoding" in busy
    quiet = compare.machine([_row("sampling", 1.2, 1.0, 1.01), _row("mtad", 0.9, 1.1, 1.12)])
    assert "on 2 cores" in quiet and "contention" not in quiet
    assert compare.machine([{"metrics": {}}]) is None  # no load recorded (an OS without one)


def _pair(verify_ms: float, spec_tokens: int = 205):
    """Sampling and speculative rows, 100 target passes each: a step costs 10 ms of CPU (a sampled token 10.5 ms);
    speculative verifies 3-8 tokens at ``verify_ms`` a pass, drafts 5 tokens at 1 ms each, and yields
    ``spec_tokens`` tokens."""
    base = _row("sampling", 1.0, 1.05, 1.06, {"target:seq:1x1": (100, 1.0)})
    verify = {f"target:seq:1x{w}": (100 // 6 + (w == 3) * 4, verify_ms / 1e3 * (100 // 6 + (w == 3) * 4))
              for w in range(3, 9)}
    cpu = sum(c for _, c in verify.values()) + 0.5 + 0.1  # + drafting + overhead
    spec = _row("speculative", 1.0, cpu, cpu, {**verify, "draft:seq:1x1": (500, 0.5)}, tokens=spec_tokens)
    return [base, spec]


def test_the_machines_cost_structure_is_said_with_the_measured_ratio():
    """A verify pass at 1.9 steps: a step costs more than the 2.05 tokens it yields, which would pay at 1 step:
    the machine rules speculation out, the sentence names the measured costs and the CPU-time ratio.
    Controls: a cheap verify with a weak draft blames the draft; no sentence when speculation is not slower."""
    decoders = ["sampling", "speculative", "mtad"]
    slow = _iv(0.85, 0.81, 0.89, "cpu_speedup")
    text = compare.cost_structure(_pair(19.0), decoders, slow)
    assert text.startswith("Why: this machine's own costs rule speculation out for smollm2_feature (float32): a "
                           "target pass verifying 3–8 tokens costs 1.90–1.90× one decoding step"), text
    assert "speculative decoding ran at 0.85× [0.81, 0.89] sampling in CPU time" in text
    assert "No speculative method can pay here unless it yields more than 2.38 tokens per target pass" in text
    weak = compare.cost_structure(_pair(11.0, spec_tokens=110), decoders, slow)
    assert weak.startswith("Why: the draft is what speculation lacks here, not the machine") and "1.10" in weak
    assert compare.cost_structure(_pair(19.0), decoders, _iv(0.95, 0.88, 1.02, "cpu_speedup")) is None
    assert compare.cost_structure(_pair(19.0), decoders, None) is None
    # the reading then says why MTAD is slower, instead of a bare verdict
    cells = {"mtad": (_iv(0.9, 0.85, 0.95), _iv(1.05, 1.01, 1.1), _iv(-9.0, -15.0, -3.0, "ppl_change"))}
    assert "MTAD is slower than sampling, as the costs above predict (Why)" in compare.reading(cells, decoders,
                                                                                              explained=True)
    assert "MTAD is slower than sampling;" in compare.reading(cells, decoders)


def test_cli_bad_decoder_list_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-m", "mtad.harness.compare", "--decoders", "mtad", "model=tiny",
                          f"results_dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "give at least two" in out.stderr and "Traceback" not in out.stderr
    assert not list(tmp_path.glob("*.jsonl"))

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
    assert lines[0].startswith("| decoder | ms/token | speed-up vs sampling")
    assert lines[2].startswith("| sampling |") and "1 (baseline)" in lines[2]
    mt = lines[4]
    assert mt.startswith("| mtad |") and mt.count("[") == 3  # speed-ups vs both and the perplexity change
    assert "tiny on" in text and "6 paired prompts" in text and text.rstrip().splitlines()[-1].startswith("What")
    # the speed-up printed is the records' ratio of sums (not a mean of per-prompt ratios)
    rec = [stats.samples_for([r["run_dir"]], None, [tmp_path / "res"]) for r in rows]
    t = lambda r: sum(v["time_s"] for v in r.values()) / sum(v["n_tokens"] for v in r.values())  # noqa: E731
    assert f"{t(rec[0]) / t(rec[2]):.2f}×" in mt
    assert not np.isclose(t(rec[0]) / t(rec[2]), 1.0, atol=1e-6)


def test_cli_bad_decoder_list_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-m", "mtad.harness.compare", "--decoders", "mtad", "model=tiny",
                          f"results_dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "give at least two" in out.stderr and "Traceback" not in out.stderr
    assert not list(tmp_path.glob("*.jsonl"))

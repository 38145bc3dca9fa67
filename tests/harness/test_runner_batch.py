"""The runner with ``task.batch_size`` > 1 on ``model=tiny`` (issue 23): prompts decoded together, records and
perplexity per prompt, timing per batch and per token, batch size in the row and its hash; a decoder that
cannot batch is refused before any work (exit status 2 from the CLI)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from inprocess import run_module
from omegaconf import OmegaConf

from mtad._util.paths import REPO_ROOT
from mtad.harness.config import register_configs
from mtad.harness.rows import config_hash

register_configs()
PROMPTS = [{"id": f"p{i}", "prompt": f"Question {i}: say hi" + " please" * i, "answer": "hi"} for i in range(3)]


def _cfg(tmp_path: Path, data_file: Path, *extra: str):
    overrides = ["model=tiny", "task=jsonl", f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
                 "name=t", "decoder.max_new_tokens=8", "decoder.temperature=0", "warmup=1", *extra]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _samples(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("decoder", ["speculative", "mtad"])
def test_batch_of_two_matches_batch_of_one(tmp_path, data_file, decoder):
    """3 prompts at batch size 2 (a full batch, then one of 1): at T = 0 the same outputs as batch size 1,
    one record per prompt with its own perplexity and acceptance, batch timing in the records and the row."""
    from mtad.harness.runner import run

    one = run(_cfg(tmp_path, data_file, f"decoder={decoder}"), run_dir=tmp_path / "one")
    two = run(_cfg(tmp_path, data_file, f"decoder={decoder}", "task.batch_size=2"), run_dir=tmp_path / "two")
    assert two["task"]["batch_size"] == 2 and one["task"]["batch_size"] == 1
    assert two["config_hash"] != one["config_hash"]
    s1, s2 = _samples(tmp_path / "one"), _samples(tmp_path / "two")
    assert [s["id"] for s in s2] == ["p0", "p1", "p2"]
    for a, b in zip(s1, s2):
        assert a["output_ids"] == b["output_ids"] and a["accepted"] == b["accepted"]
        assert b["perplexity"] == pytest.approx(a["perplexity"], rel=1e-4)
        assert "batch" not in a
    assert [s["batch"] for s in s2] == [0, 0, 1] and [s["batch_size"] for s in s2] == [2, 2, 1]
    assert s2[0]["batch_time_s"] == s2[1]["batch_time_s"] == pytest.approx(s2[0]["time_s"] + s2[1]["time_s"])
    m = two["metrics"]
    assert m["n_batches"] == 2 and m["total_decode_s"] == pytest.approx(sum(m["batch_s"]))
    assert m["ms_per_token"] == pytest.approx(1e3 * m["total_decode_s"] / m["total_tokens"])
    assert m["acceptance_rate"] == pytest.approx(one["metrics"]["acceptance_rate"])


def test_batch_size_1_hashes_as_before_the_key_existed(tmp_path, data_file):
    """task.batch_size joined the config after rows were published: at its default it is left out of the hash."""
    cfg = OmegaConf.to_container(_cfg(tmp_path, data_file), resolve=True)
    assert cfg["task"]["batch_size"] == 1
    old = {**cfg, "task": {k: v for k, v in cfg["task"].items() if k != "batch_size"}}
    assert config_hash(cfg) == config_hash(old)
    assert config_hash({**cfg, "task": {**cfg["task"], "batch_size": 4}}) != config_hash(old)


@pytest.mark.parametrize("decoder", ["mmtad", "specinfer", "mtjd_exhaustive"])
def test_unbatched_decoder_is_refused_with_exit_2(tmp_path, data_file, decoder):
    out = run_module("mtad", "model=tiny", "task=jsonl", f"task.data_file={data_file}",  # in this process
                     f"results_dir={tmp_path / 'res'}", "name=bad", "warmup=0", f"decoder={decoder}",
                     "task.batch_size=2", cwd=tmp_path)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "one prompt at a time" in errors[0], out.stderr
    assert not (tmp_path / "res" / "bad.jsonl").exists()

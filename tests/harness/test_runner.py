"""The experiment harness end to end on ``model=tiny``. Runs in-process through Hydra's
``compose`` + :func:`mtad.harness.runner.run`, and through the CLI (``python -m mtad``, in this process) where
exit codes matter."""
from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from inprocess import run_module

from mtad._util.paths import REPO_ROOT
from mtad.harness.config import register_configs
from mtad.harness.rows import ResultRow
from mtad.harness.store import load_results

register_configs()
PROMPTS = [{"id": f"p{i}", "prompt": f"Question {i}: say hi", "answer": "hi"} for i in range(3)]


def _cfg(tmp_path: Path, data_file: Path, *extra: str):
    overrides = ["model=tiny", "task=jsonl", f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
                 "name=t", "decoder.max_new_tokens=8", "warmup=1", *extra]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m mtad args`` from ``tmp_path``, in this process (:mod:`inprocess`)."""
    return run_module("mtad", *args, cwd=tmp_path, env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})


def test_end_to_end_writes_samples_and_one_complete_row(tmp_path, data_file):
    from mtad.harness.runner import run

    row = run(_cfg(tmp_path, data_file, "decoder=mtad"), run_dir=tmp_path / "run")
    rows = load_results(tmp_path / "res" / "t.jsonl")
    assert len(rows) == 1 and rows[0]["config_hash"] == row["config_hash"]
    assert set(rows[0]) == {f.name for f in dataclasses.fields(ResultRow)}
    ResultRow.from_dict(rows[0])  # strict schema check
    m = rows[0]["metrics"]
    for key in ("ms_per_token", "tokens_per_s", "block_efficiency", "acceptance_rate", "per_position_acceptance",
                "target_forwards", "draft_forwards", "ppl_mean_logprob", "ppl_token_weighted", "energy_j", "score"):
        assert key in m, key
    assert m["score"]["exact_match"] in (0.0, 1 / 3, 2 / 3, 1.0)
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["id"] for s in samples] == ["p0", "p1", "p2"]
    for s in samples:
        assert 1 <= s["n_tokens"] <= 8 and s["stop_reason"] in ("eos", "max_new_tokens")
        assert s["perplexity"] > 0 and "completion" in s and "scores" in s
    assert rows[0]["n_prompts"] == 3 and rows[0]["seed"] == 0


def test_rerun_skips_and_force_reruns(tmp_path, data_file):
    from mtad.harness.runner import run

    assert run(_cfg(tmp_path, data_file), run_dir=tmp_path / "a") is not None
    assert run(_cfg(tmp_path, data_file), run_dir=tmp_path / "b") is None  # same config hash: skipped
    assert run(_cfg(tmp_path, data_file, "force=true"), run_dir=tmp_path / "c") is not None
    assert len(load_results(tmp_path / "res" / "t.jsonl")) == 2


def test_interrupted_run_leaves_result_file_valid(tmp_path, data_file, monkeypatch):
    from mtad.harness import runner

    run = runner.run
    run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "ok")
    before = (tmp_path / "res" / "t.jsonl").read_bytes()
    calls = {"n": 0}
    real = runner.generate

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # warm-up, prompt 1, then crash mid-run on prompt 2
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "generate", flaky)
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(tmp_path, data_file, "decoder=sampling"), run_dir=tmp_path / "crash")
    assert (tmp_path / "res" / "t.jsonl").read_bytes() == before
    assert len(load_results(tmp_path / "res" / "t.jsonl")) == 1
    assert not (tmp_path / "crash" / "samples.jsonl").exists()


def test_multirun_2x2_writes_4_rows_and_rerun_writes_none(tmp_path, data_file):
    args = ["-m", "model=tiny", "task=jsonl", f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
            "name=grid", "decoder=greedy,mtad", "decoder.max_new_tokens=4,6", "warmup=0"]
    first = _cli(tmp_path, *args)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = load_results(tmp_path / "res" / "grid.jsonl")
    assert len(rows) == 4
    assert {(r["decoder"]["name"], r["decoder"]["max_new_tokens"]) for r in rows} == {
        ("greedy", 4), ("greedy", 6), ("mtad", 4), ("mtad", 6)}
    second = _cli(tmp_path, *args)
    assert second.returncode == 0, second.stderr[-2000:]
    assert len(load_results(tmp_path / "res" / "grid.jsonl")) == 4


@pytest.mark.parametrize("override,needle", [
    ("decoder=nosuch", "decoder"),
    ("model=nosuch", "model"),
    ("task=nosuch", "task"),
    ("decoder.max_new_tokens=0", "max_new_tokens"),
    ("decoder.tau=1.5", "tau"),
    ("task.data_file=does/not/exist.jsonl", "does/not/exist.jsonl"),
])
def test_bad_input_fails_with_a_named_error_and_no_row(tmp_path, data_file, override, needle):
    args = ["model=tiny", "task=jsonl", f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
            "name=bad", "warmup=0", override]
    out = _cli(tmp_path, *args)
    assert out.returncode != 0
    assert needle in out.stderr
    assert not (tmp_path / "res" / "bad.jsonl").exists()
    assert not [p for p in (tmp_path / "res").rglob("*") if p.is_file()], "a failed run left files behind"


def test_long_prompt_is_skipped_with_recorded_reason(tmp_path, data_file):
    from mtad.harness.runner import run

    rows = [{"id": "long", "prompt": "x" * 400, "answer": "hi"}] + PROMPTS[:1]
    data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    row = run(_cfg(tmp_path, data_file, "task.max_prompt_tokens=100"), run_dir=tmp_path / "run")
    assert row["n_prompts"] == 1 and row["n_skipped"] == 1
    assert "max_prompt_tokens" in next(iter(row["skip_reasons"]))


def test_wandb_offline_writes_run_files(tmp_path, data_file, monkeypatch):
    from mtad.harness.runner import run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path))  # no netrc: offline
    run(_cfg(tmp_path, data_file, "tracking=wandb", "tracking.mode=offline"), run_dir=tmp_path / "run")
    assert list((tmp_path / "run").rglob("*.wandb")), "no offline W&B run file written"
    assert len(load_results(tmp_path / "res" / "t.jsonl")) == 1


def test_weights_fingerprint_changes_when_a_local_draft_is_retrained(tmp_path):
    from mtad.harness.runner import weights_fingerprint
    from mtad.models.load import ModelConfig

    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    cfg = ModelConfig(name="p", kind="hf", target="org/some-model", draft=str(tmp_path))
    before = weights_fingerprint(cfg)
    assert before == weights_fingerprint(cfg) and "target" not in before  # hub ids: by id alone
    (tmp_path / "model.safetensors").write_bytes(b"y" * 10)
    assert weights_fingerprint(cfg) != before

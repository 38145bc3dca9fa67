"""experiments/regime_decoders.py: which draft and decoder a row ran, and the comparisons it draws from the
per-prompt records (every decoder along the draft axis)."""
from __future__ import annotations

import importlib.util
import json

import pytest

from mtad._util.paths import REPO_ROOT

spec = importlib.util.spec_from_file_location("regime_decoders", REPO_ROOT / "experiments" / "regime_decoders.py")
rd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rd)

TABLE = [{"name": "run5", "model": "smollm2_bf16_feature", "extra": [], "oracle_mix": None},
         {"name": "token", "model": "smollm2_bf16_feature", "extra": ["model.draft=models/smollm2-draft",
                                                                       "--tv-contexts", "0"], "oracle_mix": None},
         {"name": "int8", "model": "smollm2_bf16_int8draft", "extra": [], "oracle_mix": None}]


def row(model: str, draft: str, dec: dict) -> dict:
    return {"model": {"name": model, "draft": draft}, "decoder": dec, "config_hash": "x"}


def test_a_row_names_its_draft_and_decoder():
    assert rd.draft_of(row("smollm2_bf16_feature", "models/smollm2-feature-draft", {}), TABLE) == "run5"
    assert rd.draft_of(row("smollm2_bf16_feature", "models/smollm2-draft", {}), TABLE) == "token"
    assert rd.draft_of(row("smollm2_bf16_int8draft", "target:int8", {}), TABLE) == "int8"
    with pytest.raises(SystemExit, match="not a draft of results/regimes/drafts.tsv"):
        rd.draft_of(row("smollm2_bf16_w4g32", "target:w4g32", {}), TABLE)
    assert rd.decoder_of(row("m", "d", {"name": "speculative", "accept": "block"})) == "block"
    assert rd.decoder_of(row("m", "d", {"name": "speculative", "accept": "lossless"})) == "speculative"
    assert rd.decoder_of(row("m", "d", {"name": "mmtad"})) == "mmtad"


def test_jobs_are_one_per_decoder_on_the_drafts_pair():
    jobs = rd.jobs(TABLE[1], "gsm8k", 10, 48, REPO_ROOT / "results" / "x")
    assert [j[0] for j in jobs] == [f"decoder={d}" for d in rd.DECODERS]
    assert all("model=smollm2_bf16_feature" in j and "model.draft=models/smollm2-draft" in j for j in jobs)
    assert not any("--tv-contexts" in a for j in jobs for a in j)  # study arguments are not overrides


def _records(tmp_path, name: str, fwd: int, lp: float) -> str:
    run = tmp_path / name
    run.mkdir()
    run.joinpath("samples.jsonl").write_text("".join(json.dumps(
        {"id": f"p{i}", "turn": 0, "n_tokens": 40, "time_s": 1.0, "cpu_s": 1.0, "target_forwards": fwd + i % 2,
         "accepted": [2], "proposed": [4], "mean_logprob": lp - 0.01 * i, "output_ids": [i, 2, 3, i]}) + "\n"
        for i in range(10)))
    return str(run)


def test_analysis_compares_every_decoder_with_speculative(tmp_path, monkeypatch):
    """A decoder with half the target forwards has a block-efficiency ratio near 2 with an interval above 1;
    speculative itself is the baseline (no comparison of its own). Control: a decoder with speculative's records
    shows no change."""
    monkeypatch.setattr(rd, "drafts", lambda root: TABLE)
    monkeypatch.setattr(rd, "alphas", lambda root: {"run5": [0.6, 0.55, 0.65]})
    rows = []
    for dec, fwd, lp in (("speculative", 20, -1.0), ("mtad", 10, -0.9), ("block", 20, -1.0)):
        name = "speculative" if dec == "block" else dec
        spec = {"name": name, "accept": "block"} if dec == "block" else {"name": name}
        rows.append({**row("smollm2_bf16_feature", "models/smollm2-feature-draft", spec),
                     "task": {"name": "gsm8k"}, "metrics": {"total_tokens": 400},
                     "run_dir": _records(tmp_path, dec, fwd, lp), "device_name": "cpu", "git_sha": "abc",
                     "git_dirty": False})
    rows[0]["decoder"]["max_new_tokens"] = 48
    res = rd.analyze(rows, [tmp_path], tmp_path)
    d = res["drafts"]["run5"]
    assert set(d["vs_speculative"]) == {"mtad", "block"}
    be = d["vs_speculative"]["mtad"]["block_efficiency_ratio"]
    assert be[0] == pytest.approx(205 / 105) and be[1] > 1.5 and be[3] == "significant"
    assert d["vs_speculative"]["block"]["block_efficiency_ratio"][0] == pytest.approx(1.0)  # control
    assert d["vs_speculative"]["block"]["block_efficiency_ratio"][3] == "not significant"
    assert d["decoders"]["mtad"]["acceptance"] == pytest.approx(0.5)
    assert "| run5 | 0.60 |" in rd.render(res)

"""The common-random-numbers verifier study (VERIFIERS.md §6, ``python -m mtad.study verifiers``) on tiny models.

- Pairing: every rule of a context is handed the identical draft block and uniforms (spies record them), the
  hidden lossless replica agrees everywhere; negative control: handing each rule draws of its own is detected.
- Distance: at a fixed context where the target spreads its mass (T = 2) the lossless and block rules'
  first-token TV is Monte-Carlo noise (bound 0.08 with 600 drafts; measured 0.018 and 0.016), while a planted
  lossy rule that accepts every draft token is as far from the target as the draft is (its exact first-token
  law is q_1; measured 0.95, the exact TV(p_1, q_1) within 0.08).
- Summaries: L = 1 + Σ marginals for every rule; the outputs (Markdown, JSONL, CSV, PNG) are written.
"""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import tinymodels as tm
import torch

from mtad.decoding import DecoderConfig
from mtad.study import output
from mtad.study.__main__ import main
from mtad.study.verifiers import (
    Drafter,
    Rule,
    first_token_laws,
    pairing_failures,
    rules,
    run_task,
    summarize,
    tv_estimates,
)

torch.set_num_threads(1)
CFG = DecoderConfig(name="speculative", gamma=3, temperature=1.0, top_k=10, top_p=0.9, max_new_tokens=12)
PROMPTS = [[0, 5, 9, 2], [0, 7, 7, 1, 3], [0, 11, 4]]


@pytest.fixture(scope="module")
def models():
    return tm.pair("llama", vocab=32)


def spy(log: list) -> Rule:
    def fn(p, q, x, u):
        log.append((x.tolist(), u.tolist(), float(p[0].sum())))
        return 0, p[0]
    return Rule("spy", str(len(log)), True, fn)


def test_every_rule_gets_the_same_block_and_uniforms(models):
    seen_a, seen_b = [], []
    res = run_task(models, PROMPTS[:2], "t", [*rules(), spy(seen_a), spy(seen_b)], CFG, tokens=8, stride=2,
                   tv_contexts=0)
    assert len(seen_a) == len(res.tau) == 8 and seen_a == seen_b
    assert pairing_failures(res) == 0


def test_unpaired_draws_are_detected(models):
    """Negative control: each rule drawing its own uniforms breaks the lossless replica."""
    seen_a, seen_b = [], []
    res = run_task(models, PROMPTS, "t", [*rules(), spy(seen_a), spy(seen_b)], CFG, tokens=8, stride=2,
                   tv_contexts=0, paired=False)
    assert [x for x, _, _ in seen_a] == [x for x, _, _ in seen_b]  # the draft is still shared ...
    assert [u for _, u, _ in seen_a] != [u for _, u, _ in seen_b]  # ... the uniforms are not
    assert pairing_failures(res) > 0


def test_same_seed_same_study_other_seed_other_drafts(models):
    one = run_task(models, PROMPTS[:1], "t", rules(), CFG, tokens=8, stride=2, tv_contexts=0, seed=3)
    two = run_task(models, PROMPTS[:1], "t", rules(), CFG, tokens=8, stride=2, tv_contexts=0, seed=3)
    other = run_task(models, PROMPTS[:1], "t", rules(), CFG, tokens=8, stride=2, tv_contexts=0, seed=4)
    assert one.tau == two.tau and one.loglik == two.loglik and one.loglik != other.loglik


def accept_all(p, q, x, u):
    return len(x), p[len(x)]


def test_lossless_tv_is_noise_and_a_planted_lossy_rule_is_not(models):
    rule_list = [*(r for r in rules() if r.name in ("lossless", "block") and not r.control),
                 Rule("planted", "accept all", False, accept_all)]
    context = PROMPTS[0] + [3, 8]
    cfg = DecoderConfig(name="speculative", gamma=3, temperature=2.0, top_k=10, top_p=1.0)  # spread p_1
    laws = first_token_laws(models, context, rule_list, cfg, 600, seed=1)
    assert (laws["p1"] > 0.02).sum() >= 4 and laws["p1"].max() < 0.8  # several likely tokens: the test has power
    tv, lo, hi = tv_estimates([laws], n_boot=300)
    lossless, block, planted = tv
    assert lossless < 0.08 and block < 0.08, tv
    # the planted rule commits x_1 ~ q_1 always: its TV is the draft's own distance from the target
    with torch.inference_mode():
        blk = Drafter(models, context, cfg).block(context, torch.Generator().manual_seed(0))
    exact = 0.5 * float((blk.p[0] - blk.q[0]).abs().sum())
    assert exact > 0.2 and planted == pytest.approx(exact, abs=0.08)
    assert planted > 3 * max(lossless, block) and lo[2] > hi[0]


def test_summaries_are_consistent_and_outputs_written(models, tmp_path):
    res = run_task(models, PROMPTS, "t", rules(), CFG, tokens=10, stride=2, tv_contexts=1, tv_draws=40)
    rows = summarize(res, CFG.gamma, n_boot=200)
    assert [r["label"] for r in rows] == [r.label for r in rules() if not r.control]
    for r in rows:
        L, marg = r["mean_accept_length"], [m[0] for m in r["marginal_accept_rates"]]
        assert L[0] == pytest.approx(1 + sum(marg)) and L[1] <= L[0] <= L[2]
        assert all(a >= b for a, b in zip(marg, marg[1:]))
        assert sum(r["acceptance_length_histogram"].values()) == r["n_contexts"] == len(res.tau)
    lossless = next(r for r in rows if r["label"] == "lossless")
    assert lossless["delta_accept_length_vs_lossless"] == [0.0, 0.0, 0.0]
    meta = {"pair": "tiny", "device_name": "cpu", "num_threads": 1, "git_sha": None, "seconds": 1.0,
            "command": "test", "gamma": CFG.gamma, "tokens": 10, "stride": 2, "continuation": "sampled",
            "temperature": 1.0, "top_k": 10, "top_p": 0.9, "n_boot": 200, "pairing": {"t": 0}}
    md, jl, cs, png = output.write_all(rows, meta, tmp_path, "study")
    assert "| lossless | yes |" in md.read_text() and "pairing check: 0" in md.read_text()
    assert len(jl.read_text().splitlines()) == len(rows) and json.loads(jl.read_text().splitlines()[0])["study"]
    assert len(list(csv.reader(cs.open()))) == len(rows) + 1 and png.stat().st_size > 10_000


def test_tv_interval_contains_its_point():
    rng = np.random.default_rng(0)
    p1 = np.array([0.5, 0.3, 0.2])
    laws = np.eye(3)[rng.choice(3, size=(400, 1), p=p1)]  # (M, R=1, S): draws from p1 itself
    point, lo, hi = tv_estimates([{"p1": p1, "laws": laws}], n_boot=300)
    assert lo[0] <= point[0] <= hi[0] and lo[0] >= 0 and point[0] < 0.08


@pytest.mark.parametrize("argv, words", [
    (["verifiers", "--temperature", "0"], "argument --temperature: 0 is out of range"),
    (["verifiers", "--model", "nope"], "model"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, words):
    assert main([*argv, "--out", "/nonexistent/never-written"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtad.study: error:") and words in err[0]

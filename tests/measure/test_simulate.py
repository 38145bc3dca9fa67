"""The what-if simulator (mtad.measure.simulate): its prediction equals a step-by-step simulated decode with
known costs, its speed-up reduces to the reference formula, and each check fails for a wrong cost model."""
import random

import pytest

from mtad.measure.costmodel import Profile
from mtad.measure.simulate import CostProfile, declared, iid_histogram, mean_length, predict, speedup

GAMMA = 4
PROF = CostProfile(label="test", t1=30.0, c=0.12, c_W=0.2, v=1.4, overhead={"speculative": 0.05, "mtad": 0.1,
                                                                           "sampling": 0.02}, prefill=3.0)


def decode_clock(decoder: str, lengths: list[int], t1: float, c: float, c_W: float, v: float, o: float,
                 prefill: float, prompts: int) -> float:
    """ms/token of a decode simulated forward by forward: every step pays its draft passes, its verify pass
    and its harness time; every prompt its prefill, in place of its first verify pass."""
    ms = prompts * (prefill - v) * t1  # each prompt's first verify pass is its prefill pass
    for _ in lengths:
        if decoder == "mtad":
            ms += t1 * c + (GAMMA - 1) * t1 * c_W  # one row, then W beam rows
        else:
            ms += GAMMA * t1 * c
        ms += t1 * v + t1 * o
    return ms / sum(lengths)


def sampled_lengths(alpha: float, steps: int, seed: int) -> list[int]:
    rng, out = random.Random(seed), []
    for _ in range(steps):
        L = 1
        while L <= GAMMA and rng.random() < alpha:
            L += 1
        out.append(L)
    return out


def histogram(lengths):
    h = {}
    for L in lengths:
        h[L] = h.get(L, 0) + 1
    return h


@pytest.mark.parametrize("decoder", ["speculative", "mtad"])
def test_prediction_equals_a_simulated_decode(decoder):
    lengths = sampled_lengths(0.6, 500, seed=1)
    o = PROF.overhead[decoder]
    clock = decode_clock(decoder, lengths, PROF.t1, PROF.c, PROF.c_W, PROF.v, o, PROF.prefill, prompts=7)
    assert predict(histogram(lengths), decoder, PROF, GAMMA, prompts=7) == pytest.approx(clock, rel=1e-9)


def test_negative_control_wrong_beam_cost_misses():
    """MTAD's beam steps cost c_W, not c: a simulator that charged c for them would miss by more than the
    10 % the check allows, and the comparison sees it."""
    lengths = sampled_lengths(0.6, 500, seed=2)
    clock = decode_clock("mtad", lengths, PROF.t1, PROF.c, PROF.c_W, PROF.v, PROF.overhead["mtad"], 0, 0)
    wrong = predict(histogram(lengths), "speculative", PROF.replace(overhead={"speculative": PROF.overhead["mtad"]}),
                    GAMMA)
    right = predict(histogram(lengths), "mtad", PROF, GAMMA)
    assert right == pytest.approx(clock, rel=1e-9)
    # charged c per beam step (0.12 vs 0.2): off by 3 x 0.08 t1 per step of ~2.4 t1 -> ~10 %
    assert abs(wrong / clock - 1) > 0.05


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
def test_iid_reference_formula(alpha):
    """Speed-up of speculative over sampling with i.i.d. acceptance: E / (γc + v), E = (1 − α^(γ+1))/(1 − α)."""
    h = iid_histogram(alpha, GAMMA, steps=1000)
    E = (1 - alpha ** (GAMMA + 1)) / (1 - alpha)
    assert mean_length(h) == pytest.approx(E)
    prof = PROF.replace(overhead={})
    s = speedup(h, "speculative", {1: 1000}, "sampling", prof, GAMMA)
    assert s == pytest.approx(E / (GAMMA * prof.c + prof.v))
    # control: the formula with MTAD's iteration cost is a different number (c_W != c)
    assert s != pytest.approx(E / (prof.c + (GAMMA - 1) * prof.c_W + prof.v))


def test_from_profile_reads_c_cW_v():
    p = Profile(hardware="x", pair="y", costs_ms={
        "target:seq:1": [[1, 40.0], [5, 60.0], [100, 200.0]], "draft:seq:1": [[1, 4.0], [100, 24.0]],
        "draft:seq:4": [[1, 6.0]]}, overhead_ms={"mtad": 2.0})
    cp = CostProfile.from_profile(p, gamma=4, W=4, prompt_tokens=100)
    assert (cp.t1, cp.c, cp.c_W, cp.v) == (40.0, 0.1, 0.15, 1.5)
    assert cp.overhead["mtad"] == pytest.approx(0.05)
    assert cp.prefill == pytest.approx((200 + 24) / 40)


def test_declared_profiles_are_projections_with_a_range():
    lo, hi = declared("llama8b_1b")
    assert lo.kind == hi.kind == "declared" and lo.label.startswith("projection")
    assert lo.c < hi.c and lo.v <= hi.v


def test_unknown_decoder_and_empty_histogram_fail():
    with pytest.raises(ValueError):
        predict({2: 1}, "specinfer", PROF)
    with pytest.raises(ValueError):
        predict({}, "speculative", PROF)


def test_a_measured_per_prompt_cost_replaces_prefill_minus_first():
    """A profile measured from whole decodes gives each decoder's per-prompt cost outside its steps; the
    prediction adds it once per prompt (control: without it, the prefill model's term is used instead)."""
    lengths = sampled_lengths(0.6, 200, seed=5)
    hist = histogram(lengths)
    steps, tokens = len(lengths), sum(lengths)
    measured = PROF.replace(per_prompt={"speculative": 7.0})
    step = GAMMA * PROF.c + PROF.v + PROF.overhead["speculative"]
    want = PROF.t1 * (steps * step + 10 * 7.0) / tokens
    assert predict(hist, "speculative", measured, GAMMA, prompts=10) == pytest.approx(want)
    plain = predict(hist, "speculative", PROF, GAMMA, prompts=10)
    assert plain == pytest.approx(PROF.t1 * (steps * step + 10 * (PROF.prefill - PROF.v)) / tokens)
    assert plain != pytest.approx(want)  # control: the two models differ here
    assert predict(hist, "mtad", measured, GAMMA, prompts=10) == predict(hist, "mtad", PROF, GAMMA, prompts=10)

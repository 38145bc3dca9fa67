"""The cost model (mtad.measure.costmodel): lookups by hand, and predicted vs measured ms/token on tiny models."""
from __future__ import annotations

import json
import math

import pytest
import torch

from mtad.harness import profile
from mtad.measure import costmodel
from mtad.measure.costmodel import Profile, declared_profile, predict

# Stated tolerances on the tiny pair on a CPU. The cost model explains speed *ratios*: predicted ms/token of a
# decoder relative to sampling's within a factor 1.5 of the measured ratio (decodes interleaved prompt by
# prompt, so a change in the machine's load shifts every decoder alike). Absolute ms/token within a factor 3:
# the profile is measured seconds before the decodes, and on a busy shared machine the load of the two moments
# can differ by 2x (millisecond forwards, ~5 ms preemptions). The negative control is a factor 4 or more away.
RATIO_TOLERANCE = 1.5
ABSOLUTE_TOLERANCE = 3.0


def _hand_profile() -> Profile:
    return Profile(hardware="box", pair="p", num_threads=1, overhead_ms={"speculative": 0.5},
                   costs_ms={"target:seq:1": [[1, 10.0], [5, 14.0], [64, 30.0]], "target:seq:4": [[1, 16.0]],
                             "target:tree:1": [[4, 12.0], [16, 20.0]], "draft:seq:1": [[1, 2.0], [2, 2.5]]})


def test_costs_interpolate_between_measured_shapes():
    p = _hand_profile()
    assert p.cost("target", "seq", 1, 1) == 10.0 and p.cost("target", "seq", 1, 3) == pytest.approx(12.0)
    assert p.cost("target", "seq", 1, 128) == pytest.approx(30.0 + 64 * 16 / 59)  # extrapolated from the end
    assert p.cost("target", "seq", 2, 1) == pytest.approx(12.0)  # between 1 row (10) and 4 rows (16)
    assert p.cost("target", "tree", 1, 10) == pytest.approx(16.0)
    assert p.cost("draft", "tree", 1, 2) == pytest.approx(2.5)  # no draft tree curve: a pass of 2 tokens
    with pytest.raises(ValueError, match="no draft costs"):
        Profile(hardware="b", pair="p", costs_ms={"target:seq:1": [[1, 1.0]]}).cost("draft", "seq", 1, 1)


def test_prediction_by_hand_and_the_declared_projection():
    calls = {"target:seq:1x100": 1, "target:seq:1x5": 10, "draft:seq:1x1": 40, "draft:seq:1x100": 1}
    p = _hand_profile()
    prefill_t, prefill_d = p.cost("target", "seq", 1, 100), p.cost("draft", "seq", 1, 100)
    want = (prefill_t + 10 * 14.0 + 40 * 2.0 + prefill_d + 0.5 * 11) / 30
    assert predict(calls, 30, p, "speculative") == pytest.approx(want)
    # declared: target pass = 1 step at any width (4 beam rows too), draft pass = c
    d = declared_profile(0.1)
    assert predict(calls, 30, d) == pytest.approx((11 + 0.1 * 41) / 30)
    assert predict({"target:seq:4x1": 3}, 3, d) == pytest.approx(1.0)
    assert predict({}, 10, p) is None and predict(calls, 0, p) is None
    with pytest.raises(ValueError, match="bad forward-call key"):
        predict({"target:1x5": 1}, 5, p)


def test_profile_json_round_trip_and_bad_files(tmp_path):
    p = _hand_profile()
    path = tmp_path / "x.json"
    path.write_text(p.to_json())
    assert Profile.load(path) == p
    assert costmodel.find_profiles([tmp_path, tmp_path / "missing"]) == [p]
    (tmp_path / "bad.json").write_text(json.dumps({"hardware": "x", "oops": 1}))
    with pytest.raises(ValueError, match="bad.json: not a cost profile: unknown keys"):
        costmodel.find_profiles([tmp_path])


def _decode(pair, names, prompts, tokens):
    """Decode every prompt with every decoder, round-robin (prompt by prompt); per decoder (ms/token, forward
    counts, tokens)."""
    from mtad.decoding import DecoderConfig, generate

    results: dict = {name: [] for name in names}
    for i, p in enumerate(prompts):
        for name in names:
            cfg = DecoderConfig(name=name, max_new_tokens=tokens, eos_token_id=2**31 - 1)  # never generated
            results[name].append(generate(pair, p, cfg, torch.Generator().manual_seed(i)))
    out = {}
    for name, rs in results.items():
        calls: dict = {}
        for r in rs:
            for k, v in r.calls.items():
                calls[k] = calls.get(k, 0) + v
        n = sum(r.num_tokens for r in rs)
        for role in ("target", "draft"):  # every forward is counted with its shape
            assert sum(v for k, v in calls.items() if k.startswith(role)) == sum(getattr(r, f"{role}_forwards")
                                                                                for r in rs)
        out[name] = (1e3 * sum(r.wall_time_s for r in rs) / n, calls, n)
    return out


def _off(a: float, b: float) -> float:
    return abs(math.log(a / b))


@pytest.mark.slow  # times every decoder on tiny models (about 20 s); .ci/run runs it with the slow tests
def test_predicted_matches_measured_on_tiny_models(tmp_path):
    """The profile CLI on the tiny pair, then interleaved decodes of three decoders: each decoder's predicted
    ms/token relative to sampling's matches the measured ratio (RATIO_TOLERANCE), and the absolute figures
    agree within ABSOLUTE_TOLERANCE. Negative control: sampling's counts do not explain mtad's time.
    Timings are noisy on a shared 2-core box (another job on the other core moves them by 2x between the
    profile and the decodes), so the measurement is repeated up to 3 times; all three must miss to fail."""
    torch.set_num_threads(1)
    misses = []
    for attempt in range(3):
        miss = _predict_and_compare(tmp_path / str(attempt))
        if not miss:
            return
        misses.append(miss)
    raise AssertionError(f"prediction missed the measurement in 3 attempts: {misses}")


def _predict_and_compare(out) -> list:
    """Profile + decodes once; the list of (what, predicted, measured) that missed (empty: all agree)."""
    assert profile.main(["profile", "model=tiny", "num_threads=1", "--reps", "10", "--out", str(out)]) == 0
    (path,) = out.glob("*-1t-tiny.json")
    prof = Profile.load(path)
    assert prof.pair == "tiny" and prof.num_threads == 1 and prof.kind == "measured"
    assert {"target:seq:1", "target:seq:4", "target:tree:1", "draft:seq:1", "draft:seq:4", "draft:tree:1"} <= \
        set(prof.costs_ms)
    assert set(prof.overhead_ms) >= {"sampling", "speculative", "mtad", "specinfer"}

    from mtad.models.load import load_pair

    pair = load_pair({"name": "tiny", "kind": "tiny"})
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 200, (120,), generator=g).tolist() for _ in range(4)]
    runs = _decode(pair, ["sampling", "speculative", "mtad"], prompts, 48)
    assert _decode(pair, ["mmtad", "specinfer", "mtjd"], prompts[:1], 8)  # tree and beam shapes counted too
    predicted = {name: predict(calls, n, prof, name) for name, (_, calls, n) in runs.items()}
    measured = {name: ms for name, (ms, _, _) in runs.items()}
    # negative control: sampling's counts (one target pass per token, no draft) predict mtad at sampling's speed
    wrong = predict(runs["sampling"][1], runs["sampling"][2], prof, "sampling") / predicted["sampling"]
    assert _off(wrong, measured["mtad"] / measured["sampling"]) > math.log(RATIO_TOLERANCE)
    miss = [(name, predicted[name], measured[name]) for name in runs
            if _off(predicted[name], measured[name]) >= math.log(ABSOLUTE_TOLERANCE)]
    for name in ("speculative", "mtad"):
        ratio_pred, ratio_meas = predicted[name] / predicted["sampling"], measured[name] / measured["sampling"]
        if _off(ratio_pred, ratio_meas) >= math.log(RATIO_TOLERANCE):
            miss.append((f"{name}/sampling", ratio_pred, ratio_meas))
    return miss

"""Forecasts (mtad.study.forecast): settings written on one line, the cost arithmetic against a hand sum, the
harness fit recovering planted terms, declared GPU terms, replays cached and read back, paired speed-ups, the
check's containment logic and the command's one-line refusals; each with a control that fails."""
import json

import numpy as np
import pytest

from mtad.study.forecast import costs, declared
from mtad.study.forecast import predict as fp
from mtad.study.forecast.check import compare, summary
from mtad.study.forecast.costs import CostProfile, declared_forward, features, fit_harness
from mtad.study.forecast.spec import from_config, parse


# ------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("text, want", [
    ("sampling", "sampling"), ("speculative:gamma=6", "speculative:gamma=6"), ("block", "block:gamma=4"),
    ("mtad:gamma=6,W=2", "mtad:gamma=6,W=2,tau=0.5"), ("mtad:tau=0.3", "mtad:gamma=4,W=4,tau=0.3"),
    ("mmtad", "mmtad:gamma=4,W=4,tau=0.5"), ("specinfer:tree=2.2.2.2", "specinfer:tree=2.2.2.2"),
    ("specinfer:k_config=4x2x2", "specinfer:tree=4.2.2")])
def test_spec_reads_back_canonical(text, want):
    assert str(parse(text)) == want
    assert parse(str(parse(text))) == parse(text)  # the canonical text parses to the same setting


@pytest.mark.parametrize("text, words", [
    ("sampling:gamma=4", "does not read"), ("specinfer:W=2", "does not read"), ("mtad:gamma=0", "positive"),
    ("mtad:tau=2", "[0, 1]"), ("beam", "unknown decoder"), ("mtad:gamma", "key=value"),
    ("specinfer:tree=4.0", "widths")])
def test_spec_refuses_bad_settings_in_one_line(text, words):
    with pytest.raises(ValueError) as err:
        parse(text)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_spec_from_a_run_config_reads_only_what_the_decoder_reads():
    row = {"name": "speculative", "accept": "block", "gamma": 6, "beam_width": 9, "tau": 0.1}
    assert str(from_config(row)) == "block:gamma=6"  # beam_width and tau are not block's
    assert str(from_config({"name": "sampling", "gamma": 7})) == "sampling"
    assert from_config({"name": "mtad", "gamma": 6, "beam_width": 2, "tau": 0.5}) == parse("mtad:gamma=6,W=2")
    # control: a setting the decoder reads changes the spec
    assert from_config({"name": "mtad", "gamma": 6, "beam_width": 3, "tau": 0.5}) != parse("mtad:gamma=6,W=2")


def test_spec_overrides_compose_to_the_same_decoder():
    from omegaconf import OmegaConf

    from mtad.decoding import DecoderConfig
    from mtad.harness.sweep import compose_job

    for text in ("block:gamma=6", "mtad:gamma=6,W=2,tau=0.3", "specinfer:tree=2.2.2.2"):
        cfg = compose_job([*parse(text).overrides(), "model=tiny", "decoder.max_new_tokens=48"])
        got = DecoderConfig.from_any(OmegaConf.to_container(cfg, resolve=True)["decoder"])
        assert got == parse(text).decoder(48)
        assert got != parse("mtad:gamma=6,W=3").decoder(48)  # control


# ------------------------------------------------------------------------------------------- cost arithmetic
COSTS = {"target:seq:1": [[1, 10.0], [5, 16.0], [100, 60.0]], "draft:seq:1": [[1, 2.0], [100, 8.0]],
         "draft:seq:4": [[1, 3.0]], "target:tree:1": [[9, 18.0], [33, 30.0]]}
HARNESS = {"mtad": {"h0": 5.0, "h_step": 0.5, "h_row": 0.01}}
REC = {"id": "a", "prompt_tokens": 90, "n_tokens": 12, "steps": 4,
       "calls": {"target:seq:1x94": 1, "draft:seq:1x90": 1, "draft:seq:1x1": 4, "draft:seq:4x1": 12,
                 "target:seq:1x5": 3}}


def measured_profile(harness=HARNESS, costs_=COSTS) -> CostProfile:
    return CostProfile(label="test", hardware="test", pair="p", costs=costs_, harness=harness)


def test_cost_of_a_record_is_its_forwards_plus_its_harness_terms():
    prof = measured_profile()
    target_prefill = 16.0 + (60.0 - 16.0) * (94 - 5) / 95
    draft_prefill = 2.0 + 6.0 * 89 / 99
    forwards = target_prefill + draft_prefill + 4 * 2.0 + 12 * 3.0 + 3 * 16.0
    rows = 4 * 1 + 12 * 4 + 3 * 5  # non-prefill forwards: rows x new tokens
    assert features(REC) == (1.0, 4.0, float(rows))
    want = forwards + 5.0 + 0.5 * 4 + 0.01 * rows
    assert prof.cost(REC, "mtad") == pytest.approx(want)
    # controls: another harness, another beam-row cost
    assert measured_profile({"mtad": {"h0": 0.0, "h_step": 0.5, "h_row": 0.01}}).cost(REC, "mtad") != \
        pytest.approx(want)
    assert measured_profile(costs_={**COSTS, "draft:seq:4": [[1, 4.0]]}).cost(REC, "mtad") != pytest.approx(want)


def test_a_decoder_without_harness_terms_is_refused_in_one_line():
    with pytest.raises(ValueError, match="no harness terms for specinfer"):
        measured_profile().cost(REC, "specinfer")


def test_harness_fit_recovers_planted_terms_and_a_shuffle_does_not():
    rng = np.random.default_rng(0)
    obs, planted = [], (3.0, 0.8, 0.02)
    for _ in range(40):
        steps, rows = int(rng.integers(5, 40)), int(rng.integers(20, 400))
        rec = {"prompt_tokens": 50, "steps": steps, "calls": {f"draft:seq:1x{1}": rows}}
        h = planted[0] + planted[1] * steps + planted[2] * rows
        obs.append((rec, h * (1 + 0.01 * rng.standard_normal())))
    fit = fit_harness(obs)
    assert [fit["h0"], fit["h_step"], fit["h_row"]] == pytest.approx(planted, rel=0.15, abs=0.3)
    ys = [h for _, h in obs]
    rng.shuffle(ys)
    bad = fit_harness([(rec, y) for (rec, _), y in zip(obs, ys)])
    assert [bad["h0"], bad["h_step"], bad["h_row"]] != pytest.approx(planted, rel=0.15, abs=0.3)


def test_declared_terms_mean_what_the_docs_say():
    prof = declared.profile("llama8b_1b")
    t = {k: v["value"] for k, v in prof.terms.items()}
    s = prof.summary(gamma=4, W=4)
    assert s["c"] == pytest.approx(t["c"])
    assert s["cW_over_c"] == pytest.approx(1 + 3 * t["kappa"])
    assert s["v"] == pytest.approx(1 + 4 * t["nu"])
    assert declared_forward(prof.terms, "target", 1, 600, True) == pytest.approx(600 / t["rho"])
    assert declared_forward(prof.terms, "target", 1, 30, True) == 1.0  # a short prefill: one step
    # every term states its basis
    for key in declared.GPU:
        assert all(v["basis"] for v in declared.GPU[key]["terms"].values())
    # control: replacing c_W/c changes the beam step and only it
    wide = declared.profile("llama8b_1b", kappa=0.5).summary()
    assert wide["cW_over_c"] == pytest.approx(2.5) and wide["v"] == pytest.approx(s["v"])


def test_declared_profile_refuses_unknown_names():
    with pytest.raises(ValueError, match="no such declared profile"):
        declared.profile("h100")
    with pytest.raises(ValueError, match="no term"):
        declared.profile("llama8b_1b", gamma=3)


# ------------------------------------------------------------------------------------------- predictions
def records(n, tokens, steps, verify, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        s = int(steps + rng.integers(0, 3))
        out.append({"id": str(i), "prompt_tokens": 40, "n_tokens": tokens, "steps": s, "mean_logprob": -1.0,
                    "output_ids": list(range(tokens)), "calls": {"target:seq:1x44": 1, f"target:seq:1x{verify}": s,
                                                                  "draft:seq:1x1": 4 * s}})
    return out


def test_speedup_is_the_ratio_of_predicted_ms_per_token_with_an_interval_around_it():
    prof = measured_profile({"*": {"h0": 0.0, "h_step": 0.1, "h_row": 0.0}})
    fast, slow = records(12, 48, 12, 5), records(12, 48, 20, 5, seed=1)
    sp = fp.speedup(fast, "speculative", slow, "speculative", prof)
    want = fp.ms_per_token(slow, "speculative", prof)[0] / fp.ms_per_token(fast, "speculative", prof)[0]
    assert sp[0] == pytest.approx(want) and sp[1] <= sp[0] <= sp[2]
    assert sp[0] > 1.2  # fewer steps for the same tokens: faster
    assert fp.speedup(slow, "speculative", slow, "speculative", prof)[:1] == [pytest.approx(1.0)]  # control


def test_forecast_carries_quality_against_the_baseline():
    prof = measured_profile({"*": {"h0": 0.0, "h_step": 0.0, "h_row": 0.0}})
    a, b = records(8, 20, 8, 5), records(8, 20, 8, 5)
    for r in a:
        r["mean_logprob"] = -0.9
    f = fp.forecast(a, "x", prof, {"sampling": (b, "sampling")})
    assert f["quality_vs_sampling"]["ppl_change"][0] == pytest.approx(100 * (np.exp(0.9) / np.exp(1.0) - 1))
    assert f["quality_vs_sampling"]["distinct2_diff"][0] == pytest.approx(0.0)


# ------------------------------------------------------------------------------------------- the check
def _forecast_line(setting, ms, vs_s):
    return {"draft": "d", "pair": "p", "setting": setting, "role": "check", "calibrated": False,
            "forecast": {"ms_per_token": [ms, ms * 0.9, ms * 1.1], "speedup_vs_sampling": [vs_s, 0.9, 1.1],
                         "speedup_vs_speculative": None}}


def _recs(ms_per_token, n=10, jitter=0.0):
    rng = np.random.default_rng(3)
    return {(str(i), 0): {"cpu_s": 48 * ms_per_token * (1 + jitter * rng.standard_normal()) / 1e3, "n_tokens": 48,
                          "time_s": 1.0, "energy_j": None, "mean_logprob": -1.0, "score": None,
                          "target_forwards": 10, "accepted": 0, "proposed": 0, "bigrams": None} for i in range(n)}


def test_check_counts_forecasts_inside_the_measured_interval():
    recs = {("p", "sampling"): _recs(40.0, jitter=0.05), ("p", "mtad:gamma=6,W=2,tau=0.5"): _recs(30.0, jitter=0.05)}
    good = compare([_forecast_line("mtad:gamma=6,W=2,tau=0.5", 30.3, 1.33)], recs)
    assert good[0]["ms_per_token"]["contained"] and abs(good[0]["ms_per_token"]["error"]) < 0.05
    assert summary(good)["ms_per_token"]["contained"] == 1
    bad = compare([_forecast_line("mtad:gamma=6,W=2,tau=0.5", 45.0, 0.9)], recs)  # control: a wrong forecast
    assert not bad[0]["ms_per_token"]["contained"] and bad[0]["ms_per_token"]["error"] == pytest.approx(0.5, abs=0.05)
    assert not bad[0]["speedup_vs_sampling"]["contained"]
    assert summary(bad)["ms_per_token"]["largest_error"] > 0.4


# ------------------------------------------------------------------------------------------- replays and command
def test_replay_is_cached_and_read_back_without_decoding(tmp_path, monkeypatch):
    from mtad.study.forecast import replay
    from mtad.study.forecast.replay import Replayer, Workload

    w = Workload(pair=("model=tiny",), count=2, tokens=6)
    rep = Replayer(w, tmp_path)
    first = rep.records(parse("speculative:gamma=3"))
    assert len(first) == 2 and all(sum(int(k) * v for k, v in r["hist"].items()) <= r["n_tokens"] for r in first)

    def no_decoding(*a, **k):
        raise AssertionError("decoded again")

    monkeypatch.setattr(replay, "replay", no_decoding)
    assert Replayer(w, tmp_path).records(parse("speculative:gamma=3")) == first
    with pytest.raises(AssertionError, match="decoded again"):  # control: another setting is not in the cache
        Replayer(w, tmp_path).records(parse("speculative:gamma=2"))
    path = next(tmp_path.rglob("*.json"))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a replay file"):
        Replayer(w, tmp_path).records(parse("speculative:gamma=3"))


@pytest.mark.parametrize("argv, words", [
    (["predict", "model=tiny", "--decoder", "mtad:W=0", "--profile", "gpu:llama8b_1b"], "positive"),
    (["predict", "model=tiny", "--decoder", "mtad", "--profile", "gpu:h100"], "no such declared profile"),
    (["predict", "model=tiny", "--decoder", "mtad", "--profile", "/nonexistent.json"], "no such profile"),
    (["predict", "model=tiny", "--decoder", "mtad", "--profile", "gpu:llama8b_1b", "--prompts", "0"], "at least 1"),
    (["predict", "tiny", "--decoder", "mtad", "--profile", "gpu:llama8b_1b"], "model overrides"),
])
def test_command_refuses_bad_arguments_in_one_line(argv, words, capsys):
    from mtad.study.forecast.__main__ import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and words in err[-1] and not any("Traceback" in x for x in err)


def test_command_forecasts_on_the_tiny_pair(tmp_path, capsys):
    from mtad.study.forecast.__main__ import main

    prof = CostProfile(label="test profile", hardware="t", pair="tiny", costs={
        "target:seq:1": [[1, 1.0], [64, 3.0]], "draft:seq:1": [[1, 0.5], [64, 1.0]], "draft:seq:2": [[1, 0.6]],
        "draft:seq:4": [[1, 0.7]]}, harness={"*": {"h0": 0.0, "h_step": 0.1, "h_row": 0.0}})
    path = costs.write(prof, tmp_path / "p.json")
    code = main(["predict", "model=tiny", "--prompts", "5", "--tokens", "8", "--store", str(tmp_path / "s"),
                 "--decoder", "mtad:gamma=6,W=2", "--profile", str(path), "--json", str(tmp_path / "f.jsonl")])
    out = capsys.readouterr().out
    assert code == 0 and "mtad:gamma=6,W=2,tau=0.5" in out and "test profile" in out
    line = json.loads((tmp_path / "f.jsonl").read_text().splitlines()[0])
    assert line["forecast"]["ms_per_token"][0] > 0 and line["forecast"]["prompts"] == 5

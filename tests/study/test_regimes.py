"""Drafts made from the target (mtad.models.selfspec), the oracle mixture's α (mtad.study.alpha) and the regime
map (mtad.study.regimes) on a small synthetic ``results/regimes`` tree, each with a control that must fail."""
import json
import logging

import numpy as np
import pytest
import torch

from mtad.decoding import DecoderConfig, generate
from mtad.measure.simulate import CostProfile, predict
from mtad.models.pair import ModelPair
from mtad.models.selfspec import derived_draft, parse
from mtad.report.stats import ratio_interval
from mtad.study.alpha import mixture_alpha
from mtad.study.regimes import __main__ as regimes_main
from mtad.study.regimes.build import build, histograms, ratio_intervals, simulate
from mtad.study.regimes.inputs import TAUS, alphas, checks, profile
from mtad.study.regimes.tables import markdown
from tests.tinymodels import model


@pytest.fixture
def target():
    return model("llama", seed=3, layers=4).eval()


def logits(m, ids):
    with torch.no_grad():
        return m(input_ids=torch.tensor([ids])).logits[0]


def test_parse_specs():
    assert parse("target:int8").quantize == "int8"
    assert parse("target:int8body").quantize == "int8body"
    assert parse("target:layers=0-1,3").layers == (0, 1, 3)
    assert parse("target:first=2").layers == (0, 1)
    for bad in ("target:layers=3,1", "target:foo", "models/x", "target:layers=a"):
        with pytest.raises(ValueError):
            parse(bad)


def test_all_layers_kept_reproduces_the_target_and_skipping_does_not(target):
    ids = [1, 5, 7, 2, 9, 3]
    before = logits(target, ids)
    same = derived_draft("target:layers=0-3", target)
    assert torch.allclose(logits(same, ids), before, atol=1e-5)
    skipped = derived_draft("target:layers=0,1,3", target)  # control: one layer fewer must differ
    assert not torch.allclose(logits(skipped, ids), before, atol=1e-3)
    assert skipped.config.num_hidden_layers == 3 and target.config.num_hidden_layers == 4
    assert torch.equal(logits(target, ids), before)  # the target itself is untouched
    assert skipped.lm_head is target.lm_head  # head shared, not copied


def test_skip_draft_decodes_with_its_own_cache(target):
    """Greedy speculative decoding with a layer-skipping draft reproduces the target's greedy text (exactness at
    T = 0 holds for any draft; a draft whose cache indices were wrong would crash or diverge)."""
    draft = derived_draft("target:layers=0,2,3", target)
    pair = ModelPair(target=target, draft=draft, tokenizer=None, name="t", info={})
    greedy = DecoderConfig(name="greedy", max_new_tokens=20, temperature=0.0)
    spec = DecoderConfig(name="speculative", max_new_tokens=20, temperature=0.0, gamma=3)
    g = torch.Generator()
    assert generate(pair, [1, 2, 3], spec, g).tokens == generate(pair, [1, 2, 3], greedy, g).tokens


def test_int8_copy_is_close_but_not_equal(target):
    ids = [1, 5, 7, 2]
    q = derived_draft("target:int8", target)
    a, b = torch.softmax(logits(q, ids), -1), torch.softmax(logits(target, ids), -1)
    tv = 0.5 * (a - b).abs().sum(-1).max()
    assert 0 < tv < 0.5


def test_int8body_keeps_the_head_in_float():
    """``target:int8body`` quantises the body only: its output head is a float Linear, while ``target:int8``'s
    is an int8 one (control), and the two drafts' logits differ."""
    from mtad.models.tiny import tiny_pair

    target = tiny_pair("llama", seed=0).target
    body, full = derived_draft("target:int8body", target), derived_draft("target:int8", target)
    assert type(body.lm_head) is torch.nn.Linear
    assert type(full.lm_head) is not torch.nn.Linear  # control: the full copy quantises its head
    assert not torch.equal(logits(body, [1, 5, 7, 2]), logits(full, [1, 5, 7, 2]))


def test_mixture_alpha_is_exact():
    """Σ min(p, λq + (1−λ)p) = 1 − λ + λ Σ min(p, q) for random p, q; mixing the other way round (the control,
    λp + (1−λ)q) gives a different α."""
    g = torch.Generator().manual_seed(0)
    p, q = torch.rand(50, 30, generator=g).softmax(-1), torch.rand(50, 30, generator=g).mul(4).softmax(-1)
    alpha = torch.minimum(p, q).sum(-1).mean().item()
    for lam in (0.0, 0.25, 0.5, 1.0):
        mix = torch.minimum(p, lam * q + (1 - lam) * p).sum(-1).mean().item()
        assert mixture_alpha([alpha], lam)[0] == pytest.approx(mix, abs=1e-6)
    wrong = torch.minimum(p, 0.25 * p + 0.75 * q).sum(-1).mean().item()
    assert mixture_alpha([alpha], 0.25)[0] != pytest.approx(wrong, abs=1e-3)
    with pytest.raises(ValueError):
        mixture_alpha([alpha], 1.5)


def test_weight_only_quantisation_levels_and_distance(target):
    """w<bits>g<group>: each (row, group) holds at most 2^bits distinct values; 8 bits per channel stays much
    closer to the target than 2 bits (the control: coarser rounding must move the logits more)."""
    from mtad.models.selfspec import fake_quantize_

    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    fake_quantize_(w, 3, 16)
    assert all(w[r, g * 16:(g + 1) * 16].unique().numel() <= 8 for r in range(4) for g in range(4))
    ids = [1, 5, 7, 2, 9]
    ref = torch.softmax(logits(target, ids), -1)

    def tv(spec):
        return 0.5 * (torch.softmax(logits(derived_draft(spec, target), ids), -1) - ref).abs().sum(-1).mean()
    assert tv("target:w8g0") < 0.05 < tv("target:w2g16")
    assert torch.equal(torch.softmax(logits(target, ids), -1), ref)  # the target is untouched


def test_ratio_intervals_pair_by_cluster():
    """Σ L_a / Σ L_b over contexts, interval over (task, prompt) clusters: a rule against itself is exactly 1
    with a zero-width interval; one that accepts one more token per context is above 1 with an interval that
    excludes 1 (control: the interval is not degenerate there)."""
    rng = np.random.default_rng(0)
    tau = rng.integers(0, 4, size=200)
    rec = {"rules": ["lossless", "same", "more"], "task": ["a"] * 100 + ["b"] * 100,
           "prompt": [i // 10 for i in range(100)] * 2, "tau": [[t, t, t + 1] for t in tau.tolist()]}
    assert ratio_intervals(rec, "same", "lossless") == [1.0, 1.0, 1.0]
    pt, lo, hi = ratio_intervals(rec, "more", "lossless")
    assert pt == pytest.approx((tau + 2).sum() / (tau + 1).sum()) and 1 < lo < pt < hi
    assert sum(histograms(rec)["lossless"].values()) == 200


# ---- a synthetic results/regimes tree --------------------------------------------------------------------------
RULES = ["lossless", "block", *(f"mtad (τ={t})" for t in TAUS)]
DECODERS = ("sampling", "speculative", "block", "mtad")


def _profile(t1, c, c_W, v):
    return {"label": "calibration", "t1": t1, "c": c, "c_W": c_W, "v": v, "prefill": 0.0, "kind": "measured",
            "unit": "ms", "overhead": {d: 0.05 for d in DECODERS}, "per_prompt": {d: 1.0 for d in DECODERS}}


def _check(name, t1, c, errors):
    """A check file in the regime check's format: calibrations before, after and pooled; every point measured
    at ``ms`` and predicted at ``ms · (1 + error)``."""
    ms = {"sampling": 50.0, "speculative": 30.0, "block": 31.0, "mtad": 29.0}
    points = []
    for d in DECODERS:
        pred = ms[d] * (1 + errors[d])
        points.append({
            "draft": name, "decoder": d, "measured_ms_per_token": [ms[d], 0.9 * ms[d], 1.1 * ms[d]],
            "measured_wall_ms_per_token": [1.02 * ms[d], 0.96 * ms[d], 1.08 * ms[d]],
            "predicted_ms_per_token": pred, "error": pred / ms[d] - 1, "predicted_before_after": [pred - 1, pred + 1],
            "predicted_from_calls": 1.01 * ms[d], "error_from_calls": 0.01,
            "block_efficiency": 1.0 if d == "sampling" else 2.5, "acceptance_rate": None if d == "sampling" else 0.6,
            "histogram": {"1": 48} if d == "sampling" else {"1": 4, "2": 4, "3": 4, "4": 2, "5": 2},
            "n_prompts": 3, "tokens": 48,
        })
    for p in points:
        for ref in ("sampling", "speculative"):
            if p["decoder"] != ref:
                m, pr = ms[ref] / ms[p["decoder"]], (ms[ref] * (1 + errors[ref])) / p["predicted_ms_per_token"]
                p[f"speedup_vs_{ref}"] = {"measured": [m, 0.9 * m, 1.1 * m], "measured_wall": [m, None, None],
                                          "predicted": pr, "error": pr / m - 1}
    cal = {"before": _profile(1.1 * t1, c, c, 1.1), "after": _profile(0.9 * t1, c, c, 1.1),
           "pooled": _profile(t1, c, 1.2 * c, 1.1)}
    return {"draft": name, "points": points, "clock": "cpu",
            "calibration": {k: {"unit_cpu_ms": {}, "calls": {}, "prompts": 4, "profile": v} for k, v in cal.items()}}


@pytest.fixture
def tree(tmp_path):
    """drafts.tsv (two real drafts, one oracle), alpha.jsonl (stored α deliberately wrong: the map recomputes
    it), study contexts, a new-format check for each real draft (token's mtad point predicted 30 % off) and an
    old-format check that must be skipped."""
    (tmp_path / "drafts.tsv").write_text("# name\tmodel\textra\nrun5\tm\ntoken\tm\tmodel.draft=x\n"
                                         "oracle50\tm\t--oracle-mix 0.5\n")
    rng = np.random.default_rng(1)
    rows = []
    for name, a in (("run5", 0.6), ("token", 0.4)):
        pp = [[float(a * 64 + rng.normal(0, 3)), 64, "gsm8k" if i < 5 else "humaneval"] for i in range(10)]
        rows.append({"name": name, "alpha": [0.01, 0.0, 0.02], "per_prompt": pp})
        tau = rng.integers(0, 5, size=(60, 1)) + np.zeros((1, len(RULES)), dtype=int)
        tau[:, 2:] = np.minimum(tau[:, 2:] + rng.integers(0, 2, size=(60, len(RULES) - 2)), 4)
        rec = {"rules": RULES, "task": ["gsm8k"] * 30 + ["mtbench"] * 30, "prompt": [i // 6 for i in range(60)],
               "tau": tau.tolist()}
        (tmp_path / "study").mkdir(exist_ok=True)
        (tmp_path / "study" / f"{name}.contexts.json").write_text(json.dumps(rec))
    (tmp_path / "study" / "oracle50.contexts.json").write_text((tmp_path / "study" / "run5.contexts.json").read_text())
    (tmp_path / "alpha.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "check").mkdir()
    ok = dict.fromkeys(DECODERS, 0.02)
    for name, t1, c, err in (("run5", 50.0, 0.09, ok), ("token", 45.0, 0.3, {**ok, "mtad": 0.30})):
        (tmp_path / "check" / f"check-{name}.json").write_text(json.dumps(_check(name, t1, c, err)))
    (tmp_path / "check" / "check-int8.json").write_text(json.dumps({"draft": "int8", "points": [], "profiles": {}}))
    return tmp_path


def test_alpha_is_recomputed_from_the_per_prompt_counts(tree):
    """α is the one bootstrap's ratio of sums over alpha.jsonl's per-prompt counts, not the stored field (the
    control: the stored [0.01, 0, 0.02] is far from it); the oracle takes 1 − λ + λ·α of the feature draft."""
    al = alphas(tree)
    row = json.loads((tree / "alpha.jsonl").read_text().splitlines()[0])
    num, den = [a for a, _, _ in row["per_prompt"]], [n for _, n, _ in row["per_prompt"]]
    assert al["run5"] == ratio_interval(num, den)
    assert al["run5"][1] < al["run5"][0] < al["run5"][2] and al["run5"][0] != pytest.approx(row["alpha"][0], abs=0.1)
    assert al["oracle50"] == pytest.approx(mixture_alpha(al["run5"], 0.5))


def test_check_profile_and_old_format(tree, caplog):
    """The pooled calibration becomes the simulator's CostProfile, per-prompt costs included (the control: a
    prediction with prompts moves by exactly their per-prompt term); an old-format check is skipped with a
    warning."""
    with caplog.at_level(logging.WARNING):
        chk = checks(tree)
    assert set(chk) == {"run5", "token"} and "check-int8.json" in caplog.text
    prof = profile(chk["run5"])
    assert isinstance(prof, CostProfile) and prof.t1 == 50.0 and prof.c_W == pytest.approx(1.2 * 0.09)
    assert profile(chk["run5"], "before").t1 == pytest.approx(55.0)
    h = {1: 3, 2: 3, 5: 2}
    base = predict(h, "mtad", prof, 4)
    assert predict(h, "mtad", prof, 4, prompts=2) == pytest.approx(base + prof.t1 * 2 * 1.0 / 19)


def test_map_tables_from_the_new_check_format(tree):
    """Every (draft, decoder) point is listed with its CPU and wall intervals and before–after bracket; the ±10 %
    sentence counts the deliberately wrong point (token's mtad, +30 %) outside; the CPU own-cost column uses
    each checked draft's pooled profile and the feature-draft column run5's (controls: token's own cost differs
    from run5's, and its before profile would give another number)."""
    res = build(tree)
    md = markdown(res)
    for name in ("run5", "token"):
        for d in DECODERS:
            assert f"| {name} | {d} | " in md
    assert "| token | mtad | 29.0 [26.1, 31.9] | 29.6 [27.8, 31.3] | 37.7 (36.7–38.7) | +30.0 % |" in md
    assert "7 of 8 points are predicted within ±10 %" in md and "8 of 8 from their forward counts" in md
    assert "| run5 | pooled | 50.0 | 0.090 | 0.108 | 1.100 | 0.050 / 0.050 / 0.050 / 0.050 |" in md
    rows = {r["name"]: r for r in res["drafts"]}
    chk = checks(tree)
    own = simulate(rows["token"]["hist"], profile(chk["token"]))["mtad_vs_spec"]["0.5"]
    feat = simulate(rows["token"]["hist"], profile(chk["run5"]))["mtad_vs_spec"]["0.5"]
    before = simulate(rows["token"]["hist"], profile(chk["token"], "before"))["mtad_vs_spec"]["0.5"]
    assert rows["token"]["simulated"]["cpu_own"]["mtad_vs_spec"]["0.5"] == own
    assert rows["token"]["simulated"]["cpu_feature_cost"]["mtad_vs_spec"]["0.5"] == feat
    assert own != pytest.approx(feat) and own != pytest.approx(before)
    assert "cpu_own" not in rows["oracle50"]["simulated"]
    assert f"| token | {rows['token']['alpha'][0]:.2f} | {own:.3f} | {feat:.3f} |" in md
    assert {m["name"] for m in res["measured"]} == {"run5", "token"}


def test_cli_writes_the_three_outputs(tree):
    assert regimes_main.main(["--root", str(tree)]) == 0
    assert json.loads((tree / "regimes.json").read_text())["checks"]["token"]["points"][3]["decoder"] == "mtad"
    assert (tree / "regimes.md").read_text().startswith("# Regime map")
    assert (tree / "regimes.png").stat().st_size > 0


DIGITS = 12  # significant digits a re-rendered JSON float must match (the tables print 2 to 3)


def printed(x, digits: int = DIGITS):
    """``x`` with every float at ``digits`` significant digits (ints, strings, nulls as they are)."""
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    if isinstance(x, dict):
        return {k: printed(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [printed(v, digits) for v in x]
    return x


def assert_same_numbers(got, want) -> None:
    """The JSON files ``got`` and ``want`` hold the same keys, strings and ints, and floats equal at
    :data:`DIGITS` significant digits."""
    a, b = (json.loads(p.read_text()) for p in (got, want))
    assert printed(a) == printed(b), f"{got} differs from {want} beyond {DIGITS} significant digits"


def test_re_rendered_json_is_compared_at_printed_precision_not_float_bytes(tmp_path):
    """Sums in another order (the last bits) compare equal; a change at the 9th digit, a key or a string
    does not (the controls)."""
    want = {"ppl": [2.9010919068389756, None], "n": 20, "tasks": ["gsm8k"]}
    (tmp_path / "want.json").write_text(json.dumps(want))
    for changed, same in ((dict(want, ppl=[2.901091906838975, None]), True),
                          (dict(want, ppl=[2.901091916838975, None]), False),
                          (dict(want, n=21), False), (dict(want, tasks=["mt_bench"]), False),
                          (dict(want, extra=1.0), False)):
        (tmp_path / "got.json").write_text(json.dumps(changed))
        if same:
            assert_same_numbers(tmp_path / "got.json", tmp_path / "want.json")
        else:
            with pytest.raises(AssertionError, match="significant digits"):
                assert_same_numbers(tmp_path / "got.json", tmp_path / "want.json")


def test_the_committed_regime_map_and_temperature_control_re_render(tmp_path):
    """``regimes.md``/``regimes.json`` from the committed records (α per prompt, per-context study records, the
    checks with their published runs, the TV runs, the decoders' comparisons) and ``temperature.md`` and
    ``decoders.md``/``decoders.json`` from their published rows are what is committed: the Markdown byte for
    byte, the JSON number for number at :data:`DIGITS` significant digits (its floats are sums whose last bits
    follow the CPU's summation order: AVX2 and AVX-512 builds differ there).
    Control: a changed record changes the map."""
    import shutil
    import subprocess
    import sys

    from mtad._util.paths import REPO_ROOT

    src = REPO_ROOT / "results" / "regimes"
    root = tmp_path / "regimes"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("*.png", "temperature", "decoders.md"))
    assert regimes_main.main(["--root", str(root)]) == 0
    assert (root / "regimes.md").read_bytes() == (src / "regimes.md").read_bytes()
    assert_same_numbers(root / "regimes.json", src / "regimes.json")
    out = tmp_path / "temperature"
    subprocess.run([sys.executable, str(REPO_ROOT / "experiments" / "regime_temperature.py"), "--from",
                    str(REPO_ROOT / "results" / "published" / "regime_temperature-2026-12-06.jsonl"),
                    "--out", str(out)], check=True, capture_output=True)
    assert (out / "temperature.md").read_bytes() == (src / "temperature" / "temperature.md").read_bytes()
    out = tmp_path / "decoders"
    subprocess.run([sys.executable, str(REPO_ROOT / "experiments" / "regime_decoders.py"), "--from",
                    str(REPO_ROOT / "results" / "published" / "regime_decoders-2026-12-06.jsonl"),
                    "--out", str(out)], check=True, capture_output=True)
    assert (out / "decoders.md").read_bytes() == (src / "decoders" / "decoders.md").read_bytes()
    assert_same_numbers(out / "decoders.json", src / "decoders" / "decoders.json")
    rows = [json.loads(x) for x in (root / "alpha.jsonl").read_text().splitlines()]
    rows[0]["per_prompt"][0][0] += 5.0  # control: one prompt's accepted count changes the map
    (root / "alpha.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert regimes_main.main(["--root", str(root)]) == 0
    assert (root / "regimes.md").read_bytes() != (src / "regimes.md").read_bytes()

"""Drafts made from the target (mtad.models.selfspec) and the oracle mixture's α (mtad.study.alpha), each
with a control that must fail."""
import numpy as np
import pytest
import torch

from mtad.decoding import DecoderConfig, generate
from mtad.models.pair import ModelPair
from mtad.models.selfspec import derived_draft, parse
from mtad.study.alpha import mixture_alpha
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
    from mtad.study.regimes import histograms, ratio_intervals

    rng = np.random.default_rng(0)
    tau = rng.integers(0, 4, size=200)
    rec = {"rules": ["lossless", "same", "more"], "task": ["a"] * 100 + ["b"] * 100,
           "prompt": [i // 10 for i in range(100)] * 2, "tau": [[t, t, t + 1] for t in tau.tolist()]}
    assert ratio_intervals(rec, "same", "lossless") == [1.0, 1.0, 1.0]
    pt, lo, hi = ratio_intervals(rec, "more", "lossless")
    assert pt == pytest.approx((tau + 2).sum() / (tau + 1).sum()) and 1 < lo < pt < hi
    assert sum(histograms(rec)["lossless"].values()) == 200

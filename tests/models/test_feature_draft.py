"""Feature drafts (mtad.models.feature_draft): the draft reads the target's final hidden states through its Session.

Plumbing (each parent feature is the target's where the target computed the committed text, else the
draft's own output; provisional draft entries are recomputed), exactness of every drafted decoder at T=0,
losslessness of speculative sampling with a feature draft (chi-square with a broken control), and refusals.
"""
from __future__ import annotations

import functools

import pytest
import tinymodels as tm
import torch
from decoding.test_decoders import DRAFTED, N_DRAWS, N_NEW, PROMPT, SETTINGS, broken_speculative, chi_square, ids

import mtad
import mtad.decoding.rules as rules_mod
from mtad.decoding.kv import Session, Stats
from mtad.models.feature_draft import FeatureDraft, feature_config
from mtad.models.pair import ModelPair

torch.set_num_threads(1)


def feature_draft(target, seed: int = 3, layers: int = 1, std: float = 0.5, head_scale: float = 1.0) -> FeatureDraft:
    """A random feature draft for ``target``; ``head_scale`` sharpens its q (a draft far from the target)."""
    cfg = feature_config(target.config, layers)
    cfg.initializer_range = std
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        d = FeatureDraft(cfg)
        d.lm_head.weight.mul_(head_scale)
    return d.eval()


@functools.cache
def target(arch: str):
    return tm.model(arch, 1, 32, hidden=16)


@functools.cache
def fpair(arch: str) -> ModelPair:
    return ModelPair(target(arch), feature_draft(target(arch)))


class Recorder:
    """Wraps a FeatureDraft's forward to record the ``features`` of every call."""

    def __init__(self, draft: FeatureDraft):
        self.calls: list[torch.Tensor] = []
        self.forward = draft.forward

    def __call__(self, *args, **kw):
        self.calls.append(kw["features"].clone())
        return self.forward(*args, **kw)


def hidden(m, ids: list[int]) -> torch.Tensor:
    """Cache-free final hidden state of ``m`` at every position: (T, D)."""
    with torch.no_grad():
        return m(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


# ---- plumbing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_parent_features_are_the_targets_then_the_drafts_own(arch, monkeypatch):
    t = target(arch)
    d = feature_draft(t)
    rec = Recorder(d)
    monkeypatch.setattr(d, "forward", rec)
    stats = Stats()
    ts, ds = Session(t, [stats], "target"), Session(d, [stats], "draft")
    ds.link(ts)
    prompt = [5, 7, 11, 3, 9, 2]
    with torch.inference_mode():
        ds.forward([prompt])
        # the prompt minus its last token went to the target first; its features are the cache-free ones
        assert ts.ids[0] == prompt[:-1] and stats.target_forwards == 1
        H = hidden(t, prompt)  # (6, D)
        f = rec.calls[-1][0]  # (6, D)
        assert torch.equal(f[0], torch.zeros_like(f[0]))
        torch.testing.assert_close(f[1:], H[:-1], atol=1e-5, rtol=1e-5)
        # a drafted token's parent is the last prompt token, which the target has not seen: the draft's own h
        own = ds.feats[0, -1].clone()
        ds.forward([[4]])
        torch.testing.assert_close(rec.calls[-1][0, 0], own)
        with torch.no_grad():
            ref_h = d.hidden(torch.tensor([prompt]), torch.cat([torch.zeros(1, 1, H.shape[1]), H[None, :-1]], 1))
        torch.testing.assert_close(own, ref_h[0, -1], atol=1e-5, rtol=1e-5)
        # verify [last prompt token, 4, 8]; commit 4 and a new token 6: the draft drops its provisional entry
        # for 4 and recomputes it from the target's features
        ts.forward([[prompt[-1], 4, 8]], keep=3)
        committed = prompt + [4, 6]
        ds.sync([committed])
        assert ds.ids[0] == prompt
        pending = committed[len(ds.ids[0]):]
        ds.forward([pending])
        H2 = hidden(t, prompt + [4])
        torch.testing.assert_close(rec.calls[-1][0], H2[-2:], atol=1e-5, rtol=1e-5)


def test_beam_rows_carry_their_own_features(monkeypatch):
    t = target("llama")
    d = feature_draft(t)
    rec = Recorder(d)
    monkeypatch.setattr(d, "forward", rec)
    stats = Stats()
    ts, ds = Session(t, [stats], "target"), Session(d, [stats], "draft")
    ds.link(ts)
    with torch.inference_mode():
        ds.forward([[5, 7, 11]])
        ds.expand(3)
        ds.forward_beams(torch.tensor([1, 2, 3]))
        after = ds.feats[:, -1].clone()  # (3, D): each beam's own output
        assert not torch.allclose(after[0], after[1])
        ds.select(torch.tensor([2, 0, 2]))
        ds.forward_beams(torch.tensor([4, 4, 4]))
        torch.testing.assert_close(rec.calls[-1][:, 0], after[[2, 0, 2]])


def test_features_change_the_draft():
    """Negative control for the plumbing tests: the same draft with zero features gives other logits."""
    t = target("llama")
    d = feature_draft(t)
    x = torch.tensor([[5, 7, 11, 3]])
    H = hidden(t, x[0].tolist())[None]
    with torch.no_grad():
        a = d(input_ids=x, features=H).logits
        b = d(input_ids=x, features=torch.zeros_like(H)).logits
    assert (a - b).abs().max() > 1e-2


# ---- decoders ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "opt"])
@pytest.mark.parametrize("dec", DRAFTED, ids=ids)
def test_t0_equals_greedy_oracle_with_a_feature_draft(arch, dec):
    r = mtad.generate(fpair(arch), PROMPT, dict(name=dec[0], **dec[1], temperature=0, max_new_tokens=N_NEW,
                                                gamma=3, beam_width=3), torch.Generator().manual_seed(0))
    assert r.tokens == tm.oracle_greedy(target(arch), PROMPT, N_NEW)
    assert r.draft_forwards > 0


@functools.cache
def dist_feature_pair(setting: str) -> ModelPair:
    V, ts, _, _ = SETTINGS[setting]
    t = tm.model("llama", 1, V, hidden=16, layers=1, std=ts)
    return ModelPair(t, feature_draft(t, seed=2, std=1.0, head_scale=3.0))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculative_stays_lossless_with_a_feature_draft(setting, monkeypatch):
    """As tests/decoding/test_decoders.py::test_lossless_joint_of_two_tokens, with a feature draft: the first two tokens
    of 500 decodes follow the exact filtered target joint; the broken rule must fail the same bound.
    Measured (statistic ok / broken, bound): full 2.4 / 76.1 (27.9); top-k/top-p 9.9 / 91.0 (20.5)."""
    cfg = dict(name="speculative", **SETTINGS[setting][3])
    models = dist_feature_pair(setting)
    ok, bound = chi_square(models, cfg, N_DRAWS)
    assert ok < bound, f"chi2 {ok:.1f} >= {bound:.1f}"
    monkeypatch.setattr(rules_mod, "speculative_accept", broken_speculative)
    bad, _ = chi_square(models, cfg, N_DRAWS)
    assert bad > bound, f"the broken rule passed: chi2 {bad:.1f} <= {bound:.1f}"


def test_generate_and_a_plain_call_are_refused():
    d = fpair("llama").draft
    with pytest.raises(ValueError, match="feature draft"):
        d(input_ids=torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="assisted generation"):
        d.generate(torch.tensor([[1, 2]]))


def test_a_feature_draft_can_be_timed_alone(monkeypatch):
    """The cost model and the benchmark time a draft without its target: a ZeroSource stands in for it."""
    import mtad.measure.costmodel as cm
    from mtad.models.feature_draft import timing_session

    d = fpair("llama").draft
    s = timing_session(d, Stats(), "draft")
    with torch.inference_mode():
        s.forward([[1, 2, 3, 4]])
        s.forward([[5]])
        s.sync([[1, 2, 3, 4, 0]])
        assert s.ids[0] == [1, 2, 3, 4]
        s.expand(2)
        assert s.forward_beams(torch.tensor([1, 2])).shape == (2, 32)
    monkeypatch.setattr(cm, "MIN_SECONDS", 0.0)
    curves = cm.measure_model(d, "draft", gamma=2, W=2, context=8, reps=1, vocab=32, max_positions=512)
    assert curves and all(points for points in curves.values())

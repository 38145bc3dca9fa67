"""Which models a tree decoder can run on, and how each takes a 4D attention mask: the architectures whose
attention honours a float 4D mask (one per layer type) with explicit positions, and each model's sliding windows
per layer type. :mod:`mtad.decoding.kv` builds the masks; this module only answers what a model accepts."""
from __future__ import annotations

# Architectures whose attention honours a float 4D mask (one per layer type) + position_ids:
# tests/decoding/test_kv_tree.py (llama, opt) and tests/decoding/test_sliding_window.py (mistral, gemma3_text,
# qwen2, qwen3 with sliding windows).
TREE_ARCHITECTURES = {"llama", "opt", "mistral", "gemma3_text", "qwen2", "qwen3"}
MASK_LAYER_TYPES = ("full_attention", "sliding_attention")  # layer types a tree mask is built for


def check_tree_support(model, role: str) -> None:
    """Tree decoders need a 4D float mask; refuse architectures/attention kernels that cannot take one."""
    arch = getattr(model.config, "model_type", "?")
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if arch not in TREE_ARCHITECTURES or impl not in ("sdpa", "eager"):
        raise ValueError(
            f"tree attention is not supported for the {role} model (architecture '{arch}', attention '{impl}'): "
            f"tree decoders need a 4D attention mask, tested for {sorted(TREE_ARCHITECTURES)} with sdpa/eager; "
            "use decoder=mtad or speculative, or load the model with attn_implementation=sdpa")
    other = sorted(set(getattr(_text_config(model.config), "layer_types", None) or ()) - set(MASK_LAYER_TYPES))
    if other:
        raise ValueError(f"tree attention is not supported for the {role} model (architecture '{arch}'): its layer "
                         f"types {other} need masks mtad does not build (only {list(MASK_LAYER_TYPES)}); "
                         "use decoder=mtad or speculative")


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def mask_windows(config) -> dict[str | None, int | None]:
    """How the model takes a 4D mask: ``{layer type: sliding window or None}`` for models that take one mask
    per layer type (``config.layer_types`` with a sliding type: Gemma 3, Qwen2/3, whose ``forward`` uses an
    ``attention_mask`` dict as its layer type -> mask mapping), else ``{None: window}`` for one tensor that
    every layer gets as is (Llama, OPT: no window; Mistral: every layer slides)."""
    c = _text_config(config)
    window, types = getattr(c, "sliding_window", None), getattr(c, "layer_types", None)
    if not types:
        return {None: window}
    if "sliding_attention" not in types:
        return {None: None}
    return {t: window if t == "sliding_attention" else None for t in dict.fromkeys(types)}

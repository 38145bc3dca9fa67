"""Tiny random models and a byte-level tokenizer, built in-process (no files, no hub).

They make every text task run end to end on CPU in well under a second (``model=tiny``) and are the
fixtures of the test suite. Randomness is local: ``torch.random.fork_rng`` keeps the global RNG untouched.
"""
from __future__ import annotations

from mtad.models.pair import ModelPair

BYTE_TOKENS = 256
SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>")
BOS_ID, EOS_ID, PAD_ID, IM_START_ID = range(BYTE_TOKENS, BYTE_TOKENS + len(SPECIALS))
VOCAB_SIZE = BYTE_TOKENS + len(SPECIALS)  # 260
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|eos|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ARCHS = ("llama", "opt")


def tiny_tokenizer():
    """A byte-level ``PreTrainedTokenizerFast``: ids 0-255 are bytes, then bos, eos, pad, im_start."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # 256 printable stand-ins for the bytes
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=_byte_of))}
    vocab.update({tok: BYTE_TOKENS + i for i, tok in enumerate(SPECIALS)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIALS))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=SPECIALS[0], eos_token=SPECIALS[1],
                                  pad_token=SPECIALS[2], additional_special_tokens=[SPECIALS[3]])
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 4096
    return tok


def _byte_of(ch: str) -> int:
    """Inverse of GPT-2's bytes-to-unicode map, so that token id == byte value."""
    code = ord(ch)
    if 33 <= code <= 126 or 161 <= code <= 172 or 174 <= code <= 255:
        return code
    # The remaining 68 bytes were shifted to 256 + n in byte order.
    missing = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return missing[code - 256]


def tiny_model(arch: str = "llama", vocab_size: int = VOCAB_SIZE, hidden: int = 64, layers: int = 2,
               heads: int = 4, seed: int = 0, attn_implementation: str = "sdpa",
               max_positions: int = 1024, init_std: float = 0.1):
    """A random decoder-only ``PreTrainedModel`` in eval mode, float32, with ids matching ``tiny_tokenizer``.

    ``init_std`` is larger than the usual 0.02 so that next-token distributions are peaked enough for
    greedy paths to be free of near-ties.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if arch not in ARCHS:
        raise ValueError(f"tiny arch={arch!r} is unknown: allowed {ARCHS}")
    if attn_implementation not in ("sdpa", "eager"):
        raise ValueError(f"attn_implementation={attn_implementation!r}: allowed 'sdpa' or 'eager'")
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    config = _config(arch, vocab_size, hidden, layers, heads, max_positions, init_std)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 attn_implementation=attn_implementation)
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    return model.eval()


def _config(arch, vocab_size, hidden, layers, heads, max_positions, init_std):
    from transformers import LlamaConfig, OPTConfig

    ids = dict(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    if arch == "llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=max(heads // 2, 1), max_position_embeddings=max_positions,
                           initializer_range=init_std, tie_word_embeddings=False, **ids)
    return OPTConfig(vocab_size=vocab_size, hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, max_position_embeddings=max_positions,
                     word_embed_proj_dim=hidden, init_std=init_std, dropout=0.0, attention_dropout=0.0,
                     **ids)


def tiny_pair(arch: str = "llama", seed: int = 0, attn_implementation: str = "sdpa", hidden: int = 64,
              layers: int = 2, draft_hidden: int = 32, draft_layers: int = 1) -> ModelPair:
    """Target and a smaller, differently seeded random draft sharing ``tiny_tokenizer``'s vocabulary."""
    target = tiny_model(arch, hidden=hidden, layers=layers, heads=4, seed=seed,
                        attn_implementation=attn_implementation)
    draft = tiny_model(arch, hidden=draft_hidden, layers=draft_layers, heads=2, seed=seed + 1000,
                       attn_implementation=attn_implementation)
    info = {"kind": "tiny", "arch": arch, "seed": seed, "dtype": "float32", "device": "cpu",
            "target_params": _count(target), "draft_params": _count(draft),
            "target": f"tiny-{arch}-h{hidden}-l{layers}", "draft": f"tiny-{arch}-h{draft_hidden}-l{draft_layers}"}
    return ModelPair(target=target, draft=draft, tokenizer=tiny_tokenizer(), name=f"tiny_{arch}", info=info)


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())

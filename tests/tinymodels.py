"""Small-vocabulary random models for the decoding tests (built in-process, no files, no hub).

A large init std makes the next-token distributions peaky and the two models clearly different, so the
statistical tests have power (their negative controls must fail).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: tests never touch the hub

import torch
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

from mtad.models.pair import ModelPair

SLIDING = ("mistral", "gemma3", "qwen2", "qwen3")  # architectures with a sliding window (``window``)


def sliding_model(arch: str, vocab: int, hidden: int, layers: int, std: float, window: int):
    """Mistral (every layer slides) or Gemma 3 / Qwen2 / Qwen3 (text-only; layer 0 slides, the rest are full)."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=std,
                  bos_token_id=0, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                  sliding_window=window)
    hybrid = ["sliding_attention"] + ["full_attention"] * (layers - 1)
    if arch == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**common))
    if arch == "gemma3":
        cfg = tf.Gemma3TextConfig(**common, head_dim=hidden // 4, query_pre_attn_scalar=hidden // 4, layer_types=hybrid)
        return tf.Gemma3ForCausalLM(cfg)
    cls, cfg = {"qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config), "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config)}[arch]
    return cls(cfg(**common, use_sliding_window=True, layer_types=hybrid, head_dim=hidden // 4))


def model(arch: str, seed: int, vocab: int = 32, hidden: int = 32, layers: int = 2, std: float = 0.5,
          attn: str = "sdpa", window: int = 8):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if arch in SLIDING:
            m = sliding_model(arch, vocab, hidden, layers, std, window)
        elif arch == "llama":
            cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=512, initializer_range=std, bos_token_id=0,
                              eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
            m = LlamaForCausalLM(cfg)
        else:
            cfg = OPTConfig(vocab_size=vocab, hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=hidden,
                            init_std=std, bos_token_id=0, eos_token_id=None, pad_token_id=1)
            m = OPTForCausalLM(cfg)
    m.config._attn_implementation = attn
    m.generation_config.eos_token_id = None
    return m.eval()


def pair(arch: str = "llama", vocab: int = 32, same: bool = False, **kw) -> ModelPair:
    t = model(arch, 1, vocab, **kw)
    return ModelPair(t, t if same else model(arch, 2, vocab, **kw))


def oracle_greedy(m, prompt: list[int], n: int) -> list[int]:
    """Cache-free greedy: the full sequence is re-run for every token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(m(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


class Tree:
    """Nodes appended to a session: token, parent (cache index) and root-to-node token path."""

    def __init__(self, session, linear: list[int]):
        self.s, self.paths = session, {}  # cache index -> tokens after the linear part
        self.P = len(linear)

    def add(self, tokens: list[int], parents: list[int]) -> dict[int, torch.Tensor]:
        start = self.s.size(0)  # a session of one row
        for i, (t, par) in enumerate(zip(tokens, parents)):
            self.paths[start + i] = (self.paths[par] if par >= self.P else []) + [t]
        logits = self.s.forward_tree([tokens], [parents])[0]  # (S, V)
        return {start + i: logits[i] for i in range(len(tokens))}


def logits_alone(m, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].float()  # (T, V)


def near(m, seed: int, eps: float = 0.05):
    """A copy of ``m`` with Gaussian noise (std ``eps``) on every weight: a draft that agrees with the
    target often but not always, so T=0 decodes exercise both acceptance and rejection."""
    import copy

    d = copy.deepcopy(m)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for w in d.parameters():
            w.add_(eps * torch.randn_like(w))
    return d


def batch_logits(m, seqs: list[list[int]]) -> torch.Tensor:
    """Cache-free logits of equal-length sequences in one batch: (B, T, V)."""
    with torch.no_grad():
        return m(torch.tensor(seqs)).logits.float()


def chi_square(counts: torch.Tensor, probs: torch.Tensor, alpha: float = 0.999) -> tuple[float, float]:
    """(Pearson statistic, bound chi2.ppf(alpha, dof)) of ``counts`` against the exact ``probs`` (same shape).

    Cells with expected count < 5 are pooled into one bin (the usual validity rule), dof = bins - 1.
    Any count on a zero-probability cell gives an infinite statistic."""
    from scipy.stats import chi2

    counts, probs = counts.flatten().double(), probs.flatten().double()
    n = counts.sum()
    if counts[probs == 0].sum() > 0:
        return float("inf"), float(chi2.ppf(alpha, 1))
    big, small = n * probs >= 5, (probs > 0) & (n * probs < 5)
    observed = torch.cat([counts[big], counts[small].sum()[None]])  # (bins,)
    expected = torch.cat([n * probs[big], n * probs[small].sum()[None]])
    keep = expected > 0
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    return float(stat), float(chi2.ppf(alpha, int(keep.sum()) - 1))

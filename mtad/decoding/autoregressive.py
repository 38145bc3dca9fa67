"""``greedy`` and ``sampling``: one target pass per token with a KV cache (ALGORITHMS.md §1-2)."""
from __future__ import annotations

from mtad.decoding.core import register


@register("greedy")
def greedy(models, batch, cfg, rng) -> None:
    """x_{t+1} = argmax p(·|x_{<=t}), each row its own; ignores T/top_k/top_p."""
    for target, runs in batch.steps(models):
        logits = target.forward(batch.pending(target))[:, -1]  # (B, V)
        batch.commit(runs, logits.argmax(-1)[:, None].tolist())


@register("sampling")
def sampling(models, batch, cfg, rng) -> None:
    """x_{t+1} ~ p̃(·|x_{<=t}), the filtered target (the stochastic baseline), each row its own draw."""
    for target, runs in batch.steps(models):
        batch.sample_step(target, runs, rng)

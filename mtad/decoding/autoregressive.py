"""``greedy`` and ``sampling``: one target pass per token with a KV cache (ALGORITHMS.md §1-2)."""
from __future__ import annotations

from mtad.decoding.core import register, register_rows


@register("greedy")
def greedy(models, run, cfg, rng) -> None:
    """x_{t+1} = argmax p(·|x_{<=t}); ignores T/top_k/top_p."""
    target = run.session(models.target, "target")
    while not run.done:
        logits = target.forward(run.pending(target))[-1]  # (V,)
        run.commit([int(logits.argmax())])


@register("sampling")
def sampling(models, run, cfg, rng) -> None:
    """x_{t+1} ~ p̃(·|x_{<=t}), the filtered target (the stochastic baseline)."""
    target = run.session(models.target, "target")
    while not run.done:
        run.sample_step(target, rng)


@register_rows("greedy")
def greedy_rows(models, batch, cfg, rng) -> None:
    """``greedy`` on a batch: each row takes its own argmax."""
    for target, runs in batch.steps(models):
        logits = target.forward(batch.pending(target))[:, -1]  # (B, V)
        batch.commit(runs, logits.argmax(-1)[:, None].tolist())


@register_rows("sampling")
def sampling_rows(models, batch, cfg, rng) -> None:
    """``sampling`` on a batch: each row draws its own token."""
    for target, runs in batch.steps(models):
        batch.sample_step(target, runs, rng)

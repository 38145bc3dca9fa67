"""``mtad``: beam-sampled draft block + joint likelihood-ratio verification (ALGORITHMS.md §5)."""
from __future__ import annotations

import torch

from mtad.decoding.accept import mtad_accept
from mtad.decoding.beam import beam_block
from mtad.decoding.core import register
from mtad.decoding.filter import draw


@register("mtad", draft=True)
def mtad(models, run, cfg, rng) -> None:
    """draft (beam sampling on q) -> score (one target pass) -> accept (longest L_d > log tau) ->
    commit x̂_1..a + a bonus token from p̃ at position a+1 (no residual). Lossy by design."""
    for target, draft, K in run.blocks(models, rng):
        x, q_x = beam_block(draft, run, K, rng)  # K ids, (K,)
        p = run.filt(target.forward(run.pending(target) + x, keep=K + 1))  # (K+1, V)
        p_x = p[torch.arange(K, device=run.device), torch.tensor(x, device=run.device)]  # (K,)
        a = mtad_accept(p_x.log(), q_x.log(), cfg.tau)
        run.stats.record(K, a)
        run.commit(x[:a] + [int(draw(p[a], rng))])

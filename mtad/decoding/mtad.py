"""``mtad``: beam-sampled draft block + joint likelihood-ratio verification (ALGORITHMS.md §5)."""
from __future__ import annotations

import torch

from mtad.decoding.accept import mtad_accept
from mtad.decoding.beam import batched_step, beam_sample
from mtad.decoding.core import register
from mtad.decoding.filter import draw
from mtad.decoding.kv import Session


def beam_block(proposer: Session, run, K: int, rng) -> tuple[list[int], torch.Tensor]:
    """Beam-sample K tokens with W beams in the batch dimension; return the highest-weight beam and the
    proposer's q̃ of each of its tokens (K,). The proposer's cache ends holding that beam's first K-1."""
    q1 = run.filt(proposer.forward(run.pending(proposer))[-1])  # (V,)
    tree = beam_sample(q1, batched_step(proposer, run.filt), K, run.cfg.beam_width, run.cfg.replacement, rng)
    idx = tree.best()
    x = [int(v) for v in tree.gather(idx, tree.tokens)]
    if K > 1:
        proposer.collapse(idx[-2], x[:-1])  # the row that holds the best beam's ancestors
    return x, torch.tensor(tree.gather(idx, tree.q_tok), device=run.device)


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

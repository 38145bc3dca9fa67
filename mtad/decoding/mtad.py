"""``mtad``: beam-sampled draft block + joint likelihood-ratio verification (ALGORITHMS.md §5).

``proposer: ngram`` proposes by prompt lookup instead (VERIFIERS.md §4): q is one-hot, so the joint
statistic is the target's joint log-probability of the prefix, L_d = Σ_{j<=d} log p̃_j(x_j).
"""
from __future__ import annotations

import torch

from mtad.decoding.accept import mtad_accept
from mtad.decoding.beam import beam_block
from mtad.decoding.core import register
from mtad.decoding.filter import draw
from mtad.decoding.ngram import NgramLookup


@register("mtad", draft=True)
def mtad(models, run, cfg, rng) -> None:
    """draft (beam sampling on q, or prompt lookup) -> score (one target pass) -> accept (longest
    L_d > log tau) -> commit x̂_1..a + a bonus token from p̃ at position a+1 (no residual). Lossy by design."""
    lookup = NgramLookup(cfg.ngram_max, run.eos) if cfg.proposer == "ngram" else None
    for target, draft, K in run.blocks(models, rng):
        if lookup is None:
            x, q_x = beam_block(draft, run, K, rng)  # K ids, (K,)
        else:
            x = lookup.propose(run.tokens, K)  # K' <= K ids
            q_x = torch.ones(len(x), device=run.device)  # (K',): a deterministic proposal's q̃(x̂_j) = 1
        p = run.filt(target.forward(run.pending(target) + x, keep=len(x) + 1))  # (K'+1, V)
        p_x = p[torch.arange(len(x), device=run.device), torch.tensor(x, dtype=torch.long, device=run.device)]
        a = mtad_accept(p_x.log(), q_x.log(), cfg.tau)
        run.stats.record(len(x), a)
        run.commit(x[:a] + [int(draw(p[a], rng))])

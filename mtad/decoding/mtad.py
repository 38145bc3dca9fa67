"""``mtad``: beam-sampled draft block + joint likelihood-ratio verification (ALGORITHMS.md §5).

A proposer without a model (``proposer: ngram``, prompt lookup, VERIFIERS.md §4) drafts the chain instead of
beam sampling: q is one-hot, so the joint statistic is the target's joint log-probability of the prefix,
L_d = Σ_{j<=d} log p̃_j(x_j). The rule is the table's ``mtad`` entry (:mod:`mtad.decoding.rules`).
"""
from __future__ import annotations

import torch

from mtad.decoding.beam import beam_rows
from mtad.decoding.core import register, vocab_size
from mtad.decoding.filter import draw
from mtad.decoding.propose import PROPOSERS
from mtad.decoding.rules import RULES

JOINT = RULES["mtad"]


def reads(cfg) -> tuple[str, ...]:
    """The keys ``mtad`` reads: tau, the proposer and its parameters, and with a draft model the beam's."""
    beam = ("beam_width", "replacement") if PROPOSERS[cfg.proposer].model else ()
    return ("proposer", *JOINT.keys, *PROPOSERS[cfg.proposer].keys, *beam)


@register("mtad", draft=True, reads=reads)
def mtad(models, batch, cfg, rng) -> None:
    """draft (beam sampling on q, beams of every row in one draft forward per depth, or the proposer's chain)
    -> score (one target pass for every row) -> accept (each row its longest L_d > log tau) -> commit x̂_1..a +
    a bonus token from p̃ at position a+1 (no residual). Lossy by design."""
    proposer, V = PROPOSERS[cfg.proposer], vocab_size(models.target)
    states = proposer.states(cfg, batch.runs)  # one prompt-lookup table per row
    for target, draft, runs, K in batch.blocks(models, rng):
        if not proposer.model:
            x, q = proposer.rows(states, draft, batch, runs, K, rng, V)  # K'[b] <= K[b] ids, (B, max K', V)
        elif max(K):
            x, q = beam_rows(draft, batch, K, rng)  # K[b] ids per row, (B, max K)
        else:
            x, q = [[] for _ in K], torch.ones(len(K), 0, device=batch.device)
        k_max = max(map(len, x))
        p = batch.filt(target.forward([s + xb for s, xb in zip(batch.pending(target), x)], keep=k_max + 1))
        kept, nxt = [], []
        for b, (run, xb) in enumerate(zip(runs, x)):
            k = len(xb)
            a, dist = JOINT.judge(p[b, k_max - k:], q[b, :k], torch.tensor(xb, dtype=torch.long, device=batch.device),
                                  None, cfg)  # p[b]'s last k+1 rows: row b's block and bonus
            if K[b]:
                run.stats.record(k, a)
            kept.append(xb[:a])
            nxt.append(dist)
        bonus = draw(torch.stack(nxt), rng).tolist()  # (B, 1)
        batch.commit(runs, [xb + t for xb, t in zip(kept, bonus)])

"""``mtad``: beam-sampled draft block + joint likelihood-ratio verification (ALGORITHMS.md §5).

``proposer: ngram`` proposes by prompt lookup instead (VERIFIERS.md §4): q is one-hot, so the joint
statistic is the target's joint log-probability of the prefix, L_d = Σ_{j<=d} log p̃_j(x_j).
"""
from __future__ import annotations

import torch

from mtad.decoding.accept import mtad_accept
from mtad.decoding.beam import beam_block, beam_rows
from mtad.decoding.core import register, register_rows
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


def _check_rows(cfg) -> None:
    if not cfg.replacement and cfg.proposer == "draft":
        raise ValueError("decoder=mtad with replacement=false decodes one prompt at a time (rows may keep different "
                         "numbers of beams): use batch size 1 or replacement=true")


@register_rows("mtad", check=_check_rows)
def mtad_rows(models, batch, cfg, rng) -> None:
    """``mtad`` on a batch: beams of every row in one draft forward per depth, one target pass for all rows;
    each row accepts its own longest passing prefix and draws its own bonus token."""
    lookup = {id(r): NgramLookup(cfg.ngram_max, r.eos) for r in batch.runs} if cfg.proposer == "ngram" else None
    for target, draft, runs, K in batch.blocks(models):  # lookup: one table per row
        if lookup is not None:
            x = [lookup[id(run)].propose(run.tokens, k) if k else [] for run, k in zip(runs, K)]
            q_x = torch.ones(len(x), max(map(len, x)), device=batch.device)  # (B, max K'): q̃(x̂_j) = 1
        elif max(K):
            x, q_x = beam_rows(draft, batch, K, rng)  # K[b] ids per row, (B, max K)
        else:
            x, q_x = [[] for _ in K], torch.ones(len(K), 0, device=batch.device)
        k_max = max(map(len, x))
        p = batch.filt(target.forward([s + xb for s, xb in zip(batch.pending(target), x)], keep=k_max + 1))
        kept, nxt = [], []
        for b, (run, xb) in enumerate(zip(runs, x)):
            k, pb = len(xb), p[b, k_max - len(xb):]  # (k+1, V): row b's block and bonus
            p_x = pb[torch.arange(k, device=batch.device), torch.tensor(xb, dtype=torch.long, device=batch.device)]
            a = mtad_accept(p_x.log(), q_x[b, :k].log(), cfg.tau)
            if K[b]:
                run.stats.record(k, a)
            kept.append(xb[:a])
            nxt.append(pb[a])
        bonus = draw(torch.stack(nxt), rng).tolist()  # (B, 1)
        batch.commit(runs, [xb + t for xb, t in zip(kept, bonus)])

"""``speculative``: propose a chain, verify it in one target pass (ALGORITHMS.md §3, §7 threshold variant).

The chain comes from the proposer named by ``proposer`` (:mod:`mtad.decoding.propose`: the draft model, or
prompt lookup with a one-hot q, VERIFIERS.md §4); the rule named by ``accept`` judges it (the table of
:mod:`mtad.decoding.rules`: ``lossless``, ``threshold`` and the verifiers of VERIFIERS.md §1-§3).
"""
from __future__ import annotations

import torch

from mtad.decoding.core import register, vocab_size
from mtad.decoding.filter import draw, uniform, uniform_rows
from mtad.decoding.propose import PROPOSERS, draft_chain  # noqa: F401  (draft_chain: the verifier study's draw)
from mtad.decoding.rules import RULES


def verify(cfg, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, rng: torch.Generator,
           u: torch.Tensor | None = None):
    """The rule named by ``accept`` on p (K+1, V), q (K, V), x (K,): (n accepted, next-token distribution).
    ``u`` (K,): the uniforms of the rules that take them (lossless, block; drawn from ``rng`` when None)."""
    rule = RULES[cfg.accept]
    if rule.uniforms and u is None:
        u = uniform(x.shape[0], rng)
    return rule.judge(p, q, x, u, cfg)


def reads(cfg) -> tuple[str, ...]:
    """The keys ``speculative`` reads: the rule and its parameters, the proposer and its parameters."""
    return ("accept", "proposer", *RULES[cfg.accept].keys, *PROPOSERS[cfg.proposer].keys)


@register("speculative", draft=True, reads=reads)
def speculative(models, batch, cfg, rng) -> None:
    """propose (``cfg.proposer``) -> score (one target pass for every row) -> accept (``cfg.accept``, each row
    its own block with its own uniforms) -> commit (each row its own number of tokens)."""
    proposer, rule, V = PROPOSERS[cfg.proposer], RULES[cfg.accept], vocab_size(models.target)
    states = proposer.states(cfg, batch.runs)  # one prompt-lookup table per row
    for target, draft, runs, K in batch.blocks(models, rng):
        x, q = proposer.rows(states, draft, batch, runs, K, rng, V)  # K'[b] <= K[b] ids, (B, max K', V)
        k_max = max(map(len, x))
        p = batch.filt(target.forward([s + xb for s, xb in zip(batch.pending(target), x)], keep=k_max + 1))
        u = uniform_rows(len(runs), k_max, rng) if rule.uniforms else None  # (B, max K): every row its own
        kept, nxt = [], []
        for b, (run, xb) in enumerate(zip(runs, x)):
            k = len(xb)
            n, dist = verify(cfg, p[b, k_max - k:], q[b, :k], torch.tensor(xb, dtype=torch.long, device=batch.device),
                             rng, None if u is None else u[b, :k])  # p[b]'s last k+1 rows: row b's block and bonus
            if K[b]:
                run.stats.record(k, n)
            kept.append(xb[:n])
            nxt.append(dist)
        bonus = draw(torch.stack(nxt), rng).tolist()  # (B, 1)
        batch.commit(runs, [xb + t for xb, t in zip(kept, bonus)])

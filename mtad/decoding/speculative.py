"""``speculative``: propose a chain, verify it in one target pass (ALGORITHMS.md §3, §7 threshold variant).

``accept: block | typical | fuzzy`` are the verifiers of VERIFIERS.md §1-§3 (:mod:`mtad.decoding.verifiers`);
``proposer: ngram`` drafts by prompt lookup instead of a draft model, with a one-hot q (VERIFIERS.md §4).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtad.decoding.accept import speculative_accept, threshold_accept
from mtad.decoding.core import register, register_rows, vocab_size
from mtad.decoding.filter import draw, uniform, uniform_rows
from mtad.decoding.kv import Rows, Session
from mtad.decoding.ngram import NgramLookup
from mtad.decoding.verifiers import block_accept, fuzzy_accept, typical_accept


def draft_chain(draft: Session, run, K: int, rng: torch.Generator) -> tuple[list[int], torch.Tensor]:
    """K tokens x̂_j ~ q̃ autoregressively (K draft passes); returns them and q̃_1..K (K, V)."""
    ids, x, q = run.pending(draft), [], []
    for _ in range(K):
        q.append(run.filt(draft.forward(ids)[-1]))  # (V,)
        ids = [int(draw(q[-1], rng))]
        x.append(ids[0])
    return x, torch.stack(q)  # (K, V)


def ngram_chain(lookup: NgramLookup, run, K: int, V: int) -> tuple[list[int], torch.Tensor]:
    """Up to K prompt-lookup tokens (none when nothing matches) and their one-hot q (K', V), VERIFIERS.md §4."""
    x = lookup.propose(run.tokens, K)
    return x, F.one_hot(torch.tensor(x, dtype=torch.long, device=run.device), V).float()  # (K', V)


def verify(cfg, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, rng: torch.Generator,
           u: torch.Tensor | None = None):
    """The rule named by ``accept`` on p (K+1, V), q (K, V), x (K,): (n accepted, next-token distribution).
    ``u`` (K,): the uniforms of the lossless and block rules (drawn from ``rng`` when None)."""
    K = x.shape[0]
    if cfg.accept == "lossless":
        return speculative_accept(p, q, x, uniform(K, rng) if u is None else u)
    if cfg.accept == "block":
        return block_accept(p, q, x, uniform(K, rng) if u is None else u)
    if cfg.accept == "threshold":
        return threshold_accept(p, q, x, cfg.tau)
    if cfg.accept == "typical":
        return typical_accept(p, x, cfg.typical_threshold, cfg.typical_alpha)
    return fuzzy_accept(p, q, x, cfg.fuzzy_threshold, cfg.fuzzy_divergence)


@register("speculative", draft=True)
def speculative(models, run, cfg, rng) -> None:
    """propose (draft chain or prompt lookup) -> score -> accept (``cfg.accept``) -> commit."""
    lookup = NgramLookup(cfg.ngram_max, run.eos) if cfg.proposer == "ngram" else None
    for target, draft, K in run.blocks(models, rng):
        if lookup is None:
            x, q = draft_chain(draft, run, K, rng)  # K ids, (K, V)
        else:
            x, q = ngram_chain(lookup, run, K, vocab_size(models.target))  # K' <= K ids, (K', V)
        p = run.filt(target.forward(run.pending(target) + x, keep=len(x) + 1))  # (K'+1, V)
        n, nxt = verify(cfg, p, q, torch.tensor(x, dtype=torch.long, device=run.device), rng)
        run.stats.record(len(x), n)
        run.commit(x[:n] + [int(draw(nxt, rng))])


def draft_rows(draft: Rows, batch, K: list[int], rng: torch.Generator) -> tuple[list[list[int]], torch.Tensor]:
    """:func:`draft_chain` for every row at once: max(K) draft passes; row b keeps its first K[b] tokens.
    Returns the tokens per row and q̃ (B, max K, V)."""
    ids, x, q = batch.pending(draft), [], []
    for _ in range(max(K)):
        q.append(batch.filt(draft.forward(ids)[:, -1]))  # (B, V)
        x.append(draw(q[-1], rng))  # (B, 1): one draw per row
        ids = x[-1].tolist()
    if not q:
        return [[] for _ in K], torch.zeros(len(K), 0, 1, device=batch.device)
    x = torch.cat(x, 1).tolist()  # (B, max K)
    return [row[:k] for row, k in zip(x, K)], torch.stack(q, 1)  # (B, max K, V)


def ngram_rows(lookup: dict, runs, K: list[int], V: int, device) -> tuple[list[list[int]], torch.Tensor]:
    """:func:`ngram_chain` for every row (``lookup``: id(run) -> its table): up to K[b] prompt-lookup tokens
    each, one-hot q (B, max K', V)."""
    x = [lookup[id(run)].propose(run.tokens, k) if k else [] for run, k in zip(runs, K)]
    q = torch.zeros(len(x), max(map(len, x)), V, device=device)  # (B, max K', V)
    for b, xb in enumerate(x):
        q[b, torch.arange(len(xb)), torch.tensor(xb, dtype=torch.long)] = 1.0
    return x, q


@register_rows("speculative")
def speculative_rows(models, batch, cfg, rng) -> None:
    """``speculative`` on a batch: one draft pass and one target pass per iteration for every row; each row
    verifies its own block with its own uniforms and commits its own number of tokens."""
    lookup = {id(r): NgramLookup(cfg.ngram_max, r.eos) for r in batch.runs} if cfg.proposer == "ngram" else None
    for target, draft, runs, K in batch.blocks(models):  # lookup: one table per row
        if lookup is None:
            x, q = draft_rows(draft, batch, K, rng)  # K[b] ids per row, (B, max K, V)
        else:
            x, q = ngram_rows(lookup, runs, K, vocab_size(models.target), batch.device)  # K'[b] <= K[b] ids
        k_max = max(map(len, x))
        p = batch.filt(target.forward([s + xb for s, xb in zip(batch.pending(target), x)], keep=k_max + 1))
        u = uniform_rows(len(runs), k_max, rng)  # (B, max K): every row its own uniforms
        kept, nxt = [], []
        for b, (run, xb) in enumerate(zip(runs, x)):
            k = len(xb)
            n, dist = verify(cfg, p[b, k_max - k:], q[b, :k], torch.tensor(xb, dtype=torch.long, device=batch.device),
                             rng, u[b, :k])  # p[b]'s last k+1 rows: row b's block and bonus
            if K[b]:
                run.stats.record(k, n)
            kept.append(xb[:n])
            nxt.append(dist)
        bonus = draw(torch.stack(nxt), rng).tolist()  # (B, 1)
        batch.commit(runs, [xb + t for xb, t in zip(kept, bonus)])

"""``speculative``: propose a chain, verify it in one target pass (ALGORITHMS.md §3, §7 threshold variant).

``accept: block | typical | fuzzy`` are the verifiers of VERIFIERS.md §1-§3 (:mod:`mtad.decoding.verifiers`);
``proposer: ngram`` drafts by prompt lookup instead of a draft model, with a one-hot q (VERIFIERS.md §4).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtad.decoding.accept import speculative_accept, threshold_accept
from mtad.decoding.core import register, vocab_size
from mtad.decoding.filter import draw, uniform
from mtad.decoding.kv import Session
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


def verify(cfg, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, rng: torch.Generator):
    """The rule named by ``accept`` on p (K+1, V), q (K, V), x (K,): (n accepted, next-token distribution)."""
    K = x.shape[0]
    if cfg.accept == "lossless":
        return speculative_accept(p, q, x, uniform(K, rng))
    if cfg.accept == "block":
        return block_accept(p, q, x, uniform(K, rng))
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

"""``speculative``: draft a chain, verify it in one target pass (ALGORITHMS.md §3, §7 threshold variant)."""
from __future__ import annotations

import torch

from mtad.decoding.accept import speculative_accept, threshold_accept
from mtad.decoding.core import register
from mtad.decoding.filter import draw, uniform
from mtad.decoding.kv import Session


def draft_chain(draft: Session, run, K: int, rng: torch.Generator) -> tuple[list[int], torch.Tensor]:
    """K tokens x̂_j ~ q̃ autoregressively (K draft passes); returns them and q̃_1..K (K, V)."""
    ids, x, q = run.pending(draft), [], []
    for _ in range(K):
        q.append(run.filt(draft.forward(ids)[-1]))  # (V,)
        ids = [int(draw(q[-1], rng))]
        x.append(ids[0])
    return x, torch.stack(q)  # (K, V)


@register("speculative", draft=True)
def speculative(models, run, cfg, rng) -> None:
    """draft -> score -> accept -> commit; lossless (Leviathan/Chen) or ``accept: threshold`` (tau)."""
    for target, draft, K in run.blocks(models, rng):
        x, q = draft_chain(draft, run, K, rng)  # K ids, (K, V)
        p = run.filt(target.forward(run.pending(target) + x, keep=K + 1))  # (K+1, V)
        xt = torch.tensor(x, device=run.device)
        if cfg.accept == "lossless":
            n, nxt = speculative_accept(p, q, xt, uniform(K, rng))
        else:
            n, nxt = threshold_accept(p, q, xt, cfg.tau)
        run.stats.record(K, n)
        run.commit(x[:n] + [int(draw(nxt, rng))])

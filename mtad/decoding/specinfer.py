"""``specinfer``: lossless token-tree speculative sampling with a static tree (ALGORITHMS.md §7).

The draft expands a static tree ``k_config = [k_1, .., k_D]``: k_1 children of the prefix drawn i.i.d.
from q̃, then k_{d+1} i.i.d. children below each depth-d node (one draft pass per depth, tree mask).
One target pass scores every node. From the root down, the children of the current node are tried in
order with SpecInfer's multi-step speculative sampling (:func:`mtad.decoding.accept.multi_draft_accept`);
an accepted child becomes the current node; when all children fail, the next token is drawn from the
residual; at a leaf, the bonus comes from p̃ at the leaf. Every emitted token is distributed as p̃.
"""
from __future__ import annotations

import torch

from mtad.decoding.accept import multi_draft_accept
from mtad.decoding.core import register
from mtad.decoding.filter import draw, uniform
from mtad.decoding.kv import Session
from mtad.decoding.mmtad import verify_tree


def draft_tree(draft: Session, run, ks: list[int], rng):
    """Static tree: per depth the tokens (N_d,), parents (N_d,) and the q̃ each node's children come
    from (N_{d-1}, V); the draft's cache ends holding depths 1..D-1. Also returns those cache indices."""
    q = run.filt(draft.forward(run.pending(draft))[-1])[None]  # (1, V)
    tokens, parents, qs, cache_idx, prev_idx = [], [], [], [], [len(draft.ids) - 1]
    for d, k in enumerate(ks):
        if d:
            start = len(draft)
            q = run.filt(draft.forward_tree(tokens[-1].tolist(), [prev_idx[int(b)] for b in parents[-1]]))
            prev_idx = list(range(start, start + len(tokens[-1])))
            cache_idx.append(prev_idx)
        children = draw(q, rng, k, replacement=True)  # (N_{d-1}, k)
        qs.append(q)
        tokens.append(children.flatten())
        parents.append(torch.arange(q.shape[0], device=q.device).repeat_interleave(k))
    return tokens, parents, qs, cache_idx


@register("specinfer", draft=True, tree=("target", "draft"), reads=lambda cfg: ("k_config",))
def specinfer(models, batch, cfg, rng) -> None:
    """draft (static token tree) -> score (one target pass) -> accept (multi-step speculative sampling
    down the tree) -> commit the accepted path + one token from p̃ (residual or bonus)."""
    for target, draft, runs, D in batch.blocks(models, rng, depth=len(cfg.k_config)):
        run, target, draft, D = runs[0], target.session, draft.session, D[0]  # one prompt at a time
        ks = list(cfg.k_config[:D])
        tokens, parents, qs, draft_idx = draft_tree(draft, run, ks, rng)
        tree = _Tree(tokens, parents)
        p, chain, node_idx, offset = verify_tree(target, run, tree)
        path, node, nxt = [], 0, p[0]  # node = index at the current depth (root: 0)
        for d in range(D):
            first = node * ks[d]  # children of `node` are contiguous at depth d+1
            xs = tokens[d][first:first + ks[d]]
            i, resid = multi_draft_accept(nxt, qs[d][node], xs, uniform(ks[d], rng))
            if i < 0:
                nxt = resid
                break
            node = first + i
            path.append(node)
            nxt = p[1 + offset[d] + node]
        a = len(path)
        run.stats.record(D, a)
        x = [int(tokens[d][j]) for d, j in enumerate(path)]
        target.commit_path(chain + [node_idx[d][j] for d, j in enumerate(path)], run.tokens[len(target.ids):] + x)
        fed = min(a, D - 1)
        draft.commit_path([draft_idx[d][j] for d, j in enumerate(path[:fed])], x[:fed])
        run.commit(x + [int(draw(nxt, rng))])


class _Tree:
    """The shape :func:`verify_tree` reads: per-depth tokens and parents (None at depth 1)."""

    def __init__(self, tokens, parents):
        self.tokens = tokens
        self.parents = [None] + parents[1:]

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
from mtad.decoding.beam import feed_level
from mtad.decoding.core import register
from mtad.decoding.filter import draw, uniform
from mtad.decoding.kv import Session
from mtad.decoding.mmtad import commit_tree, verify_tree


def draft_tree(draft: Session, batch, ks: list[list[int]], rng):
    """Static trees, row b's of depth len(ks[b]): per row and depth the tokens (N_d,), parents (N_d,) and the q̃
    each node's children come from (N_{d-1}, V); the draft's cache ends holding depths 1..D-1. Also returns those
    node indices, per row and depth. One draft pass per depth for every row, one draw for all rows' children."""
    B = len(ks)
    q = batch.filt(draft.forward(batch.pending(draft))[:, -1])[:, None]  # (B, 1, V)
    q = {b: q[b] for b in range(B)}  # per row (N_{d-1}, V)
    tokens, parents, qs, node_idx = ([[] for _ in range(B)] for _ in range(4))
    prev = [[len(ids) - 1] for ids in draft.ids]
    for d in range(max(map(len, ks))):
        rows = [b for b in range(B) if len(ks[b]) > d]
        if d:  # feed depth d of the rows that go deeper
            q.update(feed_level(draft, batch.filt, rows, tokens, parents, prev, node_idx))
        k = ks[rows[0]][d]  # the static tree: one k_config for every row
        children = draw(torch.cat([q[b] for b in rows]), rng, k, replacement=True).split([len(q[b]) for b in rows])
        for b, c in zip(rows, children):  # c (N_{d-1}, k)
            qs[b].append(q[b])
            tokens[b].append(c.flatten())
            parents[b].append(torch.arange(q[b].shape[0], device=q[b].device).repeat_interleave(k))
    return tokens, parents, qs, node_idx


@register("specinfer", draft=True, tree=("target", "draft"), reads=lambda cfg: ("k_config",))
def specinfer(models, batch, cfg, rng) -> None:
    """draft (a static token tree per row) -> score (one target pass) -> accept (per row, multi-step speculative
    sampling down the tree) -> commit the accepted path + one token from p̃ (residual or bonus)."""
    for target, draft, runs, Ds in batch.blocks(models, rng, depth=len(cfg.k_config)):
        ks = [list(cfg.k_config[:D]) for D in Ds]
        tokens, parents, qs, draft_idx = ([[] for _ in Ds] for _ in range(4))
        if max(Ds):
            tokens, parents, qs, draft_idx = draft_tree(draft, batch, ks, rng)
        trees = [_Tree(t, par) for t, par in zip(tokens, parents)]
        t_keep, t_ids, d_keep, d_ids, blocks, nxt = [], [], [], [], [], []
        for b, (run, (p, chain, node_idx, offset)) in enumerate(zip(runs, verify_tree(target, batch, trees))):
            path, node, dist = [], 0, p[0]  # node = index at the current depth (root: 0)
            for d, k in enumerate(ks[b]):
                first = node * k  # children of `node` are contiguous at depth d+1
                i, resid = multi_draft_accept(dist, qs[b][d][node], tokens[b][d][first:first + k], uniform(k, rng))
                if i < 0:
                    dist = resid
                    break
                node = first + i
                path.append(node)
                dist = p[1 + offset[d] + node]
            a = len(path)
            if Ds[b]:
                run.stats.record(Ds[b], a)
            x = [int(tokens[b][d][j]) for d, j in enumerate(path)]
            t_keep.append(chain + [node_idx[d][j] for d, j in enumerate(path)])
            t_ids.append(run.tokens[len(target.ids[b]):] + x)
            fed = min(a, len(draft_idx[b]))  # the draft fed depths 1..D-1
            d_keep.append([draft_idx[b][d][j] for d, j in enumerate(path[:fed])])
            d_ids.append(x[:fed])
            blocks.append(x)
            nxt.append(dist)
        commit_tree(batch, runs, target, draft if max(Ds) else None, (t_keep, t_ids), (d_keep, d_ids), blocks, nxt, rng)


class _Tree:
    """The shape :func:`verify_tree` reads: per-depth tokens and parents (None at depth 1)."""

    def __init__(self, tokens, parents):
        self.tokens = tokens
        self.parents = ([None] + parents[1:]) if tokens else []

"""``dyntree``: a dynamic draft tree (EAGLE-2 style), verified losslessly or by MTAD's joint rule (ALGORITHMS.md §8).

Draft: the root's ``tree_width`` most likely children under q̃; then, depth by depth, the ``tree_width`` newest
nodes of highest cumulative draft probability (the product of q̃ along the path) are expanded, each into its
``tree_width`` most likely children (one draft tree pass per depth). Every drafted node is ranked by its
cumulative probability and the best ``tree_nodes`` are kept, re-ranked: a closed subtree, since a child never
ranks above its parent. One target tree pass scores them. Accept (``accept``): ``lossless``, SpecInfer's
multi-candidate rule with each child's proposal law a point mass (the children are fixed candidates, not draws),
or ``joint``, MMTAD's rule on the tree's paths (lossy). The drafting is deterministic: only the acceptance and the
next token draw uniforms.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from mtad.decoding.accept import multi_draft_accept
from mtad.decoding.beam import BeamTree, feed_level
from mtad.decoding.core import register
from mtad.decoding.filter import Top, uniform
from mtad.decoding.kv import Session
from mtad.decoding.mmtad import accept_tree, commit_tree, verify_tree


class Candidates:
    """One row's drafted nodes, in the order drawn up: token, parent (-1: the root), depth (1..), the log of the
    cumulative draft probability, q̃ of the token given its path; once expanded, its position in the level fed to
    the draft and its index in the draft's cache (-1 before)."""

    def __init__(self) -> None:
        self.tok, self.up, self.depth, self.logv, self.q, self.pos, self.fed = ([] for _ in range(7))

    def add(self, depth: int, parents: list[int], q_rows: list[list[float]], id_rows: list[list[int]]) -> None:
        """The children (tokens ``id_rows[j]``, laws ``q_rows[j]``) of node ``parents[j]``; those with q̃ = 0 are
        outside the filtered support and are not drafted."""
        for parent, qs, ids in zip(parents, q_rows, id_rows):
            base = self.logv[parent] if parent >= 0 else 0.0
            for q, t in zip(qs, ids):
                if q > 0:
                    for lst, v in zip((self.tok, self.up, self.depth, self.logv, self.q, self.pos, self.fed),
                                      (t, parent, depth, base + math.log(q), q, -1, -1)):
                        lst.append(v)

    def ranked(self) -> list[int]:
        """Every node, best first: cumulative probability, then the order drawn up (a parent before its child).
        **[choice]** ties go to the older node, so the best n always form a closed subtree."""
        return sorted(range(len(self.tok)), key=lambda i: (-self.logv[i], i))

    def frontier(self, depth: int, width: int, budget: int) -> list[int]:
        """The ``width`` best nodes at ``depth`` among the ``budget`` best overall. **[choice]** A node outside the
        best ``budget`` now can never be kept, nor its children, so it is not expanded (EAGLE-2 expands it anyway;
        the kept tree is the same)."""
        return [i for i in self.ranked()[:budget] if self.depth[i] == depth][:width]

    def path(self, i: int) -> list[int]:
        """The tokens from the root down to node i."""
        out = []
        while i >= 0:
            out.append(self.tok[i])
            i = self.up[i]
        return out[::-1]


# step(expand, cands): feed the nodes expand[b] (candidate ids of row b) to the proposer, set their pos and fed,
# and return each row's laws of their children: (n_b, V) or a Top of (n_b, k)
Step = Callable[[dict[int, list[int]], list[Candidates]], dict[int, "torch.Tensor | Top"]]


def children(law: "torch.Tensor | Top", width: int) -> tuple[list[list[float]], list[list[int]]]:
    """The ``width`` most likely tokens under each row of ``law`` (n, V) or its top-k support (a Top, sorted
    descending), best first: (q̃ per row, ids per row)."""
    if isinstance(law, Top):
        return law.p[:, :width].tolist(), law.idx[:, :width].tolist()
    q, ids = law.topk(min(width, law.shape[-1]), dim=-1)  # (n, w)
    return q.tolist(), ids.tolist()


def grow(q1: dict[int, "torch.Tensor | Top"], step: Step, D: list[int], width: int, budget: int) -> list[Candidates]:
    """ALGORITHMS.md §8 step 1: every row's candidate nodes. ``q1[b]`` (1, V) or a Top of (1, k): row b's law at
    its prefix, for the rows with D[b] >= 1; row b drafts down to depth D[b]."""
    cands = [Candidates() for _ in D]
    laws, parents = dict(q1), {b: [-1] for b in q1}
    for d in range(max(D, default=0)):
        if d:
            parents = {b: f for b in laws if D[b] > d for f in [cands[b].frontier(d, width, budget)] if f}
            if not parents:
                break
            laws = step(parents, cands)
        for b, law in laws.items():
            cands[b].add(d + 1, parents[b], *children(law, width))
    return cands


def prune(c: Candidates, budget: int, device) -> tuple[BeamTree, list[list[int]]]:
    """ALGORITHMS.md §8 step 2: the best ``budget`` nodes as a tree by depth, each depth best first (siblings are
    tried in that order), and each kept node's index in the draft's cache per depth (-1: never fed)."""
    keep = c.ranked()[:budget]
    levels: list[list[int]] = [[] for _ in range(max((c.depth[i] for i in keep), default=0))]
    for i in keep:
        levels[c.depth[i] - 1].append(i)
    at = {i: j for level in levels for j, i in enumerate(level)}  # node -> its index within its depth
    tokens = [torch.tensor([c.tok[i] for i in lv], dtype=torch.long, device=device) for lv in levels]  # (N_d,)
    parents = [None] * bool(levels) + [torch.tensor([at[c.up[i]] for i in lv], dtype=torch.long, device=device)
                                       for lv in levels[1:]]  # (N_d,); none for an empty tree
    q_tok = [torch.tensor([c.q[i] for i in lv], device=device) for lv in levels]  # (N_d,)
    return BeamTree(tokens, parents, q_tok, None), [[c.fed[i] for i in lv] for lv in levels]


def feeder(draft: Session, batch) -> Step:
    """The draft's :data:`Step`: each depth's expanded nodes of every row in one tree pass."""
    B = len(draft.ids)
    tokens, ups = [[] for _ in range(B)], [[] for _ in range(B)]  # per row, per fed level
    prev, node_idx = [[len(ids) - 1] for ids in draft.ids], [[] for _ in range(B)]

    def step(expand, cands):
        rows = sorted(expand)
        for b in rows:
            c = cands[b]
            tokens[b].append(torch.tensor([c.tok[i] for i in expand[b]], dtype=torch.long))
            ups[b].append(torch.tensor([c.pos[c.up[i]] if c.up[i] >= 0 else 0 for i in expand[b]]))
        laws = feed_level(draft, batch.law, rows, tokens, ups, prev, node_idx)
        for b in rows:
            for j, i in enumerate(expand[b]):
                cands[b].pos[i], cands[b].fed[i] = j, node_idx[b][-1][j]
        return laws

    return step


def draft_trees(draft: Session, batch, D: list[int], width: int, budget: int):
    """Every row's pruned tree (row b down to depth D[b]; empty when D[b] = 0) and its nodes' draft indices."""
    q1 = batch.law(draft.forward(batch.pending(draft))[:, -1])  # (B, V) or a Top of (B, k)
    rows = {b: (Top(q1.p[b:b + 1], q1.idx[b:b + 1], q1.V) if isinstance(q1, Top) else q1[b:b + 1])
            for b in range(len(D)) if D[b]}
    return [prune(c, budget, batch.device) for c in grow(rows, feeder(draft, batch), D, width, budget)]


def walk(tree: BeamTree, p: torch.Tensor, offset: list[int], u: Callable[[int, int, int], torch.Tensor]):
    """ALGORITHMS.md §8 step 3, ``lossless``, on one row: from the root down, the current node's children are
    tried in order by :func:`multi_draft_accept` with one point-mass proposal law per child, so child i passes with
    probability r_i(x_i), r_1 = p̃ at the node and r_{i+1} = r_i with x_i removed, renormalised. p (1 + N, V): p̃ at
    the root and at every node (:func:`verify_tree`); ``u(d, node, k)``: k uniforms for the children at depth d+1 of
    ``node`` (-1: the root). Returns the accepted path's node indices per depth and the next token's law: the last
    residual when every child failed, else p̃ at the leaf (the bonus)."""
    path, node, dist = [], -1, p[0]
    for d, tokens in enumerate(tree.tokens):
        ups = tree.parents[d]
        kids = list(range(len(tokens))) if ups is None else (ups == node).nonzero()[:, 0].tolist()
        if not kids:
            break
        xs = tokens[kids]  # (k,)
        q = torch.zeros(len(kids), p.shape[-1], dtype=p.dtype, device=p.device)  # (k, V): one point mass each
        q[torch.arange(len(kids), device=p.device), xs] = 1.0
        i, rest = multi_draft_accept(dist, q, xs, u(d, node, len(kids)))
        if i < 0:
            return path, rest
        node = kids[i]
        path.append(node)
        dist = p[1 + offset[d] + node]
    return path, dist


def judge(tree: BeamTree, p: torch.Tensor, offset: list[int], cfg, rng) -> tuple[list[int], torch.Tensor]:
    """The accept rule named by ``accept`` on one row's tree: the accepted path and the next token's law."""
    if cfg.accept == "joint":  # MMTAD's rule (ALGORITHMS.md §6 step 3); next token from p̃ at the node
        a, path = accept_tree(tree, p, offset, cfg)
        return path, p[1 + offset[a - 1] + path[-1]] if a else p[0]
    return walk(tree, p, offset, lambda d, node, k: uniform(k, rng))


def reads(cfg) -> tuple[str, ...]:
    """The keys ``dyntree`` reads: the tree's shape, the rule, and with ``joint`` MMTAD's tau and reference."""
    return ("accept", "tree_width", "tree_nodes", *(("tau", "reference") if cfg.accept == "joint" else ()))


@register("dyntree", draft=True, tree=("target", "draft"), reads=reads)
def dyntree(models, batch, cfg, rng) -> None:
    """draft (a dynamic tree per row, one draft pass per depth) -> score (one target pass over every row's nodes)
    -> accept (``lossless``: multi-candidate rejection sampling down the tree; ``joint``: MMTAD's rule) -> commit
    the accepted path + one token (residual or bonus; ``joint``: from p̃)."""
    for target, draft, runs, K in batch.blocks(models, rng):
        trees = [(BeamTree([], [], [], None), []) for _ in K]
        if max(K):
            trees = draft_trees(draft, batch, K, cfg.tree_width, cfg.tree_nodes)
        t_keep, t_ids, d_keep, d_ids, blocks, nxt = [], [], [], [], [], []
        scored = verify_tree(target, batch, [t for t, _ in trees])
        for b, (run, (tree, fed), (p, chain, node_idx, offset)) in enumerate(zip(runs, trees, scored)):
            path, dist = judge(tree, p, offset, cfg, rng) if tree.tokens else ([], p[0])
            if tree.tokens:
                run.stats.record(len(tree.tokens), len(path))
            x = [int(tree.tokens[d][j]) for d, j in enumerate(path)]
            t_keep.append(chain + [node_idx[d][j] for d, j in enumerate(path)])
            t_ids.append(run.tokens[len(target.ids[b]):] + x)
            kept = [fed[d][j] for d, j in enumerate(path)]
            kept = kept[:kept.index(-1)] if -1 in kept else kept  # the path's nodes the draft was fed
            d_keep.append(kept)
            d_ids.append(x[:len(kept)])
            blocks.append(x)
            nxt.append(dist)
        commit_tree(batch, runs, target, draft if max(K) else None, (t_keep, t_ids), (d_keep, d_ids), blocks, nxt, rng)

"""``mmtad``: MTAD verifying the whole beam tree in one target pass (ALGORITHMS.md §6)."""
from __future__ import annotations

import torch

from mtad.decoding.accept import mmtad_accept
from mtad.decoding.beam import BeamTree, beam_sample, tree_step
from mtad.decoding.core import register
from mtad.decoding.filter import draw
from mtad.decoding.kv import Session


def path_logprobs(tree: BeamTree, tok_logp: list[torch.Tensor]) -> list[torch.Tensor]:
    """Joint log-probabilities along every node's path, per depth: (W_d,) each."""
    out = [tok_logp[0]]
    for d in range(1, len(tree.tokens)):
        out.append(out[-1][tree.parents[d]] + tok_logp[d])
    return out


def verify_tree(target: Session, batch, trees: list) -> list[tuple]:
    """Score every node of every row's tree in one target pass (each row's pending tokens travel as a chain in
    front; a row may have an empty tree). Per row: p̃ rows (1 + N, V) — row 0 at the prefix, row 1 + offset[d] + i
    at node i of depth d+1 — the indices of the pending chain, the nodes' indices per depth, and the offsets."""
    tokens, parents, out = [], [], []
    for b, (tree, pending) in enumerate(zip(trees, batch.pending(target))):
        P = len(target.ids[b])
        chain = list(range(P, P + len(pending)))
        sizes = [len(t) for t in tree.tokens]
        offset = [sum(sizes[:d]) for d in range(len(sizes))]
        base = P + len(pending)
        par = [c - 1 for c in chain]
        for d, up in enumerate(tree.parents):
            par += [chain[-1]] * sizes[0] if up is None else [base + offset[d - 1] + int(j) for j in up]
        tokens.append(pending + (torch.cat(tree.tokens).tolist() if sizes else []))
        parents.append(par)
        out.append((sum(sizes), chain, [[base + offset[d] + i for i in range(n)] for d, n in enumerate(sizes)], offset))
    keep = max(n for n, *_ in out) + 1
    p = batch.filt(target.forward_tree(tokens, parents, keep=keep))  # (B, keep, V): row b's last 1 + N_b
    return [(p[b, keep - n - 1:], chain, idx, offset) for b, (n, chain, idx, offset) in enumerate(out)]


def accept_tree(tree: BeamTree, p: torch.Tensor, offset: list[int], cfg) -> tuple[int, list[int]]:
    """ALGORITHMS.md §6 step 3 on one row's tree and its p̃ rows (1 + N, V): the accepted depth a and the node
    indices of its path (depth 1..a)."""
    K = len(tree.tokens)
    rows = [torch.zeros_like(tree.tokens[0])] + [1 + offset[d - 1] + tree.parents[d] for d in range(1, K)]
    lp = path_logprobs(tree, [p[r, t].log() for r, t in zip(rows, tree.tokens)])
    lq = path_logprobs(tree, [q.log() for q in tree.q_tok])
    a, i = mmtad_accept(lp, lq, cfg.tau, cfg.reference)
    return a, tree.path(a, i) if a else []


def commit_tree(batch, runs, target: Session, draft: Session | None, t_path: tuple, d_path: tuple, blocks: list,
                nxt: list, rng) -> None:
    """The commit of every tree decoder: both caches compacted to the accepted paths (``(keep, ids)`` per row;
    ``draft`` None when it fed no node), then each row's block plus one token drawn from its ``nxt`` law."""
    target.commit_path(*t_path)
    if draft is not None:
        draft.commit_path(*d_path)
    bonus = draw(torch.stack(nxt), rng).tolist()  # (B, 1)
    batch.commit(runs, [x + t for x, t in zip(blocks, bonus)])


@register("mmtad", draft=True, tree=("target", "draft"),
          reads=lambda cfg: ("beam_width", "replacement", "tau", "reference"))
def mmtad(models, batch, cfg, rng) -> None:
    """draft (a beam tree per row, one draft cache) -> score (one target pass over every row's W·K nodes) ->
    accept (per row the deepest depth with a node passing log p̃(path) - R_d > log tau) -> commit its path + bonus."""
    for target, draft, runs, K in batch.blocks(models, rng):
        k_max, trees, draft_idx = max(K), [BeamTree([], [], [], None) for _ in K], [[] for _ in K]
        if k_max:
            q1 = batch.law(draft.forward(batch.pending(draft))[:, -1])  # (B, V) or its Top
            step, draft_idx = tree_step(draft, batch.law)
            trees = [t.prefix(k) for t, k in zip(beam_sample(q1, step, k_max, cfg.beam_width, cfg.replacement, rng), K)]
        t_keep, t_ids, d_keep, d_ids, blocks, nxt = [], [], [], [], [], []
        for b, (run, tree, scored) in enumerate(zip(runs, trees, verify_tree(target, batch, trees))):
            p, chain, node_idx, offset = scored
            a, idx = accept_tree(tree, p, offset, cfg) if K[b] else (0, [])
            if K[b]:
                run.stats.record(K[b], a)
            x = [int(tree.tokens[d][j]) for d, j in enumerate(idx)]
            nxt.append(p[1 + offset[a - 1] + idx[-1]] if a else p[0])
            t_keep.append(chain + [node_idx[d][j] for d, j in enumerate(idx)])
            t_ids.append(run.tokens[len(target.ids[b]):] + x)
            fed = min(a, k_max - 1)  # the draft never fed the deepest nodes
            d_keep.append([draft_idx[b][d][j] for d, j in enumerate(idx[:fed])] if k_max else [])
            d_ids.append(x[:fed])
            blocks.append(x)
        commit_tree(batch, runs, target, draft if k_max else None, (t_keep, t_ids), (d_keep, d_ids), blocks, nxt, rng)

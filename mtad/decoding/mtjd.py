"""``mtjd``: exact multi-token joint decoding with the target alone (ALGORITHMS.md §4).

``mode: exhaustive`` enumerates every block reachable under the per-step filter, one batched tree pass
per level, then selects the joint's argmax (``select: argmax``) or samples from the joint restricted to
its top ``block_top_p`` mass (``select: nucleus``) **[choice]**. ``mode: beam`` runs the beam sampling of
§5 with the target as proposer and commits the highest-weight beam. Blocks carry no bonus token.
"""
from __future__ import annotations

import torch

from mtad.decoding.attention import check_tree_support
from mtad.decoding.beam import beam_rows, feed_level
from mtad.decoding.core import register, vocab_size
from mtad.decoding.filter import _nucleus_sorted, draw
from mtad.decoding.kv import Session


def check_budget(cfg, V: int) -> None:
    """Refuse an exhaustive tree larger than ``node_budget`` before decoding starts."""
    k = 1 if cfg.temperature == 0 else (cfg.top_k if 0 < cfg.top_k < V else V)
    nodes = sum(k ** d for d in range(1, cfg.gamma + 1))
    if nodes > cfg.node_budget:
        raise ValueError(
            f"decoder.node_budget={cfg.node_budget} is too small: mtjd mode=exhaustive with top_k={cfg.top_k}, "
            f"gamma={cfg.gamma} may need {nodes} tree nodes; raise node_budget, lower gamma or top_k, "
            "or use mode=beam")


def exhaustive_blocks(target: Session, batch, K: list[int], rng) -> list[list[int]]:
    """Enumerate every row's filtered block tree level by level (one tree pass per level for all rows, row b
    down to depth K[b]); return each row's selected block (K[b] ids)."""
    cfg, B = batch.cfg, len(K)
    p0 = batch.filt(target.forward(batch.pending(target))[:, -1])  # (B, V): each root's p̃
    p = {b: p0[b:b + 1] for b in range(B)}  # per row (N_d, V)
    tokens, parents, node_idx = ([[] for _ in range(B)] for _ in range(3))
    joint = [torch.zeros(1, device=p0.device) for _ in range(B)]
    prev = [[len(ids) - 1] for ids in target.ids]
    for d in range(max(K)):
        rows = [b for b in range(B) if K[b] > d]
        if d:  # score the previous level's nodes of every row in one tree pass
            p.update(feed_level(target, batch.filt, rows, tokens, parents, prev, node_idx))
        for b in rows:
            par, tok = p[b].nonzero(as_tuple=True)  # (N_d,), (N_d,): every child in the filtered support
            joint[b] = joint[b][par] + p[b][par, tok].log()
            parents[b].append(par)
            tokens[b].append(tok)
    blocks, keep, fed = [], [], []
    for b in range(B):
        if cfg.select == "argmax":
            leaf = int(joint[b].argmax())
        else:
            order = joint[b].argsort(descending=True)
            kept = _nucleus_sorted(joint[b][order].exp(), cfg.block_top_p)
            leaf = int(order[int(draw(kept, rng))])
        path = [leaf]
        for d in range(K[b] - 1, 0, -1):
            path.append(int(parents[b][d][path[-1]]))
        path = path[::-1]
        x = [int(tokens[b][d][i]) for d, i in enumerate(path)]
        keep.append([node_idx[b][d][path[d]] for d in range(K[b] - 1)])  # the path's fed nodes (depths 1..K-1)
        fed.append(x[:-1])
        blocks.append(x)
    target.commit_path(keep, fed)
    return blocks


def check_exhaustive(models, cfg) -> None:
    """``mode: exhaustive`` needs a node budget that fits and a target that takes a tree mask."""
    if cfg.mode == "exhaustive":
        check_budget(cfg, vocab_size(models.target))
        check_tree_support(models.target, "target")


def reads(cfg) -> tuple[str, ...]:
    """The keys ``mtjd`` reads: the mode, then the beam's (beam) or the tree's and the selection's (exhaustive)."""
    if cfg.mode == "beam":
        return ("mode", "beam_width", "replacement")
    return ("mode", "select", "node_budget", *(("block_top_p",) if cfg.select == "nucleus" else ()))


@register("mtjd", check=check_exhaustive, reads=reads)
def mtjd(models, batch, cfg, rng) -> None:
    """Each iteration emits, per row, a K-token block chosen from the target's joint block distribution."""
    for target, runs in batch.steps(models):
        K = [min(cfg.gamma, r.remaining) for r in runs]
        if cfg.mode == "exhaustive":
            blocks = exhaustive_blocks(target, batch, K, rng)
        else:
            blocks = beam_rows(target, batch, K, rng)[0]  # the target as the beams' proposer
        batch.commit(runs, blocks)

"""``mtjd``: exact multi-token joint decoding with the target alone (ALGORITHMS.md §4).

``mode: exhaustive`` enumerates every block reachable under the per-step filter, one batched tree pass
per level, then selects the joint's argmax (``select: argmax``) or samples from the joint restricted to
its top ``block_top_p`` mass (``select: nucleus``) **[choice]**. ``mode: beam`` runs the beam sampling of
§5 with the target as proposer and commits the highest-weight beam. Blocks carry no bonus token.
"""
from __future__ import annotations

import torch

from mtad.decoding.beam import beam_rows
from mtad.decoding.core import register, vocab_size
from mtad.decoding.filter import _nucleus_sorted, draw
from mtad.decoding.kv import Session, check_tree_support


def check_budget(cfg, V: int) -> None:
    """Refuse an exhaustive tree larger than ``node_budget`` before decoding starts."""
    k = 1 if cfg.temperature == 0 else (cfg.top_k if 0 < cfg.top_k < V else V)
    nodes = sum(k ** d for d in range(1, cfg.gamma + 1))
    if nodes > cfg.node_budget:
        raise ValueError(
            f"decoder.node_budget={cfg.node_budget} is too small: mtjd mode=exhaustive with top_k={cfg.top_k}, "
            f"gamma={cfg.gamma} may need {nodes} tree nodes; raise node_budget, lower gamma or top_k, "
            "or use mode=beam")


def exhaustive_block(target: Session, run, K: int, rng) -> list[int]:
    """Enumerate the filtered block tree level by level; return the selected block (K ids)."""
    p = run.filt(target.forward(run.pending(target))[-1])[None]  # (1, V): the root's p̃
    tokens, parents, joint, cache_idx = [], [], torch.zeros(1, device=p.device), [len(target.ids) - 1]
    for d in range(K):
        if d:  # score the previous level's nodes in one tree pass
            start = len(target)
            p = run.filt(target.forward_tree(tokens[-1].tolist(), [cache_idx[int(b)] for b in parents[-1]]))
            cache_idx = list(range(start, start + len(tokens[-1])))
        par, tok = p.nonzero(as_tuple=True)  # (N_d,), (N_d,): every child in the filtered support
        joint = joint[par] + p[par, tok].log()
        parents.append(par)
        tokens.append(tok)
    if run.cfg.select == "argmax":
        leaf = int(joint.argmax())
    else:
        order = joint.argsort(descending=True)
        kept = _nucleus_sorted(joint[order].exp(), run.cfg.block_top_p)
        leaf = int(order[int(draw(kept, rng))])
    path = [leaf]
    for d in range(K - 1, 0, -1):
        path.append(int(parents[d][path[-1]]))
    path = path[::-1]
    x = [int(tokens[d][i]) for d, i in enumerate(path)]
    starts = [len(target.ids)]
    for d in range(1, K - 1):  # cache indices of the path's fed nodes (depths 1..K-1)
        starts.append(starts[-1] + len(tokens[d - 1]))
    target.commit_path([starts[d] + path[d] for d in range(K - 1)], x[:-1])
    return x


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
    """Each iteration emits a K-token block chosen from the target's joint block distribution (one prompt)."""
    run, target = batch.one, batch.session(models.target, "target")
    while not run.done:
        K = min(cfg.gamma, run.remaining)
        if cfg.mode == "exhaustive":
            x = exhaustive_block(target.session, run, K, rng)
        else:
            x = beam_rows(target, batch, [K], rng)[0][0]  # the target as the beams' proposer
        run.commit(x)

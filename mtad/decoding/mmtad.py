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


def verify_tree(target: Session, run, tree: BeamTree):
    """Score every node of the tree in one target pass (pending tokens travel as a chain in front).
    Returns p̃ rows (1 + N, V) — row 0 at the prefix, row 1 + offset[d] + i at node i of depth d+1 —
    the cache indices of the pending chain, the nodes' cache indices per depth, and the offsets."""
    pending = run.pending(target)
    P = len(target.ids)
    chain = list(range(P, P + len(pending)))
    sizes = [len(t) for t in tree.tokens]
    offset = [sum(sizes[:d]) for d in range(len(sizes))]
    base = P + len(pending)
    parents = [c - 1 for c in chain]
    for d, par in enumerate(tree.parents):
        parents += [chain[-1]] * sizes[0] if par is None else [base + offset[d - 1] + int(b) for b in par]
    tokens = pending + torch.cat(tree.tokens).tolist()
    p = run.filt(target.forward_tree(tokens, parents, keep=sum(sizes) + 1))  # (1 + N, V)
    node_idx = [[base + offset[d] + i for i in range(n)] for d, n in enumerate(sizes)]
    return p, chain, node_idx, offset


@register("mmtad", draft=True, tree=("target", "draft"),
          reads=lambda cfg: ("beam_width", "replacement", "tau", "reference"))
def mmtad(models, batch, cfg, rng) -> None:
    """draft (beam tree, one draft cache) -> score (one target pass over all W·K nodes) ->
    accept (deepest depth with a node passing log p̃(path) - R_d > log tau) -> commit its path + bonus."""
    for target, draft, runs, K in batch.blocks(models, rng):
        run, target, draft, K = runs[0], target.session, draft.session, K[0]  # one prompt at a time
        q1 = run.filt(draft.forward(run.pending(draft))[-1])  # (V,)
        step, draft_idx = tree_step(draft, run.filt, root=len(draft.ids) - 1)
        tree = beam_sample(q1, step, K, cfg.beam_width, cfg.replacement, rng)
        p, chain, node_idx, offset = verify_tree(target, run, tree)
        rows = [torch.zeros_like(tree.tokens[0])] + [1 + offset[d - 1] + tree.parents[d] for d in range(1, K)]
        lp = path_logprobs(tree, [p[r, t].log() for r, t in zip(rows, tree.tokens)])
        lq = path_logprobs(tree, [q.log() for q in tree.q_tok])
        a, i = mmtad_accept(lp, lq, cfg.tau, cfg.reference)
        run.stats.record(K, a)
        idx = tree.path(a, i) if a else []
        x = [int(tree.tokens[d][j]) for d, j in enumerate(idx)]
        bonus = p[1 + offset[a - 1] + i] if a else p[0]
        target.commit_path(chain + [node_idx[d][j] for d, j in enumerate(idx)], run.tokens[len(target.ids):] + x)
        fed = min(a, K - 1)  # the draft never fed depth-K nodes
        draft.commit_path([draft_idx[d][j] for d, j in enumerate(idx[:fed])], x[:fed])
        run.commit(x + [int(draw(bonus, rng))])

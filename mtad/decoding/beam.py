"""Beam sampling (ALGORITHMS.md §5 step 1), shared by ``mtad`` (draft, beams in the batch dimension),
``mmtad`` (draft, beams as a token tree) and ``mtjd mode=beam`` (the target as proposer).

Weights: step 1 ``w_b ∝ q̃(token_b)``; step s >= 2 scores every (beam b, token v) by ``w_b · q̃(v|b)``,
draws W pairs proportionally (with or without replacement) and renormalises the drawn scores by their sum.
**[choice]** without replacement, a step with fewer than W non-zero pairs keeps all of them (fewer beams).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from mtad.decoding.filter import draw
from mtad.decoding.kv import One, Rows

# step(parent, tokens) feeds the newest beam tokens (W,) and returns the proposer's filtered
# distributions for their next token (W, V); parent (W,) indexes the previous step's beams, None at depth 1.
Step = Callable[[Optional[torch.Tensor], torch.Tensor], torch.Tensor]


@dataclass
class BeamTree:
    """Every node drawn during beam sampling, per depth d = 1..K (list index d-1)."""

    tokens: list[torch.Tensor]  # (W_d,)
    parents: list[Optional[torch.Tensor]]  # (W_d,) index into depth d-1; None at depth 1
    q_tok: list[torch.Tensor]  # (W_d,) q̃ of each node's token given its path
    weight: torch.Tensor  # (W_K,) normalised weights of the final beams

    def path(self, depth: int, i: int) -> list[int]:
        """Indices (per depth 1..depth) of node i's ancestors-or-self."""
        idx = [i]
        for d in range(depth - 1, 0, -1):
            idx.append(int(self.parents[d][idx[-1]]))
        return idx[::-1]

    def best(self) -> list[int]:
        """Node indices of the highest-weight beam, depth 1..K."""
        return self.path(len(self.tokens), int(self.weight.argmax()))

    def gather(self, idx: list[int], values: list[torch.Tensor]) -> list:
        return [values[d][i].item() for d, i in enumerate(idx)]

    def row(self, b: int) -> "BeamTree":
        """Row b's tree of a batched draw (:func:`beam_sample` with q1 (B, V))."""
        return BeamTree([t[b] for t in self.tokens], [None if p is None else p[b] for p in self.parents],
                        [q[b] for q in self.q_tok], self.weight[b])


def _draw_n(probs: torch.Tensor, W: int, replacement: bool, rng: torch.Generator) -> torch.Tensor:
    n = W if replacement else min(W, int((probs > 0).sum()))
    return draw(probs, rng, n, replacement)  # on probs' device: the decode device


def beam_sample(q1: torch.Tensor, step: Step, K: int, W: int, replacement: bool,
                rng: torch.Generator) -> BeamTree:
    """Draw the beam tree: q1 (V,) is the proposer's filtered distribution at the prefix; with q1 (B, V),
    B independent trees at once (a leading row dimension on every tensor; with replacement only)."""
    tok = _draw_n(q1, W, replacement, rng)  # (..., W)
    q_tok = q1.gather(-1, tok)
    tokens, parents, q_toks, weight = [tok], [None], [q_tok], q_tok / q_tok.sum(-1, keepdim=True)
    for _ in range(1, K):
        q = step(parents[-1], tokens[-1])  # (..., W, V)
        scores = weight[..., None] * q  # (..., W, V)
        flat = scores.flatten(-2)  # (..., W*V)
        idx = _draw_n(flat, W, replacement, rng)  # (..., W)
        parent, tok = idx // q.shape[-1], idx % q.shape[-1]
        tokens.append(tok)
        parents.append(parent)
        q_toks.append(q.flatten(-2).gather(-1, idx))
        drawn = flat.gather(-1, idx)
        weight = drawn / drawn.sum(-1, keepdim=True)
    return BeamTree(tokens, parents, q_toks, weight)


def tree_step(session, filt: Callable[[torch.Tensor], torch.Tensor], root: int) -> tuple[Step, list]:
    """Beams live as tree nodes of one cache (``mmtad``): each step's W nodes go in one forward with a
    tree mask. Returns the step and the list of cache indices per depth that it fills in."""
    cache_idx: list[list[int]] = []

    def step(parent, tokens):
        parents = [root] * len(tokens) if parent is None else [cache_idx[-1][int(b)] for b in parent]
        start = len(session)
        cache_idx.append(list(range(start, start + len(tokens))))
        return filt(session.forward_tree(tokens.tolist(), parents))  # (W, V)

    return step, cache_idx


def rows_step(session: Rows | One, filt: Callable[[torch.Tensor], torch.Tensor], B: int, W: int) -> Step:
    """Beams of B rows in the cache's batch dimension, W per row: parent (B, W_s) indexes the previous step's
    beams. A batch of one may keep fewer beams (without replacement): W_s = tokens.shape[-1]."""

    def step(parent, tokens):
        if parent is None:
            session.expand(tokens.shape[-1])
        else:
            session.select((parent + W * torch.arange(B, device=parent.device)[:, None]).flatten().cpu())
        return filt(session.forward_beams(tokens.flatten())).view(B, tokens.shape[-1], -1)  # (B, W_s, V)

    return step


def beam_rows(proposer: Rows | One, batch, K: list[int], rng) -> tuple[list[list[int]], torch.Tensor]:
    """Beam-sample max(K) tokens per row, W beams each in the cache's batch dimension (one forward per depth for
    all rows); row b keeps the first K[b] tokens of its highest-weight beam. Returns them and the proposer's q̃
    of those tokens (B, max K). The proposer's cache ends holding each best beam's first max(K)-1 tokens.
    Without replacement (a batch of one only) a step may keep fewer beams. **[choice]** a row whose block is
    shortened near max_new_tokens takes a prefix of the deeper draw."""
    q1 = batch.filt(proposer.forward(batch.pending(proposer))[:, -1])  # (B, V)
    B, W, k_max = q1.shape[0], batch.cfg.beam_width, max(K)
    tree = beam_sample(q1, rows_step(proposer, batch.filt, B, W), k_max, W, batch.cfg.replacement, rng)
    trees = [tree.row(b) for b in range(B)]
    best = [t.best() for t in trees]
    full = [[int(v) for v in t.gather(idx, t.tokens)] for t, idx in zip(trees, best)]  # (B, max K)
    if k_max > 1:
        proposer.keep_beams([b * W + idx[-2] for b, idx in enumerate(best)], [xb[:-1] for xb in full])
    x = [xb[:k] for xb, k in zip(full, K)]
    q_x = torch.tensor([t.gather(idx, t.q_tok) for t, idx in zip(trees, best)], device=batch.device)  # (B, max K)
    return x, q_x

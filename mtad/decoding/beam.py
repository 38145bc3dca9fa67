"""Beam sampling (ALGORITHMS.md §5 step 1), shared by ``mtad`` (draft, beams in the batch dimension),
``mmtad`` (draft, beams as a token tree) and ``mtjd mode=beam`` (the target as proposer); and the level-by-level
feeding of the token trees of ``specinfer`` and ``mtjd mode=exhaustive`` (:func:`feed_level`).

Weights: step 1 ``w_b ∝ q̃(token_b)``; step s >= 2 scores every (beam b, token v) by ``w_b · q̃(v|b)``,
draws W pairs proportionally (with or without replacement) and renormalises the drawn scores by their sum.
**[choice]** without replacement, a step with fewer than W non-zero pairs keeps all of them (fewer beams).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from mtad.decoding.filter import Top, dense, draw, draw_support
from mtad.decoding.kv import Session

# step(parent, tokens, w) feeds the newest beam tokens (B, W_s) (row b's first w[b] real) and returns the
# proposer's filtered distributions for their next token (B, W_s, V), or their top-k supports (a Top of
# (B, W_s, k)); parent (B, W_s) indexes the previous step's beams of the same row, None at depth 1.
Step = Callable[[Optional[torch.Tensor], torch.Tensor, list[int]], "torch.Tensor | Top"]


@dataclass
class BeamTree:
    """Every node drawn during beam sampling for one row, per depth d = 1..K (list index d-1)."""

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

    def prefix(self, depth: int) -> "BeamTree":
        """The first ``depth`` levels (a row whose block is shortened verifies a prefix of the deeper draw)."""
        return BeamTree(self.tokens[:depth], self.parents[:depth], self.q_tok[:depth], self.weight)


def _draw_rows(probs: torch.Tensor, W: int, replacement: bool, rng: torch.Generator) -> tuple[torch.Tensor, list[int]]:
    """W draws per row of probs (B, N) (on probs' device: the decode device): (B, W') indices and each row's
    count. Without replacement a row with fewer than W non-zero entries draws them all (fewer beams), its
    indices padded to the widest row's W' with 0."""
    if replacement:
        return draw(probs, rng, W, True), [W] * probs.shape[0]
    w = [min(W, int((row > 0).sum())) for row in probs]
    idx = torch.zeros(probs.shape[0], max(w), dtype=torch.long, device=probs.device)  # (B, W')
    for b, row in enumerate(probs):  # one draw per row: a batch of one draws as one prompt always did
        idx[b, :w[b]] = draw(row, rng, w[b], False)
    return idx, w


def _pad(x: torch.Tensor, w: list[int]) -> torch.Tensor:
    """x (B, W') with row b's entries past w[b] set to 0 (beams a row does not have weigh nothing)."""
    if min(w) == x.shape[-1]:
        return x
    return x * (torch.arange(x.shape[-1], device=x.device)[None, :] < torch.tensor(w, device=x.device)[:, None])


def beam_sample(q1: "torch.Tensor | Top", step: Step, K: int, W: int, replacement: bool,
                rng: torch.Generator) -> list[BeamTree]:
    """Draw one beam tree per row: q1 (B, V) is the proposer's filtered distribution at each row's prefix;
    every step draws for all rows at once (with replacement: one draw of (B, W); without: one per row). With
    replacement, laws given on their top-k support (:class:`Top`) are drawn on it: the same draws from the same
    uniforms (:func:`draw_support`), over W·k scored pairs instead of W·V."""
    sparse = replacement and isinstance(q1, Top)
    if sparse:
        pos = draw_support(q1.p, q1.idx, rng, W)  # (B, W)
        tok, w, q_tok = q1.idx.gather(-1, pos), [W] * q1.p.shape[0], q1.p.gather(-1, pos)
    else:
        q1 = dense(q1)
        tok, w = _draw_rows(q1, W, replacement, rng)  # (B, W')
        q_tok = _pad(q1.gather(-1, tok), w)
    tokens, parents, q_toks, widths = [tok], [None], [q_tok], [w]
    weight = q_tok / q_tok.sum(-1, keepdim=True)  # (B, W')
    for _ in range(1, K):
        q = step(parents[-1], tokens[-1], w)  # (B, W', V) or a Top of (B, W', k)
        if sparse and isinstance(q, Top):
            V = q.V
            scores = (weight[..., None] * q.p).flatten(-2)  # (B, W'k): the non-zero scores of (B, W'V)
            ids = (torch.arange(q.p.shape[1], device=q.idx.device)[:, None] * V + q.idx).flatten(-2)  # (B, W'k)
            pos = draw_support(scores, ids, rng, W)  # (B, W)
            idx, q_at, drawn = ids.gather(-1, pos), q.p.flatten(-2).gather(-1, pos), scores.gather(-1, pos)
        else:
            q = dense(q)
            V = q.shape[-1]
            flat = (weight[..., None] * q).flatten(-2)  # (B, W'*V)
            idx, w = _draw_rows(flat, W, replacement, rng)  # (B, W'')
            q_at, drawn = _pad(q.flatten(-2).gather(-1, idx), w), _pad(flat.gather(-1, idx), w)
        parent, tok = idx // V, idx % V
        tokens.append(tok)
        parents.append(parent)
        q_toks.append(q_at)
        widths.append(w)
        weight = drawn / drawn.sum(-1, keepdim=True)
    return [BeamTree([t[b, :ws[b]] for t, ws in zip(tokens, widths)],
                     [None if p is None else p[b, :ws[b]] for p, ws in zip(parents, widths)],
                     [q[b, :ws[b]] for q, ws in zip(q_toks, widths)], weight[b, :w[b]])
            for b in range(len(w))]


def _left(x: torch.Tensor, w: list[int]) -> torch.Tensor:
    """Row b's last w[b] entries of x (B, S, ...) moved to its front, the rest zero: (B, max w, ...)."""
    if min(w) == x.shape[1]:
        return x
    out = x.new_zeros(x.shape[0], max(w), *x.shape[2:])
    for b, n in enumerate(w):
        out[b, :n] = x[b, x.shape[1] - n:]
    return out


def tree_step(session: Session, filt: Callable[[torch.Tensor], "torch.Tensor | Top"]) -> tuple[Step, list]:
    """Beams live as tree nodes of one cache per row (``mmtad``): each step's nodes of every row go in one
    forward with a tree mask. Returns the step and the node indices it fills in, per row and depth."""
    B = len(session.ids)
    node_idx: list[list[list[int]]] = [[] for _ in range(B)]

    def step(parent, tokens, w):
        parents = [[len(session.ids[b]) - 1] * w[b] if parent is None else
                   [node_idx[b][-1][int(j)] for j in parent[b, :w[b]]] for b in range(B)]
        for b in range(B):
            start = session.size(b)
            node_idx[b].append(list(range(start, start + w[b])))
        logits = session.forward_tree([tokens[b, :w[b]].tolist() for b in range(B)], parents)  # (B, S, V)
        return filt(_left(logits, w))  # (B, max w, V)

    return step, node_idx


def feed_level(session: Session, filt: Callable[[torch.Tensor], torch.Tensor], rows: list[int], tokens: list,
               parents: list, prev: list[list[int]], node_idx: list[list[list[int]]]) -> dict[int, torch.Tensor]:
    """Feed the newest level of the token trees of ``rows`` in one tree pass (``specinfer``'s draft tree,
    ``mtjd``'s exhaustive tree): row b's nodes ``tokens[b][-1]`` (N_b,) hang off its previous level, whose indices
    are ``prev[b]``, at ``parents[b][-1]`` (N_b,). Records the new nodes' indices in ``prev`` and ``node_idx``;
    returns each row's filtered distributions of their children (N_b, V)."""
    B = len(tokens)
    feed = [tokens[b][-1].tolist() if b in rows else [] for b in range(B)]
    up = [[prev[b][int(j)] for j in parents[b][-1]] if b in rows else [] for b in range(B)]
    start = [session.size(b) for b in range(B)]
    out = session.forward_tree(feed, up)  # (B, S, V): row b's last len(feed[b])
    for b in rows:
        prev[b] = list(range(start[b], start[b] + len(feed[b])))
        node_idx[b].append(prev[b])
    return {b: filt(out[b, out.shape[1] - len(feed[b]):]) for b in rows}


def rows_step(session: Session, filt: Callable[[torch.Tensor], "torch.Tensor | Top"]) -> Step:
    """Beams in the cache's batch dimension, row b's w[b] beams consecutive: parent (B, W_s) indexes the previous
    step's beams of the same row."""
    widths: list[int] = []

    def step(parent, tokens, w):
        if parent is None:
            session.expand(w)
        else:
            start = [sum(widths[:b]) for b in range(len(w))]
            session.select(torch.cat([parent[b, :n].cpu() + start[b] for b, n in enumerate(w)]))
        widths[:] = w
        flat = torch.cat([tokens[b, :n] for b, n in enumerate(w)]) if min(w) < tokens.shape[1] else tokens.flatten()
        q = filt(session.forward_beams(flat))  # (sum w, V), or a Top of (sum w, k)
        if min(w) == max(w):
            if isinstance(q, Top):
                return Top(q.p.view(len(w), w[0], -1), q.idx.view(len(w), w[0], -1), q.V)  # (B, W_s, k)
            return q.view(len(w), w[0], -1)  # (B, W_s, V)
        q = dense(q)
        out = q.new_zeros(len(w), max(w), q.shape[-1])  # (B, max w, V)
        for b, n in enumerate(w):
            out[b, :n] = q[sum(w[:b]):sum(w[:b]) + n]
        return out

    return step


def beam_rows(proposer: Session, batch, K: list[int], rng) -> tuple[list[list[int]], torch.Tensor]:
    """Beam-sample max(K) tokens per row, W beams each (or fewer, without replacement) in the cache's batch
    dimension (one forward per depth for all rows); row b keeps the first K[b] tokens of its highest-weight
    beam. Returns them and the proposer's q̃ of those tokens (B, max K). The proposer's cache ends holding each
    best beam's first max(K)-1 tokens. **[choice]** a row whose block is shortened near max_new_tokens takes a
    prefix of the deeper draw."""
    q1 = batch.law(proposer.forward(batch.pending(proposer))[:, -1])  # (B, V) or its Top
    k_max = max(K)
    trees = beam_sample(q1, rows_step(proposer, batch.law), k_max, batch.cfg.beam_width, batch.cfg.replacement, rng)
    best = [t.best() for t in trees]
    full = [[int(v) for v in t.gather(idx, t.tokens)] for t, idx in zip(trees, best)]  # (B, max K)
    if k_max > 1:
        fed = [len(t.tokens[-2]) for t in trees]  # beams per row in the last fed step
        proposer.keep_beams([sum(fed[:b]) + idx[-2] for b, idx in enumerate(best)])
    x = [xb[:k] for xb, k in zip(full, K)]
    q_x = torch.tensor([t.gather(idx, t.q_tok) for t, idx in zip(trees, best)], device=batch.device)  # (B, max K)
    return x, q_x

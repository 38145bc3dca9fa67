"""``dyntree`` (ALGORITHMS.md §8): the dynamic draft tree and its two rules, without models.

- **Exact law.** On a fixture with a three-token vocabulary and path-dependent target and draft laws (zeros
  included: filtered supports), the real tree builder (:func:`grow`, :func:`prune`) and the real lossless walk
  (:func:`walk`) give the first three emitted tokens exactly the target's law, for several widths and budgets.
  Uniforms enter the walk only through ``u < h`` with one threshold per (node, child), which the spec fixes
  (child i of a node passes with probability r_i(x_i), r_i = p̃ without the earlier children, renormalised), so
  enumerating every pass/fail pattern with its probability gives the law exactly; each pattern's uniforms sit
  just inside its side of h, so a rule whose threshold differs from the spec's takes another branch. Control: the
  same rule without removing the rejected children (every child tested against p̃) moves the law.
- **The worked example** of ALGORITHMS.md §8: the tree, the lossless first-token law and the joint rule's choice.
- **The tree** is the EAGLE-2 tree: expanding only nodes still among the best ``tree_nodes`` keeps the same
  nodes as expanding every best frontier node (random laws), and the kept nodes form a closed subtree.
- **On tiny models**: the first two tokens of 500 decodes follow the exact filtered target joint (Pearson
  chi-square below chi2.ppf(0.999, dof), small cells pooled; fixed seeds, so deterministic), and with the planted
  wrong residual they do not; at T = 0 both rules equal the greedy oracle (token and feature drafts, llama and
  OPT) and every row of a batch equals its one-prompt decode, which one tree mask for all rows breaks.
  Measured statistic (bound): lossless 5.1 (27.9), wrong residual 111.8.
The generic tests of every decoder (test_decoders.py, test_batch.py) cover it too, through conf/decoder/.
"""
from __future__ import annotations

import functools
import math
from itertools import product

import pytest
import tinymodels as tm
import torch

import mtad
import mtad.decoding.dyntree as dyntree_mod
from mtad.decoding import DecoderConfig
from mtad.decoding.dyntree import Candidates, grow, prune, walk
from mtad.decoding.filter import filter_probs
from mtad.decoding.kv import Session
from mtad.decoding.mmtad import accept_tree
from mtad.models.pair import ModelPair

torch.set_num_threads(1)
V = 3
a, b, c = 0, 1, 2


def laws(seed: int, zeros: dict) -> dict:
    """A law over V tokens for every path of length 0..2 (a dict path tuple -> (V,) float64); ``zeros[path]``
    lists tokens cut from that path's support (a filter's zeros)."""
    g, out = torch.Generator().manual_seed(seed), {}
    for n in range(3):
        for path in product(range(V), repeat=n):
            w = torch.rand(V, generator=g, dtype=torch.float64) + 0.05
            w[list(zeros.get(path, ()))] = 0
            out[path] = w / w.sum()
    return out


P = laws(1, {(): [c], (a,): [a]})  # the target: p̃(c) = 0 at the root, p̃(a | a) = 0
Q = laws(2, {(b,): [b, c]})  # the draft: one child only below b


def table_step(q: dict):
    """A proposer :data:`~mtad.decoding.dyntree.Step` from a table of laws, as the draft session's step behaves."""

    def step(expand, cands):
        out = {}
        for row, nodes in expand.items():
            for j, i in enumerate(nodes):
                cands[row].pos[i], cands[row].fed[i] = j, 100 + i
            out[row] = torch.stack([q[tuple(cands[row].path(i))] for i in nodes])  # (n, V)
        return out

    return step


def build(q: dict, width: int, budget: int, depth: int = 2):
    cands = grow({0: q[()][None]}, table_step(q), [depth], width, budget)[0]
    tree, fed = prune(cands, budget, "cpu")
    return cands, tree, fed


def node_laws(tree, p: dict) -> tuple[torch.Tensor, list[int], list[tuple]]:
    """p̃ rows (1 + N, V) in :func:`verify_tree`'s layout (root, then depth by depth), offsets, node paths."""
    paths, offset, rows = [()], [], [p[()]]
    for d, tokens in enumerate(tree.tokens):
        offset.append(len(paths) - 1)
        for i, t in enumerate(tokens.tolist()):
            up = () if d == 0 else paths[1 + offset[d - 1] + int(tree.parents[d][i])]
            paths.append(up + (t,))
            rows.append(p[up + (t,)])
    return torch.stack(rows), offset, paths


def thresholds(tree, paths, offset, p: dict) -> dict:
    """The spec: (d, node) -> the pass thresholds of that node's children, child i passing with probability
    r_i(x_i), r_i = p̃ at the node without the children before i, renormalised."""
    out = {}
    for d, tokens in enumerate(tree.tokens):
        ups = [-1] * len(tokens) if d == 0 else tree.parents[d].tolist()
        for node in sorted(set(ups)):
            law = p[paths[0 if node < 0 else 1 + offset[d - 1] + node]].clone()
            h = []
            for i in (i for i, u in enumerate(ups) if u == node):
                x = int(tokens[i])
                h.append(float(law[x] / law.sum()) if law.sum() > 0 else 0.0)
                law[x] = 0
            out[(d, node)] = h
    return out


def emitted3(x: list[int], nxt: torch.Tensor, p: dict) -> torch.Tensor:
    """Law (V, V, V) of the first 3 tokens: the path x, one token from ``nxt``, then target sampling."""
    law = torch.zeros(V, V, V, dtype=torch.float64)
    for y in range(V):
        seq = tuple(x) + (y,)
        for rest in product(range(V), repeat=3 - len(seq)):
            full, w = seq + rest, float(nxt[y])
            for k in range(len(seq), 3):
                w *= float(p[full[:k]][full[k]])
            if len(full) == 3:
                law[full] += w
    return law


def target3(p: dict) -> torch.Tensor:
    return emitted3([], p[()], p)


def exact_law(tree, p: dict) -> torch.Tensor:
    """The law of the first 3 tokens that :func:`walk` emits, over every pass/fail pattern of its uniforms."""
    rows, offset, paths = node_laws(tree, p)
    h = thresholds(tree, paths, offset, p)
    slots = [(key, i) for key, hs in h.items() for i in range(len(hs))]
    law = torch.zeros(V, V, V, dtype=torch.float64)
    for passes in product((True, False), repeat=len(slots)):
        weight, u = 1.0, {key: [0.0] * len(hs) for key, hs in h.items()}
        for ((key, i), ok) in zip(slots, passes):
            hi = h[key][i]
            weight *= hi if ok else 1 - hi
            u[key][i] = hi * (1 - EDGE) if ok else hi + (1 - hi) * EDGE  # just inside: a rule off by more fails
        if weight == 0:
            continue
        path, nxt = walk(tree, rows, offset, lambda d, node, k, u=u: torch.tensor(u[(d, node)], dtype=torch.float64))
        x = [int(tree.tokens[d][j]) for d, j in enumerate(path)]
        law += weight * emitted3(x, nxt, p)
    return law


EDGE = 1e-9
SHAPES = [(1, 1), (1, 2), (2, 2), (2, 3), (2, 6), (3, 4), (3, 12)]  # (tree_width, tree_nodes)
FIXTURES = {"zeros": (P, Q), "full": (laws(3, {}), laws(4, {}))}


@pytest.mark.parametrize("fixture", list(FIXTURES))
@pytest.mark.parametrize("width,budget", SHAPES, ids=[f"w{w}-n{n}" for w, n in SHAPES])
def test_lossless_walk_emits_the_target_law_exactly(fixture, width, budget):
    p, q = FIXTURES[fixture]
    _, tree, _ = build(q, width, budget)
    assert sum(len(t) for t in tree.tokens) == min(budget, sum(len(t) for t in build(q, width, 99)[1].tokens))
    law = exact_law(tree, p)
    assert abs(float(law.sum()) - 1) < 1e-12
    assert torch.allclose(law, target3(p), atol=1e-12), (law - target3(p)).abs().max()


def no_removal(p, q, xs, u):
    """Broken: every child tested against p̃ itself (the rejected children are not removed from the residual)."""
    for i in range(xs.shape[0]):
        if u[i] < float(p[int(xs[i])]):
            return i, p
    r = p.clone()
    r[xs] = 0
    return -1, r / r.sum() if r.sum() > 0 else p


@pytest.mark.parametrize("fixture,width,budget", [("zeros", 3, 12), ("full", 2, 3), ("full", 2, 6)])
def test_a_wrong_residual_moves_the_law(fixture, width, budget, monkeypatch):
    """Control: with the rejected children left in the residual the same enumeration leaves the target law."""
    p, q = FIXTURES[fixture]
    _, tree, _ = build(q, width, budget)
    monkeypatch.setattr(dyntree_mod, "multi_draft_accept", no_removal)
    law = exact_law(tree, p)
    assert law.isfinite().all() and (law - target3(p)).abs().max() > 1e-3


# ---- the worked example of ALGORITHMS.md §8 ----------------------------------------------------------------
def example_laws() -> tuple[dict, dict]:
    q = {(): [0.6, 0.3, 0.1], (a,): [0.1, 0.7, 0.2], (b,): [0.5, 0.3, 0.2]}
    p = {(): [0.5, 0.3, 0.2], (a,): [0.2, 0.5, 0.3], (b,): [0.6, 0.1, 0.3]}
    uniform = [1 / 3] * 3
    full = lambda t: {k: torch.tensor(t.get(k, uniform), dtype=torch.float64) for n in range(3)
                      for k in product(range(V), repeat=n)}
    return full(q), full(p)


def test_worked_example():
    q, p = example_laws()
    cands, tree, fed = build(q, 2, 4)
    # drafted: a .6, b .3 | ab .42, ac .12 (below a), ba .15, bb .09 (below b); kept: a, ab, b, ba
    assert sorted(round(math.exp(v), 6) for v in cands.logv) == [0.09, 0.12, 0.15, 0.3, 0.42, 0.6]
    assert [t.tolist() for t in tree.tokens] == [[a, b], [b, a]] and tree.parents[1].tolist() == [0, 1]
    assert fed == [[100, 101], [-1, -1]]  # depth-1 nodes were fed to expand them, the leaves were not
    rows, offset, paths = node_laws(tree, p)
    assert thresholds(tree, paths, offset, p)[(0, -1)] == pytest.approx([0.5, 0.6])  # a: p(a); b: .3 / (1 - .5)
    # all children of the root fail with probability .5 * .4 = .2, and then the residual is c for sure
    _, rest = walk(tree, rows, offset, lambda d, node, k: torch.full((k,), 0.99, dtype=torch.float64))
    assert rest.tolist() == [0.0, 0.0, 1.0]
    assert torch.allclose(exact_law(tree, p), target3(p), atol=1e-12)
    # the joint rule (reference max, tau 0.5): p(ab) / R_2 = .25 / .42 passes, p(ba) / R_2 = .18 / .42 fails
    cfg = DecoderConfig(name="dyntree", accept="joint", tau=0.5)
    assert accept_tree(tree, rows.float(), offset, cfg) == (2, [0, 0])
    assert accept_tree(tree, rows.float(), offset, DecoderConfig(name="dyntree", accept="joint", tau=0.6)) == (1, [0])


# ---- the tree -------------------------------------------------------------------------------------------------
def eagle2_tree(q: dict, width: int, budget: int, depth: int) -> set[tuple]:
    """The reference: expand the ``width`` best frontier nodes at every depth (none skipped), keep the best
    ``budget`` of all nodes; the kept nodes' paths."""
    nodes = {(t,): float(q[()][t]) for t in q[()].topk(width).indices.tolist() if q[()][t] > 0}
    frontier = list(nodes)
    for _ in range(depth - 1):
        grown = {}
        for path in sorted(frontier, key=lambda s: -nodes[s])[:width]:
            law = q[path]
            for t in law.topk(width).indices.tolist():
                if law[t] > 0:
                    grown[path + (t,)] = nodes[path] * float(law[t])
        nodes.update(grown)
        frontier = list(grown)
    return set(sorted(nodes, key=lambda s: (-nodes[s], len(s)))[:budget])


def kept_paths(cands: Candidates, budget: int) -> set[tuple]:
    return {tuple(cands.path(i)) for i in cands.ranked()[:budget]}


@pytest.mark.parametrize("seed", range(6))
def test_the_kept_tree_is_eagle2s_and_closed(seed, monkeypatch):
    g = torch.Generator().manual_seed(seed)
    q = {k: torch.softmax(3 * torch.randn(4, generator=g, dtype=torch.float64), 0)
         for n in range(4) for k in product(range(4), repeat=n)}
    for width, budget in [(2, 3), (2, 5), (3, 7), (4, 10)]:
        cands = grow({0: q[()][None]}, table_step(q), [4], width, budget)[0]
        kept = kept_paths(cands, budget)
        assert kept == eagle2_tree(q, width, budget, 4)
        assert all(s[:-1] in kept for s in kept if len(s) > 1)
        tree, _ = prune(cands, budget, "cpu")
        assert sum(len(t) for t in tree.tokens) == len(kept) <= budget
    # control: without the re-ranking (the first nodes drawn up instead of the best) the tree differs
    monkeypatch.setattr(Candidates, "ranked", lambda self: list(range(len(self.tok))))
    cands = grow({0: q[()][None]}, table_step(q), [4], 3, 7)[0]
    assert kept_paths(cands, 7) != eagle2_tree(q, 3, 7, 4)


def test_config_keys():
    with pytest.raises(ValueError, match=r"decoder.accept='block' .*lossless \| joint"):
        DecoderConfig(name="dyntree", accept="block")
    with pytest.raises(ValueError, match=r"decoder.accept='joint' .*lossless \| threshold"):
        DecoderConfig(name="speculative", accept="joint")
    for key in ("tree_width", "tree_nodes"):
        with pytest.raises(ValueError, match=rf"decoder.{key}=0 .*>= 1"):
            DecoderConfig(name="dyntree", **{key: 0})
    DecoderConfig(name="dyntree", accept="joint", tree_width=1, tree_nodes=1)


# ---- on tiny models -----------------------------------------------------------------------------------------------
PROMPT, PROMPTS, N_NEW = [5, 7, 11], [[5, 7, 11], [1, 2, 3, 4, 5, 6, 7, 8], [9]], 13
RULES = [{}, {"accept": "joint"}, {"tree_width": 2, "tree_nodes": 3}, {"tree_width": 1, "tree_nodes": 2}]


@functools.cache
def pair(arch: str, draft: str = "near") -> ModelPair:
    t = tm.model(arch, 1, 32, hidden=16)
    if draft == "feature":
        import test_batch  # its feature draft: a copy of the target reading the target's hidden states

        return ModelPair(t, test_batch.feature_draft(t))
    return ModelPair(t, tm.near(t, 5, 0.02) if draft == "near" else tm.model(arch, 2, 32, hidden=16))


@pytest.mark.parametrize("arch,draft", [("llama", "near"), ("opt", "near"), ("llama", "random"),
                                        ("llama", "feature")])
@pytest.mark.parametrize("extra", RULES, ids=lambda e: "-".join(f"{k}={v}" for k, v in e.items()) or "default")
def test_t0_equals_greedy_and_batch_rows_equal_their_own(arch, draft, extra):
    c = dict(name="dyntree", **extra, temperature=0, max_new_tokens=N_NEW, gamma=3)
    rows = mtad.generate(pair(arch, draft), PROMPTS, c, torch.Generator().manual_seed(0))
    accepted = []
    for r, p in zip(rows, PROMPTS):
        alone = mtad.generate(pair(arch, draft), p, c, torch.Generator().manual_seed(0))
        assert r.tokens == alone.tokens == tm.oracle_greedy(pair(arch, draft).target, p, N_NEW)
        assert (r.accepted, r.proposed, r.target_forwards) == (alone.accepted, alone.proposed, alone.target_forwards)
        accepted += [(x, y) for x, y in zip(r.accepted, r.proposed)]
    if draft != "random":  # guard: blocks are cut short and accepted whole
        assert any(x < y for x, y in accepted) and any(x == y >= 2 for x, y in accepted)


def test_a_broken_batch_fails_row_equality(monkeypatch):
    """Control for the test above: every row given row 0's tree mask makes some row leave its greedy decode."""
    orig = Session._tree_mask
    monkeypatch.setattr(Session, "_tree_mask", lambda self, visible, pos, key_pos:
                        orig(self, visible[:1].expand_as(visible), pos, key_pos))
    c = dict(name="dyntree", temperature=0, max_new_tokens=N_NEW, gamma=3)
    rows = mtad.generate(pair("llama"), PROMPTS, c, torch.Generator().manual_seed(0))
    assert any(r.tokens != tm.oracle_greedy(pair("llama").target, p, N_NEW) for r, p in zip(rows, PROMPTS))


FILT = dict(temperature=1.0, top_k=0, top_p=1.0)
DIST_PROMPT, N_DRAWS, DV = [1, 2, 3], 500, 4


@functools.cache
def dist_pair() -> ModelPair:
    """Peaky, clearly different target and draft on 4 tokens: the test has power."""
    return ModelPair(tm.model("llama", 1, DV, hidden=16, layers=1, std=0.5),
                     tm.model("llama", 2, DV, hidden=16, layers=1, std=1.0))


def chi_square_of_first_two(seed: int = 1) -> tuple[float, float]:
    """Pearson chi-square of the first two tokens of ``N_DRAWS`` decodes (``max_new_tokens=3, gamma=2``, a tree
    of 2 children per node and 4 nodes: acceptance at both depths, residuals and bonuses all occur) against the
    exact filtered target joint, and its bound."""
    m, f = dist_pair().target, (lambda x: filter_probs(x, **FILT))
    logits = tm.batch_logits(m, [DIST_PROMPT + [t] for t in range(DV)])  # (V, T, V)
    exact = f(logits[0, len(DIST_PROMPT) - 1])[:, None] * f(logits[:, len(DIST_PROMPT)])  # (V, V)
    g, counts = torch.Generator().manual_seed(seed), torch.zeros(DV, DV)
    c = dict(name="dyntree", **FILT, max_new_tokens=3, gamma=2, tree_width=2, tree_nodes=4)
    for _ in range(N_DRAWS):
        t = mtad.generate(dist_pair(), DIST_PROMPT, c, g).tokens
        counts[t[0], t[1]] += 1
    return tm.chi_square(counts, exact)


def test_lossless_on_a_tiny_model_and_a_wrong_residual_fails(monkeypatch):
    ok, bound = chi_square_of_first_two()
    assert ok < bound, f"dyntree is not lossless: chi2 {ok:.1f} >= {bound:.1f}"
    monkeypatch.setattr(dyntree_mod, "multi_draft_accept", no_removal)
    bad, _ = chi_square_of_first_two()
    assert bad > bound, f"the wrong residual passed: chi2 {bad:.1f} <= {bound:.1f}; the test has no power"

"""The acceptance rules of :mod:`mtad.decoding.accept` as pure functions of probabilities (no model).

Lossless rules (``speculative_accept``, ``multi_draft_accept``) are checked by simulation on synthetic
p, q with 20,000 draws against the exact target distribution (Pearson chi-square < chi2.ppf(0.999, dof),
cells with expected count < 5 pooled); each has a broken variant (5,000 draws) that must exceed its bound.
Seeds are fixed, so the outcome is deterministic. Measured statistic (bound):
speculative_accept 19.8 (43.8), broken 788.9 (37.7); multi_draft_accept k=3 5.3 (16.3), broken 1013.0 (16.3);
k=1 0.1 (16.3).
"""
from __future__ import annotations

import math
import sys

import pytest
import tinymodels as tm
import torch

from mtad.decoding.accept import (
    mmtad_accept,
    mtad_accept,
    multi_draft_accept,
    residual,
    speculative_accept,
    threshold_accept,
)

torch.set_num_threads(1)
N = 20_000
V = 5


def dist(seed: int, zero: tuple[int, ...] = (), scale: float = 1.5) -> torch.Tensor:
    """A random distribution over V tokens with the given tokens forced to 0 (a filtered support)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(scale * torch.randn(V, generator=g), -1)
    p[list(zero)] = 0.0
    return p / p.sum()


# position-indexed target P[s] and draft Q[s]; supports differ in both directions
P = torch.stack([dist(0, (4,)), dist(1), dist(2, (1,)), dist(3)])  # (4, V)
Q = torch.stack([dist(10), dist(11, (0,)), dist(12)])  # (3, V)


# ---- speculative_accept ------------------------------------------------------------------------------------
def broken_speculative(p, q, x, u):
    """No residual: after a rejection the next token comes from p̃ itself."""
    n, nxt = speculative_accept(p, q, x, u)
    return n, (p[n] if n < x.shape[0] else nxt)


def first_two(accept, n: int, seed: int = 0) -> torch.Tensor:
    """Counts (V, V) of the first two tokens emitted by speculative decoding with K=2 on the synthetic,
    context-free chain P (target) / Q (draft): the iteration at position s drafts x_j ~ Q[s+j], verifies
    against P[s:s+3] and emits x_{1..n} + one token; an iteration that emits one token is followed by one
    at s=1. Draft tokens and uniforms are drawn in bulk up front (one set per possible iteration)."""
    g, counts = torch.Generator().manual_seed(seed), torch.zeros(V, V)
    x = [torch.multinomial(Q[s:s + 2], n, replacement=True, generator=g).T for s in (0, 1)]  # (n, K) each
    u = torch.rand(2, n, 2, generator=g)  # (iteration, n, K)
    for r in range(n):
        out = []
        for s in (0, 1):
            if len(out) == s:
                k, nxt = accept(P[s:s + 3], Q[s:s + 2], x[s][r], u[s, r])
                out += x[s][r, :k].tolist() + [int(torch.multinomial(nxt, 1, generator=g))]
        counts[out[0], out[1]] += 1
    return counts


def test_speculative_accept_is_lossless_and_broken_variant_fails():
    """Every emitted token is distributed as p̃: the joint of the first two is P[0] ⊗ P[1]."""
    J = P[0][:, None] * P[1][None]  # (V, V)
    ok, bound = tm.chi_square(first_two(speculative_accept, N), J)
    assert ok < bound, (ok, bound)
    bad, bad_bound = tm.chi_square(first_two(broken_speculative, N // 4), J)
    assert bad > bad_bound, (bad, bad_bound)


def test_speculative_accept_deterministic_cases():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])  # (K+1, V)
    q = torch.tensor([[0.25, 0.25, 0.5], [0.2, 0.6, 0.2]])  # (K, V)
    # x_1 = 0: ratio 2 -> always accepted; x_2 = 1: ratio 0.5 -> accepted iff u < 0.5
    n, nxt = speculative_accept(p, q, torch.tensor([0, 1]), torch.tensor([0.99, 0.49]))
    assert n == 2 and torch.equal(nxt, p[2])  # bonus from p_{K+1}
    n, nxt = speculative_accept(p, q, torch.tensor([0, 1]), torch.tensor([0.99, 0.51]))
    assert n == 1 and torch.allclose(nxt, torch.tensor([0.0, 0.0, 1.0]))  # norm(max(0, p_2 - q_2))
    # x_1 = 2 has p = 0: rejected whatever u; residual of position 1
    n, nxt = speculative_accept(p, q, torch.tensor([2, 1]), torch.tensor([0.0, 0.0]))
    assert n == 0 and torch.allclose(nxt, torch.tensor([0.5, 0.5, 0.0]))


def test_residual():
    assert torch.allclose(residual(torch.tensor([0.6, 0.4, 0.0]), torch.tensor([0.2, 0.4, 0.4])),
                          torch.tensor([1.0, 0.0, 0.0]))
    p = torch.tensor([0.3, 0.7])
    assert torch.equal(residual(p, p.clone()), p)  # p == q: falls back to p


# ---- multi_draft_accept (SpecInfer) -------------------------------------------------------------------------
def broken_multi_draft(p, q, xs, u):
    """No residual update between children: every child is tested against p̃."""
    for i in range(xs.shape[0]):
        if u[i] < min(1.0, float(p[xs[i]] / q[xs[i]])):
            return i, p
    return -1, residual(p, q)


def multi_draft_counts(accept, p, q, k: int, n: int, seed: int = 0) -> torch.Tensor:
    """Counts (V,) of the token emitted at one node with k i.i.d. children x_i ~ q."""
    g, counts = torch.Generator().manual_seed(seed), torch.zeros(V)
    xs = torch.multinomial(q, n * k, replacement=True, generator=g).view(n, k)  # (n, k)
    u = torch.rand(n, k, generator=g)  # (n, k)
    for r in range(n):
        i, rest = accept(p, q, xs[r], u[r])
        counts[int(xs[r, i]) if i >= 0 else int(torch.multinomial(rest, 1, generator=g))] += 1
    return counts


@pytest.mark.parametrize("k", [1, 3])
def test_multi_draft_accept_is_lossless_and_broken_variant_fails(k):
    p, q = dist(20, (3,)), dist(21, (0,), scale=0.5)
    ok, bound = tm.chi_square(multi_draft_counts(multi_draft_accept, p, q, k, N), p)
    assert ok < bound, (ok, bound)
    if k > 1:  # with one child the broken rule is the correct one
        bad, bad_bound = tm.chi_square(multi_draft_counts(broken_multi_draft, p, q, k, N // 4), p)
        assert bad > bad_bound, (bad, bad_bound)


def test_multi_draft_accept_identical_distributions_accept_the_first_child():
    p = dist(5)
    for s in range(20):
        g = torch.Generator().manual_seed(s)
        xs = torch.multinomial(p, 3, replacement=True, generator=g)
        assert multi_draft_accept(p, p.clone(), xs, torch.rand(3, generator=g))[0] == 0


# ---- threshold_accept ---------------------------------------------------------------------------------------
def test_threshold_accept():
    p = torch.tensor([[0.5, 0.5], [0.2, 0.8], [0.9, 0.1]])  # (K+1, V)
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]])  # (K, V)
    n, nxt = threshold_accept(p, q, torch.tensor([0, 0]), tau=0.5)  # ratios 1.0, 0.4
    assert n == 1 and torch.equal(nxt, p[1])  # next from p̃ at the failing position, no residual
    n, nxt = threshold_accept(p, q, torch.tensor([0, 1]), tau=0.5)  # ratios 1.0, 1.6
    assert n == 2 and torch.equal(nxt, p[2])
    assert threshold_accept(p, q, torch.tensor([0, 1]), tau=1.0)[0] == 0  # ratio 1.0 is not > 1


# ---- mtad_accept ------------------------------------------------------------------------------------------------
def lq(n: int) -> torch.Tensor:
    return torch.zeros(n)


def test_mtad_longest_passing_prefix():
    log_tau = math.log(0.5)  # -0.693
    # L = [-1.0, -0.2, -0.1]: the first prefix fails, longer ones pass -> all 3 accepted
    assert mtad_accept(torch.tensor([-1.0, 0.8, 0.1]), lq(3), 0.5) == 3
    # L = [-1.0, -0.5, -1.5]: only d=2 passes
    assert mtad_accept(torch.tensor([-1.0, 0.5, -1.0]), lq(3), 0.5) == 2
    # L = [-0.5, -1.0, -1.5]: only d=1
    assert mtad_accept(torch.tensor([-0.5, -0.5, -0.5]), lq(3), 0.5) == 1
    # nothing passes
    assert mtad_accept(torch.tensor([-1.0, -0.1, -0.1]), lq(3), 0.5) == 0
    # the draft's log q enters with a minus sign: q small -> ratio large
    assert mtad_accept(torch.tensor([-3.0, -3.0]), torch.tensor([-3.0, -4.0]), 0.5) == 2
    # strict inequality at the threshold
    assert mtad_accept(torch.tensor([log_tau]), lq(1), 0.5) == 0


def test_mtad_minus_infinity():
    inf = math.inf
    assert mtad_accept(torch.tensor([0.0, -inf, 0.0]), lq(3), 0.5) == 1
    assert mtad_accept(torch.tensor([-inf, 100.0, 100.0]), lq(3), 0.5) == 0  # -inf + x stays -inf
    assert mtad_accept(torch.tensor([-inf]), lq(1), sys.float_info.min) == 0


def random_blocks(n: int, K: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(K, generator=g) * 2 - 0.5, torch.randn(K, generator=g)) for _ in range(n)]


def test_mtad_tau_monotone():
    """The accepted length never shrinks as tau decreases."""
    taus = [1.0, 0.9, 0.5, 0.3, 0.1, 0.01, 1e-4]
    for log_p, log_q in random_blocks(300):
        a = [mtad_accept(log_p, log_q, t) for t in taus]
        assert a == sorted(a), a


def test_mtad_tau_to_zero_accepts_every_finite_block():
    assert all(mtad_accept(lp, lq_, sys.float_info.min) == 4 for lp, lq_ in random_blocks(300))
    assert sum(mtad_accept(lp, lq_, 1.0) == 4 for lp, lq_ in random_blocks(300)) < 300  # tau=1 does not


def test_mtad_identical_draft_accepts_all():
    log_p = torch.log(torch.tensor([0.3, 0.01, 0.9]))
    assert mtad_accept(log_p, log_p.clone(), 0.999) == 3


# ---- mmtad_accept --------------------------------------------------------------------------------------------
def test_mmtad_deepest_passing_depth_and_best_target_joint():
    # depth 1 passes, depth 2 does not, depth 3 does: accepted depth 3
    lp = [torch.tensor([-1.0, -2.0]), torch.tensor([-9.0, -9.0]), torch.tensor([-3.0, -2.5, -6.0])]
    lq_ = [torch.tensor([-1.0, -1.5]), torch.tensor([-2.0, -3.0]), torch.tensor([-3.0, -2.9, -2.4])]
    # reference max: R_3 = -2.4; node passes when lp > -2.4 + log 0.5 = -3.09 -> nodes 0, 1; best lp: node 1
    assert mmtad_accept(lp, lq_, 0.5, "max") == (3, 1)
    # reference own: lp - lq = [0, 0.4, -3.6] -> nodes 0, 1 pass; best target joint still node 1
    assert mmtad_accept(lp, lq_, 0.5, "own") == (3, 1)


def test_mmtad_own_reference_can_reject_the_best_target_node():
    lp = [torch.tensor([-0.5, -1.0, -4.0])]
    lq_ = [torch.tensor([-0.1, -1.2, -0.2])]
    # own: lp - lq = [-0.4, 0.2, -3.8] > log 0.9 = -0.105 -> only node 1
    assert mmtad_accept(lp, lq_, 0.9, "own") == (1, 1)
    # max: R = -0.1; lp + 0.1 > -0.105 -> none pass
    assert mmtad_accept(lp, lq_, 0.9, "max") == (0, -1)


def test_mmtad_nothing_passes_and_minus_infinity():
    inf = math.inf
    lp = [torch.tensor([-inf, -5.0]), torch.tensor([-inf, -inf])]
    lq_ = [torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -2.0])]
    assert mmtad_accept(lp, lq_, 0.5) == (0, -1)
    lp = [torch.tensor([-inf, -1.0]), torch.tensor([-inf, -2.0])]
    assert mmtad_accept(lp, lq_, 0.5) == (2, 1)


@pytest.mark.parametrize("reference", ["max", "own"])
def test_mmtad_single_beam_equals_mtad(reference):
    """With W=1 the tree is a chain, R_d is the chain's own draft joint: the rule is MTAD's."""
    for log_p, log_q in random_blocks(300, seed=1):
        for tau in (1.0, 0.5, 0.05):
            a, i = mmtad_accept([x[None] for x in log_p.cumsum(0)], [x[None] for x in log_q.cumsum(0)], tau,
                                reference)
            assert a == mtad_accept(log_p, log_q, tau) and i == (0 if a else -1)


def test_mmtad_tau_monotone():
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        lp = [torch.randn(3, generator=g) * 2 - d for d in range(3)]
        lq_ = [torch.randn(3, generator=g) - d for d in range(3)]
        a = [mmtad_accept(lp, lq_, t)[0] for t in (1.0, 0.5, 0.1, 1e-3)]
        assert a == sorted(a)

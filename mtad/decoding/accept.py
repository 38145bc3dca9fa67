"""Acceptance rules as pure functions of probabilities (STYLE.md: tested without a model).

Notation (ALGORITHMS.md): ``p`` target, ``q`` draft (both already filtered), ``x`` draft tokens,
``u`` uniforms, ``tau`` the MTAD threshold. Shapes: K draft length, V vocab, W nodes at one depth.
"""
from __future__ import annotations

import math

import torch

from mtad.decoding.filter import check_device


def speculative_accept(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor):
    """Lossless speculative sampling, ALGORITHMS.md §3 steps 3-4.

    p (K+1, V), q (K, V), x (K,), u (K,). Accept x_j while u_j < min(1, p_j(x_j) / q_j(x_j)).
    Returns (n accepted, distribution of the next token): the residual norm(max(0, p_n - q_n)) after a
    rejection, or p_{K+1} (the bonus) when all K pass.
    """
    check_device(p.device, q, x, u, what="speculative_accept")
    K = x.shape[0]
    j = torch.arange(K, device=p.device)
    n = _passed((u < (p[j, x] / q[j, x]).clamp(max=1.0)).tolist())  # of (K,)
    if n == K:
        return K, p[K]
    return n, residual(p[n], q[n])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p when p <= q everywhere (then p == q and no rejection occurs)."""
    r = (p - q).clamp(min=0.0)
    s = r.sum()
    return r / s if s > 0 else p


def threshold_accept(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, tau: float):
    """``speculative`` with ``accept: threshold`` (ALGORITHMS.md §7): accept x_j while p_j(x_j)/q_j(x_j) > tau;
    the next token comes from p at the first failing position (no residual). Lossy by design."""
    check_device(p.device, q, x, what="threshold_accept")
    K = x.shape[0]
    j = torch.arange(K, device=p.device)
    n = _passed((p[j, x] > tau * q[j, x]).tolist())  # of (K,), ratio > tau without dividing by q
    return n, p[n]


def _passed(ok: list[bool]) -> int:
    """The length of the leading run of True in ``ok`` (one host copy, not a cumprod and a sum on device)."""
    return next((i for i, v in enumerate(ok) if not v), len(ok))


def mtad_accept(log_p: torch.Tensor, log_q: torch.Tensor, tau: float) -> int:
    """MTAD joint verification, ALGORITHMS.md §5 step 3: the *longest passing prefix*.

    log_p, log_q (K,): log p̃(x̂_j|·) and log q̃(x̂_j|·). L_d = Σ_{j<=d} (log p - log q); accept
    a = max{d : L_d > log tau}, 0 if none. A -inf in log_p makes every L_d from there on -inf.
    """
    check_device(log_p.device, log_q, what="mtad_accept")
    L = torch.cumsum(log_p - log_q, 0)  # (K,)
    passing = (L > math.log(tau)).nonzero()
    return int(passing[-1]) + 1 if len(passing) else 0


def mmtad_accept(log_p_path: list[torch.Tensor], log_q_path: list[torch.Tensor], tau: float,
                 reference: str = "max") -> tuple[int, int]:
    """MMTAD tree verification, ALGORITHMS.md §6 step 3.

    log_p_path[d], log_q_path[d] (W_d,): target and draft joint log-probabilities of every node at depth
    d+1. Node i passes when log p̃(path_i) - R_d > log tau, with R_d the best draft joint at that depth
    (``reference='max'``) or the node's own (``'own'``). Returns (a, i): the deepest depth with a passing
    node and, among its passing nodes, the one with the largest target joint; (0, -1) if none passes.
    """
    check_device(log_p_path[0].device, *log_p_path, *log_q_path, what="mmtad_accept")
    log_tau = math.log(tau)
    for d in range(len(log_p_path) - 1, -1, -1):
        R = log_q_path[d].max() if reference == "max" else log_q_path[d]
        ok = log_p_path[d] - R > log_tau  # (W_d,)
        if ok.any():
            return d + 1, int(log_p_path[d].masked_fill(~ok, -math.inf).argmax())
    return 0, -1


def multi_draft_accept(p: torch.Tensor, q: torch.Tensor, xs: torch.Tensor, u: torch.Tensor):
    """SpecInfer's multi-step speculative sampling at one tree node (ALGORITHMS.md §7, lossless).

    p (V,): the target distribution at the node; q (V,): the draft's, every child drawn i.i.d. from it, or
    (k, V): child i's own proposal law (``dyntree``'s fixed children: one point mass each, ALGORITHMS.md §8);
    xs (k,): the children; u (k,): uniforms. Child i is accepted with probability min(1, p_i(x_i)/q_i(x_i)),
    where p_1 = p and p_{i+1} = norm(max(0, p_i - q_i)) after each rejection. Returns (index of the accepted
    child or -1, the distribution left after all rejections — meaningful only when the index is -1).
    """
    check_device(p.device, q, xs, u, what="multi_draft_accept")
    for i in range(xs.shape[0]):
        x, qi = int(xs[i]), (q if q.dim() == 1 else q[i])
        if u[i] < min(1.0, float(p[x] / qi[x])):
            return i, p
        p = residual(p, qi)
    return -1, p

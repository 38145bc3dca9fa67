"""Verifiers beyond the paper as pure functions of probabilities (VERIFIERS.md §1-§3), beside
:mod:`mtad.decoding.accept`.

Same shapes and notation: ``p`` (K+1, V) target and ``q`` (K, V) draft, both after the same filter; ``x`` (K,)
draft tokens; ``u`` (K,) uniforms. Each rule returns ``(n accepted, distribution of the token after them)``.
K = 0 (a proposer with nothing to propose) is allowed: ``(0, p[0])``, an ordinary target step.
"""
from __future__ import annotations

import torch

from mtad.decoding.filter import check_device

DIVERGENCES = ("js", "kl", "tv")


def block_weights(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's w and h (VERIFIERS.md §1), each (K,).

    w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)) with w_0 = 1 (q_i(x_i) = 0 gives w_i = 1 unless w_{i-1} or
    p_i(x_i) is 0, and p_i(x_i) = q_i(x_i) = 0 gives w_i = 0, so h_i = 0: such a token is never accepted);
    h_i = ρ_i / (ρ_i + 1 - w_i) with ρ_i = Σ max(w_i p_{i+1} - q_{i+1}, 0) for i < K (1 when the denominator is
    0), and h_K = w_K."""
    K = x.shape[0]
    j = torch.arange(K, device=p.device)
    px, qx = p[j, x], q[j, x]  # (K,)
    # q = 0: inf where p > 0, else 0 (p = q = 0 rules the token out; 0 * inf would be NaN, and NaN turns h into 1)
    inf_or_0 = torch.where(px > 0, torch.inf, 0.0).to(p.dtype)
    ratio = torch.where(qx > 0, px / qx.clamp(min=torch.finfo(qx.dtype).tiny), inf_or_0)
    w, acc = torch.empty_like(px), torch.ones((), dtype=p.dtype, device=p.device)
    for i in range(K):  # clipped at every step, so no closed form: K is small
        acc = torch.where(acc > 0, (acc * ratio[i]).clamp(max=1.0), acc)
        w[i] = acc
    rho = (w[:-1, None] * p[1:K] - q[1:K]).clamp(min=0).sum(-1)  # (K-1,)
    den = rho + 1 - w[:-1]
    h = torch.where(den > 0, rho / den.clamp(min=torch.finfo(den.dtype).tiny), torch.ones_like(rho))
    return w, torch.cat([h, w[K - 1:]])


def block_accept(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor):
    """Block verification (Sun et al. 2024), VERIFIERS.md §1; lossless.

    τ = the **last** i with u_i < h_i (0 if none): a failing check at j does not cap τ below j. The next token
    comes from norm(max(w_τ p_{τ+1} - q_{τ+1}, 0)) when τ < K (w_0 = 1: the token-wise residual at τ = 0),
    p_{τ+1} if that mass is 0, and from p_{K+1} when τ = K. **[choice]** ``u < h`` rather than the spec's
    ``u <= h``, as in :func:`mtad.decoding.accept.speculative_accept` (the same law for u ~ U[0, 1))."""
    check_device(p.device, q, x, u, what="block_accept")
    K = x.shape[0]
    if K == 0:
        return 0, p[0]
    w, h = block_weights(p, q, x)
    passing = (u < h).nonzero()
    n = int(passing[-1]) + 1 if len(passing) else 0
    if n == K:
        return K, p[K]
    r = ((w[n - 1] if n else 1.0) * p[n] - q[n]).clamp(min=0)  # (V,)
    s = r.sum()
    return n, r / s if s > 0 else p[n]


def _prefix(ok: torch.Tensor) -> int:
    """Length of the leading run of True in ``ok`` (K,)."""
    return int(ok.long().cumprod(0).sum())


def typical_accept(p: torch.Tensor, x: torch.Tensor, threshold: float, alpha: float):
    """Medusa's typical acceptance (Cai et al. 2024), VERIFIERS.md §2; lossy, deterministic, q unused.

    Accept x_i while p_i(x_i) > min(threshold, alpha · exp(-H(p_i))), H in nats; the next token comes from
    p_{n+1}. **[choice]** H is the entropy of the filtered p̃ (Medusa: softmax(logits / T) with 1e-5 inside
    the log), and the next token is drawn from p̃_{n+1} (Medusa: its argmax, or a truncated sample), so
    T = 0 is greedy: p̃ is one-hot, H = 0 and only the argmax passes."""
    check_device(p.device, x, what="typical_accept")
    K = x.shape[0]
    j = torch.arange(K, device=p.device)
    H = -torch.special.xlogy(p[:K], p[:K]).sum(-1)  # (K,)
    thr = (alpha * torch.exp(-H)).clamp(max=threshold)  # (K,)
    n = _prefix(p[j, x] > thr)
    return n, p[n]


def divergence(p: torch.Tensor, q: torch.Tensor, kind: str = "js") -> torch.Tensor:
    """Row-wise divergence of p, q (K, V) -> (K,), natural log: ``js`` Jensen-Shannon, ``kl`` KL(q ‖ p)
    (draft against target, +inf where q > 0 = p), ``tv`` total variation (VERIFIERS.md §3)."""
    def kl(a, b):  # Σ a log(a / b), 0 log 0 = 0
        return (torch.special.xlogy(a, a) - torch.special.xlogy(a, b)).sum(-1)

    if kind == "js":
        m = (p + q) / 2
        return (kl(p, m) + kl(q, m)) / 2
    if kind == "kl":
        return kl(q, p)
    if kind == "tv":
        return (p - q).abs().sum(-1) / 2
    raise ValueError(f"divergence kind={kind!r}: valid kinds are {DIVERGENCES}")


def fuzzy_accept(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, threshold: float, kind: str = "js"):
    """Fuzzy speculative decoding (Holsman et al. 2025), VERIFIERS.md §3; lossy for threshold > 0.

    Accept x_i while Div(p_i, q_i) <= threshold (the drafted token itself is not looked at); the next token
    comes from p_{n+1} itself, no residual. **[choice]** the divergence is taken on the *filtered* p̃, q̃ (the
    official code's ``*_processed`` variants, without their 1e-10 smoothing), not on softmax(raw logits),
    so that T = 0 is greedy (one-hot p̃, q̃: Div is 0 when the argmaxes agree, ln 2 / +inf / 1 otherwise)."""
    check_device(p.device, q, x, what="fuzzy_accept")
    K = x.shape[0]
    n = _prefix(divergence(p[:K], q, kind) <= threshold)
    return n, p[n]

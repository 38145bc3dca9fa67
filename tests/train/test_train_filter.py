"""The trainer has one probability filter, ``mtad.decoding.filter.filter_probs``. It replaced two of its own:
``warp`` (the held-out p~ / q~ when top_k = 0) and the student's q~ inside ``filtered_loss`` (membership by
value over the full softmax). Both are kept below, frozen, as references: on random logits the old and new
filters keep the same tokens and agree to float rounding (a few ulp: they sum in another order), gradients
included; a different setting differs (the negative controls)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtad.decoding.filter import filter_probs
from mtad.train.losses import filtered_loss, filtered_targets

SETTINGS = [(0, 0.5), (0, 0.9), (0, 0.95), (10, 0.9), (10, 1.0), (5, 0.5), (1, 0.9), (40, 0.8)]


def old_warp(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The deleted ``mtad.train.trainer.warp`` (T = 1; ties at the top-k boundary all kept)."""
    probs = F.softmax(logits.float(), dim=-1)
    if top_k:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p >= top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


def old_student_filter(z: torch.Tensor, cols: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The deleted q~ of ``filtered_loss`` at columns ``cols`` (M, K): top-k of the full softmax, a nucleus mask
    without gradient, membership by value (>= the smallest kept value), renormalised over the kept values."""
    q = F.log_softmax(z.float(), -1).exp()
    qv, _ = q.topk(min(top_k, q.shape[-1]), dim=-1)
    before = (qv.detach().cumsum(-1) - qv.detach()) / qv.detach().sum(-1, keepdim=True)
    keep = before < top_p if top_p < 1.0 else torch.ones_like(qv, dtype=torch.bool)
    thresh = torch.where(keep, qv.detach(), torch.full_like(qv, float("inf"))).min(-1).values
    q_at = q.gather(1, cols)
    return torch.where(q_at >= thresh[:, None], q_at / (qv * keep).sum(-1)[:, None], torch.zeros_like(q_at))


def _logits(seed: int, rows: int, V: int) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _same_filter(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same kept tokens and the same probabilities up to float rounding."""
    return torch.equal(a > 0, b > 0) and torch.allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
@pytest.mark.parametrize("V", [50, 4096])
def test_the_held_out_filter_is_the_old_one(V, top_k, top_p):
    x = _logits(V + top_k, 64, V)
    new = filter_probs(F.log_softmax(x, -1), 1.0, top_k, top_p)  # what heldout.evaluate applies to log p / log q
    assert _same_filter(old_warp(x, top_k, top_p), new)
    other = filter_probs(F.log_softmax(x, -1), 1.0, top_k + 5 if top_k else 20, top_p - 0.2)  # control
    assert not _same_filter(old_warp(x, top_k, top_p), other)


@pytest.mark.parametrize("top_k,top_p", [s for s in SETTINGS if s[0]])
@pytest.mark.parametrize("N", [50, 16384])
def test_the_students_filter_is_the_old_one_gradients_included(N, top_k, top_p):
    z = _logits(N + top_k, 128, N).requires_grad_()
    cols = torch.randint(0, N, (128, 16), generator=torch.Generator().manual_seed(1))
    cols[:, :8] = z.detach().topk(8, -1).indices  # the cached ids: mostly the student's own top tokens
    old, new = old_student_filter(z, cols, top_k, top_p), filter_probs(z, 1.0, top_k, top_p).gather(1, cols)
    assert _same_filter(old, new)
    w = torch.linspace(-1, 1, 16)
    g_old, = torch.autograd.grad((old * w).sum(), z)
    g_new, = torch.autograd.grad((new * w).sum(), z)
    assert torch.allclose(g_old, g_new, rtol=0, atol=1e-5)
    control = filter_probs(z, 1.0, max(top_k // 2, 1) if top_k > 1 else 3, top_p).gather(1, cols)
    assert not _same_filter(old, control)


def test_filtered_loss_equals_the_old_loss():
    """The whole loss with the shared filter against the old one: same values and alpha, same gradient."""
    V, K, k, p = 300, 16, 10, 0.9
    t_logits, z = _logits(0, 32, V), _logits(1, 32, V).requires_grad_()
    top = torch.log_softmax(t_logits, -1).topk(K, -1)
    p_f = filtered_targets(top.values, k, p)
    per, alpha = filtered_loss(z, top.indices, p_f, "ce_tv", k, p)
    log_q = F.log_softmax(z, -1)
    ce = -(p_f * log_q.gather(1, top.indices)).sum(-1) / p_f.sum(-1)
    old_alpha = torch.minimum(p_f, old_student_filter(z, top.indices, k, p)).sum(-1)
    old = ce + (1 - old_alpha)
    assert torch.allclose(per, old, atol=1e-6) and torch.allclose(alpha, old_alpha, atol=1e-6)
    g_new, = torch.autograd.grad(per.sum(), z)
    g_old, = torch.autograd.grad(old.sum(), z)
    assert torch.allclose(g_new, g_old, atol=1e-5) and g_new.abs().max() > 1e-2
    per_tv, _ = filtered_loss(z, top.indices, p_f, "ce_filtered", k, p)  # control: another loss differs
    assert not torch.allclose(per_tv, old, atol=1e-3)

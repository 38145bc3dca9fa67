"""Distillation losses. ``p`` is the target's distribution, ``q`` the student's; p~ and q~ are both filtered by
``mtad.decoding.filter.filter_probs`` (T = 1, top-k, top-p: the verification filter), so alpha = sum min(p~, q~)
is the acceptance rate that speculative sampling sees (ALGORITHMS.md). Shapes: B rows, L positions, M selected
positions, V vocabulary, N head columns, K cached top-k, D hidden."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtad.decoding.filter import filter_probs
from mtad.train.config import TrainDraftConfig


def forward_kl(student, input_ids, attention_mask, position_ids, select, p_logits) -> torch.Tensor:
    """Mean over selected positions of KL(p || q) = sum_v p (log p - log q), full vocabulary.

    ``select`` (B, S) marks the positions whose next-token prediction is supervised; ``p_logits`` (M, V)
    holds the teacher's logits for those positions in row-major order.
    """
    h = student.model(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids).last_hidden_state  # (B, S, D)
    log_q = F.log_softmax(student.lm_head(h[select]).float(), dim=-1)  # (M, V)
    log_p = F.log_softmax(p_logits.float(), dim=-1)  # (M, V)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def filtered_targets(topk_logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """p~ on the cached top-K ids: (M, K) raw log-probs sorted descending -> (M, K) filtered probabilities."""
    return filter_probs(topk_logp.float(), 1.0, top_k, top_p)  # exactly the decoders' filter (top-k <= K)


def filtered_loss(z: torch.Tensor, tgt_ids: torch.Tensor, p_f: torch.Tensor, loss: str, top_k: int, top_p: float,
                  tv_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-position loss (M,), per-position alpha (M,)) of student logits ``z`` (M, N) against p~.

    ``tgt_ids`` (M, K) are the cached ids mapped to head columns (-1: outside the head, dropped), ``p_f``
    (M, K) their filtered probabilities p~. ``ce_filtered`` = -sum p~ log q (= KL(p~ || q) + const; p~ is
    renormalised over the ids the head can output); ``tv_filtered`` = 1 - sum min(p~, q~) = TV(p~, q~) with
    q~ = ``filter_probs(z)`` the student's own filtered distribution (its support carries no gradient);
    ``ce_tv`` = both.
    alpha = sum min(p~, q~) is the verification acceptance of this position (p~ unrenormalised).
    """
    inside = tgt_ids >= 0  # (M, K)
    cols = tgt_ids.clamp(min=0).long()
    log_q = F.log_softmax(z.float(), -1)  # (M, N)
    q_f = filter_probs(z, 1.0, top_k, top_p).gather(1, cols) * inside  # (M, K): q~ (the same filter as p~)
    alpha = torch.minimum(p_f * inside, q_f).sum(-1)  # (M,)
    ce = -(p_f * inside * log_q.gather(1, cols)).sum(-1) / (p_f * inside).sum(-1).clamp(min=1e-6)
    if loss == "ce_filtered":
        out = ce
    elif loss == "tv_filtered":
        out = 1 - alpha
    elif loss == "ce_tv":
        out = ce + tv_weight * (1 - alpha)
    else:
        raise ValueError(f"filtered_loss: unknown loss {loss!r}")
    return out, alpha.detach()


def shift_features(f: torch.Tensor) -> torch.Tensor:
    """(B, L, D) features at positions t -> each position's parent feature (t - 1; zeros at t = 0)."""
    return torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], 1)


def head_logits(student, h: torch.Tensor) -> torch.Tensor:
    """(M, N) logits of the student's head on hidden states ``h`` (M, D): a reduced head's compact columns."""
    head = student.lm_head
    return head.compact(h) if hasattr(head, "compact") else head(h)


def feature_loss(student, batch: dict, f: torch.Tensor, cfg: TrainDraftConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position loss and depth-1 alpha of a feature draft: the filtered loss at depth 1 (inputs: the
    teacher's features ``f`` (B, L, D) at each parent) and at depths 2..1+unroll (inputs: the draft's own
    outputs of the previous depth, as in a drafted block; gradients flow through them), averaged, plus
    ``feat_weight`` x the smooth-L1 distance of the depth-1 output to the teacher's feature."""
    sel = batch["select"]
    h = student.hidden(batch["input_ids"], shift_features(f))  # (B, L, D)
    per, alpha = filtered_loss(head_logits(student, h[sel]), batch["cols"], batch["p_f"], cfg.loss, cfg.gen_top_k,
                               cfg.gen_top_p, cfg.tv_weight)
    reg = F.smooth_l1_loss(h[sel], f[sel], reduction="none").mean(-1)  # (M,)
    for _ in range(cfg.unroll):
        h = student.hidden(batch["input_ids"], shift_features(h))
        per = per + filtered_loss(head_logits(student, h[sel]), batch["cols"], batch["p_f"], cfg.loss, cfg.gen_top_k,
                                  cfg.gen_top_p, cfg.tv_weight)[0]
    return per / (1 + cfg.unroll) + cfg.feat_weight * reg, alpha

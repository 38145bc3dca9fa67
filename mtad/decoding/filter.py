"""The one probability filter shared by every decoder (ALGORITHMS.md, Notation: ``filter``).

``filter_probs(logits; T, top_k, top_p)``: divide by ``T``, keep the ``top_k`` largest logits (0 = all),
then the smallest prefix of the sorted distribution whose mass reaches ``top_p``, renormalise.
``T = 0`` returns the one-hot argmax. **[choice]** ties at the ``top_k`` boundary are broken by
``torch.topk`` (exactly ``top_k`` tokens are kept).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Top:
    """A filtered law kept on its top-k support: probabilities ``p`` (..., k) at token ids ``idx`` (..., k), zero
    at the other of the ``V`` tokens (a top-p cut leaves zeros in ``p``). :meth:`dense` is :func:`filter_probs`
    bit for bit, and :meth:`draw` draws what :func:`draw` draws from it, from the same uniforms: a beam step
    draws W of W·k scored pairs instead of W·V, without the full-vocabulary cumulative sum."""

    p: torch.Tensor
    idx: torch.Tensor
    V: int

    def dense(self) -> torch.Tensor:
        """(..., V) float32."""
        return torch.zeros(*self.p.shape[:-1], self.V, device=self.p.device).scatter_(-1, self.idx, self.p)

    def draw(self, rng: torch.Generator, n: int = 1) -> torch.Tensor:
        """``n`` token ids (..., n) with replacement: :func:`draw` of :meth:`dense`."""
        return self.idx.gather(-1, draw_support(self.p, self.idx, rng, n))


def dense(law: "torch.Tensor | Top") -> torch.Tensor:
    """A law over the vocabulary (..., V): a :class:`Top`'s dense form, a tensor as it is."""
    return law.dense() if isinstance(law, Top) else law


def filter_top(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> Top | None:
    """:func:`filter_probs` kept on its top-k support; None where no top-k applies (T = 0, top_k 0 or >= V)."""
    V = logits.shape[-1]
    if temperature == 0 or not 0 < top_k < V:
        return None
    vals, idx = logits.float().topk(top_k, dim=-1)  # (..., k), sorted descending; T > 0 keeps the order
    return Top(_nucleus_sorted(torch.softmax(_scale(vals, temperature), -1), top_p), idx, V)


def filter_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Filtered probabilities over the last dimension of ``logits`` (..., V) -> (..., V), float32."""
    top = filter_top(logits, temperature, top_k, top_p)
    if top is not None:
        return top.dense()
    logits = logits.float()
    V = logits.shape[-1]
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), V).float()  # (..., V)
    probs = torch.softmax(_scale(logits, temperature), -1)
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(-1, descending=True)  # (..., V)
    return torch.zeros_like(probs).scatter_(-1, idx, _nucleus_sorted(sorted_p, top_p))


def _scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``; at T = 1 the logits themselves (a division by 1 is exact: the same bits)."""
    return logits if temperature == 1 else logits / temperature


def _nucleus_sorted(sorted_p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of descending ``sorted_p`` whose mass is >= top_p; renormalise."""
    if top_p >= 1.0:
        return sorted_p
    mass_before = sorted_p.cumsum(-1).sub_(sorted_p)
    kept = sorted_p.masked_fill(mass_before >= top_p, 0.0)
    return kept.div_(kept.sum(-1, keepdim=True))


def draw(probs: torch.Tensor, rng: torch.Generator, n: int = 1, replacement: bool = True) -> torch.Tensor:
    """``n`` draws from ``probs`` (..., V) with the explicit generator; returns indices (..., n).

    With replacement: inverse CDF in float64, the first index whose cumulative sum exceeds ``u · total``
    (~8x faster than ``torch.multinomial`` on CPU for one draw over a 4k vocabulary). ``u < 1`` in float64
    keeps ``u · total < total``, so the index always lands on a token with p > 0. ``probs`` must be on the
    generator's device (the decode device of :mod:`mtad.decoding.core`); the indices come back there."""
    check_device(rng.device, probs, what="draw")
    if not replacement:
        return torch.multinomial(probs, n, replacement=False, generator=rng)
    cdf = probs.cumsum(-1, dtype=torch.float64)  # (..., V): each term widened, then summed in float64
    u = torch.rand(cdf.shape[:-1] + (n,), generator=rng, dtype=torch.float64, device=cdf.device)  # (..., n)
    return torch.searchsorted(cdf, u * cdf[..., -1:], right=True)  # (..., n)


def draw_support(p: torch.Tensor, ids: torch.Tensor, rng: torch.Generator, n: int = 1) -> torch.Tensor:
    """:func:`draw` of the law that is ``p`` (..., m) at the distinct indices ``ids`` (..., m) and 0 elsewhere,
    without building it: positions (..., n) into the m entries. The same uniforms give the same draws: summed in
    index order, the entries give the dense cumulative sums bit for bit (the zeros between them add nothing), and
    the first cumulative sum above ``u · total`` sits at an entry of the support."""
    check_device(rng.device, p, ids, what="draw")
    order = ids.argsort(-1)  # (..., m)
    cdf = p.gather(-1, order).cumsum(-1, dtype=torch.float64)  # (..., m)
    u = torch.rand(cdf.shape[:-1] + (n,), generator=rng, dtype=torch.float64, device=cdf.device)  # (..., n)
    return order.gather(-1, torch.searchsorted(cdf, u * cdf[..., -1:], right=True))  # (..., n)


def canonical_device(device) -> torch.device:
    """``device`` with its index filled in (``cuda`` -> ``cuda:<current>``), so equal devices compare equal."""
    if type(device) is torch.device and (device.index is not None or device.type != "cuda"):
        return device  # the common case, without building a new device
    device = torch.device(device)
    if device.index is None and device.type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def check_device(device: torch.device, *tensors: torch.Tensor, what: str) -> None:
    """The device rule (:mod:`mtad.decoding.core`): every operand is on the decode ``device``."""
    if all(t.device == device for t in tensors):
        return
    device = canonical_device(device)
    bad = sorted({str(t.device) for t in tensors if canonical_device(t.device) != device})
    if bad:
        raise ValueError(f"{what}: operands on {bad} but the decode device is {device}: every probability and "
                         "index of a generate call must be on its generator's device (Session returns logits "
                         "there; create index tensors with device=run.device)")


def uniform(n: int, rng: torch.Generator) -> torch.Tensor:
    """``n`` draws of U(0, 1) from the explicit generator (on the generator's device)."""
    return torch.rand(n, generator=rng, device=rng.device)


def uniform_rows(B: int, n: int, rng: torch.Generator) -> torch.Tensor:
    """(B, n) draws of U(0, 1): each row of a batch its own (:class:`mtad.decoding.core.Batch`)."""
    return torch.rand(B, n, generator=rng, device=rng.device)

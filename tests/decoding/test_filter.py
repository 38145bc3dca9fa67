"""The one probability filter (ALGORITHMS.md, Notation) against a plain-Python reference, plus the
explicit-generator sampling helpers."""
from __future__ import annotations

import math

import pytest
import torch

from mtad.decoding.filter import Top, draw, filter_probs, filter_top, uniform

torch.set_num_threads(1)


def reference(logits: list[float], T: float, k: int, p: float) -> list[float]:
    """Spec, literally: /T, keep the k largest (0 = all), then the smallest prefix of the sorted
    distribution with mass >= p, renormalise. T = 0: one-hot argmax."""
    V = len(logits)
    if T == 0:
        best = max(range(V), key=lambda i: logits[i])
        return [float(i == best) for i in range(V)]
    order = sorted(range(V), key=lambda i: -logits[i])[: k if 0 < k < V else V]
    z = [math.exp(logits[i] / T) for i in order]
    probs = [x / sum(z) for x in z]
    kept, mass = [], 0.0
    for i, q in zip(order, probs):
        if mass >= p:
            break
        kept.append((i, q))
        mass += q
    total = sum(q for _, q in kept)
    out = [0.0] * V
    for i, q in kept:
        out[i] = q / total
    return out


@pytest.mark.parametrize("T", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("k", [0, 1, 3, 7, 50])
@pytest.mark.parametrize("p", [0.3, 0.9, 1.0])
def test_matches_reference(T, k, p):
    g = torch.Generator().manual_seed(int(10 * T) + k)
    logits = torch.randn(4, 7, 12, generator=g) * 2  # (B, T, V): any leading shape
    out = filter_probs(logits, T, k, p)
    assert out.shape == logits.shape and out.dtype == torch.float32
    for row, ref in zip(out.view(-1, 12), logits.view(-1, 12)):
        assert torch.allclose(row, torch.tensor(reference(ref.tolist(), T, k, p)), atol=1e-6)


def test_hand_computed_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    keep = lambda p: int((filter_probs(logits, 1.0, 0, p) > 0).sum())
    assert [keep(0.5), keep(0.51), keep(0.75), keep(0.9), keep(1.0)] == [1, 2, 2, 3, 4]
    assert torch.allclose(filter_probs(logits, 1.0, 0, 0.75), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # top_k before top_p: with k=2 the kept mass is renormalised first (0.625, 0.375), so p=0.6 keeps 1
    assert torch.allclose(filter_probs(logits, 1.0, 2, 0.6), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert int((filter_probs(logits, 1.0, 0, 0.6) > 0).sum()) == 2  # negative control: order matters


def test_top_k_keeps_exactly_k_on_ties():
    out = filter_probs(torch.zeros(6), 1.0, 2, 1.0)
    assert int((out > 0).sum()) == 2 and torch.allclose(out.sum(), torch.tensor(1.0))


def test_temperature_zero_is_argmax_and_low_precision_inputs():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]], dtype=torch.bfloat16)
    assert torch.equal(filter_probs(logits, 0.0, 2, 0.5), torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert filter_probs(logits.half(), 1.0, 0, 1.0).dtype == torch.float32


def test_draw_and_uniform_follow_the_generator():
    probs = torch.tensor([[0.1, 0.0, 0.9], [0.5, 0.5, 0.0]])
    a = draw(probs, torch.Generator().manual_seed(3), 50)
    b = draw(probs, torch.Generator().manual_seed(3), 50)
    assert a.shape == (2, 50) and torch.equal(a, b)
    assert not (a[0] == 1).any() and not (a[1] == 2).any()  # zero-probability tokens never drawn
    assert sorted(draw(torch.ones(5) / 5, torch.Generator().manual_seed(0), 5, replacement=False).tolist()) == \
        [0, 1, 2, 3, 4]
    u = uniform(1000, torch.Generator().manual_seed(1))
    assert torch.equal(u, uniform(1000, torch.Generator().manual_seed(1)))
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.05


def test_draw_matches_the_distribution():
    """20,000 draws (one call, and one row of a batch) against p: chi-square < chi2.ppf(0.999, dof);
    negative control: the same counts against a different distribution fail."""
    import tinymodels as tm

    p = torch.tensor([0.0, 0.05, 0.3, 0.0, 0.15, 0.5, 0.0]) * 3  # unnormalised, zeros at both ends
    g = torch.Generator().manual_seed(0)
    for x in (draw(p, g, 20_000), draw(torch.stack([p.flip(0), p]), g, 20_000)[1]):
        counts = torch.bincount(x, minlength=7).float()
        ok, bound = tm.chi_square(counts, p / p.sum())
        assert ok < bound, (ok, bound)
        wrong = torch.tensor([0.0, 0.06, 0.29, 0.0, 0.15, 0.5, 0.0])
        assert tm.chi_square(counts, wrong)[0] > bound


# ---- the top-k support: the same law and the same draws without the full vocabulary ------------------------
@pytest.mark.parametrize("T,k,p", [(1.0, 10, 0.9), (0.7, 5, 1.0), (1.3, 50, 0.5)])
def test_top_is_the_dense_filter_bit_for_bit(T, k, p):
    logits = torch.randn(3, 2, 4096, generator=torch.Generator().manual_seed(k)) * 3
    top = filter_top(logits, T, k, p)
    assert torch.equal(top.dense(), filter_probs(logits, T, k, p))
    assert not torch.equal(filter_top(logits, T, k, p * 0.5).dense(), filter_probs(logits, T, k, p))  # control
    assert filter_top(logits, 0.0, k, p) is None and filter_top(logits, T, 0, p) is None
    assert filter_top(logits, T, 4096, p) is None


def test_support_draws_are_the_dense_draws():
    """Same generator state, same ids: one draw per row, several per row, and a beam step's W·k scored pairs
    against its W·V flattened scores. Control: summing the support in its top-k order (by probability) instead
    of index order draws other tokens."""
    from mtad.decoding.filter import draw_support

    differ_unsorted = 0
    for s in range(300):
        g = torch.Generator().manual_seed(s)
        V, n = (4096, 49152)[s % 2], 1 + s % 4
        top = filter_top(torch.randn(2, V, generator=g) * 2, 1.0, 10, 0.9)
        a = draw(top.dense(), torch.Generator().manual_seed(s), n)
        assert torch.equal(top.draw(torch.Generator().manual_seed(s), n), a)
        laws = filter_top(torch.randn(2, 4, V, generator=g) * 2, 1.0, 10, 0.9)
        w = torch.rand(2, 4, 1, generator=g)
        dense = (w * laws.dense()).flatten(-2)  # (2, 4V)
        scores = (w * laws.p).flatten(-2)  # (2, 4k)
        ids = (torch.arange(4)[:, None] * V + laws.idx).flatten(-2)
        pos = draw_support(scores, ids, torch.Generator().manual_seed(s), 4)
        ref = draw(dense, torch.Generator().manual_seed(s), 4)
        assert torch.equal(ids.gather(-1, pos), ref)
        assert torch.equal(scores.gather(-1, pos), dense.gather(-1, ref))
        # control: the cumulative sum in top-k order, not index order
        cdf = top.p.cumsum(-1, dtype=torch.float64)
        u = torch.rand(2, n, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        wrong = top.idx.gather(-1, torch.searchsorted(cdf, u * cdf[..., -1:], right=True).clamp(max=9))
        differ_unsorted += not torch.equal(wrong, a)
    assert differ_unsorted > 100


def _fake_step(sparse: bool, V: int, scale: float = 1.0):
    """A deterministic stand-in for a proposer's beam step: logits seeded by the fed tokens."""
    def step(parent, tokens, w):
        g = torch.Generator().manual_seed(int(tokens.sum()) + 7 * tokens.shape[1])
        top = filter_top(torch.randn(*tokens.shape, V, generator=g) * 2, 1.0, 10, 0.9)
        top = Top(top.p * torch.linspace(1.0, scale, top.p.shape[-1]), top.idx, V)  # scale != 1: another law
        return top if sparse else top.dense()
    return step


def test_beam_sampling_on_the_support_draws_the_dense_trees():
    """Beam sampling with replacement given top-k supports draws the trees it draws from dense laws (tokens,
    parents, q̃ of the tokens, final weights), two rows at once. Control: a slightly different law (weights
    tilted within the support) draws other trees."""
    from mtad.decoding.beam import beam_sample

    V, other = 4096, 0
    for s in range(40):
        q1 = filter_top(torch.randn(2, V, generator=torch.Generator().manual_seed(s)) * 2, 1.0, 10, 0.9)
        dense = beam_sample(q1.dense(), _fake_step(False, V), 4, 4, True, torch.Generator().manual_seed(s))
        sparse = beam_sample(q1, _fake_step(True, V), 4, 4, True, torch.Generator().manual_seed(s))
        tilted = beam_sample(q1, _fake_step(True, V, 0.5), 4, 4, True, torch.Generator().manual_seed(s))
        for a, b in zip(dense, sparse):
            fields = (lambda t: t.tokens + t.q_tok + t.parents[1:] + [t.weight])
            assert all(torch.equal(x, y) for x, y in zip(fields(a), fields(b)))
        other += any(not torch.equal(torch.stack(a.tokens), torch.stack(c.tokens)) for a, c in zip(dense, tilted))
    assert other > 10

"""The verifier zoo (VERIFIERS.md §1-§4): block verification, typical and fuzzy acceptance, the n-gram proposer.

Pure rules are checked exactly on the spec's fixture F (every uniform enters only through ``u_i < h_i``, so
enumerating pass/fail patterns with their probabilities gives the exact law); decoders on tiny models: T = 0
equals the greedy oracle, and the lossless ones pass a chi-square test of the first 1, 2 and 3 tokens against
the exact filtered target while a broken variant fails it (fixed seeds: deterministic). Measured statistic
(bound) for 500 decodes: block 4.6 (13.8), 7.4 (20.5), 11.4 (27.9), broken 26.4, 58.8, 125.2;
speculative + ngram 3.9 (16.3), 4.4 (20.5), 7.8 (27.9), broken 50.0, 53.6, 57.6.
Config hashes: a published row's hash is reproduced with the new decoder keys present at their defaults.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from itertools import product

import pytest
import tinymodels as tm
import torch

import mtad
import mtad.decoding.rules as rules_mod
from mtad._util.late import LATE_KEYS
from mtad._util.paths import REPO_ROOT
from mtad.decoding import DecoderConfig
from mtad.decoding.accept import speculative_accept
from mtad.decoding.filter import filter_probs
from mtad.decoding.ngram import NgramLookup
from mtad.decoding.verifiers import block_accept, block_weights, divergence, fuzzy_accept, typical_accept
from mtad.models.pair import ModelPair

torch.set_num_threads(1)
a, b, c = 0, 1, 2
# fixture F (VERIFIERS.md §0): rows are positions 1..3 (p_3 the bonus), columns the tokens a, b, c
P = torch.tensor([[0.50, 0.30, 0.20], [0.05, 0.80, 0.15], [0.60, 0.30, 0.10]], dtype=torch.float64)
Q = torch.tensor([[0.70, 0.20, 0.10], [0.30, 0.50, 0.20]], dtype=torch.float64)
TARGET3 = P[0][:, None, None] * P[1][None, :, None] * P[2][None, None, :]  # (3, 3, 3): p_1 ⊗ p_2 ⊗ p_3


# ---- exact laws on fixture F -------------------------------------------------------------------------------
def patterns(h: torch.Tensor):
    """(probability, u) for every pass/fail pattern of u_i < h_i with u_i ~ U(0, 1) independent."""
    for passes in product((True, False), repeat=len(h)):
        weight = math.prod(float(hi) if ok else 1 - float(hi) for hi, ok in zip(h, passes))
        if weight > 0:
            yield weight, torch.tensor([hi / 2 if ok else (1 + hi) / 2 for hi, ok in zip(h.tolist(), passes)])


def emitted3(x: list[int], n: int, nxt: torch.Tensor) -> torch.Tensor:
    """Law (3, 3, 3) of the first 3 tokens: x_1..x_n, one token from ``nxt``, then target sampling."""
    rows = [torch.nn.functional.one_hot(torch.tensor(t), 3).double() for t in x[:n]] + [nxt] + list(P[n + 1:])
    return rows[0][:, None, None] * rows[1][None, :, None] * rows[2][None, None, :]


def step_law(rule, thresholds, q: torch.Tensor, drafts=None):
    """Exact (law of τ (3,), law of the first 3 tokens (3, 3, 3)) of one K = 2 step of ``rule`` on F, drafts
    x ~ q (or the given ``{draft: probability}``); ``thresholds(x)`` are the h_i that the uniforms face."""
    drafts = drafts or {x: float(q[0, x[0]] * q[1, x[1]]) for x in product(range(3), repeat=2)}
    tau, law = torch.zeros(3, dtype=torch.float64), torch.zeros(3, 3, 3, dtype=torch.float64)
    for x, px in drafts.items():
        for w, u in patterns(thresholds(torch.tensor(x))):
            n, nxt = rule(P, q, torch.tensor(x), u)
            tau[n] += px * w
            law += px * w * emitted3(list(x), n, nxt)
    return tau, law


def block_h(x):
    return block_weights(P, Q, x)[1]


def tokenwise_h(x, q=Q):
    return (P[[0, 1], x] / q[[0, 1], x]).clamp(max=1)


def contiguous_block(p, q, x, u):
    """Broken: τ = the accepted *prefix* (stop at the first failing check), the reading a review asked for."""
    K, (w, h) = x.shape[0], block_weights(p, q, x)
    n = int((u < h).long().cumprod(0).sum())
    if n == K:
        return K, p[K]
    r = ((w[n - 1] if n else 1.0) * p[n] - q[n]).clamp(min=0)
    return n, r / r.sum()


def unclipped_block(p, q, x, u):
    """Broken: τ = the last i with u_i < w_i (the prefix ratio alone, without the ρ_i correction of h_i)."""
    K, (w, _) = x.shape[0], block_weights(p, q, x)
    passing = (u < w).nonzero()
    n = int(passing[-1]) + 1 if len(passing) else 0
    if n == K:
        return K, p[K]
    r = ((w[n - 1] if n else 1.0) * p[n] - q[n]).clamp(min=0)
    return n, r / r.sum()


def unclipped_h(x):
    return block_weights(P, Q, x)[0]


def test_block_worked_example_draft_aa():
    w, h = block_weights(P, Q, torch.tensor([a, a]))
    assert torch.allclose(w, torch.tensor([5 / 7, 5 / 42], dtype=torch.float64))
    assert torch.allclose(h, torch.tensor([1 / 5, 5 / 42], dtype=torch.float64))
    tau, _ = step_law(block_accept, block_h, Q, {(a, a): 1.0})
    assert torch.allclose(tau, torch.tensor([74 / 105, 37 / 210, 5 / 42], dtype=torch.float64))
    tok, _ = step_law(speculative_accept, tokenwise_h, Q, {(a, a): 1.0})
    assert torch.allclose(tok, torch.tensor([2 / 7, 25 / 42, 5 / 42], dtype=torch.float64))
    x = torch.tensor([a, a])
    n, nxt = block_accept(P, Q, x, torch.tensor([0.99, 0.99]))
    assert n == 0 and torch.allclose(nxt, torch.tensor([0, 0.5, 0.5], dtype=torch.float64))
    n, nxt = block_accept(P, Q, x, torch.tensor([0.1, 0.99]))
    assert n == 1 and torch.allclose(nxt, torch.tensor([0, 1, 0], dtype=torch.float64))
    # a failing check at 1 does not cap τ: u_2 = 0.1 < h_2 = 5/42 accepts both
    assert block_accept(P, Q, x, torch.tensor([0.99, 0.1]))[0] == 2
    assert contiguous_block(P, Q, x, torch.tensor([0.99, 0.1]))[0] == 0  # the broken reading stops at 1


def test_block_worked_example_draft_ab_and_averages():
    w, h = block_weights(P, Q, torch.tensor([a, b]))
    assert float(w[1]) == pytest.approx(1.0) and float(h[1]) == pytest.approx(1.0)
    tau, _ = step_law(block_accept, block_h, Q)
    assert torch.allclose(tau, torch.tensor([1 / 5, 7 / 50, 33 / 50], dtype=torch.float64))
    assert float(tau @ torch.arange(3.0, dtype=torch.float64)) == pytest.approx(1.46)
    tok, _ = step_law(speculative_accept, tokenwise_h, Q)
    assert torch.allclose(tok, torch.tensor([1 / 5, 6 / 25, 14 / 25], dtype=torch.float64))
    # unit test (i): averaging over x_2 ~ q_2, P(τ >= 1 | x_1 = a) = w_1 = 5/7
    ge1 = sum(float(Q[1, x2]) * (1 - step_law(block_accept, block_h, Q, {(a, x2): 1.0})[0][0]) for x2 in range(3))
    assert ge1 == pytest.approx(5 / 7)


@pytest.mark.parametrize("broken,h", [(contiguous_block, block_h), (unclipped_block, unclipped_h)])
def test_block_is_lossless_on_F_and_broken_variants_are_not(broken, h):
    """Unit test (ii): the first 3 tokens have exactly the law p_1 ⊗ p_2 ⊗ p_3; each broken rule moves it."""
    _, law = step_law(block_accept, block_h, Q)
    assert torch.allclose(law, TARGET3, atol=1e-12)
    _, bad = step_law(broken, h, Q)
    assert (bad - TARGET3).abs().max() > 1e-3


def test_block_k1_equals_tokenwise():
    """Unit test (iii), on random distributions with supports cut in both directions."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        p = torch.softmax(2 * torch.randn(2, 5, generator=g), -1).index_fill(1, torch.tensor([4]), 0)
        p = p / p.sum(-1, keepdim=True)
        q = torch.softmax(2 * torch.randn(1, 5, generator=g), -1)
        for x, u in product(range(5), torch.rand(5, generator=g)):
            n1, r1 = block_accept(p, q, torch.tensor([x]), u[None])
            n2, r2 = speculative_accept(p, q, torch.tensor([x]), u[None])
            assert n1 == n2 and torch.allclose(r1, r2)


def test_block_zero_probabilities():
    p = P.clone()
    p[0] = torch.tensor([0.0, 0.6, 0.4], dtype=torch.float64)  # p_1(a) = 0: w = 0 from there on, τ = 0
    n, nxt = block_accept(p, Q, torch.tensor([a, b]), torch.zeros(2))
    assert n == 0 and nxt[a] == 0
    q = Q.clone()
    q[0] = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)  # q_1(a) = 0 < p_1(a): w_1 clipped to 1
    assert float(block_weights(P, q, torch.tensor([a, b]))[0][0]) == 1.0
    n, nxt = block_accept(P[:1], Q[:0], torch.tensor([], dtype=torch.long), torch.zeros(0))  # K = 0: a target step
    assert n == 0 and torch.equal(nxt, P[0])


def test_block_rejects_a_token_both_p_and_q_rule_out():
    """p_1(a) = q_1(a) = 0 (a proposer that is not q, e.g. a future one): w_1 = 0 and h_1 = 0, so τ = 0 for any u;
    the ratio 0/0 must not become NaN, which the den > 0 guard would turn into h = 1 (accept)."""
    p, q = P.clone(), Q.clone()
    p[0] = torch.tensor([0.0, 0.6, 0.4], dtype=torch.float64)
    q[0] = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    w, h = block_weights(p, q, torch.tensor([a, b]))
    assert torch.isfinite(w).all() and torch.isfinite(h).all()
    assert float(w[0]) == 0.0 and float(h[0]) == 0.0 and float(h[1]) == 0.0
    for u in (0.0, 0.5, 0.999):
        n, nxt = block_accept(p, q, torch.tensor([a, b]), torch.full((2,), u, dtype=torch.float64))
        assert n == 0 and nxt[a] == 0 and abs(float(nxt.sum()) - 1) < 1e-12
    # control: the same draft with q_1(a) > 0 = p_1(a) is rejected too, and with p_1(a) > 0 it can pass
    assert block_accept(P, Q, torch.tensor([a, b]), torch.zeros(2, dtype=torch.float64))[0] >= 1


# ---- typical acceptance -------------------------------------------------------------------------------------
def test_typical_worked_example():
    """T = 1: thr_1 = thr_2 = 0.09; every token passes at 1, only b and c at 2 (VERIFIERS.md §2)."""
    tau, first = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    for x in product(range(3), repeat=2):
        n, nxt = typical_accept(P, torch.tensor(x), 0.09, 0.3)
        assert torch.equal(nxt, P[n])
        px = float(Q[0, x[0]] * Q[1, x[1]])
        tau[n] += px
        first += px * (torch.nn.functional.one_hot(torch.tensor(x[0]), 3) if n else P[0])
    assert torch.allclose(tau, torch.tensor([0, 0.3, 0.7], dtype=torch.float64))
    assert torch.allclose(first, Q[0])  # the first token has the draft's law, not p_1: lossy
    # negative control: evaluate_posterior's own (swapped) defaults thr_2 = 0.09 e^{-0.613} = 0.049 pass a too
    assert typical_accept(P, torch.tensor([a, a]), 0.3, 0.09)[0] == 2
    assert typical_accept(P, torch.tensor([a, a]), 0.09, 0.3)[0] == 1


def test_typical_one_hot_accepts_only_the_argmax():
    p = torch.nn.functional.one_hot(torch.tensor([1, 2, 0]), 3).float()  # T = 0
    assert typical_accept(p, torch.tensor([1, 2]), 0.09, 0.3)[0] == 2
    assert typical_accept(p, torch.tensor([1, 0]), 0.09, 0.3)[0] == 1
    assert typical_accept(p, torch.tensor([1, 0]), 0.0, 0.0)[0] == 1  # p(x) = 0 fails even at threshold 0


# ---- fuzzy speculative decoding --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,values", [("js", (0.02190, 0.06879)), ("tv", (0.2, 0.3)), ("kl", (0.08512, 0.36006))])
def test_divergences_worked_example(kind, values):
    assert divergence(P[:2], Q, kind).tolist() == pytest.approx(values, abs=5e-6)


def test_kl_is_draft_against_target():
    assert divergence(Q, P[:2], "kl").tolist() != pytest.approx([0.08512, 0.36006], abs=1e-3)  # KL(p ‖ q) differs
    assert divergence(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]]), "kl").item() == math.inf


@pytest.mark.parametrize("threshold,n", [(0.05, 1), (0.0688, 2), (0.0218, 0)])
def test_fuzzy_worked_example(threshold, n):
    """js_div: τ depends only on the divergences (not on the drafted tokens); the next token comes from p_{τ+1}."""
    for x in product(range(3), repeat=2):
        k, nxt = fuzzy_accept(P, Q, torch.tensor(x), threshold, "js")
        assert k == n and torch.equal(nxt, P[n])


# ---- n-gram proposer ------------------------------------------------------------------------------------------
def hf_prompt_lookup(seq: list[int], max_n: int, K: int, eos=(), earliest: bool = True) -> list[int]:
    """Hugging Face's scan, transcribed from VERIFIERS.md §4 (``earliest=False``: a broken latest-first scan)."""
    L = len(seq)
    for n in range(min(max_n, L - 1), 0, -1):
        starts = [s for s in range(L - n + 1) if seq[s:s + n] == seq[L - n:]]
        for s in starts if earliest else starts[::-1]:
            if s + n < min(s + n + K, L):
                draft = seq[s + n:min(s + n + K, L)]
                return next((draft[:i] for i, t in enumerate(draft) if t in eos), draft)
    return []


def test_ngram_worked_example_and_edges():
    assert NgramLookup(2).propose([a, b, c, a, b], 2) == [c, a]
    assert NgramLookup(3).propose([a, b, c, a, b], 2) == [c, a]  # (c, a, b) only ends the text: back off to 2
    assert NgramLookup(2).propose([a, b, c, a, b], 5) == [c, a, b]  # the continuation stops at the text's end
    assert NgramLookup(2).propose([a, b, c], 2) == []  # no earlier occurrence of (b, c) or c
    assert NgramLookup(2, eos={a}).propose([a, b, c, a, b], 2) == [c]  # cut before the first EOS
    assert NgramLookup(1).propose([a, c, b, a, c, a], 3) == [c, b, a]  # the earliest occurrence wins


def test_ngram_online_tables_equal_the_scan():
    """The incrementally updated tables propose what a fresh scan of the whole text proposes, as the text grows;
    a latest-occurrence scan (negative control) disagrees somewhere."""
    g, differs = torch.Generator().manual_seed(0), 0
    for trial in range(30):
        seq = torch.randint(4, (40,), generator=g).tolist()
        lookup = NgramLookup(3, eos={3} if trial % 2 else set())
        for L in range(1, 41, 3):
            assert lookup.propose(seq[:L], 4) == hf_prompt_lookup(seq[:L], 3, 4, lookup.eos)
            differs += lookup.propose(seq[:L], 4) != hf_prompt_lookup(seq[:L], 3, 4, lookup.eos, earliest=False)
    assert differs > 0


def no_residual(p, q, x, u):
    """Broken: after a rejection the next token comes from p itself (the rejected draft token is not removed)."""
    n, nxt = speculative_accept(p, q, x, u)
    return n, (p[n] if n < x.shape[0] else nxt)


def test_ngram_draft_verified_losslessly_worked_example():
    """Draft [c, a] with one-hot q: P(τ = 0, 1, 2) = (0.8, 0.19, 0.01), correction (5/8, 3/8, 0) at τ = 0; block
    verification gives the same τ law; the first 3 tokens have the target's law, without the residual they do not."""
    onehot = torch.nn.functional.one_hot(torch.tensor([c, a]), 3).double()  # (K, V)
    h = lambda x: tokenwise_h(x, onehot)  # noqa: E731
    tau, law = step_law(speculative_accept, h, onehot, {(c, a): 1.0})
    assert torch.allclose(tau, torch.tensor([0.8, 0.19, 0.01], dtype=torch.float64))
    assert torch.allclose(law, TARGET3, atol=1e-12)
    n, nxt = speculative_accept(P, onehot, torch.tensor([c, a]), torch.tensor([0.5, 0.5]))
    assert n == 0 and torch.allclose(nxt, torch.tensor([5 / 8, 3 / 8, 0], dtype=torch.float64))
    block_tau, _ = step_law(block_accept, lambda x: block_weights(P, onehot, x)[1], onehot, {(c, a): 1.0})
    assert torch.allclose(block_tau, tau)
    _, bad = step_law(no_residual, h, onehot, {(c, a): 1.0})
    assert (bad - TARGET3).abs().max() > 0.05


# ---- decoders on tiny models: exactness at T = 0 ------------------------------------------------------------------
PROMPT, N_NEW = [5, 7, 11], 30
T0_CASES = [("speculative", {"accept": r}) for r in ("block", "typical", "fuzzy")]
T0_CASES += [("speculative", {"accept": "fuzzy", "fuzzy_divergence": k}) for k in ("kl", "tv")]
T0_CASES += [("speculative", {"proposer": "ngram", "accept": r}) for r in ("lossless", "block", "threshold", "typical",
                                                                          "fuzzy")]
T0_CASES += [("mtad", {"proposer": "ngram"})]


@functools.cache
def tiny(arch: str, draft: str = "near") -> ModelPair:
    t = tm.model(arch, 1, 32, hidden=16)
    return ModelPair(t, {"near": lambda: tm.near(t, 5, 0.02), "random": lambda: tm.model(arch, 2, 32, hidden=16),
                         "none": lambda: None}[draft]())


@functools.cache
def oracle(arch: str) -> tuple[int, ...]:
    return tuple(tm.oracle_greedy(tiny(arch).target, PROMPT, N_NEW))


def gen(models, name, extra=None, seed=0, prompt=PROMPT, **cfg):
    return mtad.generate(models, prompt, dict(name=name, **(extra or {}), **cfg), torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ["llama", "opt"])
@pytest.mark.parametrize("dec", T0_CASES, ids=["-".join([n, *map(str, e.values())]) for n, e in T0_CASES])
def test_t0_equals_greedy_oracle(arch, dec):
    """Every new rule and proposer reduces to exact matching at T = 0 (VERIFIERS.md §1-§4); an n-gram run
    needs no draft model (the pair has none)."""
    draft = "none" if dec[1].get("proposer") == "ngram" else "near"
    r = gen(tiny(arch, draft), *dec, temperature=0, max_new_tokens=N_NEW, gamma=3)
    assert tuple(r.tokens) == oracle(arch)
    assert max(r.accepted) >= 1 and any(a < k for a, k in zip(r.accepted, r.proposed))  # accepts and rejects


def test_ngram_ignores_a_pairs_draft_and_draft_proposer_still_needs_one():
    r = gen(tiny("llama", "near"), "speculative", {"proposer": "ngram"}, temperature=0, max_new_tokens=10)
    assert r.draft_forwards == 0 and tuple(r.tokens) == oracle("llama")[:10]
    for name in ("speculative", "mtad"):
        with pytest.raises(ValueError, match="needs a draft"):
            gen(tiny("llama", "none"), name)


def test_mtad_ngram_joint_rule_extremes():
    """q one-hot: L_d is the target's joint log-probability; tau -> 0 accepts every proposed token (full
    support), tau = 1 none (VERIFIERS.md §4)."""
    cfg = dict(top_k=0, top_p=1.0, max_new_tokens=40, gamma=3, proposer="ngram")
    lo = gen(tiny("opt", "none"), "mtad", tau=sys.float_info.min, **cfg)
    hi = gen(tiny("opt", "none"), "mtad", tau=1.0, **cfg)
    assert lo.accepted == lo.proposed and sum(lo.proposed) > 0
    assert sum(hi.accepted) == 0 and sum(hi.proposed) > 0


# ---- decoders on tiny models: losslessness ----------------------------------------------------------------------
N_DRAWS = 500


def exact_joint3(m, prompt: list[int], f) -> torch.Tensor:
    """P̃(x_1, x_2, x_3 | prompt), cache-free: (V, V, V)."""
    V = m.config.vocab_size
    l1 = tm.batch_logits(m, [prompt])[0, -1]  # (V,)
    l2 = tm.batch_logits(m, [prompt + [x] for x in range(V)])[:, -1]  # (V, V)
    l3 = tm.batch_logits(m, [prompt + [x, y] for x in range(V) for y in range(V)])[:, -1].view(V, V, V)
    return f(l1)[:, None, None] * f(l2)[:, :, None] * f(l3)


def chi_squares(models, cfg: dict, prompt: list[int], seed: int = 1) -> list[tuple[float, float]]:
    """(statistic, bound) of the first 1, 2 and 3 tokens of ``N_DRAWS`` decodes (gamma = 3, 4 new tokens: the
    first block has K = 3) against the exact filtered target (tinymodels.chi_square)."""
    V = models.target.config.vocab_size
    g, counts = torch.Generator().manual_seed(seed), torch.zeros(V, V, V)
    for _ in range(N_DRAWS):
        t = mtad.generate(models, prompt, dict(cfg, max_new_tokens=4, gamma=3), g).tokens
        counts[t[0], t[1], t[2]] += 1
    J = exact_joint3(models.target, prompt, lambda x: filter_probs(x, cfg["temperature"], cfg["top_k"], cfg["top_p"]))
    return [tm.chi_square(counts.sum((1, 2)), J.sum((1, 2))), tm.chi_square(counts.sum(2), J.sum(2)),
            tm.chi_square(counts, J)]


def lossless_and_broken_fails(models, cfg, prompt, attr, broken, monkeypatch) -> None:
    for n, (ok, bound) in enumerate(chi_squares(models, cfg, prompt), 1):
        assert ok < bound, f"{n}-token joint: chi2 {ok:.1f} >= {bound:.1f}"
    monkeypatch.setattr(rules_mod, attr, broken)  # the accept-rule table's entry calls it by name
    for n, (bad, bound) in enumerate(chi_squares(models, cfg, prompt), 1):
        assert bad > bound, f"the broken {attr} passed the {n}-token test: chi2 {bad:.1f} <= {bound:.1f}"


def broken_block(p, q, x, u):
    """Block verification without its residual: after a rejection the next token comes from p."""
    n, nxt = block_accept(p, q, x, u)
    return n, (p[n] if n < x.shape[0] else nxt)


def test_block_is_lossless_and_broken_variant_fails(monkeypatch):
    """Filtered target (top-k 3, top-p 0.95, V = 5); the subtler broken rules are caught exactly on F above."""
    models = ModelPair(tm.model("llama", 1, 5, hidden=16, layers=1, std=0.3),
                       tm.model("llama", 2, 5, hidden=16, layers=1, std=1.0))
    cfg = dict(name="speculative", accept="block", temperature=1.0, top_k=3, top_p=0.95)
    lossless_and_broken_fails(models, cfg, [1, 2, 3], "block_accept", broken_block, monkeypatch)


def test_speculative_ngram_is_lossless_and_broken_variant_fails(monkeypatch):
    """Prompt [1, 2, 3, 1, 2]: the n-gram draft is [3, 1, 2] (target p of its first token 0.895); no draft model."""
    models = ModelPair(tm.model("llama", 1, 4, hidden=16, layers=1, std=0.5))
    cfg = dict(name="speculative", proposer="ngram", temperature=1.0, top_k=0, top_p=1.0)
    prompt = [1, 2, 3, 1, 2]
    assert NgramLookup(2).propose(prompt, 3) == [3, 1, 2]
    lossless_and_broken_fails(models, cfg, prompt, "speculative_accept", no_residual, monkeypatch)


# ---- configuration: bad input, presets, hashes -----------------------------------------------------------------------
@pytest.mark.parametrize("key,value,words", [
    ("accept", "medusa", ["accept", "lossless | threshold | block | typical | fuzzy"]),
    ("proposer", "eagle", ["proposer", "'draft' or 'ngram'"]),
    ("ngram_max", 0, ["ngram_max", ">= 1"]),
    ("typical_threshold", 1.5, ["typical_threshold", "0 <= typical_threshold <= 1"]),
    ("typical_alpha", -0.1, ["typical_alpha", ">= 0"]),
    ("typical_alpha", math.nan, ["typical_alpha", ">= 0"]),
    ("fuzzy_divergence", "hellinger", ["fuzzy_divergence", "js | kl | tv"]),
    ("fuzzy_threshold", -0.1, ["fuzzy_threshold", ">= 0"]),
])
def test_bad_parameter_names_key_and_range(key, value, words):
    with pytest.raises(ValueError) as e:
        DecoderConfig(name="speculative", **{key: value})
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("name", ["mmtad", "specinfer", "mtjd", "greedy"])
def test_ngram_with_other_decoders_is_refused(name):
    words = rf"decoder.proposer='ngram'.*'draft' with decoder={name}.*speculative or mtad"
    with pytest.raises(ValueError, match=words):
        gen(tiny("llama"), name, proposer="ngram")
    DecoderConfig(name="mtad", proposer="ngram")  # accepted


def test_cli_bad_proposer_exits_2_without_a_row(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "p0", "prompt": "say hi", "answer": "hi"}) + "\n")
    from inprocess import run_module  # python -m mtad in this process

    out = run_module("mtad", "model=tiny", "task=jsonl", f"task.data_file={data}", f"results_dir={tmp_path / 'res'}",
                     "name=bad", "warmup=0", "decoder=mmtad", "decoder.proposer=ngram", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [x for x in out.stderr.splitlines() if x.startswith("mtad: error:")]
    assert len(errors) == 1 and "decoder.proposer='ngram'" in errors[0] and "'draft'" in errors[0], out.stderr[-2000:]
    assert not [p for p in (tmp_path / "res").rglob("*") if p.is_file()], "a failed run left files behind"


def _published_hash_inputs(*extra: str):
    """The resolved config of the published row cpu_table_feature-2026-12-04 (speculative, mt_bench), rebuilt
    the way the runner hashes it (composed config + weight and data fingerprints), and that row's hash."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from published_drafts import DRAFT

    from mtad.harness.config import register_configs
    from mtad.harness.runner import weights_fingerprint
    from mtad.models.load import ModelConfig
    from mtad.tasks.base import TaskConfig, get_task

    row = next(r for r in map(json.loads, (REPO_ROOT / "results/published/cpu_table_feature-2026-12-04.jsonl")
                              .read_text().splitlines()) if (r["decoder"]["name"], r["task"]["name"])
               == ("speculative", "mt_bench"))
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=cpu_table", "experiment/pair@pair=smollm2_feature",
                                           "decoder=speculative", "task=mt_bench", *extra])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    try:
        task = get_task(TaskConfig.from_any(resolved["task"]))
        data = task.data_fingerprint()
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"mt_bench data not available ({err}); set MTAD_DATA_DIR")
    resolved["task"]["source"] = task.resolved_source()  # the runner hashes the route task.source=auto took
    # the committed draft has moved on since the row was measured: its weight files are pinned to that run's
    assert set(weights_fingerprint(ModelConfig(**resolved["model"]))) == {"draft"}
    weights = {"draft": DRAFT["cpu_table_feature-2026-12-04"]}
    return {**resolved, "weights": weights, "data": data}, row


@pytest.mark.usefixtures("real_data_dir")  # the published row hashed the real MT-Bench file
def test_new_decoder_keys_keep_published_hashes(monkeypatch):
    from mtad.harness import rows as store

    resolved, row = _published_hash_inputs()
    late = {k.split(".")[1] for k in LATE_KEYS if k.startswith("decoder.")}
    assert late <= set(resolved["decoder"])  # the new keys are in the resolved config
    assert store.config_hash(resolved) == row["config_hash"]
    for override in ("decoder.proposer=ngram", "decoder.accept=block", "decoder.typical_alpha=0.5",
                     "decoder.fuzzy_threshold=0.1", "decoder.ngram_max=3"):
        assert store.config_hash(_published_hash_inputs(override)[0]) != row["config_hash"], override
    monkeypatch.setattr(store, "LATE_KEYS", {})  # negative control: without the rule the old hash is lost
    assert store.config_hash(resolved) != row["config_hash"]


def test_presets_name_their_rule():
    from hydra import compose, initialize_config_dir

    from mtad.harness.config import register_configs

    register_configs()
    want = {"block": ("speculative", "block", "draft"), "typical": ("speculative", "typical", "draft"),
            "fuzzy": ("speculative", "fuzzy", "draft"), "speculative_ngram": ("speculative", "lossless", "ngram"),
            "mtad_ngram": ("mtad", "lossless", "ngram")}
    for preset, (name, accept, proposer) in want.items():
        text = (REPO_ROOT / "conf/decoder" / f"{preset}.yaml").read_text()
        assert text.startswith("# ") and f"decoder={preset}" in text.splitlines()[0], preset  # the command
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            d = DecoderConfig.from_any(compose("config", overrides=[f"decoder={preset}"]).decoder)
        assert (d.name, d.accept, d.proposer) == (name, accept, proposer), preset


def test_runner_records_the_rule_and_loads_no_draft_for_ngram(tmp_path, monkeypatch):
    """Tiny runs of ``decoder=block``, ``speculative`` and ``speculative_ngram`` with a pair that names a draft:
    the rows name the rule and hash apart; the n-gram run asks the loader for no draft (the others do)."""
    from hydra import compose, initialize_config_dir

    from mtad.harness import runner
    from mtad.harness.config import register_configs

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "p0", "prompt": "say hi", "answer": "hi"}) + "\n")
    asked, load = [], runner.load_pair
    # an hf pair naming a draft, loaded as the tiny pair (kind=tiny refuses a model.draft it would ignore)
    monkeypatch.setattr(runner, "load_pair", lambda mcfg: asked.append(mcfg.draft) or load(
        dataclasses.replace(mcfg, kind="tiny", target=None, draft=None)))
    register_configs()
    rows = []
    for preset in ("block", "speculative", "speculative_ngram"):
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["model=tiny", "model.kind=hf", "model.target=no/such/target",
                                               "model.draft=no/such/draft", "task=jsonl",
                                               f"task.data_file={data}", "warmup=0", f"results_dir={tmp_path / 'res'}",
                                               "name=t", f"decoder={preset}", "decoder.max_new_tokens=6"])
        rows.append(runner.run(cfg, run_dir=tmp_path / preset))
    assert [r["decoder"]["accept"] for r in rows] == ["block", "lossless", "lossless"]
    assert rows[2]["decoder"]["proposer"] == "ngram" and rows[2]["metrics"]["draft_forwards"] == 0
    assert len({r["config_hash"] for r in rows}) == 3
    assert asked == ["no/such/draft", "no/such/draft", None]
    assert (tmp_path / "res" / "t.jsonl").read_text().count("\n") == 3


# ---- the acceptance-profile export's method names (VERIFIERS.md §5) ---------------------------------------------
def method_table(text: str) -> dict[tuple[str, str], str]:
    """(decoder, proposer) -> `method` from the ``| decoder | proposer | `method` |`` table of VERIFIERS.md §5."""
    rows, on = {}, False
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[:2] == ["decoder", "proposer"]:
            on = True
        elif on and len(cells) == 3 and not set(cells[0]) <= set("- "):
            rows[cells[0], cells[1]] = cells[2]
        elif on and not line.strip().startswith("|"):
            break
    return rows


def method_problems(text: str) -> list[str]:
    """Every drafted decoder with every proposer it takes is in the table, with the name the export writes."""
    from mtad.decoding.config import NGRAM_DECODERS
    from mtad.decoding.core import NEEDS_DRAFT
    from mtad.report.speculation import method_name

    table = method_table(text)
    want = {(d, p) for d in NEEDS_DRAFT for p in ("draft", "ngram") if p == "draft" or d in NGRAM_DECODERS}
    out = [f"{k} missing from the table" for k in sorted(want - set(table))]
    for (d, p), m in sorted(table.items()):
        got = method_name({"decoder": {"name": d, "proposer": p}})
        if got != m:
            out.append(f"decoder={d} proposer={p}: the doc says {m!r}, the export writes {got!r}")
    return out


def test_profile_method_names_match_the_doc():
    text = (REPO_ROOT / "docs" / "VERIFIERS.md").read_text()
    assert method_problems(text) == []
    # controls: the old wording's name for MTAD on n-gram drafts, and a missing row, are caught
    assert method_problems(text.replace("| mtad | ngram | `ngram_mtad` |", "| mtad | ngram | `mtad` |"))
    assert method_problems(text.replace("| mmtad | draft | `mmtad` |\n", ""))

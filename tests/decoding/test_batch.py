"""Batches of prompts (``mtad.generate`` on a list of prompts of different lengths, :class:`mtad.decoding.kv.Session`).

Per batch size 1, 2 and 5, with rows that stop (EOS) at different steps: at T = 0 every row equals its own
one-prompt greedy decode, token for token, with the same stop reason, the same target forwards and the same
acceptance record, for every decoder and variant: greedy, sampling, speculative (every accept rule, draft and
prompt-lookup proposers), MTAD (with and without replacement, prompt lookup), MMTAD, SpecInfer and MTJD (exhaustive
and beam), on token drafts and on a feature draft (per-row features through every crop, reorder and compaction).
Speculative sampling on a batch is lossless per row (chi-square of the first two tokens of each row against
that row's exact joint) and its rows are independent (chi-square of two identical rows' first tokens against
the product of their marginals). Controls that must fail: a rejected tail left visible in the cache,
positions advanced alike for every row, and one uniform shared by all rows.
"""
from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tinymodels as tm
from variants import variants

import mtad
import mtad.decoding.propose as propose_mod
import mtad.decoding.speculative as speculative_mod
from mtad.decoding.filter import filter_probs
from mtad.decoding.kv import Session
from mtad.models.feature_draft import FeatureDraft, feature_config
from mtad.models.pair import ModelPair

torch.set_num_threads(1)

# different lengths; the first two stop at different steps (checked in test_rows_stop_at_different_steps)
PROMPTS = [[5, 7, 11], [1, 2, 3, 4, 5, 6, 7, 8], [9], [3, 3, 8, 1, 2], [4, 4, 6, 2, 1, 9, 12]]
SIZES = [1, 2, 5]
N_NEW = 13
ARCHS = ["llama", "opt"]
# every decoder and variant from conf/decoder/ (tests/variants.py), and the sampling switches that take their own path
DECODERS = variants(("mtad", {"replacement": False}), ("mmtad", {"replacement": False, "reference": "own"}),
                    ("mtjd", {"mode": "beam", "replacement": False}))
FEATURE_DECODERS = [d for d in DECODERS if d[0] in ("speculative", "mtad", "mmtad", "specinfer")
                    and d[1].get("proposer") != "ngram" and d[1].get("accept") in (None, "lossless", "block")]


def ids(d):
    name, extra = d
    return name + "".join(f"-{k}={v}" for k, v in extra.items())


@functools.cache
def pair(arch: str) -> ModelPair:
    """A target and a near copy as draft: at T = 0 rows accept different numbers of tokens per iteration.
    ``llama-feature``: the llama target with a feature draft that reads the target's hidden states (a copy of the
    target whose input adds a small projection of the parent's feature: it accepts often, and the features change
    its proposals)."""
    if arch == "llama-feature":
        return ModelPair(pair("llama").target, feature_draft(pair("llama").target))
    t = tm.model(arch, 1, 32, hidden=16)
    return ModelPair(t, tm.near(t, 5, 0.02))


def feature_draft(target, eps: float = 0.01) -> FeatureDraft:
    c = feature_config(target.config, target.config.num_hidden_layers)
    c._attn_implementation = "sdpa"
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(3)
        d = FeatureDraft(c).eval()
        d.load_state_dict(target.state_dict(), strict=False)  # all but fc
        D = c.hidden_size
        d.fc.weight.copy_(torch.cat([torch.eye(D), eps * torch.randn(D, D)], 1))  # x = embed + eps R f_parent
        d.fc.bias.zero_()
    return d


@functools.cache
def eos(arch: str) -> int:
    """The token whose first greedy occurrence gives the most different stop steps over the five prompts."""
    outs = [tm.oracle_greedy(pair(arch).target, p, N_NEW) for p in PROMPTS]

    def stops(t):
        return [o.index(t) if t in o else N_NEW for o in outs]

    return max(range(32), key=lambda t: (len(set(stops(t))), stops(t)[0] != stops(t)[1], N_NEW in stops(t)))


def cfg(arch: str, name: str, extra: dict, **kw) -> dict:
    return dict(name=name, **extra, temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3, node_budget=10 ** 5,
                eos_token_id=eos(arch.split("-")[0]), **kw)


def one(arch, c, prompt):
    return mtad.generate(pair(arch), prompt, c, torch.Generator().manual_seed(0))


def rows(arch, c, prompts, seed=0):
    return mtad.generate(pair(arch), prompts, c, torch.Generator().manual_seed(seed))


# ---- exactness -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_rows_stop_at_different_steps(arch):
    """Guard for the tests below: under the chosen EOS the five rows stop at several different steps (some at
    max_new_tokens where possible), the first two differently, and the near draft both accepts and rejects."""
    r = [one(arch, cfg(arch, "greedy", {}), p) for p in PROMPTS]
    lengths = [len(x.tokens) for x in r]
    assert len(set(lengths)) >= 3 and lengths[0] != lengths[1], lengths
    assert "eos" in {x.stop_reason for x in r}
    acc = [a for p in PROMPTS for a in one(arch, cfg(arch, "speculative", {}), p).accepted]
    assert 0 in acc and max(acc) >= 2


@pytest.mark.parametrize("B", SIZES)
@pytest.mark.parametrize("arch,dec", [(a, d) for a in ARCHS for d in DECODERS]
                         + [("llama-feature", d) for d in FEATURE_DECODERS],
                         ids=lambda v: v if isinstance(v, str) else ids(v))
def test_each_row_equals_its_own_greedy_run(arch, B, dec):
    """At T = 0 row b of a batch of B equals the one-prompt greedy decode of prompt b (tokens, stop reason),
    and the one-prompt decode of the same decoder in its target forwards and per-iteration acceptance."""
    c = cfg(arch, *dec)
    got = rows(arch, c, PROMPTS[:B])
    assert len(got) == B
    for r, p in zip(got, PROMPTS[:B]):
        greedy, alone = one(arch, cfg(arch, "greedy", {}), p), one(arch, c, p)
        assert r.tokens == greedy.tokens and r.stop_reason == greedy.stop_reason
        assert (r.target_forwards, r.accepted, r.proposed) == (alone.target_forwards, alone.accepted, alone.proposed)


def test_tensor_prompts_and_finished_rows_leave_the_batch():
    """1-D tensors are prompts too; once a row stops, later target calls carry fewer rows."""
    c = cfg("llama", "speculative", {})
    got = rows("llama", c, [torch.tensor(p) for p in PROMPTS])
    assert [r.tokens for r in got] == [one("llama", c, p).tokens for p in PROMPTS]
    widths = {int(k.split(":")[2].split("x")[0]) for r in got for k in r.calls if k.startswith("target:")}
    assert max(widths) == len(PROMPTS) and min(widths) < len(PROMPTS)
    assert sum(r.wall_time_s for r in got) > 0


def top_draw(probs, rng, n=1, replacement=True):
    """A deterministic stand-in for every draw: the n most likely indices (ties to the lower index)."""
    return probs.argsort(dim=-1, descending=True, stable=True)[..., :n]


@pytest.mark.parametrize("B", [2, 5])
@pytest.mark.parametrize("dec", [("mtad", {"replacement": False}), ("mmtad", {"replacement": False}),
                                 ("mtjd", {"mode": "beam", "replacement": False}), ("mtjd", {"mode": "exhaustive"}),
                                 ("specinfer", {})], ids=ids)
def test_ragged_rows_equal_their_one_prompt_runs(B, dec, monkeypatch):
    """Rows whose beams or trees differ in size: without replacement a row keeps as many beams as its filtered
    support allows, and an exhaustive tree holds a row's whole support, so rows of a batch hold different numbers
    of beams or tree nodes in one pass (guarded below). At T = 1 with top_p = 0.5 and every draw and uniform made
    deterministic (the most likely entries; u = 0.5), each row equals its one-prompt decode: tokens, stop
    reason, target forwards and acceptance."""
    import mtad.decoding.beam as beam_mod
    import mtad.decoding.core as core_mod
    import mtad.decoding.mmtad as mmtad_mod
    import mtad.decoding.mtad as mtad_d
    import mtad.decoding.specinfer as specinfer_mod

    for mod in (beam_mod, core_mod, mmtad_mod, mtad_d, specinfer_mod):
        monkeypatch.setattr(mod, "draw", top_draw)
    monkeypatch.setattr(specinfer_mod, "uniform", lambda n, rng: torch.full((n,), 0.5))
    ragged, draw_rows, forward_tree = [], beam_mod._draw_rows, Session.forward_tree

    def record_widths(*a):
        idx, w = draw_rows(*a)
        ragged.append(len(set(w)) > 1)
        return idx, w

    def record_nodes(self, tokens, *a, **kw):
        ragged.append(len({len(t) for t in tokens}) > 1)
        return forward_tree(self, tokens, *a, **kw)

    monkeypatch.setattr(beam_mod, "_draw_rows", record_widths)
    monkeypatch.setattr(Session, "forward_tree", record_nodes)
    c = dict(cfg("llama", *dec), temperature=1.0, top_k=0, top_p=0.5, beam_width=4, k_config=[2, 2, 1])
    alone = [one("llama", c, p) for p in PROMPTS[:B]]
    ragged.clear()
    got = rows("llama", c, PROMPTS[:B])
    assert any(ragged), "every pass held equal rows: the test proves nothing"
    for r, a in zip(got, alone):
        assert (r.tokens, r.stop_reason, r.target_forwards, r.accepted) == \
            (a.tokens, a.stop_reason, a.target_forwards, a.accepted)


def test_feature_rows_accept_and_a_feature_bug_breaks_them(monkeypatch):
    """Guard and control for the feature-draft rows above: the feature draft accepts some tokens and rejects
    others, and with each row handed another row's features (a batching bug) or no features at all some row of a
    speculative batch of 5 leaves its one-prompt acceptance record."""
    c = cfg("llama-feature", "speculative", {})
    alone = [one("llama-feature", c, p).accepted for p in PROMPTS]
    assert 0 < sum(map(sum, alone)) < sum(map(len, alone)) * c["gamma"]
    orig = Session._features
    for bug in (lambda out: out.roll(1, 0), torch.zeros_like):
        monkeypatch.setattr(Session, "_features", lambda self, *a, bug=bug: bug(orig(self, *a)))
        got = [r.accepted for r in rows("llama-feature", c, PROMPTS)]
        monkeypatch.undo()
        assert got != alone


# ---- controls: broken caches must fail the exactness test ---------------------------------------------------
def pack_tail_visible(self):
    """Crop only what every row drops (``DynamicCache.crop`` cuts all rows alike): the other rows' rejected
    tails stay in the slots their mask shows."""
    j = min(self.junk)
    if j:
        self.cache.crop(-j)
    self.junk = [0] * len(self.junk)


def positions_uniform(self, lengths, S):
    """Every row at the longest row's position: positions advanced alike for all rows."""
    return (int(lengths.max()) + torch.arange(S))[None, :].expand(len(lengths), S)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("broken", [pack_tail_visible, positions_uniform], ids=["tail-visible", "uniform-positions"])
def test_broken_cache_fails_exactness(arch, broken, monkeypatch):
    """The exactness test has power: with either bug some row of a speculative batch of 5 leaves its greedy run."""
    c = cfg(arch, "speculative", {})
    monkeypatch.setattr(Session, broken.__name__.replace("pack_tail_visible", "_pack")
                        .replace("positions_uniform", "_positions"), broken)
    got = rows(arch, c, PROMPTS)
    monkeypatch.undo()
    assert any(r.tokens != one(arch, c, p).tokens for r, p in zip(got, PROMPTS))


# ---- half precision: a batch may break a 1-ulp tie, nothing more (ALGORITHMS.md, "Batches of prompts") --------
HALF_SEEDS = (2, 3)  # tiny bf16 llamas on which a batch of PROMPTS breaks such a tie (guarded below)
HALF_NEW = 24


@functools.cache
def half_model(seed: int, dtype: torch.dtype):
    return tm.model("llama", seed, 256, hidden=64).to(dtype)


def tie_problems(m, prompts, batch, alone, ulps: float = 2) -> tuple[int, list[str]]:
    """(rows that differ, problems): each row that leaves its one-prompt greedy decode must do so at a tie, i.e.
    where the cache-free logits of the two tokens differ by at most ``ulps`` units in the last place of m's dtype."""
    eps, bad, differ = torch.finfo(m.dtype).eps, [], 0
    for b, (r, s, p) in enumerate(zip(batch, alone, prompts)):
        if r.tokens == s.tokens:
            continue
        differ += 1
        i = next((k for k, (x, y) in enumerate(zip(r.tokens, s.tokens)) if x != y), None)
        if i is None:
            bad.append(f"row {b}: one is a prefix of the other")
            continue
        with torch.no_grad():
            lg = m(torch.tensor([p + s.tokens[:i]])).logits[0, -1].float()  # (V,)
        ulp = eps * 2 ** math.floor(math.log2(float(lg.abs().max())))
        gap = float(lg[s.tokens[i]] - lg[r.tokens[i]])
        if gap > ulps * ulp:
            bad.append(f"row {b} step {i}: logit gap {gap:.4g} > {ulps} ulp ({ulp:.4g})")
    return differ, bad


def greedy_batch_and_alone(m, prompts):
    c, pr = dict(name="greedy", max_new_tokens=HALF_NEW), ModelPair(m, None)
    return (mtad.generate(pr, prompts, c, torch.Generator().manual_seed(0)),
            [mtad.generate(pr, p, c, torch.Generator().manual_seed(0)) for p in prompts])


def test_bf16_rows_differ_from_their_one_prompt_decode_only_at_ties(monkeypatch):
    """In bf16 a batch can take the other of two tokens whose logits are 1 ulp apart (ALGORITHMS.md's promise is
    float32 equality, bf16 equality up to such ties): every difference is a tie, some row does differ here (the
    guard: the caveat is real), the same models in float32 give equal rows, and a broken batch (positions advanced
    alike for all rows) leaves its greedy decodes at non-ties (the control)."""
    differ = 0
    for seed in HALF_SEEDS:
        m = half_model(seed, torch.bfloat16)
        n, bad = tie_problems(m, PROMPTS, *greedy_batch_and_alone(m, PROMPTS))
        assert bad == []
        differ += n
        batch, alone = greedy_batch_and_alone(half_model(seed, torch.float32), PROMPTS)
        assert [r.tokens for r in batch] == [r.tokens for r in alone]
    assert differ >= 1
    monkeypatch.setattr(Session, "_positions", positions_uniform)
    m = half_model(HALF_SEEDS[0], torch.bfloat16)
    assert tie_problems(m, PROMPTS, *greedy_batch_and_alone(m, PROMPTS))[1]


def test_the_t0_promise_names_its_precision():
    """ALGORITHMS.md promises T = 0 row equality in float32 and says what bf16 batches may change."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "ALGORITHMS.md").read_text()
    bullet = text[text.index("- **At T = 0 every row equals its one-prompt decode"):]
    bullet = bullet[:bullet.index("\n- **")]
    assert "float32" in bullet and "bfloat16" in bullet and "ulp" in bullet, bullet


# ---- distribution: lossless per row, independent across rows ------------------------------------------------
V = 4
DIST_PROMPTS = [[1, 2, 3], [1, 2, 3], [2, 1], [3, 0, 1, 2, 1], [1]]  # rows 0 and 1 identical: independence
FILT = dict(temperature=1.0, top_k=0, top_p=1.0)
N_DRAWS = 400


@functools.cache
def dist_pair() -> ModelPair:
    return ModelPair(tm.model("llama", 1, V, hidden=16, layers=1, std=0.5),
                     tm.model("llama", 2, V, hidden=16, layers=1, std=1.0))


def exact_joint2(m, prompt) -> torch.Tensor:
    """P̃(x_1, x_2 | prompt), cache-free: (V, V)."""
    f = lambda x: filter_probs(x, **FILT)
    logits = tm.batch_logits(m, [prompt + [a] for a in range(V)])  # (V, T, V)
    return f(logits[0, len(prompt) - 1])[:, None] * f(logits[:, len(prompt)])  # (V, V)


def batch_counts(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the first two tokens per row (B, V, V) and of the first tokens of rows 0 and 1 (V, V) over
    ``N_DRAWS`` batched decodes (``max_new_tokens=3, gamma=2``: acceptance, residual and bonus all occur)."""
    g, models = torch.Generator().manual_seed(seed), dist_pair()
    per_row, pairs = torch.zeros(len(DIST_PROMPTS), V, V), torch.zeros(V, V)
    for _ in range(N_DRAWS):
        out = mtad.generate(models, DIST_PROMPTS, dict(name="speculative", **FILT, max_new_tokens=3, gamma=2), g)
        for b, r in enumerate(out):
            per_row[b, r.tokens[0], r.tokens[1]] += 1
        pairs[out[0].tokens[0], out[1].tokens[0]] += 1
    return per_row, pairs


def shared_draw(probs, rng, n=1, replacement=True):
    """One uniform for every row (the bug): row 0's draw, applied to every row's distribution."""
    cdf = probs.double().cumsum(-1)  # (B, V)
    u = torch.rand(n, generator=rng, dtype=torch.float64)  # (n,): shared
    return torch.searchsorted(cdf, (u[None, :] * cdf[..., -1:]).contiguous(), right=True)  # (B, n)


def shared_uniform_rows(B, n, rng):
    return torch.rand(n, generator=rng)[None, :].expand(B, n)


def test_speculative_batch_is_lossless_per_row_and_independent(monkeypatch):
    """Each row's first two tokens follow its own exact filtered target joint (Pearson chi-square below
    chi2.ppf(0.999, dof), small cells pooled), and the first tokens of the two identical rows follow the
    product of their marginals. With one uniform shared by all rows, every row's marginal is still right but
    the two identical rows always agree: the independence statistic must exceed its bound."""
    m = dist_pair().target
    per_row, pairs = batch_counts()
    for b, prompt in enumerate(DIST_PROMPTS):
        stat, bound = tm.chi_square(per_row[b], exact_joint2(m, prompt))
        assert stat < bound, f"row {b} is not lossless: chi2 {stat:.1f} >= {bound:.1f}"
    p1 = exact_joint2(m, DIST_PROMPTS[0]).sum(1)  # (V,) first-token marginal
    stat, bound = tm.chi_square(pairs, p1[:, None] * p1[None, :])
    assert stat < bound, f"rows 0 and 1 are not independent: chi2 {stat:.1f} >= {bound:.1f}"

    monkeypatch.setattr(speculative_mod, "draw", shared_draw)
    monkeypatch.setattr(propose_mod, "draw", shared_draw)  # the draft chain's draws
    monkeypatch.setattr(speculative_mod, "uniform_rows", shared_uniform_rows)
    _, pairs = batch_counts()
    bad, _ = tm.chi_square(pairs, p1[:, None] * p1[None, :])
    assert bad > bound, f"a uniform shared by all rows passed: chi2 {bad:.1f} <= {bound:.1f}; the test has no power"


LOSSLESS = [
    ("sampling", {}),
    ("speculative", {"accept": "block"}),
    ("speculative", {"proposer": "ngram", "ngram_max": 2}),
    ("specinfer", {"k_config": [2, 2]}),
    ("speculative", {"draft": "feature"}),
]


@functools.cache
def dist_feature_pair() -> ModelPair:
    """The distribution target with a feature draft far from it (a copy of the target whose input adds a large
    projection of the parent's feature)."""
    return ModelPair(dist_pair().target, feature_draft(dist_pair().target, eps=1.0))


@pytest.mark.parametrize("dec", LOSSLESS, ids=ids)
def test_lossless_decoders_follow_the_target_per_row_at_batch_4(dec):
    """Every lossless decoder at batch 4 (rows of different lengths; the default lossless speculative decoder is
    tested above at batch 5): each row's first two tokens follow that row's exact filtered target joint (Pearson
    chi-square below chi2.ppf(0.999, dof), small cells pooled). The control is a deliberately wrong law: the same
    counts tested against the draft's joint (token drafts) or the next row's target joint must exceed the bound."""
    name, extra = dec
    feature = extra.get("draft") == "feature"
    models = dist_feature_pair() if feature else dist_pair()
    g, prompts = torch.Generator().manual_seed(7), DIST_PROMPTS[1:]
    counts = torch.zeros(len(prompts), V, V)
    c = dict(name=name, **{k: v for k, v in extra.items() if k != "draft"}, **FILT, max_new_tokens=3, gamma=2)
    for _ in range(N_DRAWS // 2):
        for b, r in enumerate(mtad.generate(models, prompts, c, g)):
            counts[b, r.tokens[0], r.tokens[1]] += 1
    token_draft = name != "sampling" and extra.get("proposer") != "ngram" and not feature
    wrong = 0
    for b, prompt in enumerate(prompts):
        stat, bound = tm.chi_square(counts[b], exact_joint2(models.target, prompt))
        assert stat < bound, f"row {b} is not lossless: chi2 {stat:.1f} >= {bound:.1f}"
        bad = exact_joint2(models.draft, prompt) if token_draft else exact_joint2(models.target, prompts[b - 1])
        stat, bound = tm.chi_square(counts[b], bad)
        wrong += stat > bound
    assert wrong >= len(prompts) - 1, f"only {wrong} rows reject the wrong law: the test has too little power"


# ---- sliding windows: slot distance = position distance in every row ----------------------------------------
@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
@pytest.mark.parametrize("dec", [("greedy", {}), ("speculative", {}), ("mtad", {})], ids=ids)
def test_sliding_window_rows_equal_their_one_prompt_runs(arch, dec):
    """Window W = 8, prompts of 3 to 16 tokens and 13 new ones (every row passes the window): the model's own
    sliding mask counts cache slots, so it is right only because no row ever has a hole before a real token."""
    t = tm.model(arch, 1, 32, hidden=16, window=8)
    models = ModelPair(t, tm.near(t, 5, 0.02))
    prompts = [PROMPTS[0], list(range(1, 17)), PROMPTS[3]]
    c = dict(name=dec[0], **dec[1], temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3)
    got = mtad.generate(models, prompts, c, torch.Generator().manual_seed(0))
    for r, p in zip(got, prompts):
        assert r.tokens == tm.oracle_greedy(t, p, N_NEW)

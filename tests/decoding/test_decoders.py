"""End-to-end tests of every decoder on tiny random llama/OPT models built in-process (no files, no hub).

Exactness (T=0 equals a cache-free greedy oracle), determinism, stop rules, losslessness of
``speculative``/``specinfer`` (chi-square against the exact joint, with broken variants that must fail),
MMTAD(W=1) == MTAD, MTJD against brute force, and the validation errors of :func:`mtad.generate`.
"""
from __future__ import annotations

import functools
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tinymodels as tm
from variants import drafted, variants

import mtad
import mtad.decoding.rules as rules_mod
import mtad.decoding.specinfer as specinfer_mod
from mtad.decoding.accept import residual
from mtad.decoding.attention import TREE_ARCHITECTURES
from mtad.decoding.core import NEEDS_DRAFT, NEEDS_TREE
from mtad.decoding.filter import filter_probs
from mtad.models.pair import ModelPair

torch.set_num_threads(1)

PROMPT = [5, 7, 11]
N_NEW = 13  # not a multiple of gamma: the last block is shortened
ARCHS = ["llama", "opt"]
DRAFTS = ["random", "near", "same"]  # independent model | target + small noise | the target itself

# (name, extra config): every decoder and variant, from conf/decoder/ (tests/variants.py), and MMTAD's other reference
DECODERS = variants(("mmtad", {"reference": "own", "replacement": False}))
DRAFTED = [d for d in DECODERS if drafted(d)]  # drafted by the draft model (prompt lookup cannot copy the target)
# a draft equal to the target passes every block where the rule judges sampled drafts by p̃ against q̃: not typical
# acceptance (it judges p̃(x) alone, so an unlikely draw fails) nor dyntree (its tree holds the draft's most likely
# children: fixed candidates, not draws)
SAMPLED = [d for d in DRAFTED if d[0] != "dyntree" and d[1].get("accept") != "typical"]
STOCHASTIC = [d for d in DECODERS if d[0] != "greedy" and d[1] != {"mode": "exhaustive"}]  # these ignore the seed
STOCHASTIC += [("mtjd", {"mode": "exhaustive", "select": "nucleus"})]


def ids(d):
    name, extra = d
    return name + "".join(f"-{v}" for v in extra.values())


@functools.cache
def target(arch: str, attn: str = "sdpa"):
    return tm.model(arch, 1, 32, hidden=16, attn=attn)


@functools.cache
def pair(arch: str, draft: str = "random", attn: str = "sdpa") -> ModelPair:
    t = target(arch, attn)
    d = {"random": lambda: tm.model(arch, 2, 32, hidden=16, attn=attn),
         "near": lambda: tm.near(t, 5, 0.02), "same": lambda: t}[draft]()
    return ModelPair(t, d)


@functools.cache
def oracle(arch: str, n: int = N_NEW) -> list[int]:
    return tm.oracle_greedy(target(arch), PROMPT, n)


def gen(models, name, extra=None, seed=0, **cfg):
    return mtad.generate(models, PROMPT, dict(name=name, **(extra or {}), **cfg), torch.Generator().manual_seed(seed))


# ---- exactness -------------------------------------------------------------------------------------------
ORACLE_CASES = [(d, draft) for d in DECODERS for draft in (DRAFTS if drafted(d) else ["random"])]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec,draft", ORACLE_CASES, ids=[f"{ids(d)}-{dr}" for d, dr in ORACLE_CASES])
def test_t0_equals_greedy_oracle(arch, dec, draft):
    """At T=0 every decoder reproduces the cache-free greedy oracle token for token (ALGORITHMS.md §3-§7),
    with an independent random draft, a near copy of the target, and the target itself as draft."""
    r = gen(pair(arch, draft), *dec, temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3)
    assert r.tokens == oracle(arch)
    assert r.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec", [("speculative", {}), ("mtad", {}), ("mmtad", {}), ("specinfer", {})], ids=ids)
def test_t0_equals_greedy_oracle_eager(arch, dec):
    """Same with the eager attention kernel (the tree mask goes through a different code path)."""
    r = gen(pair(arch, "near", "eager"), *dec, temperature=0, max_new_tokens=N_NEW, gamma=3, beam_width=3)
    assert r.tokens == oracle(arch)


def test_near_draft_exercises_accept_and_reject():
    """Guard for the tests above: the 'near' draft both accepts and rejects at T=0, the 'random' one rarely
    accepts, so the oracle comparison covers both branches of every commit."""
    acc = gen(pair("llama", "near"), "speculative", temperature=0, max_new_tokens=30).accepted
    assert 0 in acc and max(acc) >= 2


# ---- randomness ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dec", STOCHASTIC, ids=ids)
def test_same_seed_same_output_different_seed_differs(dec):
    cfg = dict(temperature=1.0, top_k=8, top_p=0.95, max_new_tokens=12, gamma=2 if dec[0] == "mtjd" else 3)
    m = pair("llama", "near")
    runs = [gen(m, *dec, seed=s, **cfg).tokens for s in (0, 0, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs}) >= 3


def test_mtjd_exhaustive_argmax_ignores_the_seed():
    cfg = dict(temperature=1.0, top_k=4, top_p=1.0, max_new_tokens=8, gamma=2, mode="exhaustive")
    assert len({tuple(gen(pair("llama"), "mtjd", seed=s, **cfg).tokens) for s in range(3)}) == 1


# ---- stop rules ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dec", DECODERS, ids=ids)
@pytest.mark.parametrize("n", [1, 2, 5])
def test_exactly_max_new_tokens(dec, n):
    r = gen(pair("opt", "near"), *dec, temperature=1.0, top_k=4, top_p=1.0, max_new_tokens=n, gamma=4)
    assert len(r.tokens) == n and r.stop_reason == "max_new_tokens"


def _first_new_token(seq: list[int], start: int) -> tuple[int, int]:
    """(index, token) of the first token at index >= start that did not occur before it."""
    return next((i, t) for i, t in enumerate(seq) if i >= start and t not in seq[:i])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec", DECODERS, ids=ids)
def test_eos_kept_nothing_after_t0(arch, dec):
    """EOS set in the config to a token the greedy decode emits at index i: output = oracle[:i+1]."""
    i, eos = _first_new_token(oracle(arch, 20), 3)
    r = gen(pair(arch, "near"), *dec, temperature=0, max_new_tokens=20, gamma=3, eos_token_id=eos)
    assert r.tokens == oracle(arch, 20)[: i + 1]
    assert r.stop_reason == "eos"


@functools.cache
def frequent_token() -> int:
    toks = [t for s in range(5)
            for t in gen(pair("llama"), "sampling", seed=s, top_k=0, top_p=1.0, max_new_tokens=20).tokens]
    return max(set(toks), key=toks.count)


@pytest.mark.parametrize("dec", DECODERS, ids=ids)
def test_eos_kept_nothing_after_t1(dec):
    eos, hits = frequent_token(), 0
    for s in range(4):
        r = gen(pair("llama", "near"), *dec, seed=s, top_k=4, top_p=1.0, max_new_tokens=20, gamma=3,
                eos_token_id=eos)
        if eos in r.tokens:
            hits += 1
            assert r.tokens.index(eos) == len(r.tokens) - 1 and r.stop_reason == "eos"
        else:
            assert len(r.tokens) == 20 and r.stop_reason == "max_new_tokens"
    assert hits >= 1, "the EOS token was never emitted: the test did not exercise the EOS path"


def test_eos_from_generation_config_list():
    """Without ``eos_token_id`` in the config, every id of the target's generation_config stops."""
    ref = oracle("llama", 20)
    (i, a), (_, b) = _first_new_token(ref, 3), _first_new_token(ref, 6)
    t = tm.model("llama", 1, 32, hidden=16)
    t.generation_config.eos_token_id = [b, a]
    r = mtad.generate(ModelPair(t), PROMPT, dict(name="greedy", max_new_tokens=20))
    assert r.tokens == ref[: i + 1] and r.stop_reason == "eos"


@pytest.mark.parametrize("dec", [d for d in DRAFTED if d[0] != "mmtad" or d[1]], ids=ids)
def test_iteration_records_are_consistent(dec):
    """Each drafted iteration emits accepted+1 tokens for one target pass (plus at most one plain tail
    step); per-position counts agree with the accepted lengths."""
    r = gen(pair("llama", "near"), *dec, top_k=0, top_p=1.0, max_new_tokens=17, gamma=3, seed=1)
    tail = r.target_forwards - len(r.accepted)
    assert tail in (0, 1)
    assert len(r.tokens) == sum(a + 1 for a in r.accepted) + tail
    assert all(0 <= a <= p for a, p in zip(r.accepted, r.proposed))
    for j in range(max(r.proposed)):
        assert r.position_proposals[j] == sum(p > j for p in r.proposed)
        assert r.position_accepts[j] == sum(a > j for a in r.accepted)


# ---- a draft equal to the target accepts everything --------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dec", SAMPLED, ids=ids)
def test_identical_draft_accepts_every_block(arch, dec):
    """T=1, tau=0.5: p̃ == q̃ up to float noise, so every ratio is ~1 and every block passes."""
    r = gen(pair(arch, "same"), *dec, seed=3, top_k=0, top_p=1.0, tau=0.5, max_new_tokens=20, gamma=3)
    assert r.accepted and r.accepted == r.proposed


# ---- MMTAD with W=1 is MTAD ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_mmtad_w1_equals_mtad(arch):
    """Same seed, T=1: identical tokens and accepted lengths, over drafts/seeds where blocks are both
    accepted and rejected (tau=0.9)."""
    cfg = dict(temperature=1.0, top_k=0, top_p=1.0, beam_width=1, gamma=3, tau=0.9, max_new_tokens=20)
    accepted = []
    for draft in ("random", "near"):
        for seed in (0, 1):
            a = gen(pair(arch, draft), "mtad", seed=seed, **cfg)
            b = gen(pair(arch, draft), "mmtad", seed=seed, **cfg)
            assert a.tokens == b.tokens and a.accepted == b.accepted, (draft, seed)
            accepted += a.accepted
    assert 0 in accepted and 3 in accepted


# ---- MTJD against brute force -------------------------------------------------------------------------------
def brute_force_block(m, prefix: list[int], K: int, f) -> list[int]:
    """argmax over all V^K blocks of the filtered joint Π_j f(p(x_j | prefix, x_<j)), cache-free."""
    V = m.config.vocab_size
    tails = torch.cartesian_prod(*[torch.arange(V)] * (K - 1)).view(-1, K - 1) if K > 1 else torch.zeros(1, 0)
    logits = tm.batch_logits(m, [prefix + t.long().tolist() for t in tails])  # (V^(K-1), T, V)
    P = f(logits[:, len(prefix) - 1:])  # (V^(K-1), K, V): step j's distribution given tail[:j]
    joint = P[0, 0]  # (V,) over x_1
    for j in range(1, K):
        rows = torch.arange(V ** j) * V ** (K - 1 - j)  # a tail whose first j tokens enumerate x_1..x_j
        joint = (joint[:, None] * P[rows, j]).flatten()  # (V^(j+1),)
    flat = int(joint.argmax())
    return [flat // V ** (K - 1 - j) % V for j in range(K)]


MTJD_FILTERS = [dict(temperature=1.0, top_k=0, top_p=1.0), dict(temperature=0.8, top_k=3, top_p=0.9)]


@pytest.mark.parametrize("filt", MTJD_FILTERS, ids=["full", "filtered"])
def test_mtjd_exhaustive_equals_brute_force(filt):
    m = tm.model("llama", 1, 6, hidden=16, std=0.3)
    f = lambda logits: filter_probs(logits, filt["temperature"], filt["top_k"], filt["top_p"])
    prefix = [1, 4]
    r = mtad.generate(ModelPair(m), prefix, dict(name="mtjd", mode="exhaustive", gamma=3, max_new_tokens=11, **filt))
    ref = []
    for K in (3, 3, 3, 2):
        ref += brute_force_block(m, prefix + ref, K, f)
    assert r.tokens[:3] == ref[:3]
    assert r.tokens == ref
    # negative control: the greedy (token-by-token) decode differs from the joint argmax here
    assert tm.oracle_greedy(m, prefix, 11) != ref


def test_mtjd_beam_wide_agrees_with_exhaustive():
    """mtjd beam with W=64 finds the joint argmax block on >= 90% of 20 prompts (measured: 20/20);
    W=1 (plain sampling of a block) agrees far less often (measured: 2/20), so the rate is informative."""
    m = tm.model("llama", 1, 6, hidden=16, std=0.3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(6, (3,), generator=g).tolist() for _ in range(20)]
    f = lambda logits: filter_probs(logits, 1.0, 0, 1.0)
    cfg = dict(name="mtjd", mode="beam", gamma=3, max_new_tokens=3, top_k=0, top_p=1.0)

    def rate(W):
        return sum(mtad.generate(ModelPair(m), p, dict(cfg, beam_width=W), torch.Generator().manual_seed(i)).tokens
                   == brute_force_block(m, p, 3, f) for i, p in enumerate(prompts)) / len(prompts)

    assert rate(64) >= 0.9
    assert rate(1) <= 0.4


# ---- losslessness: the empirical joint of the first two tokens ----------------------------------------------
def exact_joint2(m, prompt, f) -> torch.Tensor:
    """P̃(x_1, x_2 | prompt) = p̃(x_1) p̃(x_2 | x_1), cache-free: (V, V)."""
    V = m.config.vocab_size
    logits = tm.batch_logits(m, [prompt + [a] for a in range(V)])  # (V, T, V)
    return f(logits[0, len(prompt) - 1])[:, None] * f(logits[:, len(prompt)])  # (V, V)


def chi_square(models, cfg: dict, n: int, seed: int = 1) -> tuple[float, float]:
    """(statistic, bound): Pearson's chi-square of the first two generated tokens of ``n`` decodes
    (``max_new_tokens=3, gamma=2``) against the exact filtered joint J, and its bound chi2.ppf(0.999, dof).
    Token pairs with expected count n·J < 5 are pooled into one bin (the usual validity rule), dof = bins - 1;
    a token pair of zero probability that occurs gives an infinite statistic."""
    V = models.target.config.vocab_size
    f = lambda x: filter_probs(x, cfg["temperature"], cfg["top_k"], cfg["top_p"])
    g, counts = torch.Generator().manual_seed(seed), torch.zeros(V, V)
    for _ in range(n):
        t = mtad.generate(models, DIST_PROMPT, dict(cfg, max_new_tokens=3, gamma=2), g).tokens
        counts[t[0], t[1]] += 1
    return tm.chi_square(counts, exact_joint2(models.target, DIST_PROMPT, f))


def broken_speculative(p, q, x, u):
    """Speculative sampling without the residual: after a rejection, resample from p̃ itself."""
    n, nxt = ORIG_SPECULATIVE(p, q, x, u)
    return n, (p[n] if n < x.shape[0] else nxt)


def broken_multi_draft(p, q, xs, u):
    """SpecInfer's rule without the residual update between children (each child tested against p̃)."""
    for i in range(xs.shape[0]):
        if u[i] < min(1.0, float(p[xs[i]] / q[xs[i]])):
            return i, p
    return -1, residual(p, q)


ORIG_SPECULATIVE = rules_mod.speculative_accept
N_DRAWS = 500
DIST_PROMPT = [1, 2, 3]
# (vocab, target std, draft std, filter): peaky, clearly different target and draft give the test power
SETTINGS = {
    "full": (4, 0.5, 1.0, dict(temperature=1.0, top_k=0, top_p=1.0)),
    "topk-topp": (5, 0.3, 1.0, dict(temperature=1.0, top_k=3, top_p=0.95)),
}


@functools.cache
def dist_pair(setting: str) -> ModelPair:
    V, ts, ds, _ = SETTINGS[setting]
    return ModelPair(tm.model("llama", 1, V, hidden=16, layers=1, std=ts),
                     tm.model("llama", 2, V, hidden=16, layers=1, std=ds))


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", ["speculative", "specinfer"])
def test_lossless_joint_of_two_tokens(setting, name, monkeypatch):
    """The first two tokens of ``N_DRAWS`` = 500 decodes (``max_new_tokens=3, gamma=2``: the first iteration
    exercises acceptance at both draft positions, the residual and the bonus) follow the exact filtered
    target joint: Pearson chi-square < chi2.ppf(0.999, dof), cells with expected count < 5 pooled
    (dof 9, bound 27.9 for the full-vocabulary setting; dof 5, bound 20.5 for top-k/top-p). The broken
    variant (speculative: resample from p̃ after a rejection; specinfer: no residual update between
    children) must exceed the same bound. Seeds are fixed, so the outcome is deterministic.

    Measured (statistic ok / broken): full: speculative 14.5 / 88.2, specinfer 7.6 / 222.7;
    top-k/top-p: speculative 3.6 / 58.0, specinfer 5.0 / 225.4."""
    filt = SETTINGS[setting][3]
    models = dist_pair(setting)
    cfg = dict(name=name, **filt)
    ok, bound = chi_square(models, cfg, N_DRAWS)
    assert ok < bound, f"{name} is not lossless: chi2 {ok:.1f} >= {bound:.1f}"
    if name == "speculative":
        monkeypatch.setattr(rules_mod, "speculative_accept", broken_speculative)
    else:
        monkeypatch.setattr(specinfer_mod, "multi_draft_accept", broken_multi_draft)
    bad, _ = chi_square(models, cfg, N_DRAWS)
    assert bad > bound, f"the broken {name} passed: chi2 {bad:.1f} <= {bound:.1f}; the test has no power"


# ---- validation -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value,words", [
    ("gamma", 0, ["gamma", ">= 1"]),
    ("tau", 0.0, ["tau", "0 < tau <= 1"]),
    ("tau", 1.5, ["tau", "0 < tau <= 1"]),
    ("beam_width", 0, ["beam_width", ">= 1"]),
    ("top_p", 0.0, ["top_p", "0 < top_p <= 1"]),
    ("top_p", 1.01, ["top_p", "0 < top_p <= 1"]),
    ("max_new_tokens", 0, ["max_new_tokens", ">= 1"]),
    ("top_k", -1, ["top_k", ">= 0"]),
    ("temperature", -0.5, ["temperature", ">= 0"]),
    ("accept", "maybe", ["accept", "lossless"]),
    ("mode", "greedy", ["mode", "exhaustive"]),
    ("k_config", [2, 0], ["k_config", ">= 1"]),
])
def test_bad_parameter_names_parameter_and_range(key, value, words):
    with pytest.raises(ValueError) as e:
        gen(pair("llama"), "mtad", **{key: value})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_unknown_decoder_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        gen(pair("llama"), "beamsearch")
    assert "beamsearch" in str(e.value)
    assert all(name in str(e.value) for name in mtad.DECODERS)


def test_unknown_config_key():
    with pytest.raises(ValueError, match="gama"):
        gen(pair("llama"), "mtad", gama=3)


def test_vocab_mismatch():
    with pytest.raises(ValueError, match="vocabularies differ.*32.*16"):
        gen(ModelPair(target("llama"), tm.model("llama", 2, 16, hidden=16)), "speculative")


def test_mtjd_exhaustive_over_budget():
    with pytest.raises(ValueError, match="node_budget"):
        gen(pair("llama"), "mtjd", mode="exhaustive", top_k=10, gamma=4, node_budget=1000)
    gen(pair("llama"), "mtjd", mode="exhaustive", top_k=10, gamma=2, node_budget=110, max_new_tokens=2)  # fits


def test_empty_prompt():
    with pytest.raises(ValueError, match="empty prompt"):
        mtad.generate(pair("llama"), [], dict(name="greedy"))


def test_prompt_too_long():
    with pytest.raises(mtad.PromptTooLong, match="512"):
        mtad.generate(pair("llama"), [1] * 500, dict(name="greedy", max_new_tokens=13))
    assert issubclass(mtad.PromptTooLong, ValueError)
    assert len(mtad.generate(pair("llama"), [1] * 499, dict(name="greedy", max_new_tokens=13)).tokens) == 13


@pytest.mark.parametrize("name", sorted(NEEDS_DRAFT))
def test_draft_decoder_without_draft(name):
    with pytest.raises(ValueError, match=f"'{name}' needs a draft"):
        gen(ModelPair(target("llama")), name)


# ---- architecture check -----------------------------------------------------------------------------------
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
                         eos_token_id=None)
        return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("name", sorted(NEEDS_TREE))
def test_tree_decoders_refuse_unsupported_architecture(name):
    m = gpt2()
    assert m.config.model_type not in TREE_ARCHITECTURES
    with pytest.raises(ValueError, match="architecture 'gpt2'"):
        gen(ModelPair(m, m), name)
    with pytest.raises(ValueError, match="architecture 'gpt2'"):  # as the draft of a supported target
        gen(ModelPair(target("llama"), m), name)  # same 32-token vocabulary as the tiny llama


def test_linear_decoders_accept_unsupported_architecture():
    m = gpt2()
    r = gen(ModelPair(m, m), "mtad", temperature=0, max_new_tokens=6)
    assert r.tokens == tm.oracle_greedy(m, PROMPT, 6)


@pytest.mark.parametrize("name", sorted(NEEDS_TREE))
def test_tree_decoders_refuse_flash_attention(name):
    t = tm.model("llama", 1, 32, hidden=16)
    t.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2"):
        gen(ModelPair(t, target("llama")), name)


# ---- the overhead micro-benchmark CLI -----------------------------------------------------------------------
def test_bench_core_cli_smoke(tmp_path, capsys):
    from mtad.measure import overhead as bench_core

    out = tmp_path / "bench.json"
    rows = bench_core.main(["--vocab", "64", "--hidden", "32", "--layers", "1", "--draft-hidden", "16",
                            "--prompts", "1", "--prompt-len", "4", "--new", "6", "--json", str(out),
                            "--decoders", "speculative", "mtad"])
    assert [r["decoder"] for r in rows] == ["speculative", "mtad"]
    assert all(r["tokens"] == 6 and 0 <= r["overhead_share"] < 1 for r in rows)
    assert "overhead" in capsys.readouterr().out
    import json

    assert json.loads(out.read_text())["rows"][1]["decoder"] == "mtad"
    with pytest.raises(SystemExit):
        bench_core.main(["--decoders", "beamsearch"])


def test_bench_core_on_a_named_pair(capsys):
    """experiments/bench_core_pair.py: the shares on a conf/model pair (the tiny one here), and one line for a
    pair that does not exist."""
    import importlib.util

    from mtad._util.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("bench_core_pair", REPO_ROOT / "experiments" / "bench_core_pair.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--pair", "tiny", "--decoders", "speculative", "mmtad", "--new", "4"])
    assert [r["decoder"] for r in rows] == ["speculative", "mmtad"]
    assert all(r["tokens"] == 3 * 4 and 0 < r["cpu_overhead_share"] < 1 for r in rows)
    with pytest.raises(SystemExit):
        mod.main(["--pair", "nope"])
    assert "no conf/model/nope.yaml" in capsys.readouterr().err

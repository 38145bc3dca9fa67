"""The verifier study with common random numbers (VERIFIERS.md §6): every rule judges the same drafts.

On the target's own continuations of a task's prompts, each *context* (prompt + the first t continuation
tokens) gets one draft block ``x ~ q`` (K chain steps of the draft, one seeded generator per context), one
target pass over it, K uniforms ``u`` and one uniform ``v`` for the token after the accepted prefix. The
identical ``(p, q, x, u, v)`` goes to every rule of :func:`rules`, so differences between rules are paired:
no draft or uniform differs between them. A hidden replica of the lossless rule is judged beside the others;
it must agree with ``lossless`` in every context (:func:`pairing_failures`), which fails as soon as a rule
is handed draws of its own.

Per rule: accepted length ``L = τ + 1`` (tokens per verification step, SPEED-Bench's convention, VERIFIERS.md
§5), the marginal acceptance ``P(τ >= i)`` per draft position, the log-likelihood of the committed block under
the raw target (T = 1, unfiltered: the perplexity's scorer), all with 95 % bootstrap intervals that resample
prompts (a prompt's contexts are correlated); and the distance from the target: the total variation between
the law of the first committed token and the filtered target ``p_1``, estimated from ``tv_draws`` fresh
drafts at each of a few fixed contexts (the correction's law is used in place of its draw, which lowers the
noise). A lossless rule's estimate is not 0 but the Monte-Carlo noise floor, which the lossless rows show.

**[choice]** MTAD here is MTAD's *joint rule* (ALGORITHMS.md §5: the longest prefix with
Σ log p/q > log τ, next token from p) applied to the same chain-sampled draft; the ``mtad`` decoder proposes
by beam sampling instead, so its acceptance in the CPU table differs from this row.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from mtad.decoding import DecoderConfig, generate
from mtad.decoding.core import Batch
from mtad.decoding.filter import draw, uniform
from mtad.decoding.rules import RULES
from mtad.decoding.speculative import draft_chain
from mtad.report import stats

log = logging.getLogger(__name__)

CONFIDENCE = 0.95
N_BOOT = stats.N_RESAMPLES
Verdict = tuple[int, torch.Tensor]  # (τ accepted, law of the token after them) (V,)


@dataclass(frozen=True)
class Rule:
    """One accept rule with its parameters: ``fn(p, q, x, u) -> (τ, next-token law)``."""

    name: str  # lossless | block | threshold | typical | fuzzy | mtad
    param: str  # e.g. "τ=0.5"; "" for the parameter-free rules
    lossless: bool
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Verdict] = field(compare=False)
    control: bool = False  # the pairing control: judged, checked, never tabulated

    @property
    def label(self) -> str:
        return f"{self.name} ({self.param})" if self.param else self.name


def shared(name: str, **params) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Verdict]:
    """The decoders' own rule ``name`` from the accept-rule table (:mod:`mtad.decoding.rules`) at ``params``
    (decoder config keys, e.g. ``tau=0.3``), as ``fn(p, q, x, u)``."""
    rule, cfg = RULES[name], DecoderConfig(**params)
    return lambda p, q, x, u: rule.judge(p, q, x, u, cfg)


def rules(threshold_taus: Sequence[float] = (0.3, 0.5), typical: Sequence[tuple[float, float]] = ((0.09, 0.3),
          (0.3, 0.55)), fuzzy_js: Sequence[float] = (0.1, 0.4), mtad_taus: Sequence[float] = (0.1, 0.5, 0.9)
          ) -> list[Rule]:
    """The rules of the study: lossless (token-wise) and block verification, the lossy rules at a few
    parameters (typical: Medusa's default (ε, δ) = (0.09, 0.3) and a looser one with δ = √ε, its
    recommendation), and the pairing control."""
    out = [Rule("lossless", "", True, shared("lossless")), Rule("block", "", True, shared("block"))]
    out += [Rule("threshold", f"τ={t:g}", False, shared("threshold", tau=t)) for t in threshold_taus]
    out += [Rule("typical", f"ε={e:g}, δ={d:g}", False, shared("typical", typical_threshold=e, typical_alpha=d))
            for e, d in typical]
    out += [Rule("fuzzy", f"JS≤{t:g}", False, shared("fuzzy", fuzzy_threshold=t, fuzzy_divergence="js"))
            for t in fuzzy_js]
    out += [Rule("mtad", f"τ={t:g}", False, shared("mtad", tau=t)) for t in mtad_taus]
    return out + [Rule("lossless", "replica", True, shared("lossless"), control=True)]


def seed_of(*parts) -> int:
    """A generator seed from the study seed and a context's coordinates (stable across runs and machines)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:7], "little")


def draw_index(law: torch.Tensor, v: float) -> int:
    """The token at uniform ``v`` under ``law`` (V,) by inverse CDF: one shared ``v`` per context, so rules
    whose next-token laws agree commit the same token."""
    cdf = law.double().cumsum(0)  # (V,)
    return min(int(torch.searchsorted(cdf, torch.tensor([v * float(cdf[-1])], dtype=cdf.dtype), right=True)),
               len(law) - 1)


# ---- drafting and scoring at a context ---------------------------------------------------------------------
@dataclass
class Block:
    """One drafted block at a context: x (K,), q (K, V) filtered draft, p (K+1, V) filtered target,
    logp (K+1, V) the raw target's log-probabilities (T = 1, no filter)."""

    x: torch.Tensor
    q: torch.Tensor
    p: torch.Tensor
    logp: torch.Tensor


class Drafter:
    """Draft and score blocks at the contexts of one prompt, which must come in growing order (the caches
    roll back to the committed text, the sessions' ``sync``)."""

    def __init__(self, models, prompt: list[int], cfg: DecoderConfig, mix: float | None = None):
        self.batch = Batch([prompt], cfg, set(), next(models.target.parameters()).device)  # a batch of one
        self.run = self.batch.runs[0]
        self.target = self.batch.session(models.target, "target")
        self.draft = self.batch.session(models.draft, "draft")
        if getattr(models.draft, "reads_target_features", False):
            self.draft.link(self.target)
        self.mix = mix  # λ of the oracle mixture λ·q̃ + (1 − λ)·p̃ (None: the draft itself)
        self.oracle = None if mix is None else self.batch.session(models.target, "oracle")

    def block(self, context: list[int], rng: torch.Generator) -> Block:
        assert context[:len(self.run.tokens)] == self.run.tokens, "contexts of one prompt must grow"
        self.run.tokens = list(context)
        K = self.run.cfg.gamma
        if self.oracle is None:
            x, q = draft_chain(self.draft, self.batch, K, rng)  # K ids, (K, V)
        else:
            x, q = mixture_chain(self.draft, self.oracle, self.batch, K, rng, self.mix)
        logits = self.target.forward([self.batch.pending(self.target)[0] + x], keep=K + 1)[0]  # (K+1, V)
        x = torch.tensor(x, dtype=torch.long, device=self.run.device)
        return Block(x, q, self.run.filt(logits), torch.log_softmax(logits.float(), -1))


def mixture_chain(draft, oracle, batch, K: int, rng: torch.Generator, lam: float) -> tuple[list[int], torch.Tensor]:
    """:func:`draft_chain` from the *oracle* mixture q̃_λ = λ·q̃ + (1 − λ)·p̃ (p̃ from a separate target session,
    so a feature draft still reads the same features as without mixing). An oracle: it runs the target
    at every draft step, so it is for hardware-free accepted lengths only, never timed."""
    ids_d, ids_o, x, q = batch.pending(draft), batch.pending(oracle), [], []  # one row each
    for _ in range(K):
        qd = batch.filt(draft.forward(ids_d)[0, -1])  # (V,)
        po = batch.filt(oracle.forward(ids_o)[0, -1])  # (V,)
        q.append(lam * qd + (1 - lam) * po)
        x.append(int(draw(q[-1], rng)))
        ids_d = ids_o = [[x[-1]]]
    return x, torch.stack(q)  # (K, V)


def judge(rule_list: Sequence[Rule], blk: Block, u: torch.Tensor, v: float) -> list[tuple[int, list[int], float]]:
    """Per rule: (τ, committed tokens x_1..x_τ + y, their summed raw-target log-probability)."""
    out = []
    for r in rule_list:
        n, nxt = r.fn(blk.p, blk.q, blk.x, u)
        tokens = blk.x[:n].tolist() + [draw_index(nxt, v)]
        ll = float(sum(blk.logp[j, t] for j, t in enumerate(tokens)))
        out.append((n, tokens, ll))
    return out


# ---- the study on one task --------------------------------------------------------------------------------
@dataclass
class TaskResult:
    """Everything measured on one task: per context and rule τ, log-likelihood and committed tokens;
    per fixed context the Monte-Carlo first-token laws."""

    task: str
    rules: list[Rule]
    prompt_of: list[int] = field(default_factory=list)  # (C,) prompt index of each context
    tau: list[list[int]] = field(default_factory=list)  # (C, R)
    loglik: list[list[float]] = field(default_factory=list)  # (C, R)
    ntok: list[list[int]] = field(default_factory=list)  # (C, R)
    tv: list[dict] = field(default_factory=list)  # per fixed context: {"p1": (S,), "laws": (M, R, S)}
    seconds: float = 0.0


def continuation(models, prompt: list[int], cfg: DecoderConfig, n: int, how: str, seed: int) -> list[int]:
    """The target's own continuation of ``prompt``: ``n`` tokens sampled under ``cfg``'s filter, or greedy."""
    name = "greedy" if how == "greedy" else "sampling"
    dec = DecoderConfig(name=name, max_new_tokens=n, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    dev = next(models.target.parameters()).device
    return generate(models, prompt, dec, torch.Generator(device=dev).manual_seed(seed)).tokens


CONTINUATION_CACHE = None  # a JSON file of the target's continuations, shared by runs that differ in the draft only


def cached_continuation(models, prompt: list[int], cfg: DecoderConfig, n: int, how: str, seed: int) -> list[int]:
    """:func:`continuation`, read from / added to ``CONTINUATION_CACHE`` when it is set (the key holds the
    target's dtype and quantisation, the prompt, the filter, the length and the seed: the target's text does not
    depend on the draft)."""
    if CONTINUATION_CACHE is None:
        return continuation(models, prompt, cfg, n, how, seed)
    import json
    from pathlib import Path

    t = models.target
    key = hashlib.sha256(repr((str(next(t.parameters()).dtype), getattr(t, "mtad_quantize", "none"), prompt,
                               cfg.temperature, cfg.top_k, cfg.top_p, n, how, seed)).encode()).hexdigest()
    path = Path(CONTINUATION_CACHE)
    store = json.loads(path.read_text()) if path.is_file() else {}
    if key not in store:
        store[key] = continuation(models, prompt, cfg, n, how, seed)
        store.update(json.loads(path.read_text()) if path.is_file() else {})
        path.write_text(json.dumps(store))
    return store[key]


def run_task(models, prompts: Sequence[list[int]], task: str, rule_list: Sequence[Rule], cfg: DecoderConfig, *,
             tokens: int = 64, stride: int = 4, how: str = "sampled", tv_contexts: int = 4, tv_draws: int = 500,
             seed: int = 0, paired: bool = True, mix: float | None = None) -> TaskResult:
    """The study on one task's prompts (token ids). ``paired=False`` hands every rule draws of its own (the
    negative control of the pairing check, never used for results)."""
    res, t0 = TaskResult(task, list(rule_list)), time.perf_counter()
    dev = next(models.target.parameters()).device
    K = cfg.gamma
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            cont = cached_continuation(models, prompt, cfg, tokens, how, seed_of(seed, task, i, "continuation"))
            drafter = Drafter(models, prompt, cfg, mix)
            for t in range(0, len(cont), stride):
                rng = torch.Generator(device=dev).manual_seed(seed_of(seed, task, i, t))
                blk = drafter.block(prompt + cont[:t], rng)
                if paired:
                    u, v = uniform(K, rng), float(uniform(1, rng))
                    verdicts = judge(rule_list, blk, u, v)
                else:
                    verdicts = [judge([r], blk, uniform(K, rng), float(uniform(1, rng)))[0] for r in rule_list]
                res.prompt_of.append(i)
                res.tau.append([n for n, _, _ in verdicts])
                res.loglik.append([ll for _, _, ll in verdicts])
                res.ntok.append([len(tok) for _, tok, _ in verdicts])
            if i < tv_contexts:
                res.tv.append(first_token_laws(models, prompt + cont[:len(cont) // 2], rule_list, cfg, tv_draws,
                                               seed_of(seed, task, i, "tv"), mix))
            log.info("%s: prompt %d/%d, %d contexts, %.0f s", task, i + 1, len(prompts), len(res.tau),
                     time.perf_counter() - t0)
    res.seconds = time.perf_counter() - t0
    return res


@torch.inference_mode()
def first_token_laws(models, context: list[int], rule_list: Sequence[Rule], cfg: DecoderConfig, draws: int,
                     seed: int, mix: float | None = None) -> dict:
    """``draws`` fresh blocks at one fixed context; per draw and rule the law of the first committed token
    (one-hot x_1 when τ >= 1, else the law of the correction), on the support of p_1 and q_1."""
    dev = next(models.target.parameters()).device
    rng = torch.Generator(device=dev).manual_seed(seed)
    drafter, laws, p1, support = Drafter(models, context, cfg, mix), [], None, None
    for _ in range(draws):
        blk = drafter.block(context, rng)
        if support is None:
            support = ((blk.p[0] > 0) | (blk.q[0] > 0)).nonzero().flatten()  # (S,)
            p1 = blk.p[0, support]
        u = uniform(cfg.gamma, rng)
        row = []
        for r in rule_list:
            n, nxt = r.fn(blk.p, blk.q, blk.x, u)
            row.append((support == blk.x[0]).double() if n >= 1 else nxt[support].double())  # (S,)
        laws.append(torch.stack(row))  # (R, S)
    return {"p1": p1.double().cpu().numpy(), "laws": torch.stack(laws).cpu().numpy(), "context_len": len(context)}


# ---- statistics -------------------------------------------------------------------------------------------
def _quantiles(dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = (1 - CONFIDENCE) / 2
    return np.quantile(dist, a, axis=0), np.quantile(dist, 1 - a, axis=0)


def cluster_weights(groups: np.ndarray, n_boot: int, key: int) -> np.ndarray:
    """(n_boot, C) bootstrap weights of C contexts that resample their groups (prompts) with replacement: the
    project's one resampling (:func:`mtad.report.stats.resample_counts`) over prompts, keyed by ``key``."""
    ids, inv = np.unique(groups, return_inverse=True)
    counts = stats.resample_counts(len(ids), key, n_boot)  # (B, P)
    return counts[:, inv]  # (B, C)


def ratio_of_sums(num: np.ndarray, den: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ num / Σ den over contexts (C, ...) and its bootstrap distribution (B, ...) under weights w (B, C)."""
    flat_n, flat_d = num.reshape(len(num), -1), den.reshape(len(den), -1)
    dist = (w @ flat_n) / (w @ flat_d)  # (B, R·...)
    return num.sum(0) / den.sum(0), dist.reshape((len(w),) + num.shape[1:])


def _interval(point: np.ndarray, dist: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = _quantiles(dist)
    return point, lo, hi


def summarize(res: TaskResult, K: int, n_boot: int = N_BOOT, seed: int = 0) -> list[dict]:
    """One dict per tabulated rule: point and 95 % interval of each figure (VERIFIERS.md §6). Differences
    from ``lossless`` are taken resample by resample (paired)."""
    tau, ll = np.array(res.tau, dtype=float), np.array(res.loglik)  # (C, R)
    ntok, ones = np.array(res.ntok, dtype=float), np.ones_like(tau)  # (C, R)
    w = cluster_weights(np.array(res.prompt_of), n_boot, stats.cell_key("verifier study", res.task, seed))
    base = [r.label for r in res.rules].index("lossless")
    L_pt, L_dist = ratio_of_sums(tau + 1, ones, w)  # (R,), (B, R)
    L, dL = _interval(L_pt, L_dist), _interval(L_pt - L_pt[base], L_dist - L_dist[:, [base]])
    reach = (tau[:, :, None] >= np.arange(1, K + 1)).astype(float)  # (C, R, K)
    marg = _interval(*ratio_of_sums(reach, np.ones_like(reach), w))  # (R, K) each
    ll_pt, ll_dist = ratio_of_sums(ll, ntok, w)
    llt, dll = _interval(ll_pt, ll_dist), _interval(ll_pt - ll_pt[base], ll_dist - ll_dist[:, [base]])
    tv = tv_estimates(res.tv, n_boot, stats.cell_key("verifier study tv", res.task, seed))
    out = []
    for j, r in enumerate(res.rules):
        if r.control:
            continue
        hist = np.bincount(tau[:, j].astype(int), minlength=K + 1)
        m = marg[0][j]
        cond = [float(m[0])] + [float(m[i] / m[i - 1]) if m[i - 1] > 0 else 0.0 for i in range(1, K)]
        out.append({
            "task": res.task, "rule": r.name, "param": r.param, "label": r.label, "lossless": r.lossless,
            "n_contexts": len(tau), "n_prompts": len(set(res.prompt_of)),
            "mean_accept_length": _triple(L, j), "delta_accept_length_vs_lossless": _triple(dL, j),
            "marginal_accept_rates": [[float(marg[k][j][i]) for k in range(3)] for i in range(K)],
            "conditional_accept_rates": cond,
            "acceptance_length_histogram": {str(n + 1): int(c) for n, c in enumerate(hist)},
            "loglik_per_token": _triple(llt, j), "delta_loglik_per_token_vs_lossless": _triple(dll, j),
            "tv_first_token": _triple(tv, j) if tv else [None, None, None],
            "tv_contexts": len(res.tv), "tv_draws": int(res.tv[0]["laws"].shape[0]) if res.tv else 0,
        })
    return out


def _triple(t: tuple, j: int) -> list[float]:
    return [float(t[0][j]), float(t[1][j]), float(t[2][j])]


def tv_estimates(tv: Sequence[dict], n_boot: int = N_BOOT, key: int = 0):
    """Per rule (R,): the mean over fixed contexts of TV(first-token law, p_1), with a bootstrap interval
    that resamples the draws within each context. None without fixed contexts."""
    if not tv:
        return None
    points, dists = [], []
    for i, c in enumerate(tv):
        laws, p1 = c["laws"], c["p1"]  # (M, R, S), (S,)
        M = laws.shape[0]
        points.append(0.5 * np.abs(laws.mean(0) - p1).sum(-1))  # (R,)
        counts = stats.resample_counts(M, stats.cell_key(key, i), n_boot) / M  # (B, M): each context's own draws
        means = np.einsum("bm,mrs->brs", counts, laws)  # (B, R, S)
        dists.append(0.5 * np.abs(means - p1).sum(-1))  # (B, R)
    point = np.mean(points, 0)
    lo, hi = _quantiles(np.mean(dists, 0))
    # basic (reverse-percentile) interval: a resampled TV is biased upward by the resampling noise, so the
    # percentile interval can miss its own point; clipped at 0, where TV ends
    return point, np.clip(2 * point - hi, 0, None), np.clip(2 * point - lo, 0, None)


def to_plain(res: TaskResult) -> dict:
    """``res`` without its rule functions (rules by label), for saving and re-rendering."""
    d = {k: getattr(res, k) for k in ("task", "prompt_of", "tau", "loglik", "ntok", "tv", "seconds")}
    return {**d, "rules": [r.label for r in res.rules]}


def from_plain(d: dict, rule_list: Sequence[Rule]) -> TaskResult:
    by_label = {r.label: r for r in rule_list}
    missing = [x for x in d["rules"] if x not in by_label]
    if missing:
        raise ValueError(f"saved study results name rules this mtad does not define: {missing}")
    return TaskResult(**{**d, "rules": [by_label[x] for x in d["rules"]]})


def pairing_failures(res: TaskResult) -> int:
    """Contexts where the replica of the lossless rule disagrees with it: 0 when every rule got the same
    draft and uniforms."""
    labels = [r.label for r in res.rules]
    a, b = labels.index("lossless"), labels.index("lossless (replica)")
    return sum(row[a] != row[b] for row in res.tau) + sum(row[a] != row[b] for row in res.loglik)

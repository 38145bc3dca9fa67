"""A what-if simulator on the cost model: from how many tokens each verification step commits and what each
forward costs, predict ms/token and speed-ups, for any draft on any hardware profile.

Inputs: a decoder's histogram of accepted lengths ``{L: steps}`` (L = τ + 1 tokens a step commits; from the
same-draft study, from a run's ``acceptance_profile``, or the i.i.d. reference :func:`iid_histogram`), and a
:class:`CostProfile` in units of one target step ``t1``:

    sampling            1                      + o_sampling        per token
    speculative, block  γ·c + v                + o_<decoder>       per step
    mtad (W beams)      c + (γ − 1)·c_W + v    + o_mtad            per step

c: a draft step of one row; c_W: a draft step of W beam rows; v: a target pass over γ + 1 tokens; o: harness
time per step outside forwards; plus ``prefill`` per prompt. Predicted ms/token = t1 · Σ step costs / Σ tokens
(a ratio of sums, as the tables compute ms/token), so a speed-up is a ratio of two such sums.

A profile measured on this machine (:meth:`CostProfile.from_profile`, from :mod:`mtad.measure.costmodel`'s
:class:`~mtad.measure.costmodel.Profile`) gives *predictions*, checked against measured runs; a declared
profile (:data:`GPU_PROFILES`) gives **projections**, never measurements.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from mtad.measure.costmodel import Profile
from mtad.measure.gpu_profiles import GPU

DECODERS = ("sampling", "speculative", "block", "mtad")


@dataclass(frozen=True)
class CostProfile:
    """Costs relative to one target step ``t1`` (ms for a measured profile; 1 step for a declared one)."""

    label: str
    t1: float = 1.0
    c: float = 0.1
    c_W: float = 0.1
    v: float = 1.0
    overhead: Mapping[str, float] = field(default_factory=dict)  # per step, in t1 units, by decoder
    prefill: float = 0.0  # per prompt (target + draft), in t1 units
    # per prompt by decoder, whatever the steps leave out (prefills, a prompt's last single-token step), where
    # measured so (calibration decodes); replaces ``prefill - first`` in :func:`predict`
    per_prompt: Mapping[str, float] = field(default_factory=dict)
    kind: str = "measured"  # measured | declared (a projection)
    unit: str = "ms"

    def step_cost(self, decoder: str, gamma: int) -> float:
        """Cost of one step of ``decoder`` in t1 units (a sampling step emits one token)."""
        o = self.overhead.get(decoder, self.overhead.get("speculative", 0.0) if decoder == "block" else 0.0)
        if decoder == "sampling":
            return 1.0 + o
        if decoder in ("speculative", "block"):
            return gamma * self.c + self.v + o
        if decoder == "mtad":
            return self.c + (gamma - 1) * self.c_W + self.v + o
        raise ValueError(f"the simulator models {DECODERS}, not {decoder!r}")

    @classmethod
    def from_profile(cls, p: Profile, gamma: int = 4, W: int = 4, prompt_tokens: int = 0,
                     overhead_ms: Mapping[str, float] | None = None) -> "CostProfile":
        """The figures of a measured cost-model profile: t1 = a 1-token target step at its context, c, c_W,
        v from the draft's 1-row and W-row steps and the target's (γ+1)-token pass; harness time per step
        from ``overhead_ms`` (default: the profile's, per target forward, which is per step)."""
        t1 = p.cost("target", "seq", 1, 1)
        oh = dict(p.overhead_ms if overhead_ms is None else overhead_ms)
        pre = (p.cost("target", "seq", 1, prompt_tokens) + p.cost("draft", "seq", 1, prompt_tokens)) / t1 \
            if prompt_tokens else 0.0
        return cls(label=p.label(), t1=t1, c=p.cost("draft", "seq", 1, 1) / t1, c_W=p.cost("draft", "seq", W, 1) / t1,
                   v=p.cost("target", "seq", 1, gamma + 1) / t1, overhead={k: v / t1 for k, v in oh.items()},
                   prefill=pre, kind="measured", unit="ms")

    def replace(self, **kw) -> "CostProfile":
        return dataclasses.replace(self, **kw)


def _hist(h: Mapping) -> dict[int, float]:
    return {int(k): float(v) for k, v in h.items() if float(v)}


def tokens_and_steps(hist: Mapping) -> tuple[float, float]:
    h = _hist(hist)
    return sum(L * n for L, n in h.items()), sum(h.values())


def predict(hist: Mapping, decoder: str, prof: CostProfile, gamma: int = 4, prompts: int = 0) -> float:
    """Predicted cost per token (``prof.unit``): t1 · (steps · step cost + prompts · (prefill − first)) / tokens,
    where ``first`` is the target pass of a prompt's first step, which the prefill pass replaces (it reads the
    prompt and that step's tokens at once); a profile measured from whole decodes gives the per-prompt term
    itself (``per_prompt``). For ``sampling`` the histogram is ``{1: tokens}``."""
    tokens, steps = tokens_and_steps(hist)
    if tokens <= 0:
        raise ValueError("an empty accepted-length histogram")
    first = 1.0 if decoder == "sampling" else prof.v  # a prompt's first target pass is its prefill
    fixed = prof.per_prompt.get(decoder, prof.prefill - first)
    return prof.t1 * (steps * prof.step_cost(decoder, gamma) + prompts * fixed) / tokens


def speedup(hist_a: Mapping, dec_a: str, hist_b: Mapping, dec_b: str, prof: CostProfile, gamma: int = 4,
            prompts: int = 0) -> float:
    """How much faster a is than b (ms/token of b over a's) under one profile."""
    return predict(hist_b, dec_b, prof, gamma, prompts) / predict(hist_a, dec_a, prof, gamma, prompts)


def iid_histogram(alpha: float, gamma: int, steps: float = 1.0) -> dict[int, float]:
    """The expected histogram under i.i.d. token-wise acceptance α: P(L = k) = α^(k−1)(1 − α) for k ≤ γ,
    P(L = γ + 1) = α^γ (Leviathan et al.); its mean is (1 − α^(γ+1)) / (1 − α)."""
    h = {k: steps * alpha ** (k - 1) * (1 - alpha) for k in range(1, gamma + 1)}
    h[gamma + 1] = steps * alpha ** gamma
    return h


def mean_length(hist: Mapping) -> float:
    tokens, steps = tokens_and_steps(hist)
    return tokens / steps


# ---- declared GPU profiles (projections) ----------------------------------------------------------------------
# The terms of mtad.measure.gpu_profiles (one source for every projection), as the simulator's ranges. Each entry:
# (label, (c low, c high), (v(gamma+1) low, v high) at gamma = 4, c_W / c high at W = 4).
def _ranges(terms) -> tuple:
    (c_lo, c_hi), (nu_lo, nu_hi), k_hi = terms["c"]["range"], terms["nu"]["range"], terms["kappa"]["range"][1]
    return (c_lo, c_hi), (1 + 4 * nu_lo, 1 + 4 * nu_hi), 1 + 3 * k_hi


GPU_PROFILES = {k: (f"GPU, {g['label'].removeprefix('GPU (A100-class), ')}", *_ranges(g["terms"]))
                for k, g in GPU.items()}


def declared(key: str) -> tuple[CostProfile, CostProfile]:
    """The favourable and unfavourable corners of a declared GPU profile, for MTAD against the others: (low
    c, low v, c_W = c) and (high c, high v, c_W = ratio·c). Labelled projections."""
    label, (c_lo, c_hi), (v_lo, v_hi), w_hi = GPU_PROFILES[key]
    base = CostProfile(label=f"projection: {label}", kind="declared", unit="step")
    return base.replace(c=c_lo, c_W=c_lo, v=v_lo), base.replace(c=c_hi, c_W=w_hi * c_hi, v=v_hi)

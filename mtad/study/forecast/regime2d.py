"""The regime map on two axes: draft strength (α) × hardware cost, for MTAD, MMTAD, SpecInfer and block
verification against speculative decoding, from the real decoders' acceptance.

Per draft of the regime axis, the decoders' measured tokens per target forward against speculative decoding's on
the same prompts (``block_efficiency_ratio`` of ``decoders/decoders.json``, a paired 95 % interval; the published
``regime_decoders`` runs, γ = 4, W = 4, SpecInfer's tree 4·2·2). A step of each decoder runs the forwards it runs
(``STEP``: what ``DecodeResult.calls`` records per step), priced by a declared profile's terms
(:func:`mtad.study.forecast.costs.declared_forward`); so

    speed-up over speculative = (tokens per step ratio) × (speculative's step cost / the decoder's step cost)

and its interval is the ratio's interval times the same cost factor. The axes are the two costs that decide:
c_W/c, the cost of a W = 4 beam-row draft step over a one-row step (MTAD drafts its beams as rows), and v(5), a
5-token verify pass over one step (the ν that also prices trees: v(n) = 1 + ν (n − 1)), each swept at a declared
profile's other terms (its c, harness time). Prefills are left out (steady state).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mtad.measure.costmodel import parse_calls
from mtad.measure.gpu_profiles import declared_forward

DECODERS = ("mtad", "mmtad", "specinfer", "block")
# forwards of one step at γ = 4, W = 4, SpecInfer 4·2·2 (as the decoders run them: DecodeResult.calls per step)
STEP = {
    "speculative": {"draft:seq:1x1": 4, "target:seq:1x5": 1},
    "block": {"draft:seq:1x1": 4, "target:seq:1x5": 1},
    "mtad": {"draft:seq:1x1": 1, "draft:seq:4x1": 3, "target:seq:1x5": 1},
    "mmtad": {"draft:seq:1x1": 1, "draft:tree:1x4": 3, "target:tree:1x17": 1},
    "specinfer": {"draft:seq:1x1": 1, "draft:tree:1x4": 1, "draft:tree:1x8": 1, "target:tree:1x29": 1},
}
CW_AXIS = tuple(np.round(np.linspace(1.0, 2.0, 21), 3))  # c_W(4) / c
V_AXIS = tuple(np.round(np.linspace(1.0, 2.0, 21), 3))  # v(5)


def step_cost(decoder: str, terms: Mapping[str, dict]) -> float:
    """One step of ``decoder`` in target steps under declared ``terms`` (harness time per step included)."""
    calls = sum(n * declared_forward(terms, role, r, s, False) for role, kind, r, s, n in parse_calls(STEP[decoder]))
    return calls + float(terms["h_step"]["value"]) + float(terms["h_row"]["value"]) * _rows(decoder)


def _rows(decoder: str) -> float:
    return sum(n * r * s for _, _, r, s, n in parse_calls(STEP[decoder]))


def with_axes(terms: Mapping[str, dict], cw: float | None = None, v5: float | None = None) -> dict:
    """``terms`` with c_W(4)/c and/or v(5) set (kappa = (c_W/c − 1) / 3, nu = (v(5) − 1) / 4)."""
    out = {k: dict(v) for k, v in terms.items()}
    if cw is not None:
        out["kappa"]["value"] = (cw - 1.0) / 3.0
    if v5 is not None:
        out["nu"]["value"] = (v5 - 1.0) / 4.0
    return out


def cost_factor(decoder: str, terms: Mapping[str, dict]) -> float:
    """Speculative decoding's step cost over ``decoder``'s."""
    return step_cost("speculative", terms) / step_cost(decoder, terms)


def axes_of(terms: Mapping[str, dict]) -> dict[str, float]:
    t = {k: float(v["value"]) for k, v in terms.items()}
    return {"c": t["c"], "cW_over_c": 1 + 3 * t["kappa"], "v5": 1 + 4 * t["nu"], "h_step": t["h_step"]}


def build(decoders_json: Mapping, gpu: Mapping[str, Mapping]) -> dict:
    """The two-axis map under every declared profile's c: per profile, the cost factor of each decoder over both
    axes, and per draft and decoder the tokens-per-step ratio with its interval (speed-up = ratio × factor),
    plus each profile's own point (its declared c_W/c and v(5)) with the speed-ups there."""
    drafts = []
    for name, d in sorted(decoders_json["drafts"].items(), key=lambda kv: (kv[1]["alpha"] or [9])[0]):
        ratios = {dec: (d["vs_speculative"].get(dec) or {}).get("block_efficiency_ratio") for dec in DECODERS}
        drafts.append({"name": name, "alpha": d["alpha"], "be_ratio": {k: v[:3] if v else None
                                                                       for k, v in ratios.items()}})
    out = {"cw_axis": list(CW_AXIS), "v_axis": list(V_AXIS), "drafts": drafts, "profiles": {},
           "source": decoders_json.get("publication"), "step_forwards": STEP}
    for key, g in gpu.items():
        terms = g["terms"]
        own = axes_of(terms)
        prof = {"label": g["label"], "terms": own,
                "factor_cw": {dec: [cost_factor(dec, with_axes(terms, cw=x)) for x in CW_AXIS] for dec in DECODERS},
                "factor_v": {dec: [cost_factor(dec, with_axes(terms, v5=y)) for y in V_AXIS] for dec in DECODERS},
                "factor_grid": {dec: [[cost_factor(dec, with_axes(terms, cw=x, v5=y)) for x in CW_AXIS]
                                      for y in V_AXIS] for dec in DECODERS},
                "at_profile": {}}
        for dr in drafts:
            prof["at_profile"][dr["name"]] = {
                dec: [x * cost_factor(dec, terms) for x in dr["be_ratio"][dec]] if dr["be_ratio"][dec] else None
                for dec in DECODERS}
        out["profiles"][key] = prof
    return out


def breakeven(ratio: float, factors: list[float], axis: tuple) -> float | None:
    """Where along ``axis`` ratio × factor crosses 1 (linear between grid points; None if it does not)."""
    s = [ratio * f - 1.0 for f in factors]
    for i in range(1, len(s)):
        if s[i - 1] >= 0 > s[i] or s[i - 1] < 0 <= s[i]:
            return float(axis[i - 1] + (axis[i] - axis[i - 1]) * s[i - 1] / (s[i - 1] - s[i]))
    return None

"""The map as one dict (``regimes.json``): per draft, the hardware-free accepted-length ratios of the same-draft
study with intervals and the simulator's speed-ups under each cost profile; per checked draft, the measured
points against the simulator's predictions and the calibrated costs."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mtad.measure.gpu_profiles import GPU
from mtad.measure.simulate import GPU_PROFILES, CostProfile, declared, predict
from mtad.report import stats
from mtad.report.stats import ratio_interval
from mtad.study.forecast import regime2d
from mtad.study.regimes import why
from mtad.study.regimes.inputs import (
    FEATURE_DRAFT,
    GAMMA,
    ROOT,
    TAUS,
    alphas,
    checks,
    contexts,
    decoders,
    drafts,
    hardware,
    profile,
    provenance,
    tv,
)

RULES = (("lossless", "speculative"), ("block", "block"), *((f"mtad (τ={t})", "mtad") for t in TAUS))
POINT_KEYS = ("decoder", "measured_ms_per_token", "measured_wall_ms_per_token", "predicted_ms_per_token",
              "predicted_before_after", "predicted_from_calls", "block_efficiency", "acceptance_rate",
              "speedup_vs_sampling", "speedup_vs_speculative")
WITHIN = 0.10  # the simulator check's tolerance, |predicted / measured − 1|


# ---- hardware-free ratios ------------------------------------------------------------------------------------
def ratio_intervals(rec: dict, num: str, den: str) -> list[float]:
    """Σ L_num / Σ L_den over contexts (L = τ + 1) [point, lo, hi]: block-efficiency ratio of two rules on the
    same drafts, the interval resampling (task, prompt) clusters (the project's one bootstrap over per-cluster
    sums)."""
    i, j = rec["rules"].index(num), rec["rules"].index(den)
    L = np.array(rec["tau"], dtype=float) + 1  # (C, R)
    _, inv = np.unique([f"{t}/{p}" for t, p in zip(rec["task"], rec["prompt"])], return_inverse=True)
    return ratio_interval(np.bincount(inv, L[:, i]), np.bincount(inv, L[:, j]))


def histograms(rec: dict) -> dict[str, dict[int, int]]:
    """Pooled accepted-length histograms {L: steps} per rule label."""
    tau = np.array(rec["tau"], dtype=int)  # (C, R)
    return {
        r: {int(L) + 1: int(c) for L, c in enumerate(np.bincount(tau[:, k], minlength=GAMMA + 1))}
        for k, r in enumerate(rec["rules"])
    }


def mean_L(h: dict) -> float:
    return sum(L * n for L, n in h.items()) / sum(h.values())


# ---- simulated speed-ups -------------------------------------------------------------------------------------
def simulate(hist: dict, prof: CostProfile) -> dict:
    """MTAD against speculative and block, and both against sampling, from the study's histograms."""
    ms = {r: predict(hist[r], dec, prof, GAMMA) for r, dec in RULES}
    samp = predict({1: 1}, "sampling", prof, GAMMA)
    return {
        "mtad_vs_spec": {t: ms["lossless"] / ms[f"mtad (τ={t})"] for t in TAUS},
        "mtad_vs_block": {t: ms["block"] / ms[f"mtad (τ={t})"] for t in TAUS},
        "spec_vs_sampling": samp / ms["lossless"],
        "mtad_vs_sampling": samp / ms["mtad (τ=0.5)"],
    }


def profiles(name: str, oracle: bool, chk: dict) -> dict[str, CostProfile]:
    """The cost profiles a draft's curves are simulated under: its own pooled calibration (a checked real
    draft), the feature draft's (what a draft of this α would give at that cost), both corners of every
    declared GPU profile (projections)."""
    out = {}
    if name in chk and not oracle:
        out["cpu_own"] = profile(chk[name])
    if FEATURE_DRAFT in chk:
        out["cpu_feature_cost"] = profile(chk[FEATURE_DRAFT])
    for key in GPU_PROFILES:
        out[f"{key}_lo"], out[f"{key}_hi"] = declared(key)
    return out


def draft_row(d: dict, rec: dict, alpha: list[float], chk: dict) -> dict:
    hist = histograms(rec)
    row = {
        "name": d["name"],
        "oracle_mix": d["oracle_mix"],
        "alpha": alpha,
        "n_contexts": len(rec["tau"]),
        "L": {r: mean_L(h) for r, h in hist.items()},
        "hist": {r: hist[r] for r, _ in RULES},
        "vs_spec": {t: ratio_intervals(rec, f"mtad (τ={t})", "lossless") for t in TAUS},
        "vs_block": {t: ratio_intervals(rec, f"mtad (τ={t})", "block") for t in TAUS},
        "block_vs_spec": ratio_intervals(rec, "block", "lossless"),
    }
    row["simulated"] = {k: simulate(row["hist"], p) for k, p in profiles(d["name"], d["oracle_mix"] is not None,
                                                                          chk).items()}
    return row


# ---- the checks ----------------------------------------------------------------------------------------------
def point(p: dict) -> dict:
    """A checked point's figures, its errors recomputed from the prediction and the measured CPU ms/token."""
    out = {k: p.get(k) for k in POINT_KEYS}
    measured = p["measured_ms_per_token"][0]
    out["error"] = p["predicted_ms_per_token"] / measured - 1
    calls = p.get("predicted_from_calls")
    out["error_from_calls"] = None if calls is None else calls / measured - 1
    return out


def within(points: list[dict], key: str = "error") -> tuple[int, int]:
    """How many of the points with an error ``key`` are within ±10 %, and how many have one."""
    errs = [p[key] for p in points if p.get(key) is not None]
    return sum(abs(e) <= WITHIN for e in errs), len(errs)


def projection(pts: dict) -> dict:
    """MTAD / speculative and MTAD / block speed-ups from the *decoders'* own accepted-length histograms of a
    checked run (beam-drafted MTAD), under both corners of each declared GPU profile: projections."""
    out = {}
    for key in GPU_PROFILES:
        vals = {"mtad_vs_spec": [], "mtad_vs_block": []}
        for prof in declared(key):
            ms = {d: predict(pts[d]["histogram"], d, prof, GAMMA) for d in ("speculative", "block", "mtad")}
            vals["mtad_vs_spec"].append(ms["speculative"] / ms["mtad"])
            vals["mtad_vs_block"].append(ms["block"] / ms["mtad"])
        out[key] = {k: [min(v), max(v)] for k, v in vals.items()}
    return out


def run_records(c: dict, root: Path) -> dict[str, dict] | None:
    """The checked runs' pooled per-prompt records by decoder (``rows``, in the order of ``points``; the
    published run directories), or None where any is missing."""
    dirs = dict(zip([p["decoder"] for p in c["points"]], c.get("rows") or []))
    found = {d: stats.resolve_run_dir(r, [root, root.parent.parent]) for d, r in dirs.items()}
    if not found or None in found.values():
        return None
    return {d: stats.per_prompt([stats.read_samples(f)], None) for d, f in found.items()}


def _iv(iv) -> list[float] | None:
    return [iv.point, iv.low, iv.high] if iv is not None and iv.point is not None else None


def vs_block(c: dict, recs: dict | None) -> list[float] | None:
    """MTAD / block verification in CPU time with its paired interval: the check's own figure, or from the
    checked runs' records where the check predates it."""
    m = next(p for p in c["points"] if p["decoder"] == "mtad")
    if m.get("speedup_vs_block"):
        return m["speedup_vs_block"]["measured"]
    return _iv(stats.compare("cpu_speedup", recs["mtad"], recs["block"])) if recs else None


def measured(name: str, c: dict, alpha: list[float], root: Path = ROOT) -> dict | None:
    """The mtad decoder of one check against the same pair's speculative and block runs (None without all
    three)."""
    pts = {p["decoder"]: p for p in c["points"]}
    if not {"mtad", "speculative", "block"} <= set(pts):
        return None
    m, b = pts["mtad"], pts["block"]
    recs = run_records(c, root)
    return {
        "name": name,
        "alpha": alpha,
        "mtad_vs_spec": m["speedup_vs_speculative"],
        "mtad_vs_sampling": m.get("speedup_vs_sampling"),
        "be_ratio_vs_spec": m["block_efficiency"] / pts["speculative"]["block_efficiency"],
        "be_ratio_vs_block": m["block_efficiency"] / b["block_efficiency"],
        "mtad_vs_block_predicted": b["predicted_ms_per_token"] / m["predicted_ms_per_token"],
        "mtad_vs_block_measured": b["measured_ms_per_token"][0] / m["measured_ms_per_token"][0],
        "mtad_vs_block": vs_block(c, recs),
        "distinct2_vs_spec": _iv(stats.compare("distinct2_diff", recs["mtad"], recs["speculative"])) if recs else None,
        "profile": c["calibration"]["pooled"]["profile"],
        "projected": projection(pts),
    }


def build(root: Path = ROOT) -> dict:
    al, chk = alphas(root), checks(root)
    rows = []
    for d in drafts(root):
        rec = contexts(d["name"], root)
        if rec is not None and d["name"] in al:
            rows.append(draft_row(d, rec, al[d["name"]], chk))
    meas = [m for name, c in chk.items() if name in al and (m := measured(name, c, al[name], root)) is not None]
    out = {
        "drafts": rows,
        "measured": meas,
        "checks": {
            name: {"points": [point(p) for p in c["points"]],
                   "calibration": {k: v["profile"] for k, v in c["calibration"].items()}}
            for name, c in chk.items()
        },
        "tv": {name: {k: v for k, v in d.items() if k != "study"} for name, d in tv(root).items()},
        "decoders": decoders(root),
        "two_axis": regime2d.build(decoders(root), GPU) if decoders(root) else None,
        "gpu_profiles": {k: list(v) for k, v in GPU_PROFILES.items()},
        "hardware": f"{hardware(root)}, 2 cores shared",
        "provenance": provenance(root),
    }
    check = root / "forecast" / "check.json"
    out["why"] = why.facts(out, why.load(check) if check.is_file() else None)
    return out

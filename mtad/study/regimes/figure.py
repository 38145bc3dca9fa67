"""``regimes.png``: the map as four panels along held-out α. Top, hardware-free: the block-efficiency ratio
MTAD / speculative and MTAD / block of the same-draft study, the mtad decoder's measured ratios and the paper's
runs. Bottom, in time: simulated speed-ups on this CPU, **projections** under the declared GPU profiles, the
measured speed-ups and the paper's."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mtad.measure.simulate import GPU_PROFILES
from mtad.study.regimes.inputs import TAUS

# the paper's per-run figures (docs/PAPER.md; Llama-3.1-8B / 3.2-1B, γ = 4, W = 4): SpecInfer's acceptance,
# MTAD's and SpecInfer's block efficiency and ms/token
PAPER_RUNS = [
    ("Spider base", 0.85, 4.19, 3.55, 33.20, 35.52),
    ("Spider instruct", 0.79, 4.14, 3.36, 30.04, 32.91),
    ("HumanEval base", 0.89, 4.33, 3.66, 29.02, 30.73),
    ("HumanEval instruct", 0.88, 4.34, 3.64, 27.67, 29.48),
]
PAPER_HEADLINES = [("arXiv v2–v4", 1.42), ("camera-ready", 1.26)]
TAU_COLORS = dict(zip(TAUS, ("#fdae61", "#f46d43", "#d73027", "#a50026", "#67001f")))


def reading(res: dict) -> str:
    """One sentence from the numbers: MTAD (τ = 0.5) / token-wise accepted-length ratio at the weakest and the
    strongest real draft, and the measured speed-up range."""
    real = sorted((r for r in res["drafts"] if r["oracle_mix"] is None), key=lambda r: r["alpha"][0])
    if not real:
        return ""
    lo, hi = real[0], real[-1]
    text = (
        f"At τ = 0.5 MTAD's joint rule accepts {lo['vs_spec']['0.5'][0]:.2f}× token-wise's mean length "
        f"with the weakest draft (α {lo['alpha'][0]:.2f}) and {hi['vs_spec']['0.5'][0]:.2f}× with the strongest "
        f"real draft (α {hi['alpha'][0]:.2f})"
    )
    if res["measured"]:
        v = [m["mtad_vs_spec"]["measured"][0] for m in res["measured"]]
        span = f"{min(v):.2f}" if f"{min(v):.2f}" == f"{max(v):.2f}" else f"{min(v):.2f}–{max(v):.2f}"
        text += f"; measured here (CPU time), the mtad decoder is {span}× speculative decoding"
    return text + "."


def _err(ivs: list) -> np.ndarray:
    """(2, n) error-bar lengths of [point, lo, hi] intervals; none where an end is missing."""
    return np.array([[0.0, 0.0] if iv[1] is None or iv[2] is None else [iv[0] - iv[1], iv[2] - iv[0]]
                     for iv in ivs]).reshape(-1, 2).T


def _paper(ax, y: list[float], label: str) -> None:
    """The paper's per-run points (x: SpecInfer's acceptance)."""
    ax.scatter([p[1] for p in PAPER_RUNS], y, marker="*", s=120, color="k", zorder=5, label=label)


def _finish(ax, title: str, ylabel: str, ref: float = 1.0) -> None:
    ax.axhline(ref, color="grey", lw=0.8, ls=":")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("held-out α of the draft (draft card's method; oracle: 1 − λ + λ·α)")
    ax.set_xlim(0.3, 1.0)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, frameon=False)


def ratio_panel(ax, res: dict, key: str, title: str) -> None:
    """Block-efficiency ratio MTAD / ``key`` (``spec`` or ``block``) along α."""
    rows = sorted(res["drafts"], key=lambda r: r["alpha"][0])
    x = np.array([r["alpha"][0] for r in rows])
    xerr = _err([r["alpha"] for r in rows])
    real = np.array([r["oracle_mix"] is None for r in rows])
    for k, t in enumerate(TAUS):
        ivs = [r[f"vs_{key}"][t] for r in rows]
        y, yerr = np.array([iv[0] for iv in ivs]), _err(ivs)
        for sel, fmt, mfc, lab in (
            (real, "o-", None, f"MTAD joint rule τ = {t}, same-draft study, real drafts "
             "(x offset ±0.008 for legibility; α interval on τ = 0.5)"),
            (~real, "o", "white", f"same, τ = {t}, oracle mixtures (not connected)"),
        ):
            if sel.any():
                ax.errorbar(x[sel] + 0.004 * (k - 2), y[sel], yerr=yerr[:, sel], xerr=xerr[:, sel] if k == 2 else None,
                            fmt=fmt, ms=4, lw=1, capsize=2, color=TAU_COLORS[t], mfc=mfc, label=lab)
    for r in rows:
        if r["oracle_mix"] is not None:
            ax.annotate(f"oracle λ={r['oracle_mix']:g}", (r["alpha"][0], r[f"vs_{key}"]["0.5"][0]), fontsize=7,
                        xytext=(4, -10), textcoords="offset points")
    if res["measured"]:
        ax.plot([m["alpha"][0] for m in res["measured"]], [m[f"be_ratio_vs_{key}"] for m in res["measured"]], "D",
                color="#1f78b4", ms=7, zorder=6,
                label="the mtad decoder (beam drafts, τ = 0.5) / the same pair's run, measured here on GSM8K")
    if key == "spec":
        _paper(ax, [p[2] / p[3] for p in PAPER_RUNS], "paper, MTAD / SpecInfer tree (x: SpecInfer acceptance)")
    _finish(ax, title, "ratio of mean accepted length (Σ L / Σ L)")


def speed_panel(ax, res: dict, key: str, title: str) -> None:
    """Speed-up MTAD (τ = 0.5) / ``key`` (``spec`` or ``block``): simulated, projected, measured, the paper's."""
    rows = sorted(res["drafts"], key=lambda r: r["alpha"][0])
    realr = [r for r in rows if r["oracle_mix"] is None]
    k_sim = f"mtad_vs_{key}"
    own = [(r["alpha"][0], r["simulated"]["cpu_own"][k_sim]["0.5"]) for r in rows if "cpu_own" in r["simulated"]]
    if own:
        ax.plot(*zip(*own), "s", color="#1f78b4", mfc="none", ms=8,
                label="simulated, this CPU, each draft at its own calibrated cost")
    feat = [(r["alpha"][0], r["simulated"]["cpu_feature_cost"][k_sim]["0.5"]) for r in realr
            if "cpu_feature_cost" in r["simulated"]]
    if feat:
        ax.plot(*zip(*feat), "-", color="#1f78b4", lw=1.5,
                label="simulated from the study's histograms, this CPU, every real draft at the feature draft's cost")
    for gk, col in (("llama8b_1b", "#33a02c"), ("opt13b_125m", "#6a3d9a")):
        lo = [r["simulated"][f"{gk}_lo"][k_sim]["0.5"] for r in realr]
        hi = [r["simulated"][f"{gk}_hi"][k_sim]["0.5"] for r in realr]
        name, (c_lo, c_hi), (v_lo, v_hi), cw = GPU_PROFILES[gk]
        label = name.removeprefix("GPU, ").split(" (")[0].replace(" target", "").replace(" draft", "").split(",")[0]
        ax.fill_between([r["alpha"][0] for r in realr], np.minimum(lo, hi), np.maximum(lo, hi), color=col, alpha=0.25,
                        label=f"PROJECTION: {label}, GPU (c {c_lo:g}–{c_hi:g}, c_W ≤ {cw:.1f} c, v ≤ {v_hi:.2f})")
    meas = res["measured"]
    for i, m in enumerate(meas):
        ax.plot([m["alpha"][0]] * 2, m["projected"]["llama8b_1b"][k_sim], "-", color="#33a02c", lw=5, alpha=0.8,
                solid_capstyle="butt",
                label=None if i else "PROJECTION: 8B/1B GPU costs on the mtad decoder's own histograms")
    ivs = [(m["alpha"][0], m["mtad_vs_spec"]["measured"] if key == "spec" else m.get("mtad_vs_block")) for m in meas]
    ivs = [(a, iv) for a, iv in ivs if iv and iv[1] is not None]
    if ivs:
        ax.errorbar([a for a, _ in ivs], [iv[0] for _, iv in ivs], yerr=_err([iv for _, iv in ivs]), fmt="D",
                    color="#e31a1c", capsize=3,
                    label="measured here (CPU time), mtad decoder (beam drafts), paired 95 % CI")
    if key == "spec":
        _paper(ax, [p[5] / p[4] for p in PAPER_RUNS],
               "paper, MTAD / SpecInfer per-run ms/token (x: SpecInfer acceptance)")
        for lbl, v in PAPER_HEADLINES:
            ax.axhline(v, color="k", lw=0.8, ls="--")
            ax.text(0.99, v, f"paper headline vs speculative, {lbl}: {v}× (no α given) ", fontsize=7, va="top",
                    ha="right", transform=ax.get_yaxis_transform())
    _finish(ax, title, "speed-up (ratio of ms/token)")


TV_SHOWN = (("lossless", "token-wise (lossless: the Monte-Carlo floor)", "#666666"), ("block", "block (lossless)",
            "#4575b4"), *((f"mtad (τ={t})", f"MTAD joint rule τ = {t}", TAU_COLORS[t]) for t in ("0.1", "0.5", "0.9")))
DECODER_COLORS = {"block": "#4575b4", "mtad": "#d73027", "mmtad": "#7b3294", "specinfer": "#1a9850"}


def tv_panel(ax, res: dict) -> None:
    """First-token TV to the target's law along α, the mean of the two tasks' estimates per rule."""
    alpha = {r["name"]: r["alpha"][0] for r in res["drafts"]}
    oracle = {r["name"] for r in res["drafts"] if r["oracle_mix"] is not None}
    names = sorted((n for n in res["tv"] if n in alpha), key=alpha.get)
    for k, (rule, label, color) in enumerate(TV_SHOWN):
        for sel, fmt, mfc, lab in ((False, "o-", None, label),
                                   (True, "o", "white", None if k else "open: oracle mixtures (not connected)")):
            pick = [n for n in names if (n in oracle) == sel]
            if pick:
                both = np.array([[res["tv"][n][t][rule][0] for t in ("gsm8k", "mt_bench")] for n in pick])  # (n, 2)
                y = both.mean(1)
                ax.errorbar([alpha[n] + 0.003 * (k - 2) for n in pick], y, yerr=[y - both.min(1), both.max(1) - y],
                            fmt=fmt, ms=4, lw=1, capsize=2, elinewidth=0.8, color=color, mfc=mfc, label=lab)
    first = next(iter(res["tv"].values()))
    ax.set_title(f"first-token TV to the target's law\n({first['contexts']} contexts × {first['draws']} drafts per "
                 "task; point: mean of GSM8K and MT-Bench, bar: the two tasks)", fontsize=10)
    ax.set_ylabel("total variation to p̃₁")
    ax.set_xlabel("held-out α of the draft")
    ax.set_xlim(0.3, 1.0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)


DECODER_PANELS = {  # comparison kind -> (title, y label, no change)
    "block_efficiency_ratio": ("every decoder on real text (GSM8K + MT-Bench):\ntokens per target forward over "
                               "speculative's", "block-efficiency ratio", 1.0),
    "distinct2_diff": ("every decoder on real text (GSM8K + MT-Bench):\ndistinct-2 of the outputs minus "
                       "speculative's", "distinct-2 difference", 0.0),
}


def decoders_panel(ax, dec: dict, kind: str = "block_efficiency_ratio") -> None:
    """Every decoder against speculative decoding on real text (``decoders.json``: a ``kind`` comparison of
    ``experiments/regime_decoders.py``), per real draft along α, with paired CIs."""
    rows = sorted((d for d in dec["drafts"].values() if d["alpha"]), key=lambda d: d["alpha"][0])
    for k, name in enumerate(DECODER_COLORS):
        ivs = [(d["alpha"][0], d["vs_speculative"].get(name, {}).get(kind)) for d in rows]
        ivs = [(a, iv) for a, iv in ivs if iv]
        if ivs:
            ax.errorbar([a + 0.004 * (k - 1.5) for a, _ in ivs], [iv[0] for _, iv in ivs],
                        yerr=_err([iv[:3] for _, iv in ivs]), fmt="o-", ms=4, lw=1, capsize=2,
                        color=DECODER_COLORS[name], label=f"{name} decoder / speculative, paired 95 % CI")
    if kind == "block_efficiency_ratio":
        _paper(ax, [p[2] / p[3] for p in PAPER_RUNS], "paper, MTAD / SpecInfer tree (x: SpecInfer acceptance)")
    title, ylabel, ref = DECODER_PANELS[kind]
    _finish(ax, title, ylabel, ref)


def figure(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    third = bool(res.get("tv")) and bool(res.get("decoders"))
    fig, axes = plt.subplots(3 if third else 2, 2, figsize=(14, 18.5 if third else 12.5))
    if third:
        tv_panel(axes[2, 0], res)
        decoders_panel(axes[2, 1], res["decoders"])
    ratio_panel(axes[0, 0], res, "spec", "block-efficiency ratio MTAD / token-wise speculative")
    ratio_panel(axes[0, 1], res, "block", "block-efficiency ratio MTAD / block verification")
    speed_panel(axes[1, 0], res, "spec", "speed-up MTAD (τ = 0.5) / speculative")
    speed_panel(axes[1, 1], res, "block", "speed-up MTAD (τ = 0.5) / block verification")
    fig.suptitle(
        "When does joint verification pay? Target SmolLM2-135M-Instruct (bf16) with drafts of increasing "
        f"strength, γ = 4\nmeasured on {res.get('hardware', 'this CPU')} (1 thread); GPU bands are PROJECTIONS "
        "under declared costs, not measurements",
        fontsize=11,
    )
    fig.text(0.5, 0.004, reading(res), ha="center", fontsize=8.5, wrap=True)
    fig.tight_layout(rect=(0, 0.03 if not third else 0.02, 1, 0.95 if not third else 0.965))
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""The two-axis map's table (in ``regimes.md``) and figure (``two_axis.png``): speed-up over speculative decoding
of MTAD, MMTAD, SpecInfer and block verification along draft strength (α) × hardware cost (c_W/c, v(5)), from
the real decoders' tokens per step (:mod:`mtad.study.forecast.regime2d`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mtad.report.markdown import DASH, interval
from mtad.report.markdown import table as md_table
from mtad.study.forecast.regime2d import DECODERS, breakeven
from mtad.study.regimes.figure import PAPER_RUNS

NAMES = {"mtad": "MTAD", "mmtad": "MMTAD", "specinfer": "SpecInfer 4·2·2", "block": "block verification"}
MAP_PROFILE = "llama8b_1b"  # the slice the figure draws: the paper's camera-ready pair's c


def _at(x) -> str:
    return DASH if x is None else f"{x:.2f}"


def tables(res: dict) -> list[str]:
    m = res.get("two_axis")
    if not m:
        return ["No two-axis map: it needs `decoders/decoders.json` (`experiments/regime_decoders.py`).", ""]
    out = []
    for p in m["profiles"].values():
        t = p["terms"]
        out += [f"**{p['label']}** (projection; c {t['c']:g}, c_W/c {t['cW_over_c']:.2f}, v(5) {t['v5']:.2f}, "
                f"harness {t['h_step']:g} step per step; every term and its basis: `mtad/measure/gpu_profiles.py`). "
                "Speed-up over speculative decoding at these costs [95 % CI], and where along each axis MTAD's and "
                "MMTAD's speed-up crosses 1 (c_W/c at this v(5); v(5) at this c_W/c; — : not within 1–2):", ""]
        rows = []
        for dr in m["drafts"]:
            at = p["at_profile"][dr["name"]]
            be = dr["be_ratio"]
            cw = breakeven(be["mtad"][0], p["factor_cw"]["mtad"], m["cw_axis"]) if be["mtad"] else None
            vm = breakeven(be["mtad"][0], p["factor_v"]["mtad"], m["v_axis"]) if be["mtad"] else None
            vmm = breakeven(be["mmtad"][0], p["factor_v"]["mmtad"], m["v_axis"]) if be["mmtad"] else None
            rows.append([dr["name"], f"{dr['alpha'][0]:.2f}", *(interval(at[d]) for d in DECODERS), _at(cw), _at(vm),
                         _at(vmm)])
        header = ["draft", "α", *(NAMES[d] for d in DECODERS), "MTAD breaks even at c_W/c", "MTAD at v(5)",
                  "MMTAD at v(5)"]
        out += [*md_table(header, rows), ""]
    return out


def _edges(y: np.ndarray) -> np.ndarray:
    mid = (y[1:] + y[:-1]) / 2
    return np.concatenate([[y[0] - (mid[0] - y[0])], mid, [y[-1] + (y[-1] - mid[-1])]])


def figure(res: dict, path: Path, hardware: str) -> None:
    """Two rows of four panels (one per decoder) at the declared camera-ready pair's c: speed-up over speculative
    decoding for each real draft (a column, ordered by α) over c_W/c (top) and over v(5) (bottom); black points:
    where the speed-up crosses 1, with the crossings of its interval's ends as bars; the profile's own value a
    dotted line; the paper's per-run figures (MTAD ÷ SpecInfer per run) in a last column of MTAD's panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm

    m = res["two_axis"]
    p = m["profiles"][MAP_PROFILE]
    drafts = m["drafts"]
    cols = np.arange(len(drafts) + 1)
    labels = [f"{d['name']}\n{d['alpha'][0]:.2f}" for d in drafts] + ["paper\nruns"]
    paper = [r[5] / r[4] for r in PAPER_RUNS]  # SpecInfer's ms/token over MTAD's, per run
    levels = np.arange(0.4, 1.61, 0.05)
    cmap = plt.get_cmap("RdBu")
    norm = BoundaryNorm(levels, cmap.N, extend="both")
    fig, axes = plt.subplots(2, 4, figsize=(20, 10))
    for row, (axis_key, fkey, ylabel, own) in enumerate((
            ("cw_axis", "factor_cw", "c_W/c: a W = 4 beam-row draft step over a one-row step", p["terms"]["cW_over_c"]),
            ("v_axis", "factor_v", "v(5): a 5-token verify pass over one target step", p["terms"]["v5"]))):
        y = np.array(m[axis_key])
        for col, dec in enumerate(DECODERS):
            ax = axes[row, col]
            f = np.array(p[fkey][dec])  # (Y,)
            z = np.full((len(y), len(drafts) + 1), np.nan)  # (Y, D + 1)
            for i, d in enumerate(drafts):
                if d["be_ratio"][dec]:
                    z[:, i] = d["be_ratio"][dec][0] * f
                    ends = [breakeven(d["be_ratio"][dec][k], list(f), m[axis_key]) for k in (0, 1, 2)]
                    if ends[0] is not None:
                        lo, hi = (e if e is not None else (y[-1] if k == 1 else y[0]) for k, e in
                                  ((1, ends[1]), (2, ends[2])))
                        ax.errorbar([i + 0.5], [ends[0]], yerr=[[max(0, ends[0] - min(lo, hi))],
                                                               [max(0, max(lo, hi) - ends[0])]],
                                    fmt="o", color="k", ms=5, capsize=3, zorder=5)
            mesh = ax.pcolormesh(np.arange(len(drafts) + 2), _edges(y), z, cmap=cmap, norm=norm)
            ax.axhline(own, color="k", ls=":", lw=1.2)
            if dec == "mtad":
                ax.scatter([len(drafts) + 0.5] * len(paper), [own] * len(paper), marker="*", s=160, color="gold",
                           edgecolor="k", zorder=6)
                ax.annotate(f"paper: MTAD ÷ SpecInfer\n{min(paper):.2f}–{max(paper):.2f}× per run",
                            (len(drafts) + 0.5, own), xytext=(0.3, y[-1] - 0.12), fontsize=8,
                            arrowprops={"arrowstyle": "->", "lw": 0.8},
                            bbox={"boxstyle": "round", "fc": "w", "alpha": 0.9})
            if dec == "block":
                ax.text(0.5, 0.5, "the same forwards as speculative decoding:\nspeed-up = tokens-per-step ratio "
                        "at any cost", transform=ax.transAxes, ha="center", fontsize=8,
                        bbox={"boxstyle": "round", "fc": "w", "alpha": 0.9})
            ax.set_xticks(cols + 0.5)
            ax.set_xticklabels(labels if dec == "mtad" else labels[:-1] + [""], fontsize=7)
            ax.set_xlim(0, len(drafts) + (1 if dec == "mtad" else 0))
            ax.set_title(f"{NAMES[dec]} ÷ speculative decoding", fontsize=10)
            if col == 0:
                ax.set_ylabel(ylabel, fontsize=9)
            if row == 1:
                ax.set_xlabel("draft and its held-out α", fontsize=9)
    fig.colorbar(mesh, ax=axes, shrink=0.8, label="speed-up over speculative decoding (projection)")
    t = p["terms"]
    fig.suptitle(
        "Two-axis regime map — PROJECTION at the declared costs of " + p["label"] + f"\n(c = {t['c']:g}, harness "
        f"{t['h_step']:g} step per step; dotted: its c_W/c = {t['cW_over_c']:.2f} and v(5) = {t['v5']:.2f}). "
        f"Acceptance: SmolLM2-135M-Instruct with 10 real drafts, tokens per target forward measured on {hardware}"
        f" ({m['source']}).\nBlack points: where the speed-up crosses 1; bars: where its 95 % interval's ends "
        "cross it (to the axis' end where they do not)", fontsize=10)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)

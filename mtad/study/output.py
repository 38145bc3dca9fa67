"""The verifier study's outputs (VERIFIERS.md §6): a Markdown table, the same figures as JSONL and CSV, and
one figure (accepted length against distance from the target, one marker per rule and parameter)."""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

from mtad._util.io import atomic_write
from mtad.report.markdown import DASH, interval, table

FAMILY_STYLE = {"lossless": ("o", "#1b9e77"), "block": ("s", "#d95f02"), "threshold": ("^", "#7570b3"),
                "typical": ("D", "#e7298a"), "fuzzy": ("v", "#66a61e"), "mtad": ("*", "#e6ab02")}


def _ci(t: Sequence[float | None], digits: int = 2, signed: bool = False) -> str:
    return interval(t, digits, signed=signed, minus="−")


def markdown(rows: Sequence[dict], meta: dict) -> str:
    """One table per task; every figure with its 95 % interval."""
    K = meta["gamma"]
    parts = [f"# Verifier study on the same drafts: {meta['pair']} ({meta['device_name']}, "
             f"{meta['num_threads']} thread{'s' if meta['num_threads'] != 1 else ''})", "",
             f"`{meta['command']}` — git {meta['git_sha'] or DASH}; {meta['seconds']:.0f} s.", ""]
    for task in dict.fromkeys(r["task"] for r in rows):
        sub = [r for r in rows if r["task"] == task]
        n = sub[0]
        parts += [f"## {task}: {n['n_contexts']} contexts from {n['n_prompts']} prompts; TV at {n['tv_contexts']} "
                  f"fixed contexts × {n['tv_draws']} drafts; pairing check: "
                  f"{meta['pairing'][task]} disagreement(s) of the lossless replica", ""]
        header = ["rule", "lossless", "accepted length L [95 % CI]", "Δ L vs token-wise",
                  *(f"P(τ≥{i})" for i in range(1, K + 1)), "TV first token [95 % CI]",
                  "log p / token (raw target)", "Δ log p / token vs token-wise"]
        body = [[r["label"], "yes" if r["lossless"] else "no", _ci(r["mean_accept_length"]),
                 _ci(r["delta_accept_length_vs_lossless"], signed=True),
                 *(_ci(m) for m in r["marginal_accept_rates"]), _ci(r["tv_first_token"], 3),
                 _ci(r["loglik_per_token"]), _ci(r["delta_loglik_per_token_vs_lossless"], 3, signed=True)]
                for r in sub]
        parts += [*table(header, body, escape=True), ""]
    parts += ["## How to read it", "", *(f"- {line}" for line in NOTES(meta)), ""]
    return "\n".join(parts)


def NOTES(meta: dict) -> list[str]:  # noqa: N802 - a constant that needs the settings
    return [f"Contexts: the target's own {meta['continuation']} continuation ({meta['tokens']} tokens, T = "
            f"{meta['temperature']:g}, top-k {meta['top_k']}, top-p {meta['top_p']:g}) of each prompt, cut every "
            f"{meta['stride']} tokens. At each context one draft block of K = {meta['gamma']} tokens is drawn from "
            "the draft with a seeded generator, scored once by the target, and handed with the same K uniforms "
            "(and one uniform for the next token) to every rule: every difference between rows is paired.",
            "L = τ + 1: tokens committed per verification step (SPEED-Bench's acceptance length). P(τ≥i): marginal "
            "acceptance of draft position i. Intervals: 95 % percentile bootstrap resampling prompts "
            f"({meta['n_boot']} resamples); Δ columns are paired (difference taken within each resample).",
            "TV first token: total variation between the law of the first committed token (Monte-Carlo over fresh "
            "drafts at a few fixed contexts, the correction's law in place of its draw) and the filtered target "
            "p_1; for a lossless rule the true value is 0 and the figure is the Monte-Carlo noise floor.",
            "log p / token: mean log-probability of the committed tokens under the raw target (T = 1, no filter), "
            "as perplexity is scored; higher is closer to the target's mode, not necessarily to its law.",
            "mtad: MTAD's joint rule (VERIFIERS.md §6 choice) on the same chain-sampled draft; the mtad decoder "
            "drafts by beam sampling. Hardware-free: acceptance, not speed; no throughput is projected here."]


CSV_COLUMNS = ("task", "rule", "param", "label", "lossless", "n_contexts", "n_prompts")


def csv_text(rows: Sequence[dict], K: int) -> str:
    """One line per (task, rule); each figure as point, low, high columns."""
    buf = io.StringIO()
    figs = ["mean_accept_length", "delta_accept_length_vs_lossless", "tv_first_token", "loglik_per_token",
            "delta_loglik_per_token_vs_lossless"]
    header = [*CSV_COLUMNS, *(f"{f}_{s}" for f in figs for s in ("point", "low", "high")),
              *(f"marginal_{i}_{s}" for i in range(1, K + 1) for s in ("point", "low", "high")),
              *(f"conditional_{i}" for i in range(1, K + 1)), "tv_contexts", "tv_draws"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow([*(r[c] for c in CSV_COLUMNS), *(x for f in figs for x in r[f]),
                    *(x for m in r["marginal_accept_rates"] for x in m), *r["conditional_accept_rates"],
                    r["tv_contexts"], r["tv_draws"]])
    return buf.getvalue()


LABEL_OFFSET = {"threshold": (-9, 0, "right"), "mtad": (10, 4, "left"), "typical": (9, -7, "left"),
                "fuzzy": (8, 4, "left")}  # offset points and alignment of a parameter label, per family
PROFILE_RULES = ("lossless", "block", "threshold (τ=0.5)", "typical (ε=0.09, δ=0.3)", "fuzzy (JS≤0.4)", "mtad (τ=0.5)")


def figure(rows: Sequence[dict], meta: dict, path: Path) -> None:
    """Per task (columns): accepted length L against TV from the target, one marker per rule and parameter,
    error bars both ways (top); the marginal acceptance P(τ >= i) per draft position of the rules at their
    default parameters (bottom)."""
    import matplotlib  # heavy optional dependency: only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    K = meta["gamma"]
    fig, axes = plt.subplots(2, len(tasks), figsize=(6.2 * len(tasks), 9.0), squeeze=False,
                             gridspec_kw={"height_ratios": [1.5, 1]})
    handles = {}
    for col, task in enumerate(tasks):
        sub = [r for r in rows if r["task"] == task]
        ax, low = axes[0][col], axes[1][col]
        no_tv = sub[0]["tv_first_token"][0] is None  # --tv-contexts 0: L per rule, rules along x
        for j, r in enumerate(sub):
            marker, color = FAMILY_STYLE.get(r["rule"], ("x", "black"))
            (x, xl, xh), (y, yl, yh) = (j, j, j) if no_tv else r["tv_first_token"], r["mean_accept_length"]
            h = ax.errorbar([x], [y], xerr=[[max(x - xl, 0)], [max(xh - x, 0)]],
                            yerr=[[max(y - yl, 0)], [max(yh - y, 0)]],
                            fmt=marker, color=color, ms=12 if marker == "*" else 7, capsize=3, lw=1, mec="black",
                            mew=0.5, zorder=3)
            handles.setdefault(r["rule"], h)
            if r["param"]:  # families label on different sides, so that labels of coinciding points do not collide
                dx, dy, ha = LABEL_OFFSET.get(r["rule"], (8, 3, "left"))
                ax.annotate(r["param"], (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7.5, color=color,
                            ha=ha, va="center", zorder=4,
                            bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7})
        n = sub[0]
        ax.set_title(f"{task}: {n['n_contexts']} contexts from {n['n_prompts']} prompts", fontsize=10)
        ax.set_xlabel(f"TV of the first committed token from the target (95 % CI; {n['tv_contexts']} fixed contexts "
                      f"× {n['tv_draws']} drafts;\nlossless rules: the true TV is 0, the figure is Monte-Carlo noise)",
                      fontsize=8.5)
        ax.grid(alpha=0.3)
        ax.set_xlim(left=-0.004)
        if no_tv:
            ax.set_xticks(range(len(sub)), [r["label"] for r in sub], rotation=60, ha="right", fontsize=7)
            ax.set_xlim(-0.5, len(sub) - 0.5)
            ax.set_xlabel("rule (no TV measured: --tv-contexts 0)", fontsize=8.5)
        shown = [r for r in sub if r["label"] in PROFILE_RULES]
        for k, r in enumerate(shown):
            marker, color = FAMILY_STYLE.get(r["rule"], ("x", "black"))
            m = r["marginal_accept_rates"]
            xs = [i + 1 + (k - (len(shown) - 1) / 2) * 0.06 for i in range(K)]  # side by side, not on top
            err = [[max(v[0] - v[1], 0) for v in m], [max(v[2] - v[0], 0) for v in m]]
            low.errorbar(xs, [v[0] for v in m], yerr=err,
                         fmt=f"-{marker}", color=color, ms=9 if marker == "*" else 5, capsize=2, lw=1, mec="black",
                         mew=0.4, label=r["label"])
        low.set_xticks(range(1, K + 1))
        low.set_xlabel("draft position i", fontsize=9)
        low.set_ylim(-0.03, 1.05)
        low.grid(alpha=0.3)
        low.legend(fontsize=7.5, loc="upper right", ncol=2, frameon=True, framealpha=0.85)  # above the curves
    axes[0][0].set_ylabel(f"accepted length L = τ + 1 (K = {K}), 95 % CI")
    axes[1][0].set_ylabel("P(τ ≥ i), 95 % CI")
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), frameon=False,
               fontsize=9, bbox_to_anchor=(0.5, 0.0), title="rule (label: parameter)", title_fontsize=8.5)
    fig.suptitle(f"Verifiers judged on the same drafts and uniforms\n{meta['pair']} on {meta['device_name']}, "
                 f"{meta['num_threads']} thread; K = {K}, T = {meta['temperature']:g}, top-k {meta['top_k']}, "
                 f"top-p {meta['top_p']:g}; contexts: the target's own {meta['continuation']} continuations",
                 fontsize=10.5)
    fig.tight_layout(rect=(0, 0.06, 1, 0.99))
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=130)
    plt.close(fig)
    atomic_write(path, data.getvalue())


def write_all(rows: Sequence[dict], meta: dict, out_dir: Path, stem: str) -> list[Path]:
    """``<stem>.md``, ``.jsonl`` (one line per task and rule, the settings under ``study``), ``.csv``,
    ``.png`` in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.{ext}" for ext in ("md", "jsonl", "csv", "png")]
    atomic_write(paths[0], markdown(rows, meta))
    atomic_write(paths[1], "".join(json.dumps({**r, "study": meta}, ensure_ascii=False) + "\n" for r in rows))
    atomic_write(paths[2], csv_text(rows, meta["gamma"]))
    figure(rows, meta, paths[3])
    return paths

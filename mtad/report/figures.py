"""What every figure of the notebooks shares, so that each one can be read on its own: a title naming the
pair(s) and the hardware, integer ticks where the axis counts something (draft positions, γ, W), legends
outside the data, error bars from the per-prompt bootstrap (:func:`mtad.report.stats.run_interval`) wherever
a figure has spread, and panels left out (with a printed note) when they would be empty or all zero.

The notebooks (``notebooks/analysis.ipynb``, ``notebooks/ablations.ipynb``) import this module; it holds no
state and draws on the axes it is given.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator

from mtad._util.paths import REPO_ROOT
from mtad.report import stats
from mtad.report.frame import VARIANT_KEYS

DECODER_COLORS = {"greedy": "black", "sampling": "tab:blue", "speculative": "tab:grey", "specinfer": "tab:olive",
                  "mtjd": "tab:brown", "mtad": "tab:red", "mmtad": "tab:purple"}
# the settings a variant label may carry that are the decoder's plain form
PLAIN_SETTINGS = ("accept=lossless", "proposer=draft")
# the colours of the verifier zoo, by a setting the variant label carries (the same in every figure and in the
# notebooks' quality plots): block verification, a fixed threshold, an n-gram proposer (MTAD's lighter red)
SETTING_COLORS = (("accept=block", "tab:cyan"), ("accept=threshold", "tab:green"), ("accept=typical", "tab:pink"),
                  ("accept=fuzzy", "gold"))
NGRAM_COLORS = {"mtad": "lightsalmon", "speculative": "tab:orange"}
# colours for any other variants of one decoder (an ablation's settings)
SPARE_COLORS = ("navy", "darkseagreen", "sienna", "slateblue", "teal", "orchid", "darkkhaki", "steelblue")


def member_colors(members: Iterable[str]) -> dict[str, str]:
    """A colour per variant label (``speculative (accept=block, proposer=draft)``), no two alike: a variant of
    the verifier zoo gets its setting's colour (:data:`SETTING_COLORS`, :data:`NGRAM_COLORS`), the plainest
    other variant of each decoder the decoder's colour, the rest spare ones."""
    def plainness(m: str) -> tuple:
        inside = m.split("(", 1)[1].rstrip(")") if "(" in m else ""
        return (sum(1 for s in inside.split(", ") if s and s not in PLAIN_SETTINGS), m)

    def preferred(m: str) -> list:
        decoder = m.split(" ")[0]
        zoo = [c for key, c in SETTING_COLORS if key in m]
        if "proposer=ngram" in m:
            zoo.append(NGRAM_COLORS.get(decoder, "tab:orange"))
        return [*zoo, DECODER_COLORS.get(decoder), *SPARE_COLORS]

    out, used = {}, set()
    for m in sorted(set(members), key=plainness):
        out[m] = next((c for c in preferred(m) if c and c not in used), f"C{len(used) % 10}")
        used.add(out[m])
    return out


def repo_path(path: str | Path) -> Path:
    """``path`` as given when it exists or is absolute, else under the repository root (a notebook run by
    ``jupyter-execute`` has ``notebooks/`` as its working directory)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or p.exists() else REPO_ROOT / p


def hardware(rows) -> str:
    """``AMD EPYC, 1 thread`` (every device and thread count among ``rows``, a DataFrame of result rows)."""
    out = []
    for name, threads in sorted({(str(r.get("device_name") or "unknown device"), r.get("num_threads"))
                                 for _, r in rows.iterrows()}, key=str):
        t = int(threads) if isinstance(threads, (int, float)) and not math.isnan(threads) and threads else None
        out.append(f"{name}, {t} thread{'s' if t != 1 else ''}" if t else name)
    return "; ".join(out)


def context(rows) -> str:
    """``pair smollm2_bf16_feature · AMD EPYC, 1 thread``: the pair(s) and hardware of a figure's rows."""
    pairs = sorted({str(p) for p in (rows["pair"] if "pair" in rows.columns else rows["model.name"])})
    return f"{'pairs' if len(pairs) > 1 else 'pair'} {', '.join(pairs)} · {hardware(rows)}"


def title(fig, what: str, rows) -> None:
    """The figure's title: what it shows, then the pair and hardware of its rows."""
    fig.suptitle(f"{what}\n{context(rows)}", fontsize=10)


def integer_ticks(ax, axis: str = "x") -> None:
    """Ticks at whole numbers only (draft positions, γ, W): never 1.5 or 2.5."""
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))


def is_integer_setting(values: Iterable[Any]) -> bool:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return bool(vals) and all(float(v).is_integer() for v in vals)


def legend_outside(ax, fig=None, **kw) -> None:
    """The legend to the right of the axes, so it covers no line, point or bar (``bbox_inches="tight"``
    on saving keeps it in the image). Nothing when there are no labelled artists."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  fontsize=kw.pop("fontsize", 7), frameon=False, **kw)


def errbar(iv, value) -> tuple[float, float]:
    """Asymmetric error bar (below, above) of an Interval around the plotted value; (0, 0) without one."""
    if iv is None or not iv.has_interval or value is None or (isinstance(value, float) and math.isnan(value)):
        return (0.0, 0.0)
    return (max(0.0, value - iv.low), max(0.0, iv.high - value))


def why_empty(values: Sequence[Any]) -> str | None:
    """Why a panel of ``values`` says nothing: ``no values`` or ``all zero`` (None when it has content)."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "no values"
    if all(v == 0 for v in vals):
        return "all zero"
    return None


def grouped_bars(ax, rows, value: str, interval: str | None, group: str = "task",
                 member: str = "variant", order: Sequence[str] = ()) -> bool:
    """Bars of ``rows[value]``: one group per ``group`` value, one bar per ``member`` inside it, coloured
    by decoder and variant (:func:`member_colors`), with 95 % bootstrap error bars of
    ``stats.run_interval(records, interval)`` where the run's per-prompt records exist. Returns whether any bar
    has an error bar."""
    groups = sorted({str(g) for g in rows[group]})
    members = sorted({str(m) for m in rows[member]},
                     key=lambda m: (order.index(m.split(" ")[0]) if m.split(" ")[0] in order else 99, m))
    width = 0.8 / max(1, len(members))
    colors = member_colors(members)
    any_err = False
    for j, m in enumerate(members):
        xs, ys, errs = [], [], []
        for i, g in enumerate(groups):
            sel = rows[(rows[group].astype(str) == g) & (rows[member].astype(str) == m)]
            if sel.empty or sel[value].isna().all():
                continue
            r = sel.iloc[-1]
            iv = stats.run_interval(r.get("records"), interval) if interval else None
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(float(r[value]))
            errs.append(errbar(iv, float(r[value])))
            any_err = any_err or (iv is not None and iv.has_interval)
        if xs:
            ax.bar(xs, ys, width=width * 0.92, label=m, color=colors[m],
                   yerr=list(zip(*errs)), capsize=3, error_kw={"elinewidth": 1})
    ax.set_xticks(range(len(groups)), groups)
    return any_err


# ------------------------------------------------------------------------------------------- sweeps
def sweep_groups(df, param: str, decoders: Sequence[str] | None = None) -> list:
    """(label, rows) for every (pair, task, decoder, other decoder settings) run at two or more values of
    ``decoder.<param>``: one line per group, every other setting held fixed."""
    col = f"decoder.{param}"
    if col not in df.columns:
        return []
    sub = df if decoders is None else df[df.decoder.isin(decoders)]
    if sub.empty:
        return []
    others = [f"decoder.{k}" for k in VARIANT_KEYS if k != param and f"decoder.{k}" in sub.columns]
    keys = [" | ".join(map(str, t)) for t in sub[["pair", "task", "decoder", *others]].itertuples(index=False)]
    groups = [g.sort_values(col) for _, g in sub.groupby(keys) if g[col].nunique() >= 2]
    varying = [c for c in others if len({str(g[c].iloc[0]) for g in groups}) > 1]
    several_pairs = len({g.pair.iloc[0] for g in groups}) > 1
    out = []
    for g in groups:
        first = g.iloc[0]
        fixed = "".join(f", {c.split('.', 1)[1]}={first[c]}" for c in varying)
        pair = f" · {first.pair}" if several_pairs else ""
        out.append((f"{first.decoder}{pair} · {first.task}{fixed}", g))
    return out


def spread(r, col: str):
    """The 95 % interval of a row's ``col`` where the figure has one (else None)."""
    if col == "speedup":
        return r.get("speedup_ci")
    if col in ("ppl", "score", *stats.RATE_FIELDS):
        return stats.run_interval(r.get("records"), col)
    return None


def plot_sweep(plt, df, param: str, symbol: str, panels, decoders=None, what: str = ""):
    """One panel per (column, label) of ``panels`` against ``decoder.<param>``, one line per sweep group,
    with 95 % error bars where the rows have per-prompt records. Returns (figure, None), or (None, why)
    when there is nothing to plot; panels without a value (or all zero) are left out and named in ``why``
    of the returned notes."""
    groups = sweep_groups(df, param, decoders)
    if not groups:
        return None, (f"no decoder was run at two or more values of {param} with its other settings fixed "
                      f"(python -m mtad.harness.sweep --experiment {param})")
    import pandas as pd  # heavy, and only the notebooks draw sweeps

    rows = pd.concat([g for _, g in groups])
    kept = []
    for c, label in panels:
        empty = why_empty(list(rows[c])) if c in rows.columns else "no values"
        if empty:
            print(f"note: {param} sweep: no '{label}' panel ({empty})")
        else:
            kept.append((c, label))
    if not kept:
        return None, "the rows carry none of the figures to plot"
    fig, axes = plt.subplots(1, len(kept), figsize=(4.2 * len(kept), 3.4), squeeze=False)
    for ax, (col, label) in zip(axes[0], kept):
        for text, g in groups:
            g = g[g[col].notna()]
            if len(g):
                err = list(zip(*[errbar(spread(r, col), r[col]) for _, r in g.iterrows()]))
                ax.errorbar(g[f"decoder.{param}"], g[col], yerr=err, marker="o", capsize=3, label=text,
                            color=DECODER_COLORS.get(g.decoder.iloc[0]))
        if col == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        if is_integer_setting(rows[f"decoder.{param}"]):
            integer_ticks(ax)
        ax.set_xlabel(symbol)
        ax.set_ylabel(label)
    legend_outside(axes[0][-1])
    title(fig, what or f"Against {symbol} (error bars: 95 % bootstrap over prompts)", rows)
    return fig, None

"""The reviewers' control on a scored task: accuracy against diversity, one point per decoder setting.

``python -m mtad.report.frontier RESULTS.jsonl --task capitals [--out DIR]`` reads a results file (e.g. the
``cpu_qa`` rows of ``make reproduce-table PROFILE=cpu_qa``), groups rows by pair, decoder and its settings
(seeds pooled), and for each setting computes on the task's prompts:

- **accuracy**: the mean over prompts of the task's headline score (each prompt's score averaged over seeds),
  with a 95 % percentile-bootstrap interval over prompts;
- **diversity**: distinct-2 (distinct token bigrams / all bigrams, :func:`mtad.measure.metrics.distinct_n`)
  over the outputs of one seed, averaged over seeds, with a bootstrap interval from the same prompt resamples
  (recentred on the estimate: a resample repeats prompts, which lowers distinct-n by itself).

It writes ``frontier_<task>.md`` (a table) and ``frontier_<task>.png``: sampling's settings joined as the
temperature frontier, MTAD's taus joined as a second line, greedy/speculative/block as single markers, error
bars both ways. Whether MTAD sits above the sampling frontier is read from the figure and the table: a point
above the line joining its neighbours in diversity, by more than the intervals. :func:`frontier_verdict`
states it for every MTAD point.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mtad._util.io import writable_dir
from mtad.report.markdown import interval
from mtad.report.markdown import table as md_table
from mtad.report.stats import (
    N_RESAMPLES,
    cell_key,
    distinct_share,
    incidence,
    percentile_interval,
    read_samples,
    resample_counts,
    resample_indices,
    resolve_run_dir,
)


@dataclass(frozen=True)
class Point:
    """One decoder setting on one task: accuracy and distinct-2 with their 95 % intervals."""

    label: str
    family: str  # sampling | mtad | greedy | speculative | block | other
    setting: float | None  # temperature (sampling), tau (mtad); None otherwise
    accuracy: tuple[float, float, float]
    distinct2: tuple[float, float, float]
    n_prompts: int
    n_seeds: int
    scores: dict = field(default_factory=dict, compare=False, repr=False)  # prompt id -> score (seeds averaged)


def read_rows(path: Path) -> list[dict]:
    """The rows of a results file; a line that is not a JSON object is an error naming file and line."""
    rows = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{i}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i}: a row must be a JSON object")
        rows.append(row)
    return rows


def setting_of(row: dict) -> tuple[str, str, float | None]:
    """(label, family, swept setting) of a row's decoder."""
    d = row.get("decoder", {})
    name, accept = d.get("name"), d.get("accept", "lossless")
    if name == "sampling":
        label = f"sampling T={d.get('temperature'):g}" + (f" top-p={d.get('top_p'):g}" if d.get("top_p") != 0.9 else "")
        return label, "sampling" if d.get("top_p") == 0.9 else "sampling_top_p", float(d.get("temperature"))
    if name == "mtad":
        return f"MTAD τ={d.get('tau'):g}", "mtad", float(d.get("tau"))
    if name == "speculative":
        return ("block verification", "block", None) if accept == "block" else (f"speculative ({accept})",
                                                                                  "speculative", None)
    return str(name), "greedy" if name == "greedy" else "other", None


def points(rows: Sequence[dict], task: str, search: Sequence[Path] = (), n_resamples: int = N_RESAMPLES,
           seed: int = 0) -> dict[str, list[Point]]:
    """pair -> the task's points, one per decoder setting (seeds pooled); rows whose samples are missing are
    left out."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("task", {}).get("name") != task:
            continue
        label, family, value = setting_of(r)
        groups[(r.get("model", {}).get("name"), label, family, value)].append(r)
    out: dict[str, list[Point]] = defaultdict(list)
    for (pair, label, family, value), grp in sorted(groups.items(), key=lambda kv: str(kv[0])):
        runs = []
        for r in grp:
            d = resolve_run_dir(r.get("run_dir"), search)
            if d is not None:
                runs.append((read_samples(d), r.get("metrics", {}).get("score_name")))
        if runs:
            out[pair].append(_point(label, family, value, runs, n_resamples, seed))
    return dict(out)


def _point(label, family, value, runs, n_resamples, seed) -> Point:
    ids = sorted({str(s["id"]) for samples, _ in runs for s in samples if "output_ids" in s})
    index = {k: i for i, k in enumerate(ids)}
    score = np.full((len(runs), len(ids)), np.nan)
    outputs: list[list] = [[None] * len(ids) for _ in runs]
    for j, (samples, name) in enumerate(runs):
        for s in samples:
            if "output_ids" not in s or str(s["id"]) not in index:
                continue
            k = index[str(s["id"])]
            v = (s.get("scores") or {}).get(name)
            score[j, k] = float(v) if isinstance(v, (int, float)) else np.nan
            outputs[j][k] = s["output_ids"]
    per_prompt = np.nanmean(score, axis=0)
    n = len(ids)
    # accuracy and distinct-2 from the same resamples of the prompts (the project's one resampling), as counts
    counts = resample_counts(n, cell_key("frontier", label, ids, seed), n_resamples) if n else np.zeros((0, 0))
    has = ~np.isnan(per_prompt)
    with np.errstate(all="ignore"):
        acc_dist = (counts[:, has] @ per_prompt[has]) / counts[:, has].sum(axis=1)  # (B,)
    div_runs, div_dists = [], []
    for j in range(len(runs)):  # distinct-2 over one seed's outputs, averaged over seeds
        bigrams = [list(zip(o, o[1:])) if o is not None else [] for o in outputs[j]]
        inc, sizes = incidence(bigrams)
        div_runs.append(float(distinct_share(np.ones((1, n)), inc, sizes)[0]) if sizes.sum() else 0.0)
        div_dists.append(np.nan_to_num(distinct_share(counts, inc, sizes)) if sizes.sum() else np.zeros(len(counts)))
    full = (float(np.nanmean(per_prompt)) if has.any() else float("nan"), float(np.mean(div_runs)) if runs else 0.0)
    boots = np.stack([acc_dist, np.mean(div_dists, axis=0)], axis=1) if n else np.zeros((0, 2))

    def band(col: int) -> tuple[float, float, float]:
        if len(boots) == 0:
            return (full[col], full[col], full[col])
        # distinct-2 is no mean over prompts: a resample's repeated prompts repeat outputs and lower it, so its
        # bootstrap distribution is recentred on the estimate (its spread kept); accuracy needs no shift
        shift = full[col] - float(np.mean(boots[:, col])) if col == 1 else 0.0
        low, high = (float(q) + shift for q in percentile_interval(boots[:, col]))
        return (full[col], max(min(low, full[col]), 0.0), min(max(high, full[col]), 1.0))  # both are shares

    return Point(label, family, value, band(0), band(1), n, len(runs),
                 {k: float(per_prompt[i]) for k, i in index.items() if not np.isnan(per_prompt[i])})


def paired_difference(a: Point, b: Point, n_resamples: int = N_RESAMPLES,
                      seed: int = 0) -> tuple[float, float, float]:
    """Accuracy of ``a`` minus ``b`` on their common prompts, with a 95 % paired bootstrap interval."""
    keys = sorted(a.scores.keys() & b.scores.keys())
    d = np.array([a.scores[k] - b.scores[k] for k in keys])
    if len(d) == 0:
        return (float("nan"),) * 3
    means = d[resample_indices(len(d), cell_key("frontier difference", a.label, b.label, keys, seed),
                               n_resamples)].mean(axis=1)
    low, high = percentile_interval(means)
    return float(d.mean()), float(low), float(high)


def frontier_verdict(pts: Sequence[Point]) -> list[str]:
    """For each MTAD point: above, on or below the sampling frontier (sampling points at top-p 0.9, joined in
    order of distinct-2), judged at the MTAD point's distinct-2 by linear interpolation; "above"/"below" only
    when the MTAD point's accuracy interval clears the frontier's value and the nearer neighbour's interval."""
    samp = sorted((p for p in pts if p.family == "sampling"), key=lambda p: p.distinct2[0])
    out = []
    for p in (p for p in pts if p.family == "mtad"):
        x = p.distinct2[0]
        if len(samp) < 2 or not samp[0].distinct2[0] <= x <= samp[-1].distinct2[0]:
            out.append(_outside(p, samp))
            continue
        right = next(i for i, s in enumerate(samp) if s.distinct2[0] >= x)
        a, b = samp[max(right - 1, 0)], samp[right]
        t = 0.0 if b.distinct2[0] == a.distinct2[0] else (x - a.distinct2[0]) / (b.distinct2[0] - a.distinct2[0])
        y = a.accuracy[0] + t * (b.accuracy[0] - a.accuracy[0])
        near = a if t < 0.5 else b
        if p.accuracy[1] > max(y, near.accuracy[2]):
            where = "above"
        elif p.accuracy[2] < min(y, near.accuracy[1]):
            where = "below"
        else:
            where = "on (within the intervals)"
        out.append(f"{p.label}: {where} the sampling frontier (accuracy {interval(p.accuracy, 3)} vs {y:.3f} on "
                   f"the frontier at distinct-2 {x:.3f})")
    return out


def _outside(p: Point, samp: Sequence[Point]) -> str:
    """A point beyond the frontier's diversity range: judged against the nearest sampling point in diversity,
    by the paired accuracy difference. Below when that point is both more diverse (it is, on the low side) and
    significantly more accurate; above when it is less diverse and significantly less accurate."""
    if not samp:
        return f"{p.label}: no sampling frontier"
    low_side = p.distinct2[0] < samp[0].distinct2[0]
    s = samp[0] if low_side else samp[-1]
    d, lo, hi = paired_difference(p, s)
    diff = f"accuracy {interval((d, lo, hi), 3, signed=True)} vs {s.label} on the same prompts"
    span = f"{samp[0].distinct2[0]:.3f}–{samp[-1].distinct2[0]:.3f}"
    if low_side and hi < 0:
        return (f"{p.label}: below the sampling frontier — {s.label} is both more diverse (distinct-2 "
                f"{s.distinct2[0]:.3f} vs {p.distinct2[0]:.3f}) and more accurate ({diff})")
    if not low_side and lo > 0:
        return (f"{p.label}: above the sampling frontier — more diverse than every sampling setting and more "
                f"accurate than the most diverse ({diff})")
    return (f"{p.label}: outside the frontier's diversity range ({span}), {'less' if low_side else 'more'} diverse "
            f"than every sampling setting; no accuracy difference the interval can show against the nearest "
            f"({diff})")


def table(pts: Sequence[Point], pair: str, task: str, hardware: str) -> str:
    rows = [[p.label, interval(p.accuracy, 3), interval(p.distinct2, 3), str(p.n_prompts), str(p.n_seeds)]
            for p in sorted(pts, key=lambda p: (p.family, p.setting or 0))]
    lines = [f"# Accuracy vs diversity: {task}, {pair} ({hardware})", "",
             *md_table(["decoder setting", "accuracy [95 % CI]", "distinct-2 [95 % CI]", "prompts", "seeds"], rows,
                       compact=True)]
    lines += ["", "Accuracy: the task's headline score per prompt, averaged over seeds; distinct-2 over one seed's "
              "outputs, averaged over seeds; intervals: percentile bootstrap over prompts "
              f"({N_RESAMPLES} resamples).", "", "MTAD against the sampling frontier:", ""]
    lines += [f"- {v}" for v in frontier_verdict(pts)]
    return "\n".join(lines) + "\n"


STYLE = {"sampling": ("C0", "o", "-"), "sampling_top_p": ("C0", "s", ""), "mtad": ("C3", "D", "-"),
         "greedy": ("k", "*", ""), "speculative": ("C2", "^", ""), "block": ("C4", "v", ""), "other": ("C7", "x", "")}


def figure(pts: Sequence[Point], pair: str, task: str, hardware: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for family, (color, marker, line) in STYLE.items():
        fam = sorted((p for p in pts if p.family == family), key=lambda p: p.distinct2[0])
        if not fam:
            continue
        x = [p.distinct2[0] for p in fam]
        y = [p.accuracy[0] for p in fam]
        xerr = [[p.distinct2[0] - p.distinct2[1] for p in fam], [p.distinct2[2] - p.distinct2[0] for p in fam]]
        yerr = [[p.accuracy[0] - p.accuracy[1] for p in fam], [p.accuracy[2] - p.accuracy[0] for p in fam]]
        name = {"sampling": "sampling (top-p 0.9), by temperature", "mtad": "MTAD, by τ",
                "sampling_top_p": "sampling, other top-p"}.get(family, fam[0].label)
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=marker + (line or ""), color=color, ms=7, capsize=3,
                    label=name, lw=1.2)
        for p in fam:
            if p.setting is not None:
                tag = f"T={p.setting:g}" if family.startswith("sampling") else f"τ={p.setting:g}"
                ax.annotate(tag, (p.distinct2[0], p.accuracy[0]), textcoords="offset points", xytext=(6, 5),
                            fontsize=8, color=color)
    ax.set_xlabel("diversity: distinct-2 over the outputs (higher = more varied)")
    ax.set_ylabel(f"accuracy ({task}, headline score)")
    ax.set_title(f"Accuracy vs diversity on {task}: {pair}, {hardware}\n95 % bootstrap intervals over prompts",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # off the data
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mtad.report.frontier", description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a results file (JSONL rows with run_dir samples)")
    p.add_argument("--task", required=True, help="the task whose rows to plot (e.g. capitals)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: <results folder>/tables)")
    p.add_argument("--resamples", type=int, default=N_RESAMPLES)
    a = p.parse_args(argv)
    if a.resamples < 1:
        p.error(f"--resamples={a.resamples} is out of range: an integer >= 1")
    try:
        if not a.results.is_file():
            raise ValueError(f"{a.results} is not a file: give a results file (results/<experiment>.jsonl)")
        out = writable_dir(a.out or a.results.parent / "tables", "--out")  # before the resampling, not after
        rows = read_rows(a.results)
        by_pair = points(rows, a.task, [a.results.parent], a.resamples)
        if not by_pair:
            tasks = sorted({r.get("task", {}).get("name") for r in rows} - {None})
            raise ValueError(f"{a.results} has no rows with samples for task {a.task!r}: it has {tasks}")
    except (ValueError, OSError, UnicodeDecodeError) as err:
        print(f"mtad.report.frontier: error: {err}", file=sys.stderr)
        return 2
    for pair, pts in by_pair.items():
        hw = next((r.get("device_name") for r in rows if r.get("model", {}).get("name") == pair
                   and r.get("device_name")), "unknown hardware")
        stem = f"frontier_{a.task}" + ("" if len(by_pair) == 1 else f"_{pair}")
        (out / f"{stem}.md").parent.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text(table(pts, pair, a.task, hw), encoding="utf-8")
        figure(pts, pair, a.task, hw, out / f"{stem}.png")
        print(table(pts, pair, a.task, hw))
        print(f"wrote {out / stem}.md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

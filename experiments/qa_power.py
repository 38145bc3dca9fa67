"""How many QA prompts decide the downstream claim: the n at which the pooled relative score change of MTAD
over sampling at T = 1 has a 95 % interval at most ±HALF_WIDTH points wide, simulated from measured outcomes.

    .venv/bin/python experiments/qa_power.py                       # from cpu_qa_rescored-2026-12-07, asserted
    .venv/bin/python experiments/qa_power.py --results FILE --score asserted --half-width 5 --sims 1000

**Statistic.** The pooled relative change 100 (sum of MTAD's per-prompt scores / sum of sampling's - 1) over
the prompts both decoded (all tasks of the results file pooled into one cell, paired by task and prompt id):
``mtad.report.stats``' ``score_change`` on one cell.

**Method.** The measured per-prompt joint outcomes (MTAD's score, sampling's score) of the results file are the
population. For a candidate n, each of ``--sims`` simulated studies draws n paired outcomes from it with
replacement, and its interval is computed as ``mtad.report.stats.bootstrap_interval`` does: ``N_RESAMPLES``
paired resamples of the n prompts, the percentile interval at ``CONFIDENCE``. Resampling n pairs of K
distinct joint outcomes is a multinomial draw of n over the K outcomes (the same distribution as resampling
prompt indices, drawn in O(K) per resample, so n in the thousands stays cheap). The half-width is (high -
low) / 2; the expected half-width is its mean over the simulated studies (a study whose bootstrap is undefined,
a resample with no baseline score, counts as infinitely wide). The answer is the smallest n whose expected
half-width is at most ``--half-width``, found by bisection; every n is simulated from its own generator (a
child of ``--seed`` keyed by n), so a rerun prints the same number. A delta-method approximation is printed
beside it as a check.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from mtad._util import cli
from mtad._util.paths import REPO_ROOT
from mtad.report import stats
from mtad.report.markdown import interval

PUBLISHED = REPO_ROOT / "results" / "published" / "cpu_qa_rescored-2026-12-07.jsonl"
Z = 1.959963984540054  # the standard normal's 97.5 % quantile (the delta-method check only)


def is_mtad(d: dict, tau: float) -> bool:
    return d["name"] == "mtad" and math.isclose(d["tau"], tau) and math.isclose(d["temperature"], 1.0)


def is_sampling(d: dict) -> bool:
    return d["name"] == "sampling" and math.isclose(d["temperature"], 1.0)


def paired_outcomes(results: Path, score: str, tau: float = 0.5) -> tuple[np.ndarray, dict[str, int]]:
    """(n, 2) per-prompt (MTAD, sampling) scores of every task in ``results`` that has both runs, joined on
    (task, id, turn); and the number of pairs per task. ValueError naming what is missing."""
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    pairs, per_task = [], {}
    for task in dict.fromkeys(r["task"]["name"] for r in rows):
        mine = [r for r in rows if r["task"]["name"] == task]
        m = [r for r in mine if is_mtad(r["decoder"], tau)]
        b = [r for r in mine if is_sampling(r["decoder"])]
        if not m or not b:
            continue
        if len(m) > 1 or len(b) > 1:
            raise ValueError(f"{results}: task {task} has {len(m)} mtad tau={tau} and {len(b)} sampling T=1 rows; "
                             "give a results file with one of each per task")
        recs = [stats.samples_for([r["run_dir"]], score, search=[results.parent]) for r in (m[0], b[0])]
        if any(x is None for x in recs):
            raise ValueError(f"{results}: task {task}: per-prompt records not found ({m[0]['run_dir']}, "
                             f"{b[0]['run_dir']})")
        keys = sorted(k for k in recs[0].keys() & recs[1].keys()
                      if recs[0][k]["score"] is not None and recs[1][k]["score"] is not None)
        pairs += [(recs[0][k]["score"], recs[1][k]["score"]) for k in keys]
        per_task[task] = len(keys)
    if not pairs:
        raise ValueError(f"{results}: no task has both an mtad tau={tau} and a sampling T=1 run with "
                         f"'{score}' scores")
    return np.asarray(pairs, dtype=float), per_task


def joint(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (method, baseline) outcomes (K, 2) and their shares (K,)."""
    values, counts = np.unique(np.asarray(pairs, dtype=float), axis=0, return_counts=True)
    return values, counts / counts.sum()


def half_widths(values: np.ndarray, probs: np.ndarray, n: int, sims: int, seed: int = 0,
                n_resamples: int = stats.N_RESAMPLES) -> np.ndarray:
    """(sims,) half-widths, in points, of the percentile interval of 100 (sum method / sum baseline - 1) of
    ``sims`` studies of n prompts drawn from the joint outcomes (``values``, ``probs``), each bootstrapped with
    ``n_resamples`` paired resamples (inf where a resample has no baseline score)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(n),)))
    out = np.empty(sims)
    for s in range(sims):
        study = rng.multinomial(n, probs)  # (K,) the study's n paired outcomes
        boot = rng.multinomial(n, study / n, size=n_resamples)  # (B, K) paired resamples of its prompts
        sums = boot @ values  # (B, 2) method's and baseline's summed scores
        with np.errstate(divide="ignore", invalid="ignore"):
            change = 100 * (sums[:, 0] / sums[:, 1] - 1)  # (B,)
        if not np.isfinite(change).all():
            out[s] = np.inf
            continue
        low, high = stats.percentile_interval(change)
        out[s] = (high - low) / 2
    return out


def expected_half_width(values, probs, n: int, sims: int, seed: int = 0,
                        n_resamples: int = stats.N_RESAMPLES) -> tuple[float, float]:
    """The mean half-width over ``sims`` studies of n prompts and its Monte-Carlo standard error."""
    hw = half_widths(values, probs, n, sims, seed, n_resamples)
    if not np.isfinite(hw).all():
        return math.inf, math.nan
    return float(hw.mean()), float(hw.std(ddof=1) / math.sqrt(sims)) if sims > 1 else math.nan


def required_n(values, probs, half_width: float = 5.0, sims: int = 1000, seed: int = 0,
               n_resamples: int = stats.N_RESAMPLES, n_min: int = stats.MIN_PAIRS,
               n_max: int = 10_000_000) -> int:
    """The smallest n in [n_min, n_max] whose expected half-width is at most ``half_width`` points (doubling,
    then bisection); ValueError when even n_max is wider."""
    def ok(n):
        return expected_half_width(values, probs, n, sims, seed, n_resamples)[0] <= half_width

    lo, hi = n_min - 1, n_min  # invariant once hi is found: ok(hi), not ok(lo) (or lo below n_min)
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > n_max:
            raise ValueError(f"even n = {n_max} prompts give an expected half-width over {half_width:g} points")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def delta_n(values, probs, half_width: float = 5.0) -> float:
    """The normal-approximation n: 100 Z sd(m - R b) / (sqrt(n) mean b) = half_width, R = mean m / mean b."""
    m, b = values[:, 0], values[:, 1]
    mean_m, mean_b = probs @ m, probs @ b
    r = mean_m / mean_b
    d = m - r * b
    sd = math.sqrt(probs @ (d - probs @ d) ** 2)
    return (100 * Z * sd / (mean_b * half_width)) ** 2


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog="qa_power", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=cli.rows_file(), default=PUBLISHED,
                   help="results file whose mtad (tau) and sampling T=1 runs give the measured outcomes")
    p.add_argument("--score", default="asserted", help="the per-prompt score (default: asserted)")
    p.add_argument("--tau", type=cli.real(0, 1, low_open=True), default=0.5, help="MTAD's threshold (0.5)")
    p.add_argument("--half-width", type=cli.real(0, low_open=True), default=5.0,
                   help="the largest acceptable half-width of the 95 %% interval, in points (5)")
    p.add_argument("--sims", type=cli.count(2), default=1000, help="simulated studies per n (1000)")
    p.add_argument("--resamples", type=cli.count(100), default=stats.N_RESAMPLES,
                   help=f"bootstrap resamples per study ({stats.N_RESAMPLES}, as the tables)")
    p.add_argument("--seed", type=cli.nonnegative_int, default=0)
    args = p.parse_args(argv)
    try:
        pairs, per_task = paired_outcomes(args.results, args.score, args.tau)
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        p.error(str(err) if isinstance(err, ValueError) else f"{args.results}: cannot read its rows ({err!r})")
    values, probs = joint(pairs)
    n0 = len(pairs)
    point = 100 * (pairs[:, 0].sum() / pairs[:, 1].sum() - 1)
    measured = stats.bootstrap_interval("score_change", [pairs[:, 0]], [pairs[:, 1]])
    print(f"measured: {n0} paired prompts ({', '.join(f'{t} {k}' for t, k in per_task.items())}); "
          f"mean score mtad tau={args.tau:g} {pairs[:, 0].mean():.3f}, sampling T=1 {pairs[:, 1].mean():.3f}; "
          f"pooled change {interval((point, measured.low, measured.high), 1, unit=' %', signed=True)}")
    print("joint outcomes (mtad, sampling): " + ", ".join(
        f"({v[0]:g}, {v[1]:g}) {c:.3f}" for v, c in zip(values, probs)))
    try:
        n = required_n(values, probs, args.half_width, args.sims, args.seed, args.resamples)
    except ValueError as err:
        p.error(str(err))
    mean, se = expected_half_width(values, probs, n, args.sims, args.seed, args.resamples)
    before = expected_half_width(values, probs, n - 1, args.sims, args.seed, args.resamples)[0]
    print(f"required n = {n}: expected half-width {mean:.2f} ± {se:.2f} (MC s.e.) points at n = {n}, "
          f"{before:.2f} at n = {n - 1} ({args.sims} simulated studies per n, {args.resamples} resamples each, "
          f"seed {args.seed})")
    print(f"delta-method check: n = {math.ceil(delta_n(values, probs, args.half_width))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

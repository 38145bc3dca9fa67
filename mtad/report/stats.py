"""Uncertainty of every comparison a table prints: a paired bootstrap over prompts.

A comparison (speed-up, energy ratio or saving, perplexity change, task-score change) is between a method's
run and a baseline's run on the same prompts. Each run's per-prompt records (``samples.jsonl`` in its run
directory) are joined on ``(id, turn)``; runs of one configuration at several seeds (a ``seed`` sweep) are
pooled first, within each prompt (times and tokens summed, log-probabilities and scores averaged over the
seeds), so the unit that is resampled is always the prompt. :func:`scipy.stats.bootstrap` draws the
resamples (``paired=True``: one index array shared by the method's and the baseline's arrays), with
``N_RESAMPLES`` resamples from the fixed seed ``SEED`` and the percentile method **[choice: BCa needs a
jackknife per statistic and fails on the degenerate distributions that identical runs give]**, for a
``CONFIDENCE`` interval; below ``MIN_PAIRS`` paired prompts there is no interval **[choice]**.

Statistics are the same ratios of sums the tables print (METRICS): ms/token = sum of decode time / sum of
tokens, perplexity = exp(-mean over prompts of the per-sample mean log-probability), score = mean score.
Aggregates over several cells (the claims table: a geometric mean of ratios, an arithmetic mean of
percentage changes) combine the cells' bootstrap distributions resample by resample, which is a stratified
bootstrap (prompts resampled within each cell).

A run whose per-prompt records are gone (rows from before they were written, a deleted run directory) has
no interval: :func:`samples_for` returns None and the caller prints the point estimate, marked as such.
"""
from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtad._util.paths import REPO_ROOT

log = logging.getLogger(__name__)

N_RESAMPLES = 2000
SEED = 0
CONFIDENCE = 0.95
METHOD = "percentile"
MIN_PAIRS = 5  # fewer paired prompts give no interval: a bootstrap of 2-4 points has only a handful of outcomes
# comparison kind -> (no-change value, unit); ratios are "x", changes are percentages
NO_CHANGE = {"speedup": 1.0, "energy_ratio": 1.0, "ppl_change": 0.0, "score_change": 0.0, "energy_saving": 0.0,
             "score_diff": 0.0, "run": float("nan")}


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval over ``n`` paired prompts (low/high None: no interval)."""

    point: float | None
    low: float | None
    high: float | None
    n: int
    kind: str
    distribution: np.ndarray | None = field(default=None, repr=False, compare=False)
    note: str = ""  # why there is no interval

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def contains_no_change(self) -> bool | None:
        """True when the interval spans "no change" (1x for ratios, 0 % for changes); None without one."""
        if not self.has_interval:
            return None
        return self.low <= NO_CHANGE[self.kind] <= self.high


# ------------------------------------------------------------------------------------------- statistics
def _ratio_of_sums(a_num, a_den, b_num, b_den, axis=-1):
    """(sum b_num / sum b_den) / (sum a_num / sum a_den): the baseline's cost per token over the method's."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.sum(b_num, axis) / np.sum(b_den, axis)) / (np.sum(a_num, axis) / np.sum(a_den, axis))


def _saving(a_num, a_den, b_num, b_den, axis=-1):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100 * (1 - 1 / _ratio_of_sums(a_num, a_den, b_num, b_den, axis))


def _ppl_change(lp_a, lp_b, axis=-1):
    """100 (ppl_a / ppl_b - 1) with ppl = exp(-mean of per-sample mean log-probabilities)."""
    return 100 * np.expm1(np.mean(lp_b, axis) - np.mean(lp_a, axis))


def _score_change(s_a, s_b, axis=-1):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100 * (np.mean(s_a, axis) / np.mean(s_b, axis) - 1)


def _score_diff(s_a, s_b, axis=-1):
    return np.mean(s_a, axis) - np.mean(s_b, axis)


# kind -> (statistic, the per-prompt fields it reads for the method and then the baseline)
STATISTICS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "speedup": (_ratio_of_sums, ("time_s", "n_tokens")),
    "energy_ratio": (_ratio_of_sums, ("energy_j", "n_tokens")),
    "energy_saving": (_saving, ("energy_j", "n_tokens")),
    "ppl_change": (_ppl_change, ("mean_logprob",)),
    "score_change": (_score_change, ("score",)),
    "score_diff": (_score_diff, ("score",)),
}


def bootstrap_interval(kind: str, method: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]],
                       n_resamples: int = N_RESAMPLES, seed: int = SEED) -> Interval:
    """The ``kind`` comparison of paired per-prompt arrays: ``method`` and ``baseline`` hold one array per
    field of ``STATISTICS[kind]`` (all of one length n, entry i from prompt i). Resampled with
    :func:`scipy.stats.bootstrap` (paired, vectorised, percentile, seeded)."""
    from scipy.stats import bootstrap

    stat, fields = STATISTICS[kind]
    arrays = [np.asarray(a, dtype=float) for a in (*method, *baseline)]
    if len(arrays) != 2 * len(fields) or len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
        raise ValueError(f"{kind}: pass {len(fields)} paired 1-D arrays of one length for the method and as many "
                         f"for the baseline ({fields}); got shapes {[a.shape for a in arrays]}")
    n = len(arrays[0])
    point = _finite(stat(*arrays))
    if n < MIN_PAIRS:
        return Interval(point, None, None, n, kind,
                        note=f"n = {n} < {MIN_PAIRS}: too few paired prompts for a bootstrap interval")
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # degenerate (identical) data is a valid case
        warnings.simplefilter("ignore")
        res = bootstrap(tuple(arrays), stat, n_resamples=n_resamples, paired=True, vectorized=True,
                        confidence_level=CONFIDENCE, method=METHOD, rng=np.random.default_rng(seed))
    dist = np.asarray(res.bootstrap_distribution, dtype=float)
    low, high = _finite(res.confidence_interval.low), _finite(res.confidence_interval.high)
    if not np.isfinite(dist).all() or low is None or high is None:  # e.g. a resample whose baseline score is 0
        return Interval(point, None, None, n, kind, note="undefined in some resamples (a baseline of 0)")
    return Interval(point, low, high, n, kind, distribution=dist)


def _ppl(lp, axis=-1):
    return np.exp(-np.mean(lp, axis))


def run_interval(records: dict[tuple, dict] | None, field_name: str = "ppl", n_resamples: int = N_RESAMPLES,
                 seed: int = SEED) -> Interval | None:
    """One run's own figure with a bootstrap interval over its prompts (error bars of a plot):
    ``ppl`` = exp(-mean of the per-sample mean log-probabilities), ``score`` = mean score, ``ms_per_token``
    / ``j_per_token`` = the ratio of sums over the resampled prompts (as the tables print them). None
    without records."""
    from scipy.stats import bootstrap

    if records is None:
        return None
    if field_name in RATE_FIELDS:
        return _rate_interval(records, field_name, n_resamples, seed)
    stat, key = {"ppl": (_ppl, "mean_logprob"), "score": (np.mean, "score")}[field_name]
    x = np.array([r[key] for r in records.values() if r[key] is not None], dtype=float)
    if len(x) < MIN_PAIRS:
        return Interval(float(stat(x)) if len(x) else None, None, None, len(x), "run")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = bootstrap((x,), stat, n_resamples=n_resamples, vectorized=True, confidence_level=CONFIDENCE,
                        method=METHOD, rng=np.random.default_rng(seed))
    return Interval(float(stat(x)), _finite(res.confidence_interval.low), _finite(res.confidence_interval.high),
                    len(x), "run")


# run_interval's per-token rates: field -> (numerator record key, scale)
RATE_FIELDS = {"ms_per_token": ("time_s", 1000.0), "j_per_token": ("energy_j", 1.0)}


def _rate_interval(records: dict[tuple, dict], field_name: str, n_resamples: int, seed: int) -> Interval:
    from scipy.stats import bootstrap

    key, scale = RATE_FIELDS[field_name]
    pairs = [(r[key], r["n_tokens"]) for r in records.values() if r.get(key) is not None and r["n_tokens"]]
    num, den = (np.array(v, dtype=float) for v in zip(*pairs)) if pairs else (np.zeros(0), np.zeros(0))

    def stat(a, b, axis=-1):
        return scale * np.sum(a, axis) / np.sum(b, axis)

    point = float(stat(num, den)) if len(num) else None
    if len(num) < MIN_PAIRS:
        return Interval(point, None, None, len(num), "run")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = bootstrap((num, den), stat, paired=True, n_resamples=n_resamples, vectorized=True,
                        confidence_level=CONFIDENCE, method=METHOD, rng=np.random.default_rng(seed))
    return Interval(point, _finite(res.confidence_interval.low), _finite(res.confidence_interval.high),
                    len(num), "run")


def _finite(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def aggregate(kind: str, cells: Sequence[Interval]) -> Interval:
    """Several cells' comparisons as one figure: geometric mean of ratios, arithmetic mean of percentage
    changes. The interval combines the cells' bootstrap distributions resample by resample (stratified);
    without an interval in every cell there is none (the point is still given)."""
    points = [c.point for c in cells]
    n = sum(c.n for c in cells)
    if not cells or any(p is None for p in points):
        return Interval(None, None, None, n, kind)
    ratio = NO_CHANGE[kind] == 1.0
    if ratio and any(p <= 0 for p in points):
        return Interval(None, None, None, n, kind)
    combine = (lambda xs: np.exp(np.mean(np.log(xs), axis=0))) if ratio else (lambda xs: np.mean(xs, axis=0))
    point = float(combine(np.array(points)))
    missing = [c for c in cells if c.distribution is None]
    if missing:
        return Interval(point, None, None, n, kind, note=missing[0].note or "a cell has no per-prompt records")
    dist = combine(np.stack([c.distribution for c in cells]))
    if not np.isfinite(dist).all():
        return Interval(point, None, None, n, kind, note="undefined in some resamples")
    alpha = (1 - CONFIDENCE) / 2
    low, high = np.quantile(dist, [alpha, 1 - alpha])
    return Interval(point, float(low), float(high), n, kind, distribution=dist)


# ------------------------------------------------------------------------------------------- per-prompt records
def resolve_run_dir(run_dir: str | None, search: Iterable[str | Path] = ()) -> Path | None:
    """The run directory of a row: as recorded (absolute or relative to the working directory), else
    relative to the repository or to a folder in ``search`` (e.g. the results file's folder; a results folder
    that was moved keeps its ``runs/<hash>`` below it). None when no ``samples.jsonl`` is found."""
    if not run_dir:
        return None

    p = Path(run_dir)
    candidates = [p, REPO_ROOT / p]
    for base in search:
        base = Path(base)
        candidates += [base / Path(*p.parts[k:]) for k in range(len(p.parts))]
    return next((c for c in candidates if (c / "samples.jsonl").is_file()), None)


_CACHE: dict[Path, list[dict]] = {}


def read_samples(run_dir: Path) -> list[dict]:
    path = (Path(run_dir) / "samples.jsonl").resolve()
    if path not in _CACHE:
        _CACHE[path] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return _CACHE[path]


def per_prompt(samples_by_seed: Sequence[list[dict]], score_name: str | None) -> dict[tuple, dict]:
    """(id, turn) -> pooled record over seeds: ``time_s``, ``n_tokens``, ``energy_j`` summed (energy None
    if any seed lacks it); ``mean_logprob``, ``score`` averaged over the seeds that have them. Skipped
    prompts (no completion) are left out."""
    acc: dict[tuple, dict] = {}
    for samples in samples_by_seed:
        for s in samples:
            if s.get("skip_reason") or "n_tokens" not in s:
                continue
            r = acc.setdefault((str(s["id"]), int(s.get("turn", 0))),
                               {"time_s": 0.0, "n_tokens": 0, "energy_j": 0.0, "lp": [], "sc": []})
            r["time_s"] += float(s.get("time_s") or 0.0)
            r["n_tokens"] += int(s["n_tokens"])
            e = s.get("energy_j")
            r["energy_j"] = None if e is None or r["energy_j"] is None else r["energy_j"] + float(e)
            if s.get("mean_logprob") is not None:
                r["lp"].append(float(s["mean_logprob"]))
            score = (s.get("scores") or {}).get(score_name) if score_name else None
            if isinstance(score, (int, float)):
                r["sc"].append(float(score))
    out = {}
    for key, r in acc.items():
        out[key] = {"time_s": r["time_s"], "n_tokens": r["n_tokens"], "energy_j": r["energy_j"],
                    "mean_logprob": float(np.mean(r["lp"])) if r["lp"] else None,
                    "score": float(np.mean(r["sc"])) if r["sc"] else None}
    return out


def samples_for(run_dirs: Sequence[str | None], score_name: str | None,
                search: Iterable[str | Path] = ()) -> dict[tuple, dict] | None:
    """The pooled per-prompt records of one configuration's runs (one run dir per seed); None when any
    run's ``samples.jsonl`` cannot be found (then no interval is computed for it)."""
    dirs = [resolve_run_dir(d, search) for d in run_dirs]
    if not dirs or any(d is None for d in dirs):
        return None
    return per_prompt([read_samples(d) for d in dirs], score_name)


def compare(kind: str, method: dict[tuple, dict] | None, baseline: dict[tuple, dict] | None,
            n_resamples: int = N_RESAMPLES, seed: int = SEED) -> Interval | None:
    """The ``kind`` interval of two configurations' pooled records, joined on (id, turn); None when either
    lacks per-prompt records. Prompts missing a field the statistic needs are left out of the pairs."""
    if method is None or baseline is None:
        return None
    fields = STATISTICS[kind][1]
    keys = sorted(k for k in method.keys() & baseline.keys()
                  if all(method[k][f] is not None and baseline[k][f] is not None for f in fields))
    if not keys:
        return Interval(None, None, None, 0, kind, note="no prompt has the figure in both runs")
    m = [[method[k][f] for k in keys] for f in fields]
    b = [[baseline[k][f] for k in keys] for f in fields]
    return bootstrap_interval(kind, m, b, n_resamples, seed)

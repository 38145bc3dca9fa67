"""Uncertainty of every comparison the project prints: one bootstrap over prompts, used by the tables, the
claims, the frontier and the verifier study alike.

A comparison (speed-up, energy ratio or saving, perplexity change, task-score change) is between a method's
run and a baseline's run on the same prompts. Each run's per-prompt records (``samples.jsonl`` in its run
directory) are joined on ``(id, turn)``; runs of one configuration at several seeds (a ``seed`` sweep) are
pooled first, within each prompt (times and tokens summed, log-probabilities and scores averaged over the
seeds), so the unit that is resampled is always the prompt.

**Resampling.** A *cell* (one comparison of two runs, or one run's own figure) draws its ``N_RESAMPLES``
resamples of its n prompts from its own generator: a child of the project seed ``SEED`` keyed by the cell's
identity (:func:`cell_key`: a digest of the cell's joined prompt ids and values, or a key the caller names),
so two cells never share resample indices — not even two cells of equal n — while a re-render draws the same
indices again, byte for byte. Within a cell the method's and the baseline's arrays are resampled with one
index array (paired). Intervals are percentile intervals **[choice: BCa needs a jackknife per statistic and
fails on the degenerate distributions that identical runs give]** at ``CONFIDENCE``; below ``MIN_PAIRS``
paired prompts there is no interval **[choice]**.

**Verdicts under the draw.** A verdict reads the interval as printed (:func:`judge_printed`), and a printed end
is itself a Monte-Carlo estimate: another seed draws other resamples and can move it across the rounding edge of
no change (1.0049 prints 1.00, 1.0051 prints 1.01). The Monte-Carlo error of an end, the q-quantile of B
resamples, follows from order statistics: the number of resamples below the true quantile is binomial(B, q), so
the end's rank moves by sqrt(B q (1 - q)); its band of ``MC_MARGIN`` standard errors is the pair of quantiles at
q ± MC_MARGIN sqrt(q (1 - q) / B) (:func:`mc_band`), without assuming a shape for the distribution. An end is
settled when its whole band prints on one side of no change (or at it). :func:`settle` adds resamples (doubling,
each batch from a further child generator of the cell, the first ``N_RESAMPLES`` unchanged) while an end is
unsettled, up to ``MAX_RESAMPLES``; :func:`judge` gives the printed verdict of the settled interval, and
"borderline" when an end is still unsettled **[choice: the end is then within Monte-Carlo error of rounding to
no change, which is what borderline says]**. A renderer that prints a verdict prints the settled interval, so
the word and the interval agree; an interval far from the edges is left as drawn, byte for byte.

Statistics are the same ratios of sums the tables print (METRICS): ms/token = sum of decode time / sum of
tokens, perplexity = exp(-mean over prompts of the per-sample mean log-probability), score = mean score.
Aggregates over several cells (the claims table: a geometric mean of ratios, an arithmetic mean of
percentage changes) combine the cells' bootstrap distributions resample by resample: a stratified bootstrap,
the strata (cells, on disjoint prompt sets) resampled independently of each other.

A run whose per-prompt records are gone (rows from before they were written, a deleted run directory) has
no interval: :func:`samples_for` returns None and the caller prints the point estimate, marked as such.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mtad._util.paths import REPO_ROOT
from mtad.report.markdown import DASH, interval

log = logging.getLogger(__name__)

N_RESAMPLES = 10_000
SEED = 0  # the project seed every cell's generator descends from
CONFIDENCE = 0.95
METHOD = "percentile"
MIN_PAIRS = 5  # fewer paired prompts give no interval: a bootstrap of 2-4 points has only a handful of outcomes
MC_MARGIN = 3.0  # Monte-Carlo standard errors an interval end must clear a rounding edge of no change by
MAX_RESAMPLES = 64 * N_RESAMPLES  # the most resamples :func:`settle` draws for an end near such an edge
# comparison kind -> (no-change value, unit); ratios are "x", changes are percentages
NO_CHANGE = {"speedup": 1.0, "cpu_speedup": 1.0, "energy_ratio": 1.0, "ppl_change": 0.0, "score_change": 0.0,
             "energy_saving": 0.0, "score_diff": 0.0, "distinct2_diff": 0.0, "block_efficiency_ratio": 1.0,
             "run": float("nan")}
# decimals a comparison is printed with (ratios 1.05×, changes −11.1 %, differences +0.012): a verdict reads the
# interval as printed (:func:`judge`)
DIGITS = {"speedup": 2, "cpu_speedup": 2, "energy_ratio": 2, "ppl_change": 1, "score_change": 1, "energy_saving": 1,
          "score_diff": 3, "distinct2_diff": 3, "block_efficiency_ratio": 3}


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
    # (n_resamples, batch) -> the statistic on that many resamples of the cell's batch-th generator (batch 0 gave
    # ``distribution``); :func:`settle` draws further batches with it, None where it cannot
    resample: Callable[[int, int], np.ndarray] | None = field(default=None, repr=False, compare=False)
    batches: int = field(default=1, compare=False)  # generator batches (of its first size) ``distribution`` holds

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def contains_no_change(self) -> bool | None:
        """True when the interval spans "no change" (1x for ratios, 0 % for changes); None without one."""
        if not self.has_interval:
            return None
        return self.low <= NO_CHANGE[self.kind] <= self.high


def printed(x: float, kind: str) -> float:
    """``x`` as the tables print it (rounded to ``DIGITS[kind]`` decimals)."""
    return float(f"{x:.{DIGITS[kind]}f}")


def printed_interval(v: Sequence | None, kind: str) -> str:
    """``[point, low, high, verdict]`` of a ``kind`` comparison as the experiments' tables print it:
    ``1.12× [1.04, 1.21] (significant)``, ``-0.4 % [-7.9, 7.7] (not significant)``; the point alone without an
    interval, ``—`` without a point."""
    if v is None or v[0] is None:
        return DASH
    unit = "×" if NO_CHANGE.get(kind) == 1.0 else (" %" if kind == "ppl_change" else "")
    body = interval(v[:3], DIGITS.get(kind, 3), unit=unit)
    return body + (f" ({v[3]})" if len(v) > 3 and v[3] else "")


def judge(iv: Interval) -> str | None:
    """The verdict of an interval as printed, holding under the bootstrap's draw: :func:`judge_printed` of the
    :func:`settle`-d interval, "borderline" when an end's Monte-Carlo band still straddles a rounding edge of
    no change after ``MAX_RESAMPLES`` resamples; None without an interval. An interval without a distribution
    (made by hand) is judged as printed."""
    if not iv.has_interval:
        return None
    settled = settle(iv)
    return "borderline" if unsettled(settled) else judge_printed(settled)


def judge_printed(iv: Interval) -> str | None:
    """The verdict of an interval **as printed**, with no margin for Monte-Carlo error: "significant" when both
    printed ends lie on one side of no change, "borderline" when one printed end equals it (e.g. a speed-up of
    1.05× [1.00, 1.09]: the lower end rounds to no change), "not significant" when the printed interval spans it
    (or is no change at both ends); None without an interval."""
    if not iv.has_interval:
        return None
    nc = NO_CHANGE[iv.kind]
    low, high = printed(iv.low, iv.kind), printed(iv.high, iv.kind)
    if low < nc < high or low == high == nc:
        return "not significant"
    return "borderline" if nc in (low, high) else "significant"


def mc_band(dist: np.ndarray, q: float, margin: float = MC_MARGIN) -> tuple[float, float]:
    """The band of ``margin`` Monte-Carlo standard errors around the q-quantile of the resamples ``dist``: the
    quantiles at q ± margin sqrt(q (1 - q) / B) (order statistics: the count of resamples below the true
    quantile is binomial(B, q))."""
    h = margin * math.sqrt(q * (1 - q) / len(dist))
    lo, hi = np.quantile(dist, [max(q - h, 0.0), min(q + h, 1.0)])
    return float(lo), float(hi)


def _side(x: float, kind: str) -> int:
    """-1, 0 or 1: ``x`` prints below, at or above no change."""
    return int(np.sign(printed(x, kind) - NO_CHANGE[kind]))


def unsettled(iv: Interval) -> str | None:
    """"lower" or "upper": an end of ``iv`` whose Monte-Carlo band (:func:`mc_band`) prints on two sides of
    no change, so that another draw could print another verdict; None when both ends are settled, or without
    a bootstrap distribution or a printed precision."""
    if not iv.has_interval or iv.distribution is None or iv.kind not in DIGITS:
        return None
    alpha = (1 - CONFIDENCE) / 2
    for end, q in (("lower", alpha), ("upper", 1 - alpha)):
        lo, hi = mc_band(iv.distribution, q)
        if _side(lo, iv.kind) != _side(hi, iv.kind):
            return end
    return None


def settle(iv: Interval, max_resamples: int = MAX_RESAMPLES) -> Interval:
    """``iv`` with resamples added while an end is :func:`unsettled`, up to ``max_resamples``: the count doubled
    each time, in batches of the first one's size from the cell's further generators (batch k keyed (key, k)),
    the ends recomputed from all of them. ``iv`` itself when both ends are settled as drawn, or it cannot draw
    more."""
    if iv.distribution is None or iv.resample is None:
        return iv
    size = len(iv.distribution) // iv.batches
    parts, batch = [iv.distribution], iv.batches
    while unsettled(replace(iv, distribution=parts[0] if len(parts) == 1 else np.concatenate(parts))) \
            and batch * size < max_resamples:
        more = [np.asarray(iv.resample(size, k), dtype=float) for k in range(batch, 2 * batch)]
        if not all(np.isfinite(m).all() for m in more):  # e.g. a resample whose baseline is 0: keep what was drawn
            break
        parts, batch = parts + more, 2 * batch
    if batch == iv.batches:
        return iv
    dist = np.concatenate(parts)
    low, high = percentile_interval(dist)
    return replace(iv, low=float(low), high=float(high), distribution=dist, batches=batch)


def judged(iv: Interval | None) -> list | None:
    """``[point, low, high, verdict]`` of the settled interval (what :func:`printed_interval` prints); the
    verdict None for a kind without one (a run's own figure); None without a point."""
    if iv is None or iv.point is None:
        return None
    if iv.low is None or iv.kind not in DIGITS:
        return [iv.point, iv.low, iv.high, None]
    iv = settle(iv)
    return [iv.point, iv.low, iv.high, judge(iv)]


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
    "cpu_speedup": (_ratio_of_sums, ("cpu_s", "n_tokens")),  # CPU seconds: little moved by a shared machine
    "block_efficiency_ratio": (_ratio_of_sums, ("target_forwards", "n_tokens")),  # tokens per target forward
    "energy_ratio": (_ratio_of_sums, ("energy_j", "n_tokens")),
    "energy_saving": (_saving, ("energy_j", "n_tokens")),
    "ppl_change": (_ppl_change, ("mean_logprob",)),
    "score_change": (_score_change, ("score",)),
    "score_diff": (_score_diff, ("score",)),
}


def cell_key(*parts: Any) -> int:
    """A stable 64-bit key for a cell from anything printable (a name, the cell's arrays): sha256 of the parts'
    ``repr`` (arrays by their bytes), the same on every machine and in every session."""
    h = hashlib.sha256()
    for p in parts:
        h.update(np.ascontiguousarray(p, dtype=float).tobytes() if isinstance(p, np.ndarray) else repr(p).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest()[:8], "little")


def cell_rng(key: int, batch: int = 0) -> np.random.Generator:
    """The cell's own generator: the child of ``SEED`` whose spawn key is ``key`` (numpy SeedSequence); batch
    k > 0 (the resamples :func:`settle` adds) is the child keyed (``key``, k)."""
    spawn = (int(key),) if batch == 0 else (int(key), int(batch))
    return np.random.default_rng(np.random.SeedSequence(SEED, spawn_key=spawn))


def resample_indices(n: int, key: int, n_resamples: int = N_RESAMPLES, batch: int = 0) -> np.ndarray:
    """(n_resamples, n) prompt indices drawn with replacement from the cell's own generator (its ``batch``):
    the one resampling every interval of the project is computed from."""
    return cell_rng(key, batch).integers(0, n, (n_resamples, n)) if n else np.zeros((n_resamples, 0), dtype=int)


def resample_counts(n: int, key: int, n_resamples: int = N_RESAMPLES, batch: int = 0) -> np.ndarray:
    """(n_resamples, n) how often each prompt is drawn in each resample of :func:`resample_indices` (the
    same resamples, as weights: for statistics that weight contexts by their prompt's count)."""
    idx = resample_indices(n, key, n_resamples, batch)
    flat = (np.arange(n_resamples)[:, None] * n + idx).ravel()  # (B n,): resample b's draw of prompt i -> b n + i
    return np.bincount(flat, minlength=n_resamples * n).reshape(n_resamples, n).astype(float)


def percentile_interval(dist: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of a bootstrap distribution (along axis 0)."""
    alpha = (1 - confidence) / 2
    low, high = np.quantile(dist, [alpha, 1 - alpha], axis=0)
    return low, high


def bootstrap_interval(kind: str, method: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]],
                       n_resamples: int = N_RESAMPLES, key: int | None = None) -> Interval:
    """The ``kind`` comparison of paired per-prompt arrays: ``method`` and ``baseline`` hold one array per
    field of ``STATISTICS[kind]`` (all of one length n, entry i from prompt i). One index array resamples both
    (paired), drawn from the cell's own generator (``key``; by default :func:`cell_key` of the arrays)."""
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
    key = cell_key(*arrays) if key is None else key

    def draw(n_resamples: int, batch: int = 0) -> np.ndarray:
        idx = resample_indices(n, key, n_resamples, batch)  # (B, n)
        with np.errstate(all="ignore"):  # degenerate (identical) data is a valid case
            return np.asarray(stat(*(a[idx] for a in arrays), axis=-1), dtype=float)  # (B,)

    dist = draw(n_resamples)
    if not np.isfinite(dist).all():  # e.g. a resample whose baseline score is 0
        return Interval(point, None, None, n, kind, note="undefined in some resamples (a baseline of 0)")
    low, high = percentile_interval(dist)
    return Interval(point, float(low), float(high), n, kind, distribution=dist, resample=draw)


def ratio_interval(num: Sequence[float], den: Sequence[float], key: int | None = None,
                   n_resamples: int = N_RESAMPLES) -> list[float]:
    """[point, low, high] of Σ num / Σ den over prompts (one value of each per prompt: accepted tokens over
    positions, milliseconds over tokens), resampling prompts from the cell's own generator (``key``; by default
    :func:`cell_key` of the two arrays). NaNs for no prompts."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if len(num) == 0:
        return [float("nan")] * 3
    idx = resample_indices(len(num), cell_key(num, den) if key is None else key, n_resamples)  # (B, n)
    with np.errstate(all="ignore"):
        dist = num[idx].sum(1) / den[idx].sum(1)
    low, high = percentile_interval(dist)
    return [float(num.sum() / den.sum()), float(low), float(high)]


def _ppl(lp, axis=-1):
    return np.exp(-np.mean(lp, axis))


def run_interval(records: dict[tuple, dict] | None, field_name: str = "ppl", n_resamples: int = N_RESAMPLES,
                 key: int | None = None) -> Interval | None:
    """One run's own figure with a bootstrap interval over its prompts (error bars of a plot):
    ``ppl`` = exp(-mean of the per-sample mean log-probabilities), ``score`` = mean score, ``ms_per_token``
    / ``j_per_token`` = the ratio of sums over the resampled prompts (as the tables print them). None
    without records."""
    if records is None:
        return None
    if field_name in RATE_FIELDS:
        rkey, scale = RATE_FIELDS[field_name]
        pairs = [(r[rkey], r["n_tokens"]) for r in records.values() if r.get(rkey) is not None and r["n_tokens"]]
        arrays = [np.array(v, dtype=float) for v in zip(*pairs)] if pairs else [np.zeros(0), np.zeros(0)]

        def stat(a, b, axis=-1):
            return scale * np.sum(a, axis) / np.sum(b, axis)
    else:
        stat, rkey = {"ppl": (_ppl, "mean_logprob"), "score": (_mean, "score")}[field_name]
        arrays = [np.array([r[rkey] for r in records.values() if r[rkey] is not None], dtype=float)]
    n = len(arrays[0])
    point = float(stat(*arrays)) if n else None
    if n < MIN_PAIRS:
        return Interval(point, None, None, n, "run")
    idx = resample_indices(n, cell_key(field_name, *arrays) if key is None else key, n_resamples)
    with np.errstate(all="ignore"):
        dist = np.asarray(stat(*(a[idx] for a in arrays), axis=-1), dtype=float)
    low, high = percentile_interval(dist)
    return Interval(point, _finite(low), _finite(high), n, "run", distribution=dist)


def _mean(x, axis=-1):
    return np.mean(x, axis)


# run_interval's per-token rates: field -> (numerator record key, scale)
RATE_FIELDS = {"ms_per_token": ("time_s", 1000.0), "j_per_token": ("energy_j", 1.0)}


def _finite(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def aggregate(kind: str, cells: Sequence[Interval]) -> Interval:
    """Several cells' comparisons as one figure: geometric mean of ratios, arithmetic mean of percentage
    changes. The interval combines the cells' bootstrap distributions resample by resample (stratified: each
    cell was resampled from its own generator, independently of the others);
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
    low, high = percentile_interval(dist)
    draws = [c.resample for c in cells]

    def draw(n_resamples: int, batch: int = 0) -> np.ndarray:  # every cell's batch, combined resample by resample
        return combine(np.stack([d(n_resamples, batch) for d in draws]))

    return Interval(point, float(low), float(high), n, kind, distribution=dist,
                    resample=draw if all(d is not None for d in draws) else None)


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
    """(id, turn) -> pooled record over seeds: ``time_s``, ``cpu_s``, ``n_tokens``, ``energy_j``,
    ``target_forwards`` summed (energy, CPU time and forwards None if any seed lacks them); ``accepted`` and
    ``proposed``, the draft tokens accepted and proposed over the steps, summed; ``mean_logprob``, ``score``
    averaged over the seeds that have them; ``bigrams``, the token bigrams of every seed's output (None without
    ``output_ids``). Skipped prompts (no completion) are left out."""
    acc: dict[tuple, dict] = {}
    for samples in samples_by_seed:
        for s in samples:
            if s.get("skip_reason") or "n_tokens" not in s:
                continue
            r = acc.setdefault((str(s["id"]), int(s.get("turn", 0))),
                               {"time_s": 0.0, "cpu_s": 0.0, "n_tokens": 0, "energy_j": 0.0, "target_forwards": 0,
                                "accepted": 0, "proposed": 0, "lp": [], "sc": [], "bi": []})
            if s.get("output_ids") is not None:
                ids = [int(t) for t in s["output_ids"]]
                r["bi"].append(list(zip(ids, ids[1:])))
            r["time_s"] += float(s.get("time_s") or 0.0)
            r["n_tokens"] += int(s["n_tokens"])
            for f in ("energy_j", "cpu_s", "target_forwards"):  # None when any seed lacks it (energy off, old rows)
                v = s.get(f)
                r[f] = None if v is None or r[f] is None else r[f] + v
            r["accepted"] += sum(s.get("accepted") or ())
            r["proposed"] += sum(s.get("proposed") or ())
            if s.get("mean_logprob") is not None:
                r["lp"].append(float(s["mean_logprob"]))
            score = (s.get("scores") or {}).get(score_name) if score_name else None
            if isinstance(score, (int, float)):
                r["sc"].append(float(score))
    out = {}
    for key, r in acc.items():
        out[key] = {"time_s": r["time_s"], "cpu_s": r["cpu_s"], "n_tokens": r["n_tokens"],
                    "energy_j": r["energy_j"], "target_forwards": r["target_forwards"],
                    "accepted": r["accepted"], "proposed": r["proposed"],
                    "mean_logprob": float(np.mean(r["lp"])) if r["lp"] else None,
                    "score": float(np.mean(r["sc"])) if r["sc"] else None,
                    "bigrams": [b for out_ in r["bi"] for b in out_] if r["bi"] else None}
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
            n_resamples: int = N_RESAMPLES) -> Interval | None:
    """The ``kind`` interval of two configurations' pooled records, joined on (id, turn); None when either
    lacks per-prompt records. Prompts missing a field the statistic needs are left out of the pairs. The
    cell's resamples are keyed by its joined prompt ids and both runs' records (:func:`cell_key`), so every
    kind of comparison of the same two runs resamples the same prompts, and any other cell others."""
    if method is None or baseline is None:
        return None
    if kind == "distinct2_diff":
        return distinct2_diff(method, baseline, n_resamples)
    fields = STATISTICS[kind][1]
    keys = sorted(k for k in method.keys() & baseline.keys()
                  if all(method[k][f] is not None and baseline[k][f] is not None for f in fields))
    if not keys:
        return Interval(None, None, None, 0, kind, note="no prompt has the figure in both runs")
    m = [[method[k][f] for k in keys] for f in fields]
    b = [[baseline[k][f] for k in keys] for f in fields]
    key = cell_key(keys, [[method[k][f] for f in RECORD_FIELDS] for k in keys],
                   [[baseline[k][f] for f in RECORD_FIELDS] for k in keys])
    return bootstrap_interval(kind, m, b, n_resamples, key)


RECORD_FIELDS = ("time_s", "n_tokens", "energy_j", "mean_logprob", "score")  # a pooled record's fields


def distinct_share(counts: np.ndarray, incidence: np.ndarray, sizes: np.ndarray,
                   weights: np.ndarray | None = None) -> np.ndarray:
    """distinct-2 of resampled prompt sets: (B,) distinct bigrams / all bigrams, where prompt i is drawn
    ``counts[b, i]`` times, ``incidence`` (n, U) marks which of the U distinct bigrams prompt i's outputs hold
    and ``sizes`` (n,) counts its bigrams (a repeated prompt repeats its bigrams: they count in the total, not
    as new distinct ones). ``weights`` (U,): how many bigrams each column stands for (:func:`compress`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        present = (counts > 0).astype(np.float32) @ incidence.astype(np.float32)  # (B, U): float32 counts are exact
        seen = (present > 0).sum(axis=1) if weights is None else (present > 0) @ weights  # (B,): exact integers
        return seen / (counts @ sizes)


def compress(inc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An incidence matrix (n, U) as its distinct columns (n, U') and how many bigrams hold each (U',): a bigram
    is present in a resample when any prompt holding it is drawn, so bigrams held by the same prompts count
    together (most are held by one prompt alone); :func:`distinct_share` gives the same shares, faster."""
    cols, mult = np.unique(inc, axis=1, return_counts=True)  # (n, U'), (U',)
    return cols, mult.astype(float)


def incidence(bigrams: Sequence[list]) -> tuple[np.ndarray, np.ndarray]:
    """(n, U) which of the U distinct bigrams each of n prompts holds, and (n,) how many bigrams each has."""
    vocab = {b: j for j, b in enumerate(sorted({b for bs in bigrams for b in bs}))}
    inc = np.zeros((len(bigrams), len(vocab)))
    for i, bs in enumerate(bigrams):
        inc[i, [vocab[b] for b in bs]] = 1.0
    return inc, np.array([len(bs) for bs in bigrams], dtype=float)


def distinct2_diff(method: dict[tuple, dict], baseline: dict[tuple, dict],
                   n_resamples: int = N_RESAMPLES) -> Interval:
    """distinct-2 of the method's outputs minus the baseline's (distinct token bigrams / all bigrams over the
    outputs of the prompts both runs decoded), with a paired bootstrap interval over those prompts. Repeated
    prompts in a resample lower distinct-2 (their bigrams are no longer new), so the bootstrap distribution is
    recentred on the estimate (its spread kept), as the frontier recentres its distinct-2."""
    keys = sorted(k for k in method.keys() & baseline.keys()
                  if method[k].get("bigrams") is not None and baseline[k].get("bigrams") is not None)
    if not keys:
        return Interval(None, None, None, 0, "distinct2_diff", note="no output token ids in the records")
    (inc_m, n_m), (inc_b, n_b) = (incidence([r[k]["bigrams"] for k in keys]) for r in (method, baseline))
    ones = np.ones((1, len(keys)))
    point = _finite(distinct_share(ones, inc_m, n_m)[0] - distinct_share(ones, inc_b, n_b)[0])
    if len(keys) < MIN_PAIRS or point is None:
        return Interval(point, None, None, len(keys), "distinct2_diff",
                        note=f"n = {len(keys)} < {MIN_PAIRS}: too few paired prompts for a bootstrap interval")
    key = cell_key("distinct-2", keys, [method[k]["bigrams"] for k in keys], [baseline[k]["bigrams"] for k in keys])
    inc_m, inc_b = compress(inc_m), compress(inc_b)

    def draw(n_resamples: int, batch: int = 0) -> np.ndarray:  # each batch recentred on the estimate
        counts = resample_counts(len(keys), key, n_resamples, batch)  # (B, n)
        d = distinct_share(counts, inc_m[0], n_m, inc_m[1]) - distinct_share(counts, inc_b[0], n_b, inc_b[1])
        return d + (point - float(np.mean(d)))

    dist = draw(n_resamples)
    low, high = percentile_interval(dist)
    return Interval(point, float(low), float(high), len(keys), "distinct2_diff", distribution=dist, resample=draw)

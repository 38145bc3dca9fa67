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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtad._util.paths import REPO_ROOT

log = logging.getLogger(__name__)

N_RESAMPLES = 10_000
SEED = 0  # the project seed every cell's generator descends from
CONFIDENCE = 0.95
METHOD = "percentile"
MIN_PAIRS = 5  # fewer paired prompts give no interval: a bootstrap of 2-4 points has only a handful of outcomes
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
        return "—"
    d = DIGITS.get(kind, 3)
    unit = "×" if NO_CHANGE.get(kind) == 1.0 else (" %" if kind == "ppl_change" else "")
    body = f"{v[0]:.{d}f}{unit} [{v[1]:.{d}f}, {v[2]:.{d}f}]" if v[1] is not None else f"{v[0]:.{d}f}{unit}"
    return body + (f" ({v[3]})" if len(v) > 3 and v[3] else "")


def judge(iv: Interval) -> str | None:
    """The verdict of an interval **as printed**: "significant" when both printed ends lie on one side of no
    change, "borderline" when one printed end equals it (e.g. a speed-up of 1.05× [1.00, 1.09]: the lower end
    rounds to no change), "not significant" when the printed interval spans it (or is no change at both ends);
    None without an interval."""
    if not iv.has_interval:
        return None
    nc = NO_CHANGE[iv.kind]
    low, high = printed(iv.low, iv.kind), printed(iv.high, iv.kind)
    if low < nc < high or low == high == nc:
        return "not significant"
    return "borderline" if nc in (low, high) else "significant"


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


def cell_rng(key: int) -> np.random.Generator:
    """The cell's own generator: the child of ``SEED`` whose spawn key is ``key`` (numpy SeedSequence)."""
    return np.random.default_rng(np.random.SeedSequence(SEED, spawn_key=(int(key),)))


def resample_indices(n: int, key: int, n_resamples: int = N_RESAMPLES) -> np.ndarray:
    """(n_resamples, n) prompt indices drawn with replacement from the cell's own generator: the one
    resampling every interval of the project is computed from."""
    return cell_rng(key).integers(0, n, (n_resamples, n)) if n else np.zeros((n_resamples, 0), dtype=int)


def resample_counts(n: int, key: int, n_resamples: int = N_RESAMPLES) -> np.ndarray:
    """(n_resamples, n) how often each prompt is drawn in each resample of :func:`resample_indices` (the
    same resamples, as weights: for statistics that weight contexts by their prompt's count)."""
    idx = resample_indices(n, key, n_resamples)
    counts = np.zeros((n_resamples, n), dtype=float)
    np.add.at(counts, (np.arange(n_resamples)[:, None], idx), 1.0)
    return counts


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
    idx = resample_indices(n, cell_key(*arrays) if key is None else key, n_resamples)  # (B, n)
    with np.errstate(all="ignore"):  # degenerate (identical) data is a valid case
        dist = np.asarray(stat(*(a[idx] for a in arrays), axis=-1), dtype=float)  # (B,)
    if not np.isfinite(dist).all():  # e.g. a resample whose baseline score is 0
        return Interval(point, None, None, n, kind, note="undefined in some resamples (a baseline of 0)")
    low, high = percentile_interval(dist)
    return Interval(point, float(low), float(high), n, kind, distribution=dist)


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


def distinct_share(counts: np.ndarray, incidence: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """distinct-2 of resampled prompt sets: (B,) distinct bigrams / all bigrams, where prompt i is drawn
    ``counts[b, i]`` times, ``incidence`` (n, U) marks which of the U distinct bigrams prompt i's outputs hold
    and ``sizes`` (n,) counts its bigrams (a repeated prompt repeats its bigrams: they count in the total, not
    as new distinct ones)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        present = (counts > 0).astype(np.float32) @ incidence.astype(np.float32)  # (B, U): float32 counts are exact
        return (present > 0).sum(axis=1) / (counts @ sizes)


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
    counts = resample_counts(len(keys), key, n_resamples)  # (B, n)
    dist = distinct_share(counts, inc_m, n_m) - distinct_share(counts, inc_b, n_b)
    dist = dist + (point - float(np.mean(dist)))
    low, high = percentile_interval(dist)
    return Interval(point, float(low), float(high), len(keys), "distinct2_diff", distribution=dist)

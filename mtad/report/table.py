"""Render result rows as the paper's table: ``results/tables/<experiment>.md`` and ``.tex``.

Input is the flattened frame of :func:`mtad.harness.store.load_frame` (one row per run). Everything derived is
computed here by joining rows on their fields (STYLE.md, "Results"), never from file names:

- **quality**: rows (pair, decoder), per task the output perplexity (``metrics.ppl_mean_logprob``, the
  paper's aggregation) and the task score (``metrics.score.<metrics.score_name>``);
- **speed**, one table per task: ms/token, speed-up vs ``speculative``, J/token, energy ratio vs
  ``speculative``, block efficiency, acceptance rate. The baseline of a row is the lossless ``speculative``
  row with the same :data:`JOIN_KEYS` (pair, draft, dtype, task, prompts, token budget, hardware, threads); when several
  qualify, the one with the same ``gamma``, then the latest. speed-up = ms/token(baseline) / ms/token(row);
  energy ratio = J/token(baseline) / J/token(row) (> 1: the row uses less energy);
- **claims**: each headline claim of the paper (:data:`CLAIMS`, figures as published, with the version they
  come from) beside our figure for the same comparison, ``—`` where we have no measurement;
- **uncertainty** (:mod:`mtad.report.stats`): every ratio and change carries a 95 % paired-bootstrap interval over
  the prompts (records from each run's ``samples.jsonl``, found through the row's ``run_dir``), and every
  cell its n; a row whose per-prompt records are gone gets its point estimate marked ``†`` and is named
  under the table, never an invented interval. Runs of one configuration at several seeds are pooled;
- **cost model** (:mod:`mtad.measure.costmodel`): the ms/token predicted from the run's forward counts under the
  cost profile of its hardware and pair, beside the measured one, and a **projection** of the speed-up
  under a declared profile (and under any other hardware's measured profile of the pair).

A decoder that appears with several settings (an ablation) is split into variants labelled by the settings
that differ, e.g. ``mtad (tau=0.3)``. Identical configurations measured twice keep the latest row.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtad._util.paths import REPO_ROOT
from mtad.measure.costmodel import declared_profile, find_profiles, predict
from mtad.report import stats

log = logging.getLogger(__name__)

BASELINE = "speculative"
DASH = "—"
# Rows are comparable only when these agree (columns missing from a frame are ignored).
JOIN_KEYS = ("model.name", "model.draft", "model.dtype", "task.name", "task.n_prompts", "decoder.max_new_tokens",
             "device_name", "num_threads")
DECODER_ORDER = ("greedy", "sampling", "speculative", "specinfer", "mtjd", "mtad", "mmtad")
# Decoder settings that may distinguish variants of one decoder (ablations).
VARIANT_KEYS = ("gamma", "beam_width", "tau", "temperature", "top_k", "top_p", "accept", "mode", "select",
                "reference", "k_config", "replacement", "block_top_p")
PAPER_DEFAULTS = {"decoder.gamma": 4, "decoder.beam_width": 4, "decoder.tau": 0.5, "decoder.temperature": 1.0,
                  "decoder.top_p": 0.9}
POINT_ONLY = "†"  # a point estimate without an interval (no per-prompt records)
SPEED_COLUMNS = (("n", "n"), ("ms_per_token", "ms/token"), ("predicted_ms", "predicted ms/token"),
                 ("speedup", f"speed-up vs {BASELINE} [95 % CI]"),
                 ("proj_speedup", f"projected speed-up vs {BASELINE}‡"),
                 ("j_per_token", "J/token"), ("energy_ratio", f"energy ratio vs {BASELINE} [95 % CI]"),
                 ("block_efficiency", "block eff."), ("acceptance_rate", "acceptance"))
DIVERSITY = (("distinct_1", "distinct-1"), ("distinct_2", "distinct-2"), ("distinct_3", "distinct-3"),
             ("rep_3", "rep-3"))


@dataclass(frozen=True)
class Claim:
    """A headline figure of the paper, as published (source: docs/PAPER.md, "Headline claims")."""

    version: str  # the paper version the figure comes from
    text: str  # the claim as the paper states it
    paper: float  # the published number
    kind: str  # how we measure it: ppl_change | score_change (%), speedup | energy_ratio (x), energy_saving (%)
    versus: str  # our baseline decoder for the comparison
    pairs: tuple[str, ...] = ()  # the pairs the paper measured it on (our model.name); () = any
    method: str = "mtad"


V24 = "arXiv 2407.09722 v2–v4"
ICLR = "ICLR 2025 camera-ready"
V1 = "arXiv 2407.09722 v1 (MJSD)"
_V24_PAIRS = ("opt13b", "opt30b", "llama2-13b", "llama2-70b")
_ICLR_PAIRS = ("llama3-8b", "llama3-8b-instruct")
CLAIMS: tuple[Claim, ...] = (
    Claim(V24, "output perplexity −21.2 % vs single-token sampling", -21.2, "ppl_change", "sampling", _V24_PAIRS),
    Claim(V24, "1.42× speed-up vs speculative decoding", 1.42, "speedup", "speculative", _V24_PAIRS),
    Claim(V24, "1.54× less energy vs speculative decoding", 1.54, "energy_ratio", "speculative", _V24_PAIRS),
    Claim(ICLR, "downstream score +43 % vs single-token sampling", 43.0, "score_change", "sampling", _ICLR_PAIRS),
    Claim(ICLR, "1.26× speed-up vs vanilla speculative decoding", 1.26, "speedup", "speculative", _ICLR_PAIRS),
    Claim(ICLR, "23.6 % less energy vs vanilla speculative decoding", 23.6, "energy_saving", "speculative",
          _ICLR_PAIRS),
    Claim(V1, "2.21× speed-up vs autoregressive decoding", 2.21, "speedup", "sampling", _V24_PAIRS),
    Claim(V1, "2.84× less energy vs autoregressive decoding", 2.84, "energy_ratio", "sampling", _V24_PAIRS),
    Claim(V1, "1.49× speed-up vs vanilla speculative decoding", 1.49, "speedup", "speculative", _V24_PAIRS),
    Claim(V1, "1.62× less energy vs vanilla speculative decoding", 1.62, "energy_ratio", "speculative", _V24_PAIRS),
)
_KIND_TEXT = {"ppl_change": "perplexity change", "score_change": "task score change", "speedup": "speed-up",
              "energy_ratio": "energy ratio (baseline J / method J)", "energy_saving": "energy saved"}
_PERCENT_KINDS = ("ppl_change", "score_change", "energy_saving")


# ------------------------------------------------------------------------------------------- preparing
def _col(frame, name: str, default: Any = None):
    import pandas as pd

    return frame[name] if name in frame.columns else pd.Series([default] * len(frame), index=frame.index)


def _num(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


NOTE_COLUMNS = ("timestamp", "n_prompts", "seed", "git_sha", "versions.torch", "versions.transformers",
                "versions.mtad", "metrics.per_position_acceptance", "metrics.energy_source", "run_id", "run_dir")
# row metrics that seeds pool over (sums), and the diversity metrics (means over seeds)
_SUMS = ("total_decode_s", "total_tokens", "target_forwards", "energy_j", "ppl_n_samples", "forward_time_s")
CALLS_PREFIX = "metrics.forward_calls."


def prepare(frame, keep: Sequence[str] = (), search: Sequence[str | Path] = (), profiles=None):
    """A slim frame with the columns every table reads: ``pair decoder variant task ppl score score_name
    ms_per_token j_per_token block_efficiency acceptance_rate speedup energy_ratio`` (None where a run lacks
    the figure), the join keys, ``decoder.*`` settings, a few bookkeeping columns and ``keep``; duplicates of
    one configuration and seed reduced to the latest row, seeds pooled; ``speedup``/``energy_ratio`` joined
    in, with their intervals (``speedup_ci``, ``energy_ratio_ci``: :class:`mtad.report.stats.Interval` or None)
    from the runs' per-prompt records (``run_dir`` resolved against ``search``), and the cost model's
    ``predicted_ms`` and ``proj_speedup`` (``profiles``: a list of :class:`mtad.measure.costmodel.Profile`; default:
    every profile under ``<search>/profiles`` and ``results/profiles``)."""
    if frame is None or len(frame) == 0:
        raise ValueError("no result rows to tabulate: run the experiment first (python -m mtad.harness.sweep)")
    for need in ("decoder.name", "model.name", "task.name"):
        if need not in frame.columns:
            raise ValueError(f"result rows lack the column {need!r}: they are not mtad result rows")
    df = frame.copy().reset_index(drop=True)
    df["pair"], df["decoder"], df["task"] = df["model.name"], df["decoder.name"], df["task.name"]
    df["score_name"] = _col(df, "metrics.score_name")
    df["score"] = [_num(r.get(f"metrics.score.{r['score_name']}")) if isinstance(r["score_name"], str) else None
                   for _, r in df.iterrows()]
    for new, old in (("ppl", "metrics.ppl_mean_logprob"), ("ms_per_token", "metrics.ms_per_token"),
                     ("j_per_token", "metrics.energy_j_per_token"), ("block_efficiency", "metrics.block_efficiency"),
                     ("acceptance_rate", "metrics.acceptance_rate"),
                     *((k, f"metrics.{k}") for k, _ in DIVERSITY), *((k, f"metrics.{k}") for k in _SUMS)):
        df[new] = [_num(v) for v in _col(df, old)]
    call_cols = [c for c in df.columns if c.startswith(CALLS_PREFIX)]
    df["forward_calls"] = [{c[len(CALLS_PREFIX):]: int(r[c]) for c in call_cols if _num(r[c])} or None
                           for _, r in df[call_cols].iterrows()] if call_cols else None
    wanted = ["pair", "decoder", "task", "score_name", "score", "ppl", "ms_per_token", "j_per_token",
              "block_efficiency", "acceptance_rate", *(k for k, _ in DIVERSITY), *_SUMS, "forward_calls",
              *JOIN_KEYS, *NOTE_COLUMNS, *keep, *(c for c in df.columns if c.startswith("decoder."))]
    df = df[[c for c in dict.fromkeys(wanted) if c in df.columns]].copy()
    df["variant"] = _variants(df)
    df = _pool_seeds(_latest_per_config(df))
    df = add_baseline_ratios(df)
    df = add_intervals(df, search)
    return add_cost_model(df, default_profiles(search) if profiles is None else profiles)


# Measurement settings that, when they differ within one file, also split a decoder's rows (short names).
SETTING_LABELS = {"model.draft": "draft", "model.dtype": "dtype", "decoder.max_new_tokens": "tokens",
                  "task.n_prompts": "prompts", "device_name": "on", "num_threads": "threads"}


def _variants(df) -> list[str]:
    """``decoder`` plus the decoder settings that differ between this decoder's rows, e.g. ``mtad (tau=0.3)``,
    plus any measurement setting that differs within the frame, e.g. ``greedy [on=NVIDIA H200]``."""
    labels = list(df["decoder"])
    for name in set(df["decoder"]):
        rows = df[df["decoder"] == name]
        varying = [k for k in VARIANT_KEYS if f"decoder.{k}" in df.columns
                   and len({_hashable(v) for v in rows[f"decoder.{k}"]}) > 1]
        threshold = "decoder.accept" in df.columns and any(v == "threshold" for v in rows["decoder.accept"])
        if name == BASELINE and threshold and "accept" not in varying:
            varying.insert(0, "accept")
        for i, row in rows.iterrows():
            if varying:
                labels[i] = f"{name} (" + ", ".join(f"{k}={_fmt_setting(row[f'decoder.{k}'])}" for k in varying) + ")"
    settings = [c for c in SETTING_LABELS if c in df.columns and len({_hashable(v) for v in df[c]}) > 1]
    if settings:
        labels = [f"{label} [" + ", ".join(f"{SETTING_LABELS[c]}={_fmt_setting(df.at[i, c])}" for c in settings) + "]"
                  for i, label in enumerate(labels)]
    return labels


def _fmt_setting(value: Any) -> str:
    value = _hashable(value)
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _join_columns(df) -> list[str]:
    return [k for k in JOIN_KEYS if k in df.columns]


def _latest_per_config(df):
    keys = _join_columns(df) + ["variant"] + (["seed"] if "seed" in df.columns else [])
    order = df.sort_values("timestamp") if "timestamp" in df.columns else df
    dedup = order.drop_duplicates(subset=keys, keep="last")
    if len(dedup) < len(df):
        log.info("kept the latest of %d repeated measurements of one configuration", len(df) - len(dedup))
    return dedup.sort_index().reset_index(drop=True)


def _pool_seeds(df):
    """One row per configuration: runs at several seeds (a ``seed`` sweep) pooled into the latest one's row.
    ms/token, J/token and block efficiency become ratios of the summed times, energies, tokens and target
    forwards; perplexity the exp of the pooled mean log-probability (weighted by scored samples); score and
    diversity the prompt-weighted means; acceptance the target-forward-weighted mean **[choice: rows do
    not record the proposed-token total]**. ``run_dirs``/``seeds`` list the pooled runs."""
    import pandas as pd

    keys = _join_columns(df) + ["variant"]
    out = []
    for _, g in df.groupby([df[k].map(lambda v: str(_hashable(v))) for k in keys], sort=False):
        last = g.sort_values("timestamp") if "timestamp" in g.columns else g
        row = dict(last.iloc[-1].to_dict(), _order=g.index.min())
        row["run_dirs"] = list(g["run_dir"]) if "run_dir" in g.columns else [None] * len(g)
        row["seeds"] = [None if _num(x) is None else int(x) for x in _col(g, "seed")]
        out.append(_pooled(row, g) if len(g) > 1 else row)
    out.sort(key=lambda r: r.pop("_order"))
    return pd.DataFrame(out)


def _pooled(row, g):
    def total(col):
        vals = [_num(v) for v in _col(g, col)]
        return None if any(v is None for v in vals) else sum(vals)

    def mean(col, weight):
        pairs = [(_num(v), _num(w) or 0.0) for v, w in zip(_col(g, col), _col(g, weight))]
        if any(v is None for v, _ in pairs) or not sum(w for _, w in pairs):
            return None
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)

    for col in _SUMS + ("n_prompts",):
        row[col] = total(col)
    tokens = row["total_tokens"]
    row["ms_per_token"] = _ratio(1e3 * row["total_decode_s"], tokens) if row["total_decode_s"] is not None else None
    row["j_per_token"] = _ratio(row["energy_j"], tokens)
    row["block_efficiency"] = _ratio(tokens, row["target_forwards"])
    logs = [(_num(p), _num(n) or 0.0) for p, n in zip(_col(g, "ppl"), _col(g, "ppl_n_samples"))]
    if logs and all(p is not None and p > 0 for p, _ in logs) and sum(n for _, n in logs):
        row["ppl"] = math.exp(sum(math.log(p) * n for p, n in logs) / sum(n for _, n in logs))
    row["score"] = mean("score", "n_prompts")
    row["acceptance_rate"] = mean("acceptance_rate", "target_forwards")
    for col, _ in DIVERSITY:
        row[col] = mean(col, "n_prompts")
    calls: dict = {}
    for c in _col(g, "forward_calls"):
        for k, v in (c or {}).items():
            calls[k] = calls.get(k, 0) + v
    row["forward_calls"] = calls or None
    return row


def add_intervals(df, search: Sequence[str | Path] = ()):
    """``records`` (pooled per-prompt records of every row, None when a run's ``samples.jsonl`` is gone),
    ``n`` (prompts with records, else the row's prompts) and the intervals of ``speedup``/``energy_ratio``."""
    out = df.copy()
    search = [*search, Path.cwd()]
    out["records"] = [stats.samples_for(r["run_dirs"], r["score_name"] if isinstance(r["score_name"], str)
                                        else None, search) for _, r in df.iterrows()]
    out["n"] = [len(rec) if rec is not None else _int_or_none(r.get("n_prompts")) for rec, (_, r)
                in zip(out["records"], df.iterrows())]
    out["n_seeds"] = [len(r) for r in out["run_dirs"]]
    speed, energy = [], []
    for _, row in out.iterrows():
        base = baseline_of(out, row)
        rec = (row["records"], base["records"]) if base is not None else (None, None)
        speed.append(stats.compare("speedup", *rec) if row["speedup"] is not None else None)
        energy.append(stats.compare("energy_ratio", *rec) if _num(row["energy_ratio"]) is not None else None)
    out["speedup_ci"], out["energy_ratio_ci"] = speed, energy
    return out


def _int_or_none(x):
    return None if _num(x) is None else int(x)


def default_profiles(search: Sequence[str | Path] = ()) -> list:
    """Every cost profile under ``<search>/profiles`` and the repository's ``results/profiles``."""
    dirs = dict.fromkeys(Path(d).resolve() / "profiles" for d in [*search, REPO_ROOT / "results"])
    return find_profiles(list(dirs))


def add_cost_model(df, profiles: Sequence = ()):
    """``predicted_ms``: ms/token from the row's forward counts under the profile measured on its hardware
    for its pair (None without one, or for rows from before counts were recorded); ``proj_speedup``: the
    speed-up vs the baseline projected under the declared profile; ``proj_other``: {profile label: projected
    ms/token} under measured profiles of the pair on other hardware."""
    declared = declared_profile()
    out = df.copy()
    own, units, other = [], [], []
    for _, r in df.iterrows():
        calls, tokens = r.get("forward_calls"), _int_or_none(r.get("total_tokens"))
        if not calls or not tokens:
            own.append(None), units.append(None), other.append({})
            continue
        match = [p for p in profiles if p.matches(r.get("device_name"), r["pair"], r.get("num_threads"))]
        own.append(predict(calls, tokens, match[-1], r["decoder"]) if match else None)
        units.append(predict(calls, tokens, declared, r["decoder"]))
        other.append({p.label(): predict(calls, tokens, p, r["decoder"]) for p in profiles
                      if p.kind == "measured" and p.pair == r["pair"] and p.hardware != r.get("device_name")})
    out["predicted_ms"], out["proj_units"], out["proj_other"] = own, units, other
    proj = []
    for _, r in out.iterrows():
        base = baseline_of(out, r)
        proj.append(_ratio(base["proj_units"], r["proj_units"]) if base is not None and r["proj_units"] else None)
    out["proj_speedup"] = proj
    return out


def baseline_of(df, row, decoder: str = BASELINE):
    """The row of ``decoder`` measured under the same JOIN_KEYS as ``row`` (same gamma preferred, then the
    latest); None when there is none. For ``speculative`` only the lossless variant qualifies."""
    keys = _join_columns(df)
    mask = df["decoder"] == decoder
    if decoder == BASELINE and "decoder.accept" in df.columns:
        mask &= df["decoder.accept"].fillna("lossless") == "lossless"
    for k in keys:  # null-safe equality: a missing value matches a missing value
        want = _hashable(row[k])
        mask &= df[k].map(lambda v, want=want: _hashable(v) == want).astype(bool)
    cands = df[mask]
    for key in ("decoder.temperature", "decoder.top_p"):  # a sampling sweep: the paper's settings
        if len(cands) > 1 and key in df.columns and (cands[key] == PAPER_DEFAULTS[key]).any():
            cands = cands[cands[key] == PAPER_DEFAULTS[key]]
    if len(cands) > 1 and "decoder.gamma" in df.columns:
        same = cands[cands["decoder.gamma"] == row.get("decoder.gamma")]
        cands = same if len(same) else cands
    if len(cands) > 1 and "decoder.gamma" in df.columns:
        default = cands[cands["decoder.gamma"] == PAPER_DEFAULTS["decoder.gamma"]]
        cands = default if len(default) else cands
    if len(cands) > 1 and "timestamp" in cands.columns:
        cands = cands.sort_values("timestamp")
    return None if cands.empty else cands.iloc[-1]


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den not in (None, 0.0) else None


def add_baseline_ratios(df, decoder: str = BASELINE):
    """Add ``speedup`` and ``energy_ratio`` of every row against its ``decoder`` baseline row."""
    speed, energy = [], []
    for _, row in df.iterrows():
        base = baseline_of(df, row, decoder)
        speed.append(_ratio(base["ms_per_token"], row["ms_per_token"]) if base is not None else None)
        energy.append(_ratio(base["j_per_token"], row["j_per_token"]) if base is not None else None)
    out = df.copy()
    out["speedup"], out["energy_ratio"] = speed, energy
    return out


# ------------------------------------------------------------------------------------------- claims
def _primary(df):
    """For claims: per decoder, the rows at the paper's default settings when an ablation holds several."""
    keep = []
    for _, row in df.iterrows():
        same = df[(df["decoder"] == row["decoder"]) & (df["pair"] == row["pair"]) & (df["task"] == row["task"])]
        if len(same) == 1:
            keep.append(True)
            continue
        keep.append(all(row.get(k) == v for k, v in PAPER_DEFAULTS.items() if k in df.columns
                        and _num(row.get(k)) is not None))
    return df[keep]


def _cells(prim, method: str, versus: str, pairs: Sequence[str]) -> tuple[list[tuple[Any, Any]], bool]:
    """(method row, baseline row) per comparable cell of the ``_primary`` frame; the bool says whether the
    paper's pairs were found."""
    on_paper = bool(pairs) and prim["pair"].isin(pairs).any()
    rows = prim[prim["pair"].isin(pairs)] if on_paper else prim
    cells = []
    for _, row in rows[rows["decoder"] == method].iterrows():
        base = baseline_of(prim, row, versus)
        if base is not None:
            cells.append((row, base))
    return cells, on_paper


def _per_cell(kind: str, m, b) -> float | None:
    m, b = {k: _num(m[k]) for k in _FIGURES}, {k: _num(b[k]) for k in _FIGURES}
    if kind == "ppl_change":
        r = _ratio(m["ppl"], b["ppl"])
        return 100 * (r - 1) if r is not None else None
    if kind == "score_change":
        r = _ratio(m["score"], b["score"])
        return 100 * (r - 1) if r is not None else None
    if kind == "speedup":
        return _ratio(b["ms_per_token"], m["ms_per_token"])
    if kind == "energy_ratio":
        return _ratio(b["j_per_token"], m["j_per_token"])
    if kind == "energy_saving":
        r = _ratio(m["j_per_token"], b["j_per_token"])
        return 100 * (1 - r) if r is not None else None
    raise ValueError(f"unknown claim kind {kind!r}")


_FIGURES = ("ppl", "score", "ms_per_token", "j_per_token")


def _aggregate(kind: str, values: list[float]) -> float | None:
    """Ratios: geometric mean over cells; percentage changes: arithmetic mean."""
    if not values:
        return None
    if kind in _PERCENT_KINDS:
        return sum(values) / len(values)
    if any(v <= 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _cell_interval(kind: str, m, b):
    """The cell's comparison as an Interval: bootstrapped from both rows' per-prompt records, else the
    row-level point estimate without an interval (note says why)."""
    point = _per_cell(kind, m, b)
    iv = stats.compare(kind, m.get("records"), b.get("records"))
    if iv is None:
        return stats.Interval(point, None, None, _int_or_none(m.get("n")) or 0, kind,
                              note="no per-prompt records"), False
    if iv.point is None and point is not None:  # e.g. the records lack the field: keep the row's figure
        return stats.Interval(point, None, None, iv.n, kind, note=iv.note), True
    return iv, True


def claims(df, claim_list: Iterable[Claim] = CLAIMS) -> list[dict]:
    """One dict per claim: the paper's figure, ours (None if unmeasured) with its interval
    (:class:`mtad.report.stats.Interval`), the cells it is over, hardware, and the verdict text."""
    out, prim = [], _primary(df)
    for c in claim_list:
        cells, on_paper = _cells(prim, c.method, c.versus, c.pairs)
        ivs = [(m, b, *_cell_interval(c.kind, m, b)) for m, b in cells]
        ivs = [(m, b, iv, has) for m, b, iv, has in ivs if iv.point is not None]
        agg = stats.aggregate(c.kind, [iv for _, _, iv, _ in ivs])
        fallback = None
        if c.kind == "score_change" and cells and not agg.has_interval:  # undefined relative change: points
            diffs = [stats.compare("score_diff", m.get("records"), b.get("records")) for m, b in cells]
            if all(d is not None and d.point is not None for d in diffs):
                fallback = stats.aggregate("score_diff", diffs)
                ivs = [(m, b, d, True) for (m, b), d in zip(cells, diffs)]
        missing = sorted({f"{r['variant']} · {r['task']}" for m, b, _, has in ivs if not has for r in (m, b)
                          if r.get("records") is None})
        pairs = sorted({m["pair"] for m, _, _, _ in ivs})
        tasks = sorted({m["task"] for m, _, _, _ in ivs})
        hardware = sorted({str(x) for m, b, _, _ in ivs for x in (m.get("device_name"), b.get("device_name")) if x})
        out.append({"version": c.version, "claim": c.text, "paper": c.paper, "kind": c.kind,
                    "ours": (fallback.point if fallback else agg.point) if ivs else None,
                    "interval": agg if ivs else None, "fallback": fallback,
                    "comparison": f"{c.method} vs {c.versus}: {_KIND_TEXT[c.kind]}", "n_cells": len(ivs),
                    "n": agg.n if ivs else 0, "missing": missing,
                    "pairs": pairs, "tasks": tasks, "hardware": hardware,
                    "paper_pairs": on_paper or not c.pairs})
    return out


def verdict(c: dict) -> str:
    """"not significant at n = …" where the 95 % interval spans no change; "significant …" where it does
    not; the reason where there is no interval."""
    iv = c["fallback"] or c["interval"]
    if c["ours"] is None or iv is None:
        return DASH
    if not iv.has_interval:
        if c["missing"]:
            return f"point estimate only: no per-prompt records for {len(c['missing'])} row(s)"
        return f"no interval: {iv.note or 'too few prompts'}"
    what = "score difference" if c["fallback"] else "interval"
    if iv.contains_no_change():
        return f"not significant at n = {iv.n} ({what} spans no change)"
    return f"significant at n = {iv.n} (95 % {what} excludes no change)"


# ------------------------------------------------------------------------------------------- layout
def _order(df) -> list[tuple[str, str]]:
    def rank(variant_row):
        dec = variant_row[1]
        return (DECODER_ORDER.index(dec) if dec in DECODER_ORDER else len(DECODER_ORDER), dec)

    keys = {(r["pair"], r["decoder"], r["variant"]) for _, r in df.iterrows()}
    ordered = sorted(keys, key=lambda k: (str(k[0]), rank(k), _variant_sort_key(k[2])))
    return [(p, v) for p, _, v in ordered]


def _variant_sort_key(label: str) -> tuple:
    """Sort ``mtad (tau=0.1)`` before ``mtad (tau=0.9)`` and ``gamma=2`` before ``gamma=10``."""
    parts = []
    for tok in label.replace("(", " ").replace(")", " ").replace(",", " ").replace("=", " ").split():
        num = _num(tok)
        parts.append((0, num, "") if num is not None else (1, 0.0, tok))
    return tuple(parts)


def _tasks(df) -> list[str]:
    return sorted(set(df["task"]))


def _cell(df, pair: str, variant: str, task: str):
    hit = df[(df["pair"] == pair) & (df["variant"] == variant) & (df["task"] == task)]
    return None if hit.empty else hit.iloc[-1]


def _score_label(df, task: str) -> str | None:
    names = sorted({n for n in df[df["task"] == task]["score_name"] if isinstance(n, str)})
    return "/".join(names) if names else None


def quality_rows(df) -> tuple[list[str], list[list[float | str | None]]]:
    """Header and rows of the quality table: pair, decoder, then per task PPL and score."""
    header, cols = ["pair", "decoder"], []
    for task in _tasks(df):
        header.append(f"{task} PPL")
        cols.append((task, "ppl"))
        label = _score_label(df, task)
        if label:
            header.append(f"{task} {label}")
            cols.append((task, "score"))
    rows = []
    for pair, variant in _order(df):
        cells = [_cell(df, pair, variant, t) for t, _ in cols]
        rows.append([pair, variant] + [None if c is None else c[field] for c, (_, field) in zip(cells, cols)])
    return header, rows


def _n_cell(r) -> str | None:
    n = _int_or_none(r.get("n"))
    if n is None:
        return None
    seeds = r.get("n_seeds") or 1
    return f"{n} × {seeds} seeds" if seeds > 1 else str(n)


def fmt_interval(point: float | None, iv, percent: bool = False, digits: int = 2) -> str:
    """``1.17× [0.95, 1.40]`` / ``−4.0 % [−9.1, +1.2]``; the point marked † when there is no interval."""
    if point is None:
        return DASH
    if iv is not None and iv.point is not None and iv.has_interval:
        point = iv.point
    f = (lambda x: f"{x:+.1f}".replace("-", "−")) if percent else (lambda x: f"{x:.{digits}f}")
    unit = " %" if percent else "×"
    if iv is None or not iv.has_interval:
        return f"{f(point)}{unit}{POINT_ONLY}"
    return f"{f(point)}{unit} [{f(iv.low)}, {f(iv.high)}]"


def speed_rows(df, task: str) -> tuple[list[str], list[list]]:
    sub = df[df["task"] == task]
    others = sorted({k for v in sub.get("proj_other", []) for k in (v or {})})
    header = ["pair", "decoder"] + [label for _, label in SPEED_COLUMNS] + [f"projected ms/token on {o}‡"
                                                                             for o in others]
    rows = []
    for pair, variant in _order(sub):
        c = _cell(df, pair, variant, task)
        cells = []
        for key, _ in SPEED_COLUMNS:
            if key == "n":
                cells.append(_n_cell(c))
            elif key in ("speedup", "energy_ratio"):
                cells.append(fmt_interval(_num(c[key]), c.get(f"{key}_ci")))
            elif key == "proj_speedup":
                cells.append(None if _num(c.get(key)) is None else f"{c[key]:.2f}×")
            else:
                cells.append(c.get(key))
        cells += [(c.get("proj_other") or {}).get(o) for o in others]
        rows.append([pair, variant] + cells)
    return header, rows


def diversity_rows(df) -> tuple[list[str], list[list]]:
    """Per task distinct-2 and rep-3 of every variant (all four metrics in the LaTeX/notebook frame)."""
    header, cols = ["pair", "decoder"], []
    for task in _tasks(df):
        for key, label in DIVERSITY:
            if key in ("distinct_2", "rep_3") and key in df.columns:
                header.append(f"{task} {label}")
                cols.append((task, key))
    rows = []
    for pair, variant in _order(df):
        cells = [_cell(df, pair, variant, t) for t, _ in cols]
        rows.append([pair, variant] + [None if c is None else _num(c.get(k)) for c, (_, k) in zip(cells, cols)])
    return header, rows


def versus_sampling_rows(df) -> tuple[list[str], list[list]]:
    """Per task, every variant's perplexity change and task-score difference against ``sampling`` at the
    paper's settings, with paired 95 % intervals; [] rows without a sampling row."""
    header, tasks = ["pair", "decoder"], _tasks(df)
    for task in tasks:
        header += [f"{task} n", f"{task} PPL change [95 % CI]"]
        if _score_label(df, task):
            header.append(f"{task} score Δ [95 % CI]")
    rows = []
    for pair, variant in _order(df):
        cells, any_base = [], False
        for task in tasks:
            c = _cell(df, pair, variant, task)
            b = baseline_of(df, c, "sampling") if c is not None else None
            has_score = bool(_score_label(df, task))
            if c is None or b is None or c["variant"] == b["variant"]:
                cells += [None, None] + ([None] if has_score else [])
                continue
            any_base = True
            ppl = stats.compare("ppl_change", c["records"], b["records"])
            point = _per_cell("ppl_change", c, b)
            cells += [_n_cell(c) if ppl is None else str(ppl.n), fmt_interval(point, ppl, percent=True)]
            if has_score:
                sd = stats.compare("score_diff", c["records"], b["records"])
                sp = _num(c["score"]) - _num(b["score"]) if None not in (_num(c["score"]), _num(b["score"])) else None
                cells.append(_fmt_diff(sp, sd))
        if any_base:
            rows.append([pair, variant] + cells)
    return header, rows


def _fmt_diff(point, iv) -> str:
    if point is None:
        return DASH
    f = lambda x: f"{x:+.3f}".replace("-", "−")  # noqa: E731
    if iv is None or not iv.has_interval:
        return f"{f(point)}{POINT_ONLY}"
    return f"{f(iv.point)} [{f(iv.low)}, {f(iv.high)}]"


def missing_records(df) -> list[str]:
    """Rows without per-prompt records (their figures are point estimates, marked †)."""
    return [f"{r['pair']} · {r['variant']} · {r['task']} (run_dir {', '.join(str(d) for d in r['run_dirs'])})"
            for _, r in df.iterrows() if r.get("records") is None]


def _fmt(value: Any, column: str = "") -> str:
    x = _num(value) if not isinstance(value, str) else None
    if isinstance(value, str):
        return value
    if x is None:
        return DASH
    if math.isinf(x):
        return "inf"
    if "(paper)" in column:
        return f"{x:.2f}"  # as published
    if "speed-up" in column or "ratio" in column:
        return f"{x:.2f}×"
    if "J/token" in column:
        return f"{x:.3g}"
    if "ms/token" in column:
        return f"{x:.1f}"
    if "PPL" in column or "block" in column:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _fmt_claim(value: float | None, kind: str) -> str:
    if value is None:
        return DASH
    if kind in _PERCENT_KINDS:
        return f"{value:+.1f} %".replace("-", "−")
    return f"{value:.2f}×"


@dataclass(frozen=True)
class PerRun:
    """A per-run figure published with the reference implementation (docs/PAPER.md; ICLR 2025 camera-ready,
    Llama-3.1-8B(-Instruct) target, Llama-3.2-1B(-Instruct) draft, 100 new tokens, gamma = 4, W = 4)."""

    task: str
    pair: str
    method: str
    tau: float | None
    score: str  # as published, with its metric
    ms_per_token: float
    acceptance_rate: float
    block_efficiency: float


PER_RUN: tuple[PerRun, ...] = (
    PerRun("spider", "llama3-8b", "mtad", 0.5, "exec. acc. 47.0", 33.20, 0.80, 4.19),
    PerRun("spider", "llama3-8b", "specinfer", None, "exec. acc. 37.0", 35.52, 0.85, 3.55),
    PerRun("spider", "llama3-8b-instruct", "mtad", 0.3, "exec. acc. 64.0", 30.04, 0.78, 4.14),
    PerRun("spider", "llama3-8b-instruct", "specinfer", None, "exec. acc. 52.0", 32.91, 0.79, 3.36),
    PerRun("humaneval", "llama3-8b", "mtad", 0.5, "pass@1 0.299", 29.02, 0.83, 4.33),
    PerRun("humaneval", "llama3-8b", "specinfer", None, "pass@1 0.238", 30.73, 0.89, 3.66),
    PerRun("humaneval", "llama3-8b-instruct", "mtad", 0.5, "pass@1 0.457", 27.67, 0.84, 4.34),
    PerRun("humaneval", "llama3-8b-instruct", "specinfer", None, "pass@1 0.427", 29.48, 0.88, 3.64),
)


def per_run_rows(df) -> tuple[list[str], list[list]]:
    """The published per-run figures beside ours for the same (task, pair, method, tau); [] rows when the
    frame holds none of those pairs (only the paper profile measures them)."""
    header = ["task", "pair", "method", "score (paper)", "score (ours)", "ms/token (paper)", "ms/token (ours)",
              "acceptance (paper)", "acceptance (ours)", "block eff. (paper)", "block eff. (ours)"]
    if not df["pair"].isin({p.pair for p in PER_RUN}).any():
        return header, []
    rows = []
    for p in PER_RUN:
        hit = df[(df["pair"] == p.pair) & (df["task"] == p.task) & (df["decoder"] == p.method)]
        if p.tau is not None and "decoder.tau" in hit.columns and (hit["decoder.tau"] == p.tau).any():
            hit = hit[hit["decoder.tau"] == p.tau]
        m = {} if hit.empty else hit.iloc[-1].to_dict()
        score = f"{m['score_name']} {m['score']:.3f}" if _num(m.get("score")) is not None else None
        name = p.method + (f" τ={p.tau:g}" if p.tau is not None else "")
        rows.append([p.task, p.pair, name, p.score, score, p.ms_per_token, m.get("ms_per_token"),
                     p.acceptance_rate, m.get("acceptance_rate"), p.block_efficiency, m.get("block_efficiency")])
    return header, rows


def claim_rows(df) -> tuple[list[str], list[list[str]]]:
    header = ["paper version", "claim (as published)", "paper", "our comparison", "ours [95 % CI]", "verdict",
              "measured on", "hardware"]
    rows = []
    for c in claims(df):
        paper = _fmt_claim(c["paper"], c["kind"])
        where = DASH
        if c["n_cells"]:
            cells = f"{c['n_cells']} cell" + ("s" if c["n_cells"] > 1 else "")
            where = f"{', '.join(c['pairs'])} × {', '.join(c['tasks'])} ({cells}, n = {c['n']})"
            if not c["paper_pairs"]:
                where += "; not the paper's pairs"
        rows.append([c["version"], c["claim"], paper, c["comparison"], _fmt_claim_ci(c), verdict(c), where,
                     "; ".join(c["hardware"]) or DASH])
    return header, rows


def _fmt_claim_ci(c: dict) -> str:
    if c["ours"] is None:
        return DASH
    if c["fallback"] is not None:
        return "relative change undefined (a baseline score of 0); score Δ " + _fmt_diff(c["fallback"].point,
                                                                                       c["fallback"])
    return fmt_interval(c["ours"], c["interval"], percent=c["kind"] in _PERCENT_KINDS)


# ------------------------------------------------------------------------------------------- markdown
def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(esc(_fmt(v, h)) for v, h in zip(row, header)) + " |")
    return "\n".join(lines)


def _settings_note(df) -> list[str]:
    def values(col: str) -> str:
        if col not in df.columns:
            return DASH
        vals = sorted({str(_hashable(v)) for v in df[col] if v is not None}, key=str)
        return ", ".join(vals) if vals else DASH

    notes = [f"- hardware: {values('device_name')}; torch threads: {values('num_threads')}",
             (f"- prompts per run: {values('n_prompts')} (task.n_prompts: {values('task.n_prompts')}); "
              f"max new tokens: {values('decoder.max_new_tokens')}; seed: {values('seed')}"),
             (f"- git: {values('git_sha')}; versions: torch {values('versions.torch')}, transformers "
              f"{values('versions.transformers')}, mtad {values('versions.mtad')}"),
             (f"- {len(df)} runs. PPL = exp(−mean over samples of the mean log-probability) under the raw target. "
              f"speed-up and energy ratio are {BASELINE}'s ms/token (J/token) divided by the row's, joined on "
              f"{', '.join(_join_columns(df))}.")]
    return notes


def _uncertainty_note(df) -> list[str]:
    lines = [f"Intervals: 95 % paired bootstrap over prompts (pairs joined on prompt id and turn; seeds pooled "
             f"within a prompt), scipy.stats.bootstrap, {stats.N_RESAMPLES} resamples, {stats.METHOD} method, "
             f"seed {stats.SEED}; no interval below {stats.MIN_PAIRS} paired prompts. n = prompts per cell "
             "(× seeds where several were pooled)."]
    missing = missing_records(df)
    if missing:
        lines.append(f"{POINT_ONLY} point estimate only, no interval: {len(missing)} row(s) have no per-prompt "
                     "records (samples.jsonl not found): " + "; ".join(missing[:12])
                     + (f"; and {len(missing) - 12} more" if len(missing) > 12 else "") + ".")
    return lines


def _cost_note(df) -> list[str]:
    has_counts = df["forward_calls"].map(bool).any() if "forward_calls" in df.columns else False
    lines = ["predicted ms/token: the run's forward counts (metrics.forward_calls) × the per-forward costs "
             # published wording kept, so published tables re-render byte for byte ("mtad.costmodel profile"
             # is the cost profile, today written by python -m mtad.harness.profile)
             "measured for this hardware and pair (mtad.costmodel profile, results/profiles/), plus its harness "
             "time per target forward; — where no profile or no counts exist"
             + ("" if has_counts else " (these rows predate forward counts)") + ".",
             f"‡ **projection, not a measurement**: the same counts under another profile. Speed-up: "
             f"{declared_profile().note}."]
    others = sorted({k for v in df.get("proj_other", []) for k in (v or {})})
    if others:
        lines.append("Projected ms/token: under the measured profile of " + "; ".join(others) + ".")
    return lines


def render_markdown(frame, title: str = "results", search: Sequence[str | Path] = (), profiles=None) -> str:
    df = prepare(frame, search=search, profiles=profiles)
    parts = [f"# {title}", "", "## Output quality", "", _md_table(*quality_rows(df)), ""]
    header, rows = versus_sampling_rows(df)
    if rows:
        parts += ["## Quality against sampling", "",
                  "Perplexity change = PPL(row) / PPL(sampling) − 1; score Δ = score(row) − score(sampling); "
                  "sampling at the paper's settings (T = 1, top-p = 0.9), same pair, task and prompts.", "",
                  _md_table(header, rows), ""]
    header, rows = diversity_rows(df)
    if len(header) > 2:
        parts += ["## Diversity", "", "distinct-n = distinct n-grams / all n-grams over a run's outputs (token ids); "
                  "rep-3 = share of a sample's trigrams that repeat an earlier one, mean over samples.", "",
                  _md_table(header, rows), ""]
    for task in _tasks(df):
        parts += [f"## Speed and energy — {task}", "", _md_table(*speed_rows(df, task)), ""]
    parts += _cost_note(df) + [""]
    parts += ["## The paper's headline claims beside ours", "",
              ("Paper figures as published (docs/PAPER.md); ours aggregate the comparable (pair, task) cells: "
               "geometric mean of ratios, arithmetic mean of percentage changes, the interval from the cells' "
               "bootstrap distributions combined resample by resample. — = not measured here."), "",
              _md_table(*claim_rows(df)), ""]
    header, rows = per_run_rows(df)
    if rows:
        parts += ["## Per-run figures published with the reference implementation", "",
                  "ICLR 2025 camera-ready setting (docs/PAPER.md): 100 new tokens, gamma = 4, W = 4, SpecInfer tree "
                  "[4, 2, 2]; paper scores as published (Spider in %).", "", _md_table(header, rows), ""]
    parts += ["## Settings", ""] + _settings_note(df) + ["- " + x for x in _uncertainty_note(df)] + [""]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------- LaTeX
_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "×": r"$\times$", "—": "---", "–": "--", "−": "$-$", "τ": r"$\tau$", "γ": r"$\gamma$",
                "†": r"\textdagger{}", "‡": r"\textdaggerdbl{}", "Δ": r"$\Delta$", "·": r"$\cdot$"}


def tex_escape(text: str) -> str:
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in str(text))


def _tex_table(header: Sequence[str], rows: Sequence[Sequence[Any]], caption: str, fmt=None,
               spec: str | None = None) -> str:
    spec = spec or "ll" + "r" * (len(header) - 2)
    body = [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{tex_escape(caption)}}}",
            rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(tex_escape(h) for h in header) + r" \\",
            r"\midrule"]
    for row in rows:
        cells = [fmt(v, h) if fmt else _fmt(v, h) for v, h in zip(row, header)]
        body.append(" & ".join(tex_escape(c) for c in cells) + r" \\")
    body += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(body)


def render_latex(frame, title: str = "results", search: Sequence[str | Path] = (), profiles=None) -> str:
    """Booktabs tables (``\\usepackage{booktabs}``), one ``table`` float each."""
    df = prepare(frame, search=search, profiles=profiles)
    # "mtad.table": the wording of every published table, kept so that they re-render byte for byte
    parts = [f"% {title}: generated by mtad.table from result rows; do not edit by hand",
             _tex_table(*quality_rows(df), caption=f"{title}: output perplexity and task score")]
    header, rows = versus_sampling_rows(df)
    if rows:
        parts.append(_tex_table(header, rows, caption=f"{title}: quality against sampling (95 % paired bootstrap)"))
    for task in _tasks(df):
        parts.append(_tex_table(*speed_rows(df, task), caption=f"{title}: speed and energy on {task}. "
                                + " ".join(_cost_note(df)[1:])))
    header, rows = claim_rows(df)
    parts.append(_tex_table(header, rows, caption="The paper's headline claims beside our measurements. "
                            + " ".join(_uncertainty_note(df)), fmt=lambda v, h: str(v),
                            spec="p{2.2cm}p{3.2cm}rp{2.6cm}p{2.4cm}p{2.6cm}p{3cm}p{1.8cm}"))
    header, rows = per_run_rows(df)
    if rows:
        parts.append(_tex_table(header, rows, caption="Per-run figures published with the reference implementation "
                                "beside ours", spec="lll" + "r" * (len(header) - 3)))
    return "\n\n".join(parts) + "\n"


def write_tables(frame, out_dir: str | Path, name: str, search: Sequence[str | Path] = (),
                 profiles=None) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.md`` and ``.tex``; returns both paths. ``search``: folders the rows' run
    directories and ``profiles/`` may be found under (e.g. the results file's folder)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, tex = out / f"{name}.md", out / f"{name}.tex"
    md.write_text(render_markdown(frame, title=name, search=search, profiles=profiles))
    tex.write_text(render_latex(frame, title=name, search=search, profiles=profiles))
    log.info("wrote %s and %s", md, tex)
    return md, tex

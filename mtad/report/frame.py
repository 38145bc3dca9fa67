"""The derived frame every table and notebook reads: one row per configuration, figures joined on fields.

Input is the flattened frame of ``mtad.harness.store.load_frame`` (one row per run). Everything derived is
computed here by joining rows on their fields (STYLE.md, "Results"), never from file names:

- **variants**: a decoder that appears with several settings (an ablation) is split into variants labelled
  by the settings that differ, e.g. ``mtad (tau=0.3)``; identical configurations measured twice keep the
  latest row; runs of one configuration at several seeds are pooled;
- **baselines**: the baseline of a row is the lossless ``speculative`` row with the same :data:`JOIN_KEYS`
  (pair, draft, dtype, task, prompts, token budget, hardware, threads); when several qualify, the one with
  the same ``gamma``, then the latest. speed-up = ms/token(baseline) / ms/token(row); energy ratio =
  J/token(baseline) / J/token(row) (> 1: the row uses less energy);
- **uncertainty** (:mod:`mtad.report.stats`): every ratio carries a 95 % paired-bootstrap interval over the
  prompts (records from each run's ``samples.jsonl``, found through the row's ``run_dir``), and every row
  its n; a row whose per-prompt records are gone has ``records`` None, never an invented interval;
- **cost model** (:mod:`mtad.measure.costmodel`): the ms/token predicted from the run's forward counts under
  the cost profile of its hardware and pair, and a projection of the speed-up under a declared profile
  (and under any other hardware's measured profile of the pair).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad._util.late import HASHED_LATE_KEYS, LATE_KEYS
from mtad._util.paths import REPO_ROOT
from mtad.measure.costmodel import declared_profile, find_profiles, predict
from mtad.report import stats

log = logging.getLogger(__name__)

BASELINE = "speculative"
# Rows are comparable only when these agree (columns missing from a frame are ignored).
JOIN_KEYS = ("model.name", "model.draft", "model.dtype", "task.name", "task.n_prompts", "decoder.max_new_tokens",
             "device_name", "num_threads")
# Decoder settings that may distinguish variants of one decoder (ablations).
VARIANT_KEYS = ("gamma", "beam_width", "tau", "temperature", "top_k", "top_p", "accept", "proposer", "mode", "select",
                "reference", "k_config", "replacement", "block_top_p")
# Decoder keys that rows written before them lack, and the value those rows ran with (VERIFIERS.md §4)
LATE_DEFAULTS = {**HASHED_LATE_KEYS, **LATE_KEYS}
# Measurement settings that, when they differ within one file, also split a decoder's rows (short names).
SETTING_LABELS = {"model.draft": "draft", "model.dtype": "dtype", "decoder.max_new_tokens": "tokens",
                  "task.n_prompts": "prompts", "device_name": "on", "num_threads": "threads"}
PAPER_DEFAULTS = {"decoder.gamma": 4, "decoder.beam_width": 4, "decoder.tau": 0.5, "decoder.temperature": 1.0,
                  "decoder.top_p": 0.9}
DIVERSITY = (("distinct_1", "distinct-1"), ("distinct_2", "distinct-2"), ("distinct_3", "distinct-3"),
             ("rep_3", "rep-3"))
NOTE_COLUMNS = ("timestamp", "n_prompts", "seed", "git_sha", "versions.torch", "versions.transformers",
                "versions.mtad", "metrics.per_position_acceptance", "metrics.energy_source", "run_id", "run_dir",
                "git_dirty", "timing.interleaved", "timing.load_start", "timing.load_end", "timing.cpus",
                "publication.name", "publication.override")
# row metrics that seeds pool over (sums); the diversity metrics are means over seeds
SUMS = ("total_decode_s", "total_tokens", "target_forwards", "energy_j", "ppl_n_samples", "forward_time_s")
CALLS_PREFIX = "metrics.forward_calls."
# figure columns of the slim frame and the metrics they are read from
_METRICS = (("ppl", "metrics.ppl_mean_logprob"), ("ms_per_token", "metrics.ms_per_token"),
            ("j_per_token", "metrics.energy_j_per_token"), ("block_efficiency", "metrics.block_efficiency"),
            ("acceptance_rate", "metrics.acceptance_rate"),
            *((k, f"metrics.{k}") for k, _ in DIVERSITY), *((k, f"metrics.{k}") for k in SUMS))


# ------------------------------------------------------------------------------------------- values
def col(frame, name: str, default: Any = None):
    """``frame[name]``, or a column of ``default`` where the frame lacks it."""
    import pandas as pd  # heavy optional dependency: only the tables need it

    return frame[name] if name in frame.columns else pd.Series([default] * len(frame), index=frame.index)


def num(value: Any) -> float | None:
    """``value`` as a float; None for a missing, non-numeric or NaN value."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def int_or_none(x: Any) -> int | None:
    return None if num(x) is None else int(x)


def hashable(value: Any) -> Any:
    """Lists as tuples and NaN as None, so that cell values compare and group."""
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; None when either is missing or ``b`` is 0."""
    return a / b if a is not None and b not in (None, 0.0) else None


def join_columns(df) -> list[str]:
    return [k for k in JOIN_KEYS if k in df.columns]


# ------------------------------------------------------------------------------------------- the frame
def prepare(frame, keep: Sequence[str] = (), search: Sequence[str | Path] = (), profiles=None):
    """A slim frame with the columns every table reads: ``pair decoder variant task ppl score score_name
    ms_per_token j_per_token block_efficiency acceptance_rate speedup energy_ratio`` (None where a run lacks
    the figure), the join keys, ``decoder.*`` settings, a few bookkeeping columns and ``keep``; duplicates of
    one configuration and seed reduced to the latest row, seeds pooled; ``speedup``/``energy_ratio`` joined
    in, with their intervals (``speedup_ci``, ``energy_ratio_ci``: :class:`mtad.report.stats.Interval` or None)
    from the runs' per-prompt records (``run_dir`` resolved against ``search``), and the cost model's
    ``predicted_ms`` and ``proj_speedup`` (``profiles``: a list of :class:`mtad.measure.costmodel.Profile`; default:
    every profile under ``<search>/profiles`` and ``results/profiles``)."""
    df = _slim(_checked(frame), keep)
    df["variant"] = _variants(df)
    df = _pool_seeds(_latest_per_config(df))
    df = add_intervals(add_baseline_ratios(df), search)
    return add_cost_model(df, default_profiles(search) if profiles is None else profiles)


def _checked(frame):
    if frame is None or len(frame) == 0:
        raise ValueError("no result rows to tabulate: run the experiment first (python -m mtad.harness.sweep)")
    for need in ("decoder.name", "model.name", "task.name"):
        if need not in frame.columns:
            raise ValueError(f"result rows lack the column {need!r}: they are not mtad result rows")
    return frame


def _slim(frame, keep: Sequence[str]):
    df = frame.copy().reset_index(drop=True)
    for key, default in LATE_DEFAULTS.items():  # older rows ran with the default of a key they lack
        if key in df.columns:
            df[key] = [default if hashable(v) is None else v for v in df[key]]
    df["pair"], df["decoder"], df["task"] = df["model.name"], df["decoder.name"], df["task.name"]
    df["score_name"] = col(df, "metrics.score_name")
    df["score"] = [num(r.get(f"metrics.score.{r['score_name']}")) if isinstance(r["score_name"], str) else None
                   for _, r in df.iterrows()]
    for new, old in _METRICS:
        df[new] = [num(v) for v in col(df, old)]
    call_cols = [c for c in df.columns if c.startswith(CALLS_PREFIX)]
    df["forward_calls"] = [{c[len(CALLS_PREFIX):]: int(r[c]) for c in call_cols if num(r[c])} or None
                           for _, r in df[call_cols].iterrows()] if call_cols else None
    wanted = ["pair", "decoder", "task", "score_name", "score", "ppl", "ms_per_token", "j_per_token",
              "block_efficiency", "acceptance_rate", *(k for k, _ in DIVERSITY), *SUMS, "forward_calls",
              *JOIN_KEYS, *NOTE_COLUMNS, *keep, *(c for c in df.columns if c.startswith("decoder."))]
    return df[[c for c in dict.fromkeys(wanted) if c in df.columns]].copy()


def _variants(df) -> list[str]:
    """``decoder`` plus the decoder settings that differ between this decoder's rows, e.g. ``mtad (tau=0.3)``,
    plus any measurement setting that differs within the frame, e.g. ``greedy [on=NVIDIA H200]``."""
    labels = list(df["decoder"])
    for name in set(df["decoder"]):
        rows = df[df["decoder"] == name]
        varying = [k for k in VARIANT_KEYS if f"decoder.{k}" in df.columns
                   and len({hashable(v) for v in rows[f"decoder.{k}"]}) > 1]
        threshold = "decoder.accept" in df.columns and any(v == "threshold" for v in rows["decoder.accept"])
        if name == BASELINE and threshold and "accept" not in varying:
            varying.insert(0, "accept")
        for i, row in rows.iterrows():
            if varying:
                labels[i] = f"{name} (" + ", ".join(f"{k}={_fmt_setting(row[f'decoder.{k}'])}" for k in varying) + ")"
    drafted = [not _draft_free(r) for _, r in df.iterrows()]  # a draft-free row's draft=none splits nothing
    settings = [c for c in SETTING_LABELS if c in df.columns
                and len({hashable(v) for v in (df[c][drafted] if c == "model.draft" else df[c])}) > 1]
    if settings:
        labels = [f"{label} [" + ", ".join(f"{SETTING_LABELS[c]}={_fmt_setting(df.at[i, c])}" for c in settings) + "]"
                  for i, label in enumerate(labels)]
    return labels


def _draft_free(row) -> bool:
    """A row decoded by a draft-free proposer (decoder.proposer=ngram): its config records no draft."""
    return hashable(row.get("decoder.proposer")) == "ngram"


def _fmt_setting(value: Any) -> str:
    value = hashable(value)
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _latest_per_config(df):
    keys = join_columns(df) + ["variant"] + (["seed"] if "seed" in df.columns else [])
    order = df.sort_values("timestamp") if "timestamp" in df.columns else df
    dedup = order.drop_duplicates(subset=keys, keep="last")
    if len(dedup) < len(df):
        log.info("kept the latest of %d repeated measurements of one configuration", len(df) - len(dedup))
    return dedup.sort_index().reset_index(drop=True)


# ------------------------------------------------------------------------------------------- seeds
def _pool_seeds(df):
    """One row per configuration: runs at several seeds (a ``seed`` sweep) pooled into the latest one's row
    (:func:`_pooled`). ``run_dirs``/``seeds`` list the pooled runs."""
    import pandas as pd  # heavy optional dependency: only the tables need it

    keys = join_columns(df) + ["variant"]
    out = []
    for _, g in df.groupby([df[k].map(lambda v: str(hashable(v))) for k in keys], sort=False):
        last = g.sort_values("timestamp") if "timestamp" in g.columns else g
        row = dict(last.iloc[-1].to_dict(), _order=g.index.min())
        row["run_dirs"] = list(g["run_dir"]) if "run_dir" in g.columns else [None] * len(g)
        row["seeds"] = [None if num(x) is None else int(x) for x in col(g, "seed")]
        out.append(_pooled(row, g) if len(g) > 1 else row)
    out.sort(key=lambda r: r.pop("_order"))
    return pd.DataFrame(out)


def _pooled(row: dict, g) -> dict:
    """ms/token, J/token and block efficiency become ratios of the summed times, energies, tokens and target
    forwards; perplexity the exp of the pooled mean log-probability (weighted by scored samples); score and
    diversity the prompt-weighted means; acceptance the target-forward-weighted mean **[choice: rows do
    not record the proposed-token total]**."""
    for name in SUMS + ("n_prompts",):
        vals = [num(v) for v in col(g, name)]
        row[name] = None if any(v is None for v in vals) else sum(vals)
    tokens = row["total_tokens"]
    row["ms_per_token"] = ratio(1e3 * row["total_decode_s"], tokens) if row["total_decode_s"] is not None else None
    row["j_per_token"] = ratio(row["energy_j"], tokens)
    row["block_efficiency"] = ratio(tokens, row["target_forwards"])
    logs = [(num(p), num(n) or 0.0) for p, n in zip(col(g, "ppl"), col(g, "ppl_n_samples"))]
    if logs and all(p is not None and p > 0 for p, _ in logs) and sum(n for _, n in logs):
        row["ppl"] = math.exp(sum(math.log(p) * n for p, n in logs) / sum(n for _, n in logs))
    row["score"] = _weighted_mean(g, "score", "n_prompts")
    row["acceptance_rate"] = _weighted_mean(g, "acceptance_rate", "target_forwards")
    for name, _ in DIVERSITY:
        row[name] = _weighted_mean(g, name, "n_prompts")
    calls: dict = {}
    for c in col(g, "forward_calls"):
        for k, v in (c or {}).items():
            calls[k] = calls.get(k, 0) + v
    row["forward_calls"] = calls or None
    return row


def _weighted_mean(g, name: str, weight: str) -> float | None:
    pairs = [(num(v), num(w) or 0.0) for v, w in zip(col(g, name), col(g, weight))]
    if any(v is None for v, _ in pairs) or not sum(w for _, w in pairs):
        return None
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)


# ------------------------------------------------------------------------------------------- baselines
def where_mask(df, where: dict):
    """The rows whose settings equal ``where`` ({column: value}); a row that lacks a key of
    :data:`LATE_DEFAULTS` (written before it existed) counts as having its default."""
    import pandas as pd  # heavy optional dependency: only the tables need it

    mask = pd.Series(True, index=df.index)
    for k, v in where.items():
        if k not in df.columns:
            mask &= LATE_DEFAULTS.get(k) == v
        else:
            mask &= df[k].map(lambda x, k=k: LATE_DEFAULTS.get(k) if hashable(x) is None else x) == v
    return mask


def baseline_of(df, row, decoder: str = BASELINE, where: dict | None = None):
    """The row of ``decoder`` measured under the same JOIN_KEYS as ``row`` (same gamma preferred, then the
    latest); None when there is none. ``where`` ({column: value}) picks a variant, e.g.
    ``{"decoder.accept": "block"}``; by default a ``speculative`` baseline is the lossless token-wise rule
    with a draft model (not block verification, not the n-gram proposer)."""
    if where is None and decoder == BASELINE:
        where = {"decoder.accept": "lossless", "decoder.proposer": "draft"}
    mask = (df["decoder"] == decoder) & where_mask(df, where or {})
    for k in join_columns(df):  # null-safe equality: a missing value matches a missing value
        if k == "model.draft" and _draft_free(row):
            continue  # a draft-free proposer ran on the pair with its draft left out: any draft's baseline
        want = hashable(row[k])
        mask &= df[k].map(lambda v, want=want: hashable(v) == want).astype(bool)
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


def add_baseline_ratios(df, decoder: str = BASELINE):
    """Add ``speedup`` and ``energy_ratio`` of every row against its ``decoder`` baseline row."""
    speed, energy = [], []
    for _, row in df.iterrows():
        base = baseline_of(df, row, decoder)
        speed.append(ratio(base["ms_per_token"], row["ms_per_token"]) if base is not None else None)
        energy.append(ratio(base["j_per_token"], row["j_per_token"]) if base is not None else None)
    out = df.copy()
    out["speedup"], out["energy_ratio"] = speed, energy
    return out


_FIGURES = ("ppl", "score", "ms_per_token", "j_per_token")


def cell_change(kind: str, m, b) -> float | None:
    """Row ``m`` against baseline row ``b`` from their row-level figures: ``ppl_change``/``score_change``
    (% change), ``speedup``/``energy_ratio`` (baseline cost / row cost), ``energy_saving`` (%) or
    ``distinct2_diff`` (distinct-2 of the row minus the baseline's)."""
    if kind == "distinct2_diff":
        d_m, d_b = num(m.get("distinct_2")), num(b.get("distinct_2"))
        return d_m - d_b if d_m is not None and d_b is not None else None
    m, b = {k: num(m[k]) for k in _FIGURES}, {k: num(b[k]) for k in _FIGURES}
    if kind == "ppl_change":
        r = ratio(m["ppl"], b["ppl"])
        return 100 * (r - 1) if r is not None else None
    if kind == "score_change":
        r = ratio(m["score"], b["score"])
        return 100 * (r - 1) if r is not None else None
    if kind == "speedup":
        return ratio(b["ms_per_token"], m["ms_per_token"])
    if kind == "energy_ratio":
        return ratio(b["j_per_token"], m["j_per_token"])
    if kind == "energy_saving":
        r = ratio(m["j_per_token"], b["j_per_token"])
        return 100 * (1 - r) if r is not None else None
    raise ValueError(f"unknown claim kind {kind!r}")


# ------------------------------------------------------------------------------------------- intervals
def add_intervals(df, search: Sequence[str | Path] = ()):
    """``records`` (pooled per-prompt records of every row, None when a run's ``samples.jsonl`` is gone),
    ``n`` (prompts with records, else the row's prompts) and the intervals of ``speedup``/``energy_ratio``."""
    out = df.copy()
    search = [*search, Path.cwd()]
    out["records"] = [stats.samples_for(r["run_dirs"], r["score_name"] if isinstance(r["score_name"], str)
                                        else None, search) for _, r in df.iterrows()]
    out["n"] = [len(rec) if rec is not None else int_or_none(r.get("n_prompts")) for rec, (_, r)
                in zip(out["records"], df.iterrows())]
    out["n_seeds"] = [len(r) for r in out["run_dirs"]]
    speed, energy = [], []
    for _, row in out.iterrows():
        base = baseline_of(out, row)
        rec = (row["records"], base["records"]) if base is not None else (None, None)
        speed.append(stats.compare("speedup", *rec) if row["speedup"] is not None else None)
        energy.append(stats.compare("energy_ratio", *rec) if num(row["energy_ratio"]) is not None else None)
    out["speedup_ci"], out["energy_ratio_ci"] = speed, energy
    return out


# ------------------------------------------------------------------------------------------- cost model
def default_profiles(search: Sequence[str | Path] = ()) -> list:
    """Every cost profile under ``<search>/profiles`` and the repository's ``results/profiles``."""
    dirs = dict.fromkeys(Path(d).resolve() / "profiles" for d in [*search, REPO_ROOT / "results"])
    return find_profiles(list(dirs))


def add_cost_model(df, profiles: Sequence = ()):
    """``predicted_ms``: ms/token from the row's forward counts under the profile measured on its hardware
    for its pair (None without one, or for rows from before counts were recorded); ``proj_speedup``: the
    speed-up vs the baseline projected under the declared profile; ``proj_other``: {profile label: projected
    ms/token} under measured profiles of the pair on other hardware."""
    out, declared = df.copy(), declared_profile()
    cols = [_predictions(r, profiles, declared) for _, r in df.iterrows()]
    out["predicted_ms"], out["proj_units"], out["proj_other"] = ([c[i] for c in cols] for i in range(3))
    proj = []
    for _, r in out.iterrows():
        base = baseline_of(out, r)
        proj.append(ratio(base["proj_units"], r["proj_units"]) if base is not None and r["proj_units"] else None)
    out["proj_speedup"] = proj
    return out


def _predictions(r, profiles: Sequence, declared) -> tuple[float | None, float | None, dict]:
    """(ms/token under the row's own profile, under the declared one, {label: under other hardware})."""
    calls, tokens = r.get("forward_calls"), int_or_none(r.get("total_tokens"))
    if not calls or not tokens:
        return None, None, {}
    match = [p for p in profiles if p.matches(r.get("device_name"), r["pair"], r.get("num_threads"))]
    own = predict(calls, tokens, match[-1], r["decoder"]) if match else None
    units = predict(calls, tokens, declared, r["decoder"])
    return own, units, {p.label(): predict(calls, tokens, p, r["decoder"]) for p in profiles
                        if p.kind == "measured" and p.pair == r["pair"] and p.hardware != r.get("device_name")}

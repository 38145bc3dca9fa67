"""Forecasts from replayed acceptance and a cost profile, with intervals over the prompts.

For a decoder setting, its replay records on a workload (:mod:`.replay`) and a profile (:mod:`.costs`):

    predicted ms/token = Σ_prompts cost(record) / Σ_prompts tokens          (a ratio of sums, as tables compute it)

and a speed-up over a baseline setting is the ratio of two such figures on the same prompts. Intervals are the
project's paired bootstrap over prompts (:mod:`mtad.report.stats`): they carry the prompts' spread of accepted
lengths and forward counts, not the profile's own error (a calibration's spread is reported beside it).
Quality costs come from the same records: perplexity change and distinct-2 difference against a baseline.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mtad.report import stats
from mtad.study.forecast.costs import CostProfile


def _join(a: Sequence[Mapping], b: Sequence[Mapping]) -> tuple[list[Mapping], list[Mapping]]:
    """The records of the prompts both lists hold, in one order."""
    bi = {r["id"]: r for r in b}
    keys = [r["id"] for r in a if r["id"] in bi]
    ai = {r["id"]: r for r in a}
    return [ai[k] for k in keys], [bi[k] for k in keys]


def ms_per_token(recs: Sequence[Mapping], decoder: str, prof: CostProfile) -> list[float]:
    """[point, low, high] of the predicted ms/token over the records' prompts."""
    cost = [prof.cost(r, decoder) for r in recs]
    toks = [r["n_tokens"] for r in recs]
    return stats.ratio_interval(cost, toks, key=stats.cell_key("forecast", cost, toks))


def speedup(recs: Sequence[Mapping], decoder: str, base: Sequence[Mapping], base_decoder: str,
            prof: CostProfile) -> list[float]:
    """[point, low, high] of how much faster ``recs`` are predicted to decode than ``base`` (paired prompts)."""
    a, b = _join(recs, base)
    ca = np.array([prof.cost(r, decoder) for r in a])
    cb = np.array([prof.cost(r, base_decoder) for r in b])
    ta = np.array([r["n_tokens"] for r in a], dtype=float)
    tb = np.array([r["n_tokens"] for r in b], dtype=float)
    point = (cb.sum() / tb.sum()) / (ca.sum() / ta.sum())
    if len(a) < stats.MIN_PAIRS:
        return [float(point), None, None]
    idx = stats.resample_indices(len(a), stats.cell_key("forecast-speedup", ca, cb, ta, tb))  # (B, n)
    dist = (cb[idx].sum(1) / tb[idx].sum(1)) / (ca[idx].sum(1) / ta[idx].sum(1))
    low, high = stats.percentile_interval(dist)
    return [float(point), float(low), float(high)]


def tokens_per_step(recs: Sequence[Mapping]) -> list[float]:
    """[point, low, high] of tokens committed per verification step (block efficiency without prefills)."""
    toks, steps = [r["n_tokens"] for r in recs], [r["steps"] for r in recs]
    return stats.ratio_interval(toks, steps, key=stats.cell_key("tokens-per-step", toks, steps))


def _per_prompt(recs: Sequence[Mapping]) -> dict[tuple, dict]:
    out = {}
    for r in recs:
        ids = r.get("output_ids") or []
        out[(r["id"], 0)] = {"mean_logprob": r.get("mean_logprob"), "n_tokens": r["n_tokens"],
                             "bigrams": list(zip(ids, ids[1:]))}
    return out


def quality(recs: Sequence[Mapping], base: Sequence[Mapping]) -> dict[str, list | None]:
    """Perplexity change (%) and distinct-2 difference against ``base`` on the same prompts, with intervals."""
    a, b = _join(recs, base)
    out = {}
    lp_a = [r["mean_logprob"] for r in a]
    lp_b = [r["mean_logprob"] for r in b]
    if all(x is not None for x in lp_a + lp_b) and a:
        iv = stats.bootstrap_interval("ppl_change", [lp_a], [lp_b])
        out["ppl_change"] = [iv.point, iv.low, iv.high]
    else:
        out["ppl_change"] = None
    iv = stats.distinct2_diff(_per_prompt(a), _per_prompt(b))
    out["distinct2_diff"] = [iv.point, iv.low, iv.high] if iv.point is not None else None
    return out


def forecast(recs: Sequence[Mapping], decoder: str, prof: CostProfile,
             baselines: Mapping[str, tuple[Sequence[Mapping], str]]) -> dict:
    """Everything a forecast prints for one setting: ms/token, tokens per step, speed-up over each baseline
    (``{label: (records, decoder)}``) and the quality change against each."""
    out = {"ms_per_token": ms_per_token(recs, decoder, prof), "tokens_per_step": tokens_per_step(recs),
           "prompts": len(recs), "tokens": sum(r["n_tokens"] for r in recs)}
    for label, (base, base_dec) in baselines.items():
        out[f"speedup_vs_{label}"] = speedup(recs, decoder, base, base_dec, prof)
        out[f"quality_vs_{label}"] = quality(recs, base)
    return out

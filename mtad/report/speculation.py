"""Result rows -> SPEED-Bench's speculation profile (``specdec_bench`` schema 1.0, VERIFIERS.md §5).

``python -m mtad.results profile RESULTS.jsonl`` prints it (:mod:`mtad.results`). A profile describes one
*method*: the speculative-family rows of one pair and one decoder setting (decoder, accept rule, proposer,
gamma), pooled over their tasks, which also appear one by one under ``per_category``. Each row carries its
``metrics.acceptance_profile`` (:func:`mtad.measure.metrics.acceptance_profile`); the histograms are summed
and the rates recomputed from the sum. ``validation`` repeats SPEED-Bench's two checks: ``mean_consistency``
(AL = 1 + Σ marginals, |Δ| <= 0.02) and ``marginal_monotonicity`` (non-increasing marginals, slack 1e-9).

The profile is measured acceptance. Replaying it in vLLM's or SGLang's synthetic-acceptance mode gives a
serving throughput that is a **projection** for that engine and hardware, not a measurement of this harness.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from mtad.measure.metrics import MEAN_CONSISTENCY_TOLERANCE, check_profile

SCHEMA_VERSION = "1.0"
MONOTONICITY_SLACK = 1e-9
PROJECTION_NOTE = ("measured acceptance on this harness; a throughput obtained by replaying it in an engine's "
                   "synthetic-acceptance mode is a projection, not a measurement")


class ProfileError(ValueError):
    """Rows that cannot give a profile: none speculative, none with profiles, or several methods."""


def method_key(row: Mapping[str, Any]) -> tuple:
    """(pair, decoder, accept, proposer, gamma): the rows of one method share it."""
    d = row.get("decoder") or {}
    return ((row.get("model") or {}).get("name"), d.get("name"), d.get("accept", "lossless"),
            d.get("proposer", "draft"), d.get("gamma"))


def describe(key: tuple) -> str:
    pair, name, accept, proposer, gamma = key
    return f"--pair {pair} --decoder {name} --accept {accept} --proposer {proposer} --gamma {gamma}"


def speculative_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Rows of decoders that propose draft tokens (``metrics.acceptance_rate`` or a profile present)."""
    return [r for r in rows if (r.get("metrics") or {}).get("acceptance_rate") is not None
            or (r.get("metrics") or {}).get("acceptance_profile")]


def select(rows: Sequence[Mapping[str, Any]], **want: Any) -> list[Mapping[str, Any]]:
    """The speculative rows of the one method left after filtering on ``pair decoder accept proposer gamma
    task`` (None: any); :class:`ProfileError` naming the choices when none or several are left."""
    spec = speculative_rows(rows)
    if not spec:
        raise ProfileError("no speculative-family rows (none has an acceptance rate): a profile needs rows of "
                           "speculative, mtad, specinfer or mmtad runs")
    fields = ("pair", "decoder", "accept", "proposer", "gamma")
    keep = [r for r in spec if all(want.get(f) is None or str(want[f]) == str(v)
                                   for f, v in zip(fields, method_key(r)))
            and (want.get("task") is None or (r.get("task") or {}).get("name") == want["task"])]
    methods = list(dict.fromkeys(method_key(r) for r in keep))
    if not methods:
        have = "; ".join(describe(k) for k in dict.fromkeys(method_key(r) for r in spec))
        raise ProfileError(f"no speculative row matches the selection; the rows hold: {have}")
    if len(methods) > 1:
        raise ProfileError(f"the rows hold {len(methods)} methods, a profile describes one: pick it with "
                           + "; or ".join(describe(k) for k in methods))
    missing = [r for r in keep if not (r.get("metrics") or {}).get("acceptance_profile")]
    if missing:
        raise ProfileError(f"{len(missing)} of {len(keep)} rows of {describe(methods[0])} have no "
                           "metrics.acceptance_profile (rows written before profiles were recorded): rerun them")
    return keep


def pooled(profiles: Sequence[Mapping[str, Any]]) -> dict:
    """The sum of several rows' histograms, with the rates and the per-step mean recomputed from it; the
    per-request mean is the step-weighted mean of theirs."""
    K = max(max(int(p["num_speculative_tokens"]), max(map(int, p["acceptance_length_histogram"]), default=1) - 1)
            for p in profiles)  # a histogram longer than its declared K widens K
    hist = [0] * (K + 1)
    for p in profiles:
        for L, c in p["acceptance_length_histogram"].items():
            hist[int(L) - 1] += int(c)
    n = sum(hist)
    marg = [sum(hist[i:]) / n for i in range(1, K + 1)] if n else [0.0] * K
    cond = [marg[0] if i == 0 else (marg[i] / marg[i - 1] if marg[i - 1] > 0 else 0.0) for i in range(K)]
    per_req = [(p["mean_accept_length_per_request"], p["steps"]) for p in profiles
               if p.get("mean_accept_length_per_request") is not None]
    return {"num_speculative_tokens": K, "steps": n,
            "truncated_steps": sum(p.get("truncated_steps", 0) for p in profiles),
            "acceptance_length_histogram": {str(L + 1): c for L, c in enumerate(hist)},
            "conditional_accept_rates": cond, "marginal_accept_rates": marg,
            "mean_accept_length": sum((L + 1) * c for L, c in enumerate(hist)) / n if n else None,
            "mean_accept_length_per_request": (sum(m * s for m, s in per_req) / sum(s for _, s in per_req)
                                               if per_req and sum(s for _, s in per_req) else None)}


def monotonicity(marginals: Sequence[float], slack: float = MONOTONICITY_SLACK) -> dict:
    bad = [i for i in range(1, len(marginals)) if marginals[i] > marginals[i - 1] + slack]
    return {"passed": not bad, "violations": bad}


def _model_id(spec: Any) -> str | None:
    """An org/model id or a repository-relative folder; never an absolute path (its last part instead)."""
    if not spec:
        return None
    p = PurePath(str(spec))
    return p.name if p.is_absolute() else str(spec)


def method_name(row: Mapping[str, Any]) -> str:
    d = row.get("decoder") or {}
    if d.get("proposer") == "ngram":
        return "ngram" if d.get("name") == "speculative" else f"ngram_{d.get('name')}"
    return "draft_model" if d.get("name") == "speculative" else str(d.get("name"))


def build_profile(rows: Sequence[Mapping[str, Any]], **want: Any) -> dict:
    """The ``speculation_profile.json`` of the one method selected from ``rows`` (see :func:`select`)."""
    keep = select(rows, **want)
    first, d = keep[0], keep[0].get("decoder") or {}
    prof = pooled([r["metrics"]["acceptance_profile"] for r in keep])
    per_task: dict[str, list] = {}
    for r in keep:
        per_task.setdefault((r.get("task") or {}).get("name"), []).append(r["metrics"]["acceptance_profile"])
    lossless_chain = method_name(first) == "draft_model" and d.get("accept", "lossless") == "lossless"
    model = first.get("model") or {}
    K = prof["num_speculative_tokens"]
    stored = [(p.get("mean_accept_length"), p["steps"]) for p in (r["metrics"]["acceptance_profile"] for r in keep)]
    if all(m is not None for m, _ in stored) and sum(s for _, s in stored):
        # the rows' own per-step means against the marginals of their summed histograms
        prof["mean_accept_length"] = sum(m * s for m, s in stored) / sum(s for _, s in stored)
    consistency = check_profile(prof, MEAN_CONSISTENCY_TOLERANCE)
    return {
        "schema_version": SCHEMA_VERSION, "measured": True, "method": method_name(first),
        "draft_checkpoint": None if d.get("proposer") == "ngram" else _model_id(model.get("draft")),
        "target_model": _model_id(model.get("target") or (model.get("info") or {}).get("target")),
        "num_speculative_tokens": K, "block_size": None, "max_supported_k": K,
        "verification_method": "block" if d.get("accept") == "block" else "longest_prefix",
        "conditional_accept_rates": prof["conditional_accept_rates"],
        "marginal_accept_rates": prof["marginal_accept_rates"],
        "mean_accept_length": prof["mean_accept_length"],
        "mean_accept_length_per_request": prof["mean_accept_length_per_request"],
        # chain_analytic extrapolates a lossless token-wise chain of a draft model across K (SPEED-Bench: for
        # draft_model); block, lossy and joint rules and the n-gram proposer do not extrapolate (VERIFIERS.md §5)
        "accept_length_model": "chain_analytic" if lossless_chain else "measured_per_k",
        "accept_length_by_k": {str(K): prof["mean_accept_length"]},
        "acceptance_length_histogram": prof["acceptance_length_histogram"],
        "per_category": {t: {k: v for k, v in pooled(ps).items() if k != "truncated_steps"}
                         for t, ps in per_task.items()},
        "measurement_conditions": {
            "pair": model.get("name"), "decoder": d.get("name"), "accept": d.get("accept", "lossless"),
            "proposer": d.get("proposer", "draft"), "gamma": d.get("gamma"), "temperature": d.get("temperature"),
            "top_k": d.get("top_k"), "top_p": d.get("top_p"), "tau": d.get("tau") if d.get("name") == "mtad" else None,
            "max_new_tokens": d.get("max_new_tokens"), "tasks": sorted(str(t) for t in per_task),
            "prompts": sum(int(r.get("n_prompts") or 0) for r in keep), "steps": prof["steps"],
            "truncated_steps": prof["truncated_steps"],
            "hardware": sorted({str(r.get("device_name")) for r in keep}),
            "lossless": d.get("accept", "lossless") in ("lossless", "block") and d.get("name") == "speculative",
            "note": PROJECTION_NOTE},
        "validation": {"mean_consistency": consistency,
                       "marginal_monotonicity": monotonicity(prof["marginal_accept_rates"]),
                       "rows": _row_checks(keep)},
    }


def _row_checks(rows: Sequence[Mapping[str, Any]]) -> dict:
    """Each row's own stored profile re-checked: its consistency and that its histogram and rates agree."""
    bad = []
    for r in rows:
        p = r["metrics"]["acceptance_profile"]
        again = pooled([p])
        if not check_profile(p)["passed"] or any(abs(a - b) > 1e-9 for a, b in
                                                 zip(again["marginal_accept_rates"], p["marginal_accept_rates"])) \
                or len(again["marginal_accept_rates"]) != len(p["marginal_accept_rates"]):
            bad.append(r.get("run_id") or (r.get("task") or {}).get("name"))
    return {"passed": not bad, "inconsistent_rows": bad}


def passed(profile: Mapping[str, Any]) -> bool:
    v = profile["validation"]
    return all(v[k]["passed"] for k in ("mean_consistency", "marginal_monotonicity", "rows"))

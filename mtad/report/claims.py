"""The paper's claims with their published figures (docs/PAPER.md), and our verdict on each.

Each headline claim (:data:`CLAIMS`, with the paper version it comes from) is measured by the same comparison
on the frame of :func:`mtad.report.frame.prepare`: over every comparable (pair, task) cell, the geometric
mean of ratios or the arithmetic mean of percentage changes, with the interval from the cells' bootstrap
distributions combined resample by resample (:func:`mtad.report.stats.aggregate`). :data:`PER_RUN` holds
the per-run figures published with the reference implementation, matched to ours by :func:`per_run_rows`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtad.report import stats
from mtad.report.frame import PAPER_DEFAULTS, baseline_of, cell_change, int_or_none, num, where_mask

DASH = "—"  # the mark of a figure we do not have


@dataclass(frozen=True)
class Claim:
    """A headline figure of the paper, as published (source: docs/PAPER.md, "Headline claims")."""

    version: str  # the paper version the figure comes from
    text: str  # the claim as the paper states it
    paper: float | None  # the published number; None for a comparison the paper does not make
    kind: str  # how we measure it: ppl_change | score_change (%), speedup | energy_ratio (x), energy_saving (%)
    versus: str  # our baseline decoder for the comparison
    pairs: tuple[str, ...] = ()  # the pairs the paper measured it on (our model.name); () = any
    method: str = "mtad"
    versus_where: tuple[tuple[str, Any], ...] = ()  # the baseline's variant, e.g. (("decoder.accept", "block"),)
    # the method's variant: the paper's MTAD drafts with a model (a draft-free n-gram proposer is another method)
    method_where: tuple[tuple[str, Any], ...] = (("decoder.proposer", "draft"),)


V24 = "arXiv 2407.09722 v2–v4"
ICLR = "ICLR 2025 camera-ready"
V1 = "arXiv 2407.09722 v1 (MJSD)"
REVIEW = "not in the paper"
_V24_PAIRS = ("opt13b", "opt30b", "llama2-13b", "llama2-70b")
_ICLR_PAIRS = ("llama3-8b", "llama3-8b-instruct")
CLAIMS: tuple[Claim, ...] = (
    Claim(V24, "output perplexity −21.2 % vs single-token sampling", -21.2, "ppl_change", "sampling", _V24_PAIRS),
    # Not the paper's: lower perplexity can be bought with less diversity (colder sampling does both), so the
    # perplexity claim is shown beside the change in distinct-2 it came with.
    Claim(REVIEW, "MTAD vs sampling: distinct-2 change (output diversity)", None, "distinct2_diff", "sampling"),
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
    # Not the paper's: the reviewer's question (VERIFIERS.md §1). Block verification is the lossless joint rule,
    # never worse than token-wise in expectation; does the lossy joint rule beat it, and at what perplexity?
    Claim(REVIEW, "MTAD vs block verification: speed-up", None, "speedup", "speculative",
          versus_where=(("decoder.accept", "block"), ("decoder.proposer", "draft"))),
    Claim(REVIEW, "MTAD vs block verification: perplexity change", None, "ppl_change", "speculative",
          versus_where=(("decoder.accept", "block"), ("decoder.proposer", "draft"))),
)
KIND_TEXT = {"ppl_change": "perplexity change", "score_change": "task score change", "speedup": "speed-up",
             "energy_ratio": "energy ratio (baseline J / method J)", "energy_saving": "energy saved",
             "distinct2_diff": "distinct-2 difference"}
TIMED_KINDS = ("speedup", "energy_ratio", "energy_saving")  # verdicts that need paired (interleaved) timings
PERCENT_KINDS = ("ppl_change", "score_change", "energy_saving")


# ------------------------------------------------------------------------------------------- judging
def claims(df, claim_list: Iterable[Claim] = CLAIMS) -> list[dict]:
    """One dict per claim: the paper's figure, ours (None if unmeasured) with its interval
    (:class:`mtad.report.stats.Interval`), the cells it is over, hardware, and the verdict text."""
    prim = _primary(df)
    return [_judge(c, prim) for c in claim_list]


def by_task(df, c: Claim) -> list[dict]:
    """The claim judged on each task alone (the pooled figure can hide a task where it fails)."""
    prim = _primary(df)
    return [{**_judge(c, prim[prim["task"] == t]), "task": t} for t in sorted(set(prim["task"]))]


def _judge(c: Claim, prim) -> dict:
    cells, on_paper = _cells(prim, c.method, c.versus, c.pairs, c.versus_where, c.method_where)
    ivs = [(m, b, *_cell_interval(c.kind, m, b)) for m, b in cells]
    ivs = [(m, b, iv, has) for m, b, iv, has in ivs if iv.point is not None]
    agg = stats.aggregate(c.kind, [iv for _, _, iv, _ in ivs])
    fallback, pooled = None, False
    undefined = len(ivs) < len(cells) or not agg.has_interval  # a cell's own change is undefined
    if c.kind == "score_change" and len(cells) > 1 and undefined:
        merged = _merged_records(cells)
        iv = stats.compare("score_change", *merged) if all(merged) else None
        if iv is not None and iv.has_interval:  # the change of the summed scores over every cell's prompts
            agg, pooled = iv, True
            ivs = [(m, b, iv, True) for m, b in cells]
    if c.kind == "score_change" and cells and not agg.has_interval:  # undefined relative change: points
        diffs = [stats.compare("score_diff", m.get("records"), b.get("records")) for m, b in cells]
        if all(d is not None and d.point is not None for d in diffs):
            fallback = stats.aggregate("score_diff", diffs)
            ivs = [(m, b, d, True) for (m, b), d in zip(cells, diffs)]
    missing = sorted({f"{r['variant']} · {r['task']}" for m, b, _, has in ivs if not has for r in (m, b)
                      if r.get("records") is None})
    hardware = sorted({str(x) for m, b, _, _ in ivs for x in (m.get("device_name"), b.get("device_name")) if x})
    rows = [r for m, b, _, _ in ivs for r in (m, b)]
    interleaved = bool(rows) and all(was_interleaved(r) for r in rows)
    if c.kind not in TIMED_KINDS or interleaved:  # a verdict is printed: with the interval it reads
        agg, fallback = stats.settle(agg), fallback and stats.settle(fallback)
    return {"version": c.version, "claim": c.text, "paper": c.paper, "kind": c.kind,
            "ours": (fallback.point if fallback else agg.point) if ivs else None,
            "interval": agg if ivs else None, "fallback": fallback, "pooled_prompts": pooled,
            "comparison": f"{c.method} vs {_versus_text(c)}: {KIND_TEXT[c.kind]}", "n_cells": len(ivs),
            "n": agg.n if ivs else 0, "missing": missing,
            "pairs": sorted({m["pair"] for m, _, _, _ in ivs}), "tasks": sorted({m["task"] for m, _, _, _ in ivs}),
            "hardware": hardware, "paper_pairs": on_paper or not c.pairs, "interleaved": interleaved,
            "load": load_text(rows)}


def _versus_text(c: Claim) -> str:
    settings = ", ".join(f"{k.rpartition('.')[2]}={v}" for k, v in c.versus_where)
    return f"{c.versus} ({settings})" if settings else c.versus


def _merged_records(cells) -> tuple[dict | None, dict | None]:
    """The method's and the baseline's per-prompt records of every cell in one pair of dicts (keys prefixed
    by pair and task), so a relative change can be taken over all prompts at once."""
    out = []
    for side in (0, 1):
        recs = [cell[side].get("records") for cell in cells]
        if any(r is None for r in recs):
            out.append(None)
            continue
        out.append({(cell[0]["pair"], cell[0]["task"], *k): v for cell, r in zip(cells, recs) for k, v in r.items()})
    return out[0], out[1]


def _primary(df):
    """For claims: per decoder, the rows at the paper's default settings when an ablation holds several."""
    keep = []
    for _, row in df.iterrows():
        same = df[(df["decoder"] == row["decoder"]) & (df["pair"] == row["pair"]) & (df["task"] == row["task"])]
        if len(same) == 1:
            keep.append(True)
            continue
        keep.append(all(row.get(k) == v for k, v in PAPER_DEFAULTS.items() if k in df.columns
                        and num(row.get(k)) is not None))
    return df[keep]


def _cells(prim, method: str, versus: str, pairs: Sequence[str], where: tuple[tuple[str, Any], ...] = (),
           method_where: tuple[tuple[str, Any], ...] = ()) -> tuple[list[tuple[Any, Any]], bool]:
    """(method row, baseline row) per comparable cell of the ``_primary`` frame (the method's variant picked by
    ``method_where``, the baseline's by ``where``); the bool says whether the paper's pairs were found."""
    on_paper = bool(pairs) and prim["pair"].isin(pairs).any()
    rows = prim[prim["pair"].isin(pairs)] if on_paper else prim
    cells = []
    for _, row in rows[(rows["decoder"] == method) & where_mask(rows, dict(method_where))].iterrows():
        base = baseline_of(prim, row, versus, dict(where) if where else None)
        if base is not None:
            cells.append((row, base))
    return cells, on_paper


def _cell_interval(kind: str, m, b):
    """The cell's comparison as an Interval: bootstrapped from both rows' per-prompt records, else the
    row-level point estimate without an interval (note says why)."""
    point = cell_change(kind, m, b)
    iv = stats.compare(kind, m.get("records"), b.get("records"))
    if iv is None:
        return stats.Interval(point, None, None, int_or_none(m.get("n")) or 0, kind,
                              note="no per-prompt records"), False
    if iv.point is None and point is not None:  # e.g. the records lack the field: keep the row's figure
        return stats.Interval(point, None, None, iv.n, kind, note=iv.note), True
    return iv, True


def verdict(c: dict) -> str:
    """The verdict of the interval **as printed**, holding under the bootstrap's draw
    (:func:`mtad.report.stats.judge`): "significant at n = …" when both printed ends exclude no change,
    "borderline at n = …" when a printed end rounds to it or lies within Monte-Carlo error of rounding to it,
    "not significant at n = …" when it spans it; the reason where there is no interval. A speed or energy claim
    gets a verdict only when every row it compares was decoded interleaved (its ``timing`` says so): timings of
    runs decoded one after another are not paired."""
    iv = c["fallback"] or c["interval"]
    if c["ours"] is None or iv is None:
        return DASH
    if not iv.has_interval:
        if c["missing"]:
            return f"point estimate only: no per-prompt records for {len(c['missing'])} row(s)"
        return f"no interval: {iv.note or 'too few prompts'}"
    if c["kind"] in TIMED_KINDS and not c.get("interleaved"):
        return (f"no speed verdict at n = {iv.n}: the rows do not record being decoded interleaved, so their "
                "timings are not paired")
    what = "score difference" if c["fallback"] else "interval"
    judged = stats.judge(iv)
    if judged == "borderline":
        nc = stats.NO_CHANGE[iv.kind]
        if nc in (stats.printed(iv.low, iv.kind), stats.printed(iv.high, iv.kind)):
            end = "lower" if stats.printed(iv.low, iv.kind) == nc else "upper"
            return f"borderline at n = {iv.n} (the printed {what}'s {end} end is no change)"
        return (f"borderline at n = {iv.n} (the {what}'s {stats.unsettled(stats.settle(iv))} end is within "
                "Monte-Carlo error of rounding to no change)")
    if judged == "not significant":
        return f"not significant at n = {iv.n} ({what} spans no change)"
    return f"significant at n = {iv.n} (95 % {what} excludes no change)"


def was_interleaved(row) -> bool:
    """Whether a row records being decoded interleaved (``timing.interleaved`` true; absent in older rows)."""
    v = row.get("timing.interleaved")
    return isinstance(v, (bool, np.bool_)) and bool(v)


def load_text(rows: Iterable) -> str:
    """The machine's load while rows were timed: the range of their 1-minute load averages at start and end,
    and the CPU count ("load average 1.2–4.4 on 2 CPUs"); "not recorded" for rows written before it was."""
    loads, cpus = [], set()
    for r in rows:
        for k in ("timing.load_start", "timing.load_end"):
            v = r.get(k) if hasattr(r, "get") else None
            if isinstance(v, (list, tuple)) and v:
                loads.append(float(v[0]))
        if num(r.get("timing.cpus")) is not None:
            cpus.add(int(r.get("timing.cpus")))
    if not loads:
        return "load not recorded"
    on = f" on {'/'.join(str(c) for c in sorted(cpus))} CPUs" if cpus else ""
    return f"load average {min(loads):.1f}–{max(loads):.1f}{on}"


# ------------------------------------------------------------------------------------------- per run
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
        score = f"{m['score_name']} {m['score']:.3f}" if num(m.get("score")) is not None else None
        name = p.method + (f" τ={p.tau:g}" if p.tau is not None else "")
        rows.append([p.task, p.pair, name, p.score, score, p.ms_per_token, m.get("ms_per_token"),
                     p.acceptance_rate, m.get("acceptance_rate"), p.block_efficiency, m.get("block_efficiency")])
    return header, rows

"""Render the frame of :func:`mtad.report.frame.prepare` as the paper's tables: ``<name>.md`` and ``.tex``.

- **quality**: rows (pair, decoder), per task the output perplexity (``metrics.ppl_mean_logprob``, the
  paper's aggregation) and the task score (``metrics.score.<metrics.score_name>``); against ``sampling``,
  the perplexity change and score difference with paired 95 % intervals; diversity (distinct-2, rep-3);
- **speed**, one table per task: n, ms/token (measured and predicted by the cost model), speed-up and
  energy ratio vs ``speculative`` with their intervals, the projected speed-up, J/token, block efficiency,
  acceptance rate;
- **claims** (:mod:`mtad.report.claims`): each headline claim beside our figure, ``—`` where we have no
  measurement, and the per-run figures of the reference implementation beside ours;
- a point estimate without an interval (no per-prompt records) is marked ``†`` and its row named under the
  table; every cell carries its n.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mtad.measure.costmodel import declared_profile
from mtad.report import stats
from mtad.report.claims import (
    CLAIMS,
    DASH,
    PERCENT_KINDS,
    TIMED_KINDS,
    by_task,
    claims,
    load_text,
    per_run_rows,
    verdict,
    was_interleaved,
)
from mtad.report.frame import (
    BASELINE,
    DIVERSITY,
    baseline_of,
    cell_change,
    col,
    hashable,
    int_or_none,
    join_columns,
    num,
    prepare,
)
from mtad.report.markdown import interval, table

log = logging.getLogger(__name__)

DECODER_ORDER = ("greedy", "sampling", "speculative", "specinfer", "mtjd", "mtad", "mmtad")
POINT_ONLY = "†"  # a point estimate without an interval (no per-prompt records)
SPEED_COLUMNS = (("n", "n"), ("ms_per_token", "ms/token"), ("predicted_ms", "predicted ms/token"),
                 ("speedup", f"speed-up vs {BASELINE} [95 % CI]"),
                 ("proj_speedup", f"projected speed-up vs {BASELINE}‡"),
                 ("j_per_token", "J/token"), ("energy_ratio", f"energy ratio vs {BASELINE} [95 % CI]"),
                 ("block_efficiency", "block eff."), ("acceptance_rate", "acceptance"))


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
        x = num(tok)
        parts.append((0, x, "") if x is not None else (1, 0.0, tok))
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
    n = int_or_none(r.get("n"))
    if n is None:
        return None
    seeds = r.get("n_seeds") or 1
    return f"{n} × {seeds} seeds" if seeds > 1 else str(n)


def fmt_interval(point: float | None, iv, percent: bool = False, digits: int = 2) -> str:
    """``1.17× [0.95, 1.40]`` / ``−4.0 % [−9.1, +1.2]``; the point marked † when there is no interval."""
    if point is None:
        return DASH
    if iv is None or not iv.has_interval:
        v = (point,)
    else:
        v = (point if iv.point is None else iv.point, iv.low, iv.high)
    if percent:
        return interval(v, 1, unit=" %", signed=True, minus="−", bare=POINT_ONLY)
    return interval(v, digits, unit="×", bare=POINT_ONLY)


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
                cells.append(fmt_interval(num(c[key]), c.get(f"{key}_ci")))
            elif key == "proj_speedup":
                cells.append(None if num(c.get(key)) is None else f"{c[key]:.2f}×")
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
        rows.append([pair, variant] + [None if c is None else num(c.get(k)) for c, (_, k) in zip(cells, cols)])
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
            point = cell_change("ppl_change", c, b)
            cells += [_n_cell(c) if ppl is None else str(ppl.n), fmt_interval(point, ppl, percent=True)]
            if has_score:
                sd = stats.compare("score_diff", c["records"], b["records"])
                sp = num(c["score"]) - num(b["score"]) if None not in (num(c["score"]), num(b["score"])) else None
                cells.append(_fmt_diff(sp, sd))
        if any_base:
            rows.append([pair, variant] + cells)
    return header, rows


def _fmt_diff(point, iv) -> str:
    if point is None:
        return DASH
    v = (point,) if iv is None or not iv.has_interval else (iv.point, iv.low, iv.high)
    return interval(v, 3, signed=True, minus="−", bare=POINT_ONLY)


def missing_records(df) -> list[str]:
    """Rows without per-prompt records (their figures are point estimates, marked †)."""
    return [f"{r['pair']} · {r['variant']} · {r['task']} (run_dir {', '.join(str(d) for d in r['run_dirs'])})"
            for _, r in df.iterrows() if r.get("records") is None]


def _fmt(value: Any, column: str = "") -> str:
    x = num(value) if not isinstance(value, str) else None
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
    if kind == "distinct2_diff":
        return f"{value:+.3f}".replace("-", "−")
    if kind in PERCENT_KINDS:
        return f"{value:+.1f} %".replace("-", "−")
    return f"{value:.2f}×"


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
                     _hardware(c)])
        if c["kind"] == "score_change" and len(c["tasks"]) > 1:  # the downstream claim per task too
            claim = next(x for x in CLAIMS if x.text == c["claim"])
            for t in (t for t in by_task(df, claim) if t["n_cells"]):
                rows.append([c["version"], f"↳ {t['task']} only", paper, c["comparison"], _fmt_claim_ci(t),
                             verdict(t), f"{', '.join(t['pairs'])} × {t['task']} (n = {t['n']})",
                             _hardware(t)])
    return header, rows


def _hardware(c: dict) -> str:
    """The claim's hardware; for a speed or energy claim also how its rows were timed (interleaved or not) and
    the machine's load while they were."""
    hw = "; ".join(c["hardware"]) or DASH
    if c["kind"] not in TIMED_KINDS or not c["n_cells"]:
        return hw
    return f"{hw}; {'interleaved' if c.get('interleaved') else 'not recorded as interleaved'}, {c['load']}"


def _fmt_claim_ci(c: dict) -> str:
    if c["ours"] is None:
        return DASH
    if c["fallback"] is not None:
        return "relative change undefined (a baseline score of 0); score Δ " + _fmt_diff(c["fallback"].point,
                                                                                       c["fallback"])
    if c["kind"] == "distinct2_diff":
        return _fmt_diff(c["ours"], c["interval"])
    text = fmt_interval(c["ours"], c["interval"], percent=c["kind"] in PERCENT_KINDS)
    return text + (" (summed over every cell's prompts: a cell's own change is undefined)"
                   if c.get("pooled_prompts") else "")


# ------------------------------------------------------------------------------------------- markdown
def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return "\n".join(table(header, [[_fmt(v, h) for v, h in zip(row, header)] for row in rows], escape=True))


def _settings_note(df) -> list[str]:
    def values(col: str) -> str:
        if col not in df.columns:
            return DASH
        vals = sorted({str(hashable(v)) for v in df[col] if v is not None}, key=str)
        return ", ".join(vals) if vals else DASH

    notes = [f"- hardware: {values('device_name')}; torch threads: {values('num_threads')}",
             (f"- prompts per run: {values('n_prompts')} (task.n_prompts: {values('task.n_prompts')}); "
              f"max new tokens: {values('decoder.max_new_tokens')}; seed: {values('seed')}"),
             (f"- git: {values('git_sha')}; versions: torch {values('versions.torch')}, transformers "
              f"{values('versions.transformers')}, mtad {values('versions.mtad')}"),
             (f"- {len(df)} runs. PPL = exp(−mean over samples of the mean log-probability) under the raw target. "
              f"speed-up and energy ratio are {BASELINE}'s ms/token (J/token) divided by the row's, joined on "
              f"{', '.join(join_columns(df))}.")]
    return notes


def _uncertainty_note(df) -> list[str]:
    lines = [f"Intervals: 95 % paired bootstrap over prompts (pairs joined on prompt id and turn; seeds pooled "
             f"within a prompt), {stats.N_RESAMPLES} resamples, {stats.METHOD} method, each cell resampled from its "
             f"own generator (a child of seed {stats.SEED} keyed by the cell), pooled figures combining the cells' "
             f"resamples; no interval below {stats.MIN_PAIRS} paired prompts. n = prompts per cell "
             "(× seeds where several were pooled). Verdicts read the interval as printed: significant when both "
             "ends exclude no change, borderline when an end rounds to it or lies within "
             f"{stats.MC_MARGIN:g} Monte-Carlo standard errors of rounding to it after up to {stats.MAX_RESAMPLES} "
             "resamples (an end that close draws more resamples; the interval is printed from them); speed and "
             "energy verdicts only for rows decoded interleaved."]
    if "timing.interleaved" in df.columns:
        timed = [r for _, r in df.iterrows()]
        n_int = sum(was_interleaved(r) for r in timed)
        lines.append(f"Timing: {n_int} of {len(timed)} rows decoded interleaved; {load_text(timed)} while they ran.")
    else:
        lines.append("Timing: the rows do not record how they were timed (interleaved or not) or the machine's load.")
    lines.append(_provenance_note(df))
    missing = missing_records(df)
    if missing:
        lines.append(f"{POINT_ONLY} point estimate only, no interval: {len(missing)} row(s) have no per-prompt "
                     "records (samples.jsonl not found): " + "; ".join(missing[:12])
                     + (f"; and {len(missing) - 12} more" if len(missing) > 12 else "") + ".")
    return lines


def _provenance_note(df) -> str:
    """Which code measured the rows: clean commits checked by the publish step, overrides with their reasons,
    or (rows published before the step existed) how many came from a dirty tree."""
    shas = sorted({str(v)[:10] for v in col(df, "git_sha") if isinstance(v, str)})
    overrides = sorted({str(v) for v in col(df, "publication.override") if isinstance(v, str)})
    checked = [isinstance(v, str) for v in col(df, "publication.name")]
    if overrides:
        return (f"Provenance: **{len(overrides)} override(s) of the publish step's check**: " + "; ".join(overrides)
                + f". Commits: {', '.join(shas) or DASH}.")
    if checked and all(checked):
        return f"Provenance: every row from a clean tree at a commit in the repository's history ({', '.join(shas)})."
    dirty = sum(isinstance(v, (bool, np.bool_)) and bool(v) for v in col(df, "git_dirty"))
    return (f"Provenance: not checked (rows published before the publish step); {dirty} of {len(df)} rows record a "
            f"dirty tree; commits: {', '.join(shas) or DASH}.")


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
    """Every table of the frame as one Markdown document (arguments as for :func:`mtad.report.frame.prepare`)."""
    return _markdown(prepare(frame, search=search, profiles=profiles), title)


def _markdown(df, title: str, claims: tuple | None = None) -> str:
    """The Markdown document of a prepared frame (``claims``: its :func:`claim_rows`, when already made)."""
    parts = [f"# {title}", ""] + _md_quality(df) + _md_speed(df) + _md_claims(df, claims)
    parts += ["## Settings", ""] + _settings_note(df) + ["- " + x for x in _uncertainty_note(df)] + [""]
    return "\n".join(parts)


def _md_section(heading: str, note: str | None, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return [f"## {heading}", ""] + ([note, ""] if note else []) + [_md_table(header, rows), ""]


_VERSUS_SAMPLING_NOTE = ("Perplexity change = PPL(row) / PPL(sampling) − 1; score Δ = score(row) − score(sampling); "
                         "sampling at the paper's settings (T = 1, top-p = 0.9), same pair, task and prompts.")
_DIVERSITY_NOTE = ("distinct-n = distinct n-grams / all n-grams over a run's outputs (token ids); rep-3 = share of a "
                   "sample's trigrams that repeat an earlier one, mean over samples.")
_CLAIMS_NOTE = ("Paper figures as published (docs/PAPER.md); ours aggregate the comparable (pair, task) cells: "
                "geometric mean of ratios, arithmetic mean of percentage changes, the interval from the cells' "
                "bootstrap distributions combined resample by resample. — = not measured here.")
_PER_RUN_NOTE = ("ICLR 2025 camera-ready setting (docs/PAPER.md): 100 new tokens, gamma = 4, W = 4, SpecInfer tree "
                 "[4, 2, 2]; paper scores as published (Spider in %).")


def _md_quality(df) -> list[str]:
    parts = _md_section("Output quality", None, *quality_rows(df))
    header, rows = versus_sampling_rows(df)
    if rows:
        parts += _md_section("Quality against sampling", _VERSUS_SAMPLING_NOTE, header, rows)
    header, rows = diversity_rows(df)
    if len(header) > 2:
        parts += _md_section("Diversity", _DIVERSITY_NOTE, header, rows)
    return parts


def _md_speed(df) -> list[str]:
    parts = []
    for task in _tasks(df):
        parts += _md_section(f"Speed and energy — {task}", None, *speed_rows(df, task))
    return parts + _cost_note(df) + [""]


def _md_claims(df, claims: tuple | None = None) -> list[str]:
    parts = _md_section("The paper's headline claims beside ours", _CLAIMS_NOTE, *(claims or claim_rows(df)))
    header, rows = per_run_rows(df)
    if rows:
        parts += _md_section("Per-run figures published with the reference implementation", _PER_RUN_NOTE,
                             header, rows)
    return parts


# ------------------------------------------------------------------------------------------- LaTeX
_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "×": r"$\times$", "—": "---", "–": "--", "−": "$-$", "τ": r"$\tau$", "γ": r"$\gamma$",
                "†": r"\textdagger{}",
                "↳": r"$\hookrightarrow$", "‡": r"\textdaggerdbl{}", "Δ": r"$\Delta$", "·": r"$\cdot$"}


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


def _latex(df, title: str, claims: tuple | None = None) -> str:
    """The LaTeX tables of a prepared frame (``claims`` as for :func:`_markdown`): booktabs
    (``\\usepackage{booktabs}``), one ``table`` float each; :func:`write_tables` writes them beside the Markdown."""
    # "mtad.table": the wording of every published table, kept so that they re-render byte for byte
    parts = [f"% {title}: generated by mtad.table from result rows; do not edit by hand",
             _tex_table(*quality_rows(df), caption=f"{title}: output perplexity and task score")]
    header, rows = versus_sampling_rows(df)
    if rows:
        parts.append(_tex_table(header, rows, caption=f"{title}: quality against sampling (95 % paired bootstrap)"))
    for task in _tasks(df):
        parts.append(_tex_table(*speed_rows(df, task), caption=f"{title}: speed and energy on {task}. "
                                + " ".join(_cost_note(df)[1:])))
    header, rows = claims or claim_rows(df)
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
    df = prepare(frame, search=search, profiles=profiles)  # once for both documents, and their claims
    claims = claim_rows(df)
    md.write_text(_markdown(df, name, claims))
    tex.write_text(_latex(df, name, claims))
    log.info("wrote %s and %s", md, tex)
    return md, tex

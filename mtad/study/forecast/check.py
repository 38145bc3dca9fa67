"""Forecast against measurement: the table of an ex-ante check (experiments/forecast_check.py).

Reads the registered forecasts (``forecasts.jsonl``, committed before the measurement) and the measured rows with
their per-prompt records, joins them on (pair, setting), and writes ``check.{json,md}``: per setting the forecast
and the measured CPU ms/token, speed-up over sampling and over speculative decoding (γ = 4) with paired 95 %
intervals over prompts, each forecast's error (forecast / measured − 1) and whether the measured interval
contains it; then how many checked forecasts the intervals contain and the largest error. Nothing is re-fitted.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from mtad._util.io import atomic_write
from mtad.report import stats
from mtad.report.markdown import DASH, interval, table
from mtad.study.forecast.spec import from_config, parse

FIGURES = (("ms_per_token", "CPU ms/token", 1), ("speedup_vs_sampling", "vs sampling", 2),
           ("speedup_vs_speculative", "vs speculative γ=4", 2))


def read_jsonl(path: Path) -> list[dict]:
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise ValueError(f"{path}:{i}: not a JSON line") from None
    return out


def measured(rows: list[dict], search: list[Path]) -> dict[tuple[str, str], dict]:
    """(pair, setting) -> its per-prompt records, CPU ms/token and perplexity, from measured rows."""
    recs = {}
    for r in rows:
        key = (r["model"]["name"], str(from_config(r["decoder"])))
        got = stats.samples_for([r.get("run_dir")], None, search)
        if got is None:
            raise ValueError(f"per-prompt records of {key} not found ({r.get('run_dir')}): pass the folder that "
                             "holds the run directories")
        recs[key] = got
    return recs


def compare(forecasts: list[dict], recs: dict[tuple[str, str], dict]) -> list[dict]:
    base_of = {"speedup_vs_sampling": str(parse("sampling")), "speedup_vs_speculative": str(parse("speculative"))}
    out = []
    for f in forecasts:
        mine = recs.get((f["pair"], f["setting"]))
        if mine is None:
            continue
        row = {k: f[k] for k in ("draft", "pair", "setting", "role", "calibrated")}
        ms = [1e3 * v["cpu_s"] for v in mine.values()]
        toks = [v["n_tokens"] for v in mine.values()]
        meas = {"ms_per_token": stats.ratio_interval(ms, toks)}
        for fig, base in base_of.items():
            other = recs.get((f["pair"], base))
            iv = stats.compare("cpu_speedup", mine, other) if other is not None and base != f["setting"] else None
            meas[fig] = [iv.point, iv.low, iv.high] if iv is not None and iv.point is not None else None
        sampling = recs.get((f["pair"], str(parse("sampling"))))
        ppl = stats.compare("ppl_change", mine, sampling) if sampling is not None and f["setting"] != "sampling" \
            else None
        row["measured_ppl_change_vs_sampling"] = [ppl.point, ppl.low, ppl.high] if ppl and ppl.point is not None \
            else None
        row["forecast_ppl_change_vs_sampling"] = (f["forecast"].get("quality_vs_sampling") or {}).get("ppl_change")
        row["prompts"] = len(mine)
        for fig, _, _ in FIGURES:
            fc, m = f["forecast"].get(fig), meas.get(fig)
            if fc is None or m is None or fc[0] is None:
                row[fig] = None
                continue
            row[fig] = {"forecast": fc, "measured": m, "error": fc[0] / m[0] - 1,
                        "contained": m[1] <= fc[0] <= m[2] if m[1] is not None else None}
        out.append(row)
    return out


def ranking(forecasts: list[dict], recs: dict[tuple[str, str], dict]) -> dict:
    """Per draft: the settings ordered by forecast ms/token (the recommendation), the measured order's rank
    correlation with it, and the forecast winner against its runner-up as measured (paired CPU speed-up)."""
    out = {}
    for draft in sorted({f["draft"] for f in forecasts}):
        fs = sorted((f for f in forecasts if f["draft"] == draft and (f["pair"], f["setting"]) in recs),
                    key=lambda f: f["forecast"]["ms_per_token"][0])
        if len(fs) < 2:
            continue
        meas = [stats.ratio_interval([1e3 * v["cpu_s"] for v in recs[(f["pair"], f["setting"])].values()],
                                     [v["n_tokens"] for v in recs[(f["pair"], f["setting"])].values()])[0] for f in fs]
        order = np.argsort(np.argsort(meas))  # measured rank of each forecast-ordered setting
        n = len(fs)
        rho = 1 - 6 * float(np.sum((order - np.arange(n)) ** 2)) / (n * (n * n - 1))
        win, second = fs[0], fs[1]
        iv = stats.compare("cpu_speedup", recs[(win["pair"], win["setting"])],
                           recs[(second["pair"], second["setting"])])
        out[draft] = {"forecast_order": [f["setting"] for f in fs], "measured_ms_per_token": meas,
                      "spearman": rho, "winner": win["setting"], "runner_up": second["setting"],
                      "forecast_winner_vs_runner_up": second["forecast"]["ms_per_token"][0]
                      / win["forecast"]["ms_per_token"][0],
                      "measured_winner_vs_runner_up": [iv.point, iv.low, iv.high] if iv and iv.point else None}
    return out


def summary(points: list[dict]) -> dict:
    checked = [p for p in points if p["role"] == "check"]
    out = {"checked": len(checked), "calibrated_settings_among_checked": sum(p["calibrated"] for p in checked)}
    for fig, _, _ in FIGURES:
        xs = [p[fig] for p in checked if p.get(fig)]
        if xs:
            worst = max(xs, key=lambda x: abs(x["error"]))
            out[fig] = {"points": len(xs), "contained": sum(bool(x["contained"]) for x in xs),
                        "largest_error": worst["error"],
                        "mean_abs_error": sum(abs(x["error"]) for x in xs) / len(xs)}
    return out


def render(res: dict) -> str:
    s = res["summary"]
    head = ["# Forecast against measurement: the ex-ante check", "",
            f"Forecasts registered in `{res['forecasts_file']}` (added in commit "
            f"{(res.get('forecasts_commit') or '—')[:10]}); measured after it, by runs of commit "
            + ", ".join(s[:10] for s in res["git_sha"] if s)
            + (f", published as `{res['publication']}`" if res.get("publication") else "")
            + f"; {res['hardware']}, one thread, CPU time"
            + (f", load average {res['load_1min'][0]:.1f}–{res['load_1min'][1]:.1f} on 2 cores during the runs"
               if res.get("load_1min") else "") + ". Forecast: the setting's hardware-free replay on GSM8K "
            "train prompts × the pair's cost profile, calibrated by its own command on other train prompts at "
            "other settings. Measured: GSM8K test prompts, every setting of a draft interleaved; paired 95 % "
            "intervals over prompts. Error = forecast / measured − 1; ✓ = the measured interval contains the "
            "forecast.", ""]
    lines = [f"**{s['checked']} checked settings** (none calibrated: {s['calibrated_settings_among_checked']} of "
             "them in the profiles' calibration lists)."]
    for fig, label, _ in FIGURES:
        if fig in s:
            x = s[fig]
            lines.append(f"- {label}: the measured interval contains {x['contained']} of {x['points']} forecasts; "
                         f"largest error {100 * x['largest_error']:+.1f} %, mean |error| "
                         f"{100 * x['mean_abs_error']:.1f} %.")
    rows = []
    for p in res["points"]:
        cells = []
        for fig, _, d in FIGURES:
            x = p.get(fig)
            cells.append(DASH if x is None else f"{interval(x['forecast'], d)} / {interval(x['measured'], d)} / "
                         f"{100 * x['error']:+.1f} % {'✓' if x['contained'] else '✗'}")
        q = [interval(p[f"{k}_ppl_change_vs_sampling"], 1) for k in ("forecast", "measured")]
        rows.append([p["draft"], p["setting"], p["role"], *cells, " / ".join(q)])
    tab = ["", *table(["draft", "setting", "role", *(f"{lab}: forecast / measured / error" for _, lab, _ in FIGURES),
                       "perplexity vs sampling: forecast / measured"], rows)]
    rank = ["", "## The recommendation checked: settings ranked by forecast, then measured", ""]
    for draft, r in res.get("ranking", {}).items():
        m = r["measured_winner_vs_runner_up"]
        rank.append(f"- {draft}: forecast winner `{r['winner']}`, runner-up `{r['runner_up']}` (forecast "
                    f"{r['forecast_winner_vs_runner_up']:.2f}× faster); measured "
                    + interval(m, unit="×")
                    + f" in CPU time. Rank correlation of forecast and measured ms/token over "
                    f"{len(r['forecast_order'])} settings: {r['spearman']:.2f}.")
    return "\n".join(head + lines + tab + rank) + "\n"


def added_in(path: Path) -> str | None:
    """The commit that added ``path`` (the forecasts' registration), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    shas = out.stdout.split()
    return shas[-1] if out.returncode == 0 and shas else None


def render_check(out_dir: Path, rows_path: Path | None) -> int:
    forecasts = read_jsonl(out_dir / "forecasts.jsonl")
    rows_path = rows_path or out_dir / "forecast_check.jsonl"
    rows = read_jsonl(rows_path)
    recs = measured(rows, [rows_path.parent, out_dir])
    points = compare(forecasts, recs)
    pubs = sorted({(r.get("publication") or {}).get("name") for r in rows} - {None})
    loads = [x for r in rows for k in ("load_start", "load_end") if (x := (r.get("timing") or {}).get(k))]
    res = {"forecasts_file": "results/regimes/forecast/forecasts.jsonl", "publication": ", ".join(pubs) or None,
           "hardware": rows[0].get("device_name", "this CPU"),
           "git_sha": sorted({r.get("git_sha") for r in rows}), "points": points, "summary": summary(points),
           "ranking": ranking(forecasts, recs), "forecasts_commit": added_in(out_dir / "forecasts.jsonl"),
           "load_1min": [min(x[0] for x in loads), max(x[0] for x in loads)] if loads else None}
    atomic_write(out_dir / "check.json", json.dumps(res, indent=1, default=float) + "\n")
    atomic_write(out_dir / "check.md", render(res))
    print(render(res))
    return 0

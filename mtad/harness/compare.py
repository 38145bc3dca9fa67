"""The main job (``make run``): a miniature reproduction of the paper's comparison on the embedded pair.

``python -m mtad.harness.compare [--decoders sampling,speculative,mtad] [key=value ...]`` decodes the same
GSM8K prompts with each decoder on one loaded pair, prompt by prompt in rotating order
(:func:`mtad.harness.runner.run_interleaved`, so that drift of the machine falls on every decoder alike),
writes one row per decoder to ``${results_dir}/main.jsonl`` like any run (a rerun with the same settings
reads them back instead of decoding again), and prints a table: ms/token, speed-up vs the first decoder
(sampling) and vs speculative decoding, block efficiency, acceptance, perplexity change vs sampling; every
ratio with its paired 95 % bootstrap interval over prompts (:mod:`mtad.report.stats`), then one line that
says what the numbers show. The pair is ``model=smollm2``, the best embedded pair for the machine
(:func:`mtad.models.load.resolve_alias` says which and why). Trailing ``key=value`` arguments are Hydra
overrides for every decoder (``task.n_prompts=40``, ``model=smollm2_token``, ``results_dir=other_results``).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from mtad.harness.config import experiment_name
from mtad.harness.runner import run_interleaved
from mtad.harness.sweep import compose_job
from mtad.models.load import ModelConfig, resolve_alias
from mtad.report import stats

DECODERS = ("sampling", "speculative", "mtad")
# 20 zero-shot GSM8K prompts x 64 new tokens: ~3 min for the three decoders on 2 CPU cores (bf16 pair)
DEFAULTS = ("model=smollm2", "task=gsm8k", "task.n_prompts=20", "task.few_shot=0", "decoder.max_new_tokens=64",
            "num_threads=1", "warmup=1", "name=main", "progress=false")


def configs(decoders: Sequence[str], overrides: Sequence[str]) -> list:
    """One composed config per decoder, the user's overrides after the defaults."""
    return [compose_job([f"decoder={d}", *DEFAULTS, *overrides]) for d in decoders]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mtad.harness.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--decoders", default=",".join(DECODERS),
                   help="comma-separated decoder presets (conf/decoder/); the first is the baseline")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every decoder, e.g. task.n_prompts=40")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    try:
        if len(decoders) < 2:
            raise ValueError(f"--decoders={args.decoders!r} names {len(decoders)} decoder(s): give at least two, "
                             "the first being the baseline (e.g. sampling,speculative,mtad)")
        twice = sorted({d for d in decoders if decoders.count(d) > 1})
        if twice:
            raise ValueError(f"--decoders={args.decoders!r} names {', '.join(twice)} more than once: give each "
                             "decoder once (each is one column of the table)")
        cfgs = configs(decoders, args.overrides)
        resolved = [OmegaConf.to_container(c, resolve=True) for c in cfgs]
        mcfg, why = resolve_alias(ModelConfig.from_any(resolved[0]["model"]))
        print(f"pair: {why or mcfg.name}", flush=True)
        n = resolved[0]["task"]["n_prompts"]
        tokens = resolved[0]["decoder"]["max_new_tokens"]
        print(f"decoding {n or 'all'} {resolved[0]['task']['name']} prompts x {tokens} "
              f"new tokens with {', '.join(decoders)} (interleaved, one thread)", flush=True)
        clock = Eta()
        rows = run_interleaved(cfgs, on_prompt=clock.progress)
        results_file = Path(resolved[0].get("results_dir", "results")) / f"{experiment_name(resolved[0])}.jsonl"
    except (ValueError, OSError) as err:  # OSError: a results folder that cannot be written, a full disk
        print(f"mtad.harness.compare: error: {err}", file=sys.stderr)
        return 2
    print(render(rows, decoders, search=[results_file.parent]))
    print(f"rows in {results_file}; per-prompt records in each row's run_dir")
    return 0


class Eta:
    """Progress lines whose time left is measured from the first prompt's end: loading the pair (and the
    first prompt's warm-up) is not decoding, and would inflate every estimate."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock, self.t0 = clock, clock()
        self.first: float | None = None

    def line(self, i: int, total: int) -> str:
        now = self.clock()
        if self.first is None or i <= 1:
            self.first = now
            return f"  prompt {i}/{total} done ({now - self.t0:.0f} s elapsed, loading included)"
        eta = (now - self.first) / (i - 1) * (total - i)
        return f"  prompt {i}/{total} done ({now - self.t0:.0f} s elapsed, ~{eta:.0f} s left)"

    def progress(self, i: int, total: int) -> None:
        print(self.line(i, total), file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- table
def _fmt(iv: stats.Interval | None, unit: str) -> str:
    if iv is None or iv.point is None:
        return "—"
    if unit == "x":
        text = f"{iv.point:.2f}×"
        return text + (f" [{iv.low:.2f}, {iv.high:.2f}]" if iv.has_interval else "")
    text = f"{iv.point:+.1f} %"
    return text + (f" [{iv.low:+.1f}, {iv.high:+.1f}]" if iv.has_interval else "")


def _records(row: dict, search) -> dict | None:
    return stats.samples_for([row.get("run_dir")], row.get("metrics", {}).get("score_name"), search)


def render(rows: list[dict], decoders: Sequence[str], search: Sequence[Path] = ()) -> str:
    """The comparison table (markdown) and the line that reads it."""
    recs = [_records(r, search) for r in rows]
    base = 0
    spec = decoders.index("speculative") if "speculative" in decoders else None
    head = ["decoder", "ms/token", f"speed-up vs {decoders[base]}", "speed-up vs speculative",
            "block efficiency", "acceptance", f"perplexity change vs {decoders[base]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cells = {}
    for i, (d, row, rec) in enumerate(zip(decoders, rows, recs)):
        m = row.get("metrics", {})
        vs_base = stats.compare("speedup", rec, recs[base]) if i != base else None
        vs_spec = stats.compare("speedup", rec, recs[spec]) if spec is not None and i != spec else None
        ppl = stats.compare("ppl_change", rec, recs[base]) if i != base else None
        cells[d] = (vs_base, vs_spec, ppl)
        acc = m.get("acceptance_rate")
        lines.append("| " + " | ".join([
            d, f"{m['ms_per_token']:.1f}" if m.get("ms_per_token") is not None else "—",
            _fmt(vs_base, "x") if i != base else "1 (baseline)", _fmt(vs_spec, "x") if vs_spec else "—",
            f"{m['block_efficiency']:.2f}" if m.get("block_efficiency") is not None else "—",
            f"{acc:.2f}" if acc is not None else "—", _fmt(ppl, "%") if i != base else "—"]) + " |")
    n = min((len(r) for r in recs if r), default=0)
    pair = rows[0].get("model", {}).get("name")
    hw = rows[0].get("device_name") or "this machine"
    lines += ["", f"{pair} on {hw}, {n} paired prompts, 95 % bootstrap intervals over prompts; "
              "block efficiency = tokens per target forward; acceptance = accepted / proposed draft tokens.",
              "", reading(cells, decoders)]
    return "\n".join(lines)


def reading(cells: dict, decoders: Sequence[str]) -> str:
    """One sentence on MTAD against the baseline and speculative decoding, saying only what the 95 %
    intervals as printed support (:func:`mtad.report.stats.judge`: borderline when an end rounds to no change)."""
    if "mtad" not in cells:
        return "What it shows: read the intervals above (no MTAD row)."
    vs_base, vs_spec, ppl = cells["mtad"]
    base = decoders[0]

    def says(iv: stats.Interval | None, up: str, down: str, same: str) -> str:
        if iv is None or iv.point is None:
            return f"{same}: not measured"
        judged = stats.judge(iv)  # the interval as printed
        if judged is None or judged == "not significant":
            return f"{same}: no difference the interval can show (n = {iv.n})"
        if judged == "borderline":
            return f"{same}: borderline (an end of the printed interval is no change, n = {iv.n})"
        return up if iv.low > stats.NO_CHANGE[iv.kind] else down

    parts = [says(vs_base, f"MTAD is faster than {base}", f"MTAD is slower than {base}", f"MTAD vs {base} speed"),
             says(vs_spec, "faster than speculative decoding", "slower than speculative decoding",
                  "vs speculative speed"),
             says(ppl, f"and its outputs have higher perplexity than {base}'s",
                  f"and its outputs have lower perplexity than {base}'s (the paper's direction)",
                  f"perplexity vs {base}")]
    return "What it shows: " + "; ".join(parts) + " (95 % intervals as printed, both ends excluding no change)."


if __name__ == "__main__":
    sys.exit(main())

"""The main job (``make run``): a miniature reproduction of the paper's comparison on the embedded pair.

``python -m mtad.harness.compare [--decoders sampling,speculative,mtad] [key=value ...]`` decodes the same
GSM8K prompts with each decoder on one loaded pair, prompt by prompt in rotating order
(:func:`mtad.harness.runner.run_interleaved`, so that drift of the machine falls on every decoder alike),
writes one row per decoder to ``${results_dir}/main.jsonl`` like any run (a rerun with the same settings
reads them back instead of decoding again), and prints a table: ms/token in wall and in CPU time, speed-up
vs the first decoder (sampling) and vs speculative decoding in both, block efficiency, acceptance, perplexity
change vs sampling; every ratio with its paired 95 % bootstrap interval over prompts (:mod:`mtad.report.stats`).
Below it: the machine's load beside its cores (a busy machine's wall-time ratios measure contention), the
machine's own costs where they rule speculation out (:func:`cost_structure`), and one line that says what the
numbers show. The pair is ``model=smollm2``, the best embedded pair for the machine
(:func:`mtad.models.load.resolve_alias` says which and why). Trailing ``key=value`` arguments are Hydra
overrides for every decoder (``task.n_prompts=40``, ``model=smollm2_token``, ``results_dir=other_results``).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from mtad.harness.config import experiment_name
from mtad.harness.rows import machine_load
from mtad.harness.runner import run_interleaved
from mtad.harness.sweep import compose_job
from mtad.models.load import ModelConfig, resolve_alias
from mtad.report import stats
from mtad.report.markdown import DASH, interval, table

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
        busy = busy_now()
        if busy:
            print(busy, flush=True)
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
    if iv is None:
        return DASH
    v = (iv.point, iv.low, iv.high) if iv.has_interval else (iv.point,)
    return interval(v, unit="×") if unit == "x" else interval(v, 1, unit=" %", signed=True)


def _records(row: dict, search) -> dict | None:
    return stats.samples_for([row.get("run_dir")], row.get("metrics", {}).get("score_name"), search)


def _per_token_ms(m: dict, seconds: str) -> str:
    s, n = m.get(seconds), m.get("total_tokens")
    return f"{1e3 * s / n:.1f}" if s is not None and n else "—"


def render(rows: list[dict], decoders: Sequence[str], search: Sequence[Path] = ()) -> str:
    """The comparison table (markdown), the machine's load, its costs where they rule speculation out, and the
    line that reads it."""
    recs = [_records(r, search) for r in rows]
    base = 0
    spec = decoders.index("speculative") if "speculative" in decoders else None
    head = ["decoder", "ms/token", "CPU ms/token", f"speed-up vs {decoders[base]}",
            f"CPU-time speed-up vs {decoders[base]}", "speed-up vs speculative", "CPU-time speed-up vs speculative",
            "block efficiency", "acceptance", f"perplexity change vs {decoders[base]}"]
    body, cells, cpu = [], {}, {}
    for i, (d, row, rec) in enumerate(zip(decoders, rows, recs)):
        m = row.get("metrics", {})
        vs_base = stats.compare("speedup", rec, recs[base]) if i != base else None
        vs_spec = stats.compare("speedup", rec, recs[spec]) if spec is not None and i != spec else None
        cpu[d] = (stats.compare("cpu_speedup", rec, recs[base]) if i != base else None,
                  stats.compare("cpu_speedup", rec, recs[spec]) if spec is not None and i != spec else None)
        ppl = stats.compare("ppl_change", rec, recs[base]) if i != base else None
        cells[d] = (vs_base, vs_spec, ppl)
        acc = m.get("acceptance_rate")
        body.append([
            d, f"{m['ms_per_token']:.1f}" if m.get("ms_per_token") is not None else "—",
            _per_token_ms(m, "total_cpu_s"),
            _fmt(vs_base, "x") if i != base else "1 (baseline)", _fmt(cpu[d][0], "x") if i != base else "1 (baseline)",
            _fmt(vs_spec, "x") if vs_spec else "—", _fmt(cpu[d][1], "x") if cpu[d][1] else "—",
            f"{m['block_efficiency']:.2f}" if m.get("block_efficiency") is not None else "—",
            f"{acc:.2f}" if acc is not None else "—", _fmt(ppl, "%") if i != base else "—"])
    lines = table(head, body, compact=True)
    n = min((len(r) for r in recs if r), default=0)
    pair = rows[0].get("model", {}).get("name")
    hw = rows[0].get("device_name") or "this machine"
    lines += ["", f"{pair} on {hw}, {n} paired prompts, 95 % bootstrap intervals over prompts; "
              "block efficiency = tokens per target forward; acceptance = accepted / proposed draft tokens; "
              "CPU time = this process's CPU seconds, little moved by other processes.", ""]
    load = machine(rows)
    if load:
        lines += [load, ""]
    why = cost_structure(rows, decoders, cpu[decoders[spec]][0] if spec is not None else None)
    if why:
        lines += [why, ""]
    lines.append(reading(cells, decoders, explained=why is not None))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- the machine
def busy_now() -> str | None:
    """A line before decoding when the 1-minute load average already exceeds the logical CPUs, else None."""
    load, cpus = machine_load(), os.cpu_count()
    if not load or not cpus or load[0] <= cpus:
        return None
    return (f"note: the machine is busy before decoding (load average {load[0]:.1f} on {cpus} cores): the wall "
            "times will measure contention; the CPU-time columns will not")


def machine(rows: list[dict]) -> str | None:
    """The load while the rows were timed (1-minute load average at each row's start and end, recorded in its
    ``timing``) beside the cores, each decoder's CPU time as a share of its wall time, and, when the load
    exceeded the cores, that the wall-time ratios measure contention. None when no row recorded a load."""
    loads = [x[0] for r in rows for x in (r.get("timing", {}).get("load_start"), r.get("timing", {}).get("load_end"))
             if x]
    cpus = next((r["timing"]["cpus"] for r in rows if r.get("timing", {}).get("cpus")), None)
    if not loads or not cpus:
        return None
    share = [f"{r.get('decoder', {}).get('name', '?')} {m['total_cpu_s'] / m['total_decode_s']:.2f}"
             for r in rows for m in [r.get("metrics", {})] if m.get("total_cpu_s") and m.get("total_decode_s")]
    text = (f"Machine: load average {min(loads):.1f}–{max(loads):.1f} (1 min, at the runs' start and end) on {cpus} "
            f"cores; CPU time / wall time: {', '.join(share) or 'not recorded'}.")
    if max(loads) > cpus:
        text += (f" The load exceeded the {cpus} cores: other processes competed for them, so the wall-time "
                 "speed-ups measure contention as much as decoding; read the CPU-time columns.")
    return text


def _cpu_per_call(m: dict, key: str) -> float | None:
    n, s = m.get("forward_calls", {}).get(key), m.get("forward_call_cpu_s", {}).get(key)
    return s / n if n and s else None


def cost_structure(rows: list[dict], decoders: Sequence[str], spec_cpu: stats.Interval | None) -> str | None:
    """Why speculation does not pay here, from what this run measured, when speculative decoding (lossless:
    the draft's tokens checked by one target pass) is slower than the baseline in CPU time by its printed
    interval; else None. In units of one baseline token's CPU time, a speculative step costs ``cost`` and
    yields ``tokens`` (tokens per target pass), so the CPU-time ratio is ``tokens / cost``. Part of the cost is
    the machine's: a target pass verifying S tokens costs ``verify`` x one decoding step (``forward_call_cpu_s``
    over ``forward_calls`` of the rows' own forwards, widths 2..gamma+2, prompt passes excluded), where a
    memory-bound accelerator pays about 1x. When the yield would cover the step with verifying at 1x but not
    at this machine's ``verify``, the machine's cost structure rules speculation out and the sentence says so;
    when it would not cover even that, the draft (its yield, its own cost) is the reason."""
    if spec_cpu is None or spec_cpu.point is None or stats.judge(spec_cpu) != "significant" or spec_cpu.high >= 1:
        return None
    base, spec = rows[0].get("metrics", {}), rows[decoders.index("speculative")]
    sm = spec.get("metrics", {})
    tokens, cpu_s, fwd = sm.get("total_tokens"), sm.get("total_cpu_s"), sm.get("target_forwards")
    b_tokens, b_cpu = base.get("total_tokens"), base.get("total_cpu_s")
    step = _cpu_per_call(base, "target:seq:1x1") or _cpu_per_call(sm, "target:seq:1x1")
    if not (tokens and cpu_s and fwd and b_tokens and b_cpu and step):
        return None
    token_cpu = b_cpu / b_tokens  # CPU seconds of one baseline token
    gamma = spec.get("decoder", {}).get("gamma") or 0
    widths, n, verify_s = {}, 0, 0.0
    for key, count in sm.get("forward_calls", {}).items():
        role, kind, shape = key.split(":")
        height, new = (int(x) for x in shape.split("x"))
        if role == "target" and kind == "seq" and height == 1 and 2 <= new <= gamma + 2:
            widths[new] = _cpu_per_call(sm, key) / step
            n, verify_s = n + count, verify_s + sm["forward_call_cpu_s"][key]
    if not n:
        return None
    verify = verify_s / n / step  # a verify pass, in decoding steps (weighted by how often each width ran)
    cost, yielded = cpu_s / fwd / token_cpu, tokens / fwd
    at_one_step = cost - (verify - 1) * step / token_cpu  # the same step with verifying as cheap as one step
    pair = rows[0].get("model", {})
    lo, hi = min(widths), max(widths)
    measured = (f"a target pass verifying {lo}–{hi} tokens costs {min(widths.values()):.2f}–"
                f"{max(widths.values()):.2f}× one decoding step in CPU time (this run's forwards), so a speculative "
                f"step (drafting included) costs the CPU time of {cost:.2f} {decoders[0]} tokens and yields "
                f"{yielded:.2f}: speculative decoding ran at {_fmt(spec_cpu, 'x')} {decoders[0]} in CPU time")
    if yielded >= at_one_step:
        return (f"Why: this machine's own costs rule speculation out for {pair.get('name', 'the pair')} "
                f"({pair.get('dtype', '?')}): {measured}. No speculative method can pay here unless it yields more "
                f"than {cost:.2f} tokens per target pass; with verifying as cheap as one step (a GPU, a CPU that "
                f"multiplies bf16 natively) this step would cost {at_one_step:.2f} and pay.")
    return (f"Why: the draft is what speculation lacks here, not the machine: {measured}. With verifying as cheap "
            f"as one step it would still cost {at_one_step:.2f} tokens' CPU time, more than the {yielded:.2f} "
            f"it yields.")


def reading(cells: dict, decoders: Sequence[str], explained: bool = False) -> str:
    """One sentence on MTAD against the baseline and speculative decoding, saying only what the 95 %
    intervals as printed support (:func:`mtad.report.stats.judge`: borderline when an end rounds to no change).
    ``explained``: the machine's costs rule speculation out (:func:`cost_structure`), and a slower MTAD says so."""
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

    slower = f"MTAD is slower than {base}" + (", as the costs above predict (Why)" if explained else "")
    parts = [says(vs_base, f"MTAD is faster than {base}", slower, f"MTAD vs {base} speed"),
             says(vs_spec, "faster than speculative decoding", "slower than speculative decoding",
                  "vs speculative speed"),
             says(ppl, f"and its outputs have higher perplexity than {base}'s",
                  f"and its outputs have lower perplexity than {base}'s (the paper's direction)",
                  f"perplexity vs {base}")]
    return "What it shows: " + "; ".join(parts) + " (95 % intervals as printed, both ends excluding no change)."


if __name__ == "__main__":
    sys.exit(main())

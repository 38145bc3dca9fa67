"""Batch benchmark (``make bench-batch``): tokens/s of sampling, speculative, MTAD, MMTAD and SpecInfer at batch
widths 1, 4, 16.

``python experiments/bench_batch.py [model=smollm2] [--prompts 16] [--new 48] [--batches 1,4,16] [--reps 3]``

The same GSM8K prompts (zero-shot, the pair's chat template) are decoded by every (decoder, batch width) in
every repeat, ``--prompts`` prompts per cell in batches of B (``mtad.generate`` on a list of prompts); cells run
interleaved (each repeat visits every cell, in an order rotated per repeat) after an untimed warm-up of every
cell. tokens/s of a cell = generated tokens / wall seconds of all its calls; the interval is a 95% t-interval
over repeats, and ratios between decoders (speculative / sampling, MTAD / speculative) are paired per repeat.
Block efficiency (tokens / target forwards per row) and acceptance (accepted / proposed) come from the decodes.

The cost model with batch width (:func:`mtad.measure.costmodel.batch_cost_per_token`) is fitted from forward
timings of the same pair (:func:`mtad.measure.costmodel.measure_batch`, B = 1, 2, 4, 8, 16 at the mean context)
and predicts each cell's tokens/s from its measured block efficiency (sampling, speculative and MTAD: the model
has no term for a tree pass, so the MMTAD and SpecInfer cells have no prediction), and the batch width at which
speculation stops paying (:func:`mtad.measure.costmodel.speculation_stops_paying`).

The default pair is the project default ``model=smollm2`` (its feature draft); the earlier published table ran
on ``model=smollm2_bf16`` (token draft), which ``model=smollm2_bf16`` still selects.
Writes ``results/published/batch_bench.json`` (``--out``) and a figure beside it (``.png``).
"""
from __future__ import annotations

import json
import logging
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from mtad._util.paths import REPO_ROOT
from mtad.decoding import generate
from mtad.harness import clicheck
from mtad.harness.rows import environment_info, git_info
from mtad.measure.costmodel import Profile, batch_cost_per_token, measure_batch, speculation_stops_paying
from mtad.models.load import load_pair

log = logging.getLogger("bench_batch")
DECODERS = ("sampling", "speculative", "mtad", "mmtad", "specinfer")
MODELLED = ("sampling", "speculative", "mtad")  # the decoders batch_cost_per_token predicts
RATIOS = (("speculative", "sampling"), ("mtad", "speculative"), ("mtad", "sampling"), ("mmtad", "speculative"),
          ("specinfer", "speculative"))


def compose(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from mtad.harness.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(hydra_compose("config", overrides=list(overrides)), resolve=True)


def batch_widths(text: str) -> list[int]:
    """``--batches``: comma-separated batch widths, each >= 1."""
    return [clicheck.positive_int(b) for b in clicheck.comma_list()(text)]


def gsm8k_prompts(pair, n: int, chat: bool) -> list[list[int]]:
    from mtad.tasks.base import TaskConfig, get_task

    task = get_task(TaskConfig(name="gsm8k", n_prompts=n, few_shot=0, max_prompt_tokens=384,
                               on_long_prompt="truncate"))
    return [task.encode(s, pair.tokenizer, 0, (), chat).ids for s in task.samples()]


def run_cell(pair, prompts, dec: dict, B: int, seed: int) -> dict:
    """Decode every prompt in batches of B; totals of the cell."""
    g = torch.Generator(device=pair.device).manual_seed(seed)
    tokens = forwards = accepted = proposed = 0
    t0 = time.perf_counter()
    for i in range(0, len(prompts), B):
        group = prompts[i:i + B]
        for r in generate(pair, group, dec, g):  # a list of prompts, one of them included: one result each
            tokens += r.num_tokens
            forwards += r.target_forwards
            accepted += sum(r.accepted)
            proposed += sum(r.proposed)
    seconds = time.perf_counter() - t0
    return dict(prompts=len(prompts), tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds,
                block_efficiency=tokens / forwards, acceptance_rate=accepted / proposed if proposed else None)


def interval(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): 95% t-interval over repeats."""
    from scipy.stats import t

    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    h = t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, m - h, m + h


def main(argv=None) -> int:
    p = clicheck.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=clicheck.positive_int, default=16)
    p.add_argument("--new", type=clicheck.positive_int, default=48, help="max_new_tokens")
    p.add_argument("--batches", type=batch_widths, default="1,4,16", help="batch widths, comma-separated")
    p.add_argument("--reps", type=clicheck.positive_int, default=3)
    p.add_argument("--gamma", type=clicheck.positive_int, default=4)
    p.add_argument("--out", default=str(REPO_ROOT / "results" / "published" / "batch_bench.json"))
    p.add_argument("--replot", action="store_true", help="redraw the figure of --out from its JSON, no decoding")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (default model=smollm2)")
    args = p.parse_args(argv)
    if args.replot:
        out = clicheck.check_or_exit(p, clicheck.json_file("--replot redraws the figure of the JSON this benchmark "
                                                           "wrote (--out)"), args.out)
        figure(json.loads(out.read_text()), out.with_suffix(".png"))
        return 0
    clicheck.check_or_exit(p, clicheck.writable_file, args.out, "--out")
    clicheck.check_or_exit(p, clicheck.check_overrides, args.overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    overrides = args.overrides if any(o.startswith("model=") for o in args.overrides) else \
        ["model=smollm2", *args.overrides]
    cfg = compose(overrides)
    sha, dirty = git_info(REPO_ROOT)  # the code that runs: read before the (long) benchmark, not after
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg["num_threads"]))
    pair = load_pair(cfg["model"])
    prompts = gsm8k_prompts(pair, args.prompts, bool(cfg["model"].get("chat_template", True)))
    batches = args.batches

    def dec(name: str) -> dict:  # the paper's T / top-k / top-p defaults
        return dict(name=name, max_new_tokens=args.new, gamma=args.gamma, beam_width=4)

    cells = [(d, B) for B in batches for d in DECODERS]
    for d, B in cells:  # warm-up: every cell's shapes once
        run_cell(pair, prompts[:B], dict(dec(d), max_new_tokens=8), B, 12345)
    runs = []
    for rep in range(args.reps):
        order = cells[rep % len(cells):] + cells[:rep % len(cells)]
        for d, B in order:
            r = run_cell(pair, prompts, dec(d), B, 1000 + rep)
            runs.append(dict(decoder=d, batch=B, rep=rep, **r))
            log.info("rep %d %s B=%d: %.1f tok/s, block efficiency %.2f", rep, d, B, r["tokens_per_s"],
                     r["block_efficiency"])
    P = int(statistics.fmean(map(len, prompts)))
    ctx = P + args.new // 2
    costs = measure_batch(pair, sorted({1, 2, 4, 8, *batches}), args.gamma, 4, ctx, P)
    env = environment_info({p_.device for m in (pair.target, pair.draft) for p_ in m.parameters()})
    profile = Profile(hardware=env["device_name"], pair=pair.name, costs_ms=costs, num_threads=env["num_threads"],
                      context_tokens=ctx, measured=datetime.now(UTC).isoformat(timespec="seconds"))
    summary = summarize(runs, batches, profile, args.gamma, P, args.new)
    out = dict(pair=pair.name, hardware=env["device_name"], num_threads=env["num_threads"], versions=env["versions"],
               git_sha=sha, git_dirty=dirty, prompts=len(prompts), max_new_tokens=args.new, gamma=args.gamma,
               beam_width=4, reps=args.reps, context_tokens=ctx, mean_prompt_tokens=P, measured=profile.measured,
               summary=summary, runs=runs, costs_ms=costs)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    figure(out, path.with_suffix(".png"))
    print(json.dumps(summary, indent=1))
    return 0


def summarize(runs, batches, profile, gamma, P, new) -> dict:
    def cell(d, B):
        return [r for r in runs if r["decoder"] == d and r["batch"] == B]

    def tps(d, B):  # tokens/s per repeat, in repeat order (pairs ratios within a repeat)
        return [r["tokens_per_s"] for r in sorted(cell(d, B), key=lambda r: r["rep"])]

    out = {"cells": [], "ratios": []}
    for B in batches:
        for d in DECODERS:
            rs = cell(d, B)
            e = statistics.fmean(r["block_efficiency"] for r in rs)
            acc = [r["acceptance_rate"] for r in rs if r["acceptance_rate"] is not None]
            n_new = statistics.fmean(r["tokens"] / r["prompts"] for r in rs)  # mean generated tokens per prompt
            pred = 1e3 / batch_cost_per_token(profile, d, B, gamma, 4, e if d != "sampling" else 1.0, P, n_new) \
                if d in MODELLED else None
            out["cells"].append(dict(decoder=d, batch=B, tokens_per_s=interval(tps(d, B)), block_efficiency=e,
                                     acceptance_rate=statistics.fmean(acc) if acc else None,
                                     predicted_tokens_per_s=pred))
        for num, den in RATIOS:
            out["ratios"].append(dict(ratio=f"{num}/{den}", batch=B,
                                      value=interval([a / b for a, b in zip(tps(num, B), tps(den, B))])))
    if len(batches) > 1:
        out["sampling_batch_gain"] = dict(
            (f"B{B}/B1", interval([a / b for a, b in zip(tps("sampling", B), tps("sampling", batches[0]))]))
            for B in batches[1:])
    for d in ("speculative", "mtad"):
        e1 = next(c["block_efficiency"] for c in out["cells"] if c["decoder"] == d and c["batch"] == batches[0])
        measured = next((B for B in batches if next(r["value"][0] for r in out["ratios"]
                                                     if r["ratio"] == f"{d}/sampling" and r["batch"] == B) < 1), None)
        out[f"{d}_stops_paying"] = dict(measured_first_batch_below_sampling=measured,
                                        predicted=speculation_stops_paying(profile, d, e1, gamma, 4, 256, P, new))
    return out


def figure(out: dict, path: Path) -> None:
    """Left: tokens/s against batch size, one line per decoder (95% CI over repeats), the cost model dashed.
    Right: the paired ratios speculative / sampling and MTAD, MMTAD, SpecInfer / speculative (95% CI), 1 = parity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, rx) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    sizes = sorted({c["batch"] for c in out["summary"]["cells"]})
    for d, color in zip(DECODERS, ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:purple")):
        cells = [c for c in out["summary"]["cells"] if c["decoder"] == d]
        B = [c["batch"] for c in cells]
        m = [c["tokens_per_s"][0] for c in cells]
        err = [[c["tokens_per_s"][0] - c["tokens_per_s"][1] for c in cells],
               [c["tokens_per_s"][2] - c["tokens_per_s"][0] for c in cells]]
        ax.errorbar(B, m, yerr=err, marker="o", capsize=3, color=color, label=f"{d} (measured, 95% CI)")
        if d in MODELLED:
            ax.plot(B, [c["predicted_tokens_per_s"] for c in cells], ls="--", color=color, alpha=0.6,
                    label=f"{d} (cost model)")
    for name, color in (("speculative/sampling", "tab:blue"), ("mtad/speculative", "tab:orange"),
                        ("mmtad/speculative", "tab:green"), ("specinfer/speculative", "tab:purple")):
        rs = [r for r in out["summary"]["ratios"] if r["ratio"] == name]
        if not rs:  # a JSON written before the tree decoders joined
            continue
        v = [r["value"] for r in rs]
        err = [[x[0] - x[1] for x in v], [x[2] - x[0] for x in v]]
        rx.errorbar([r["batch"] for r in rs], [x[0] for x in v], yerr=err, marker="o", capsize=3, color=color,
                    label=name)
    rx.axhline(1.0, color="black", lw=0.8)
    rx.set_ylabel("tokens/s ratio (paired per repeat)")
    for a in (ax, rx):
        a.set_xscale("log", base=2)
        a.set_xticks(sizes)
        a.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        a.set_xlabel("batch size (prompts decoded together)")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax.set_ylabel("generated tokens / s")
    threads = out["num_threads"]
    fig.suptitle(f"{out['pair']} on {out['hardware']}, {threads} thread"
                 f"{'s' if threads != 1 else ''}; GSM8K, {out['prompts']} prompts x {out['max_new_tokens']} new "
                 f"tokens, gamma={out['gamma']}, W={out['beam_width']}, {out['reps']} interleaved repeats", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

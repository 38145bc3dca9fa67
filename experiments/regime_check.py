"""Check the what-if simulator (mtad.measure.simulate) against measured interleaved runs on this machine.

    .venv/bin/python experiments/regime_check.py --pair run5 --pair token [--prompts 10] [--tokens 48]

For each draft, a **cost profile from the decoders' own forwards**: each decoder decodes a few
calibration prompts (GSM8K *train*, never evaluated; half before the runs, half after, pooled, and each half
alone to bracket the drift), and the CPU seconds of every forward shape it ran (the
core's per-shape clock, ``DecodeResult.call_cpu_s``) give t1 (a target step), c (a draft step), c_W (a draft
step of W beam rows, with its features and reorders), v (a target pass over γ + 1 tokens), each decoder's
harness time per step (CPU time outside forwards) and its cost per prompt that the steps leave out (prefills,
a last single-token step). Then the interleaved runs of
sampling, speculative, block verification and MTAD on the evaluated prompts (GSM8K test;
``mtad.harness.runner.run_interleaved``, as ``python -m mtad.harness.compare`` runs them). The simulator
predicts each run's ms/token from the run's accepted-length histogram and prompt count alone; a second
prediction reads the run's own forward counts. Both are compared with the run's measured **CPU** ms/token
(CPU seconds, little moved by other processes on a shared machine; with one thread, the wall time of a quiet
one), and the wall-clock figures are kept beside them. Every point's error (predicted / measured − 1) goes to
``results/regimes/check/check-<draft>.json``; the interleaved rows and their per-prompt records stay in
``results/regimes/check/`` for the publish step.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.paths import REPO_ROOT, repo_relative
from mtad.decoding import DecoderConfig, generate
from mtad.harness import clicheck
from mtad.harness.runner import run_interleaved
from mtad.harness.sweep import compose_job
from mtad.measure.costmodel import parse_calls
from mtad.measure.simulate import CostProfile, predict
from mtad.models.load import ModelConfig, load_pair
from mtad.report import stats
from mtad.tasks.base import TaskConfig, get_task

log = logging.getLogger("regime_check")
PAIRS = {  # draft name -> Hydra overrides of the bf16 pair (results/regimes/drafts.tsv names)
    "run5": ["model=smollm2_bf16_feature"],
    "token": ["model=smollm2_bf16_feature", "model.draft=models/smollm2-draft"],
    "int8": ["model=smollm2_bf16_int8draft"],
    "skip2": ["model=smollm2_bf16_skip2"],
    "w4g32": ["model=smollm2_bf16_w4g32"],
}
DECODERS = {
    "sampling": ["decoder=sampling"],
    "speculative": ["decoder=speculative"],
    "block": ["decoder=block"],
    "mtad": ["decoder=mtad"],
}
GAMMA, W = 4, 4
CALIBRATION_PROMPTS = 4


def prompts_of(cfg, pair, mcfg, split: str | None = None, n: int | None = None) -> list[list[int]]:
    """The encoded prompts of the job's task (or of ``split``, ``n`` of them)."""
    task_cfg = OmegaConf.to_container(cfg, resolve=True)["task"]
    if split is not None:
        task_cfg.update(split=split, n_prompts=n)
    task = get_task(TaskConfig.from_any(task_cfg))
    return [task.encode(s, pair.tokenizer, 0, (), mcfg.chat_template).ids for s in task.samples()]


def unit_costs(results) -> tuple[dict[str, float], dict[str, int]]:
    """CPU seconds per forward of each shape over ``results``, and how many forwards of each there were."""
    cpu, calls = Counter(), Counter()
    for r in results:
        cpu.update(r.call_cpu_s)
        calls.update(r.calls)
    return {k: cpu[k] / calls[k] for k in calls}, dict(calls)


def calibration_decodes(pair, decs: dict[str, DecoderConfig], prompts: list[list[int]], seed: int) -> dict:
    """Every calibration prompt decoded by every decoder, rotating the order (after one untimed warm-up each):
    ``{decoder: [DecodeResult]}``."""
    with torch.inference_mode():
        for cfg in decs.values():
            generate(pair, prompts[0][:32], cfg, torch.Generator().manual_seed(999))
    res: dict[str, list] = {d: [] for d in decs}
    names = list(decs)
    for i, p in enumerate(prompts):
        for d in names[i % len(names):] + names[:i % len(names)]:
            res[d].append(generate(pair, p, decs[d], torch.Generator().manual_seed(seed + i)))
    return res


def calibrate(res: dict) -> dict:
    """The simulator's profile read off the calibration decodes' own forwards (module docstring)."""
    unit, calls = unit_costs([r for rs in res.values() for r in rs])
    t1 = unit["target:seq:1x1"]
    prof = CostProfile(label="the decoders' own forwards on the calibration prompts (CPU)", t1=1e3 * t1,
                       c=unit["draft:seq:1x1"] / t1, c_W=unit[f"draft:seq:{W}x1"] / t1,
                       v=unit[f"target:seq:1x{GAMMA + 1}"] / t1, kind="measured", unit="ms")
    overhead, fixed = {}, {}
    for d, rs in res.items():  # steps as the histogram counts them (a sampled token is a step)
        steps = sum(len(r.accepted) if r.accepted else r.num_tokens for r in rs)
        overhead[d] = sum(r.cpu_time_s - sum(r.call_cpu_s.values()) for r in rs) / steps / t1
        step = prof.replace(overhead=overhead).step_cost(d, GAMMA)
        fixed[d] = (sum(r.cpu_time_s for r in rs) / t1 - steps * step) / len(rs)
    prof = prof.replace(overhead=overhead, per_prompt=fixed)
    return {"profile": prof, "unit_cpu_ms": {k: 1e3 * v for k, v in sorted(unit.items())}, "calls": calls,
            "prompts": len(next(iter(res.values())))}


def predict_from_calls(forward_calls: dict, steps: int, tokens: int, unit_ms: dict, overhead_ms: float) -> float:
    """ms/token from a run's own forward counts: each shape at its calibrated cost (a shape the calibration
    did not run, e.g. a prefill of another length, from the line through that role's and width's calibrated
    shapes in new tokens), plus the decoder's harness time per step."""
    fams: dict[tuple, list] = {}
    for role, kind, rows, new, _ in parse_calls(unit_ms):
        fams.setdefault((role, kind, rows), []).append((new, unit_ms[f"{role}:{kind}:{rows}x{new}"]))
    total = overhead_ms * steps
    for role, kind, rows, new, n in parse_calls(forward_calls):
        key = f"{role}:{kind}:{rows}x{new}"
        if key in unit_ms:
            total += n * unit_ms[key]
            continue
        pts = sorted(fams.get((role, kind, rows)) or fams[(role, kind, 1)])
        x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
        a, b = np.polyfit(x, y, 1) if len(set(x)) > 1 else (y[0] / x[0], 0.0)
        total += n * (a * new + b)
    return total / tokens


def per_prompt_records(run_dir: Path) -> dict[tuple, dict]:
    return stats.per_prompt([stats.read_samples(run_dir)], None)


def check(name: str, prompts: int, tokens: int, out_dir: Path) -> dict:
    overrides = [*PAIRS[name], "task=gsm8k", f"task.n_prompts={prompts}", "task.few_shot=0",
                 f"decoder.max_new_tokens={tokens}", "num_threads=1", "warmup=1", f"name=regime_check_{name}",
                 "progress=false", f"results_dir={repo_relative(out_dir)}"]
    cfgs = [compose_job([*DECODERS[d], *overrides]) for d in DECODERS]
    mcfg = ModelConfig.from_any(OmegaConf.to_container(cfgs[0], resolve=True)["model"])
    pair = load_pair(mcfg)
    torch.set_num_threads(1)
    decs = {d: DecoderConfig.from_any(OmegaConf.to_container(c, resolve=True)["decoder"])
            for d, c in zip(DECODERS, cfgs)}
    t0 = time.perf_counter()
    cal_prompts = prompts_of(cfgs[0], pair, mcfg, split="train", n=2 * CALIBRATION_PROMPTS)
    load = [round(x, 2) for x in os.getloadavg()]
    before = calibration_decodes(pair, decs, cal_prompts[:CALIBRATION_PROMPTS], 1000)
    log.info("%s: calibrated before the runs, %.0f s", name, time.perf_counter() - t0)
    rows = run_interleaved(cfgs)
    log.info("%s: interleaved runs done, %.0f s", name, time.perf_counter() - t0)
    after = calibration_decodes(pair, decs, cal_prompts[CALIBRATION_PROMPTS:], 2000)
    cals = {"before": calibrate(before), "after": calibrate(after),
            "pooled": calibrate({d: before[d] + after[d] for d in decs})}
    cal, prof = cals["pooled"], cals["pooled"]["profile"]
    log.info("%s: calibrated after, %.0f s: t1 %.1f ms, c %.3f, c_W %.3f, v %.3f", name, time.perf_counter() - t0,
             prof.t1, prof.c, prof.c_W, prof.v)
    recs = [per_prompt_records(stats.resolve_run_dir(r.get("run_dir"), [out_dir])) for r in rows]
    points = []
    for d, row, rec in zip(DECODERS, rows, recs):
        m = row["metrics"]
        hist = {1: m["total_tokens"]} if d == "sampling" else m["acceptance_profile"]["acceptance_length_histogram"]
        n = [x["n_tokens"] for x in rec.values()]
        cpu = stats.ratio_interval([1e3 * x["cpu_s"] for x in rec.values()], n)
        wall = stats.ratio_interval([1e3 * x["time_s"] for x in rec.values()], n)
        pred = predict(hist, d, prof, GAMMA, prompts=m["n_samples"])
        bracket = [predict(hist, d, cals[k]["profile"], GAMMA, prompts=m["n_samples"]) for k in ("before", "after")]
        calls = predict_from_calls(m["forward_calls"], m["target_forwards"], m["total_tokens"], cal["unit_cpu_ms"],
                                   prof.overhead[d] * prof.t1)
        points.append({
            "draft": name, "decoder": d, "measured_ms_per_token": cpu, "measured_wall_ms_per_token": wall,
            "predicted_ms_per_token": pred, "error": pred / cpu[0] - 1, "predicted_before_after": bracket,
            "predicted_from_calls": calls, "error_from_calls": calls / cpu[0] - 1,
            "block_efficiency": m["block_efficiency"], "acceptance_rate": m["acceptance_rate"],
            "histogram": {str(k): v for k, v in hist.items()}, "n_prompts": m["n_samples"],
            "tokens": m["total_tokens"], "distinct_2": m.get("distinct_2"),
        })
    base = {p["decoder"]: p for p in points}
    for p, rec in zip(points, recs):
        for ref in ("sampling", "speculative", "block"):
            if p["decoder"] == ref:
                continue
            other = recs[list(DECODERS).index(ref)]
            cpu_iv, wall_iv = stats.compare("cpu_speedup", rec, other), stats.compare("speedup", rec, other)
            pred = base[ref]["predicted_ms_per_token"] / p["predicted_ms_per_token"]
            p[f"speedup_vs_{ref}"] = {
                "measured": [cpu_iv.point, cpu_iv.low, cpu_iv.high],
                "measured_wall": [wall_iv.point, wall_iv.low, wall_iv.high],
                "predicted": pred, "error": pred / cpu_iv.point - 1,
            }
    out = {
        "draft": name, "overrides": overrides, "points": points, "clock": "cpu",
        "calibration": {k: {**{f: v for f, v in c.items() if f != "profile"},
                            "profile": {**{f: v for f, v in vars(c["profile"]).items()
                                           if f not in ("overhead", "per_prompt")},
                                        "overhead": dict(c["profile"].overhead),
                                        "per_prompt": dict(c["profile"].per_prompt)}}
                        for k, c in cals.items()},
        "rows": [r.get("run_dir") for r in rows], "load_average_start": load,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "seconds": time.perf_counter() - t0,
        "command": "python experiments/regime_check.py " + " ".join(sys.argv[1:]),
    }
    (out_dir / f"check-{name}.json").write_text(json.dumps(out, indent=1, default=float))
    return out


def main(argv=None) -> int:
    ap = clicheck.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", action="append", choices=sorted(PAIRS), required=True)
    ap.add_argument("--prompts", type=clicheck.positive_int, default=10)
    ap.add_argument("--tokens", type=clicheck.positive_int, default=48, help="new tokens per prompt")
    ap.add_argument("--out", default=str(REPO_ROOT / "results" / "regimes" / "check"))
    args = ap.parse_args(argv)
    out = clicheck.check_or_exit(ap, clicheck.writable_dir, args.out, "--out").resolve()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    os.chdir(REPO_ROOT)  # the runs' results_dir is recorded relative to the repository
    for name in args.pair:
        if (out / f"check-{name}.json").is_file():
            log.info("%s: already checked (%s)", name, out / f"check-{name}.json")
            continue
        r = check(name, args.prompts, args.tokens, out)
        for p in r["points"]:
            log.info("%s %s: measured %.1f CPU ms/token, predicted %.1f (error %+.1f %%), from its calls %.1f "
                     "(%+.1f %%)", name, p["decoder"], p["measured_ms_per_token"][0], p["predicted_ms_per_token"],
                     100 * p["error"], p["predicted_from_calls"], 100 * p["error_from_calls"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Check the what-if simulator (mtad.measure.simulate) against measured interleaved runs on this machine.

    .venv/bin/python experiments/regime_check.py --pair run5 --pair token [--prompts 10] [--tokens 48]

For each draft: a cost profile (c, c_W, v, prefill, harness time per step) measured just before the runs, the
interleaved runs of sampling, speculative, block verification and MTAD (``mtad.harness.runner.run_interleaved``,
as ``python -m mtad.harness.compare`` runs them; paired intervals over prompts), and a second profile just after,
so that the prediction uses costs from the same window (the mean of the two; the two alone bracket the drift).
The simulator predicts each run's ms/token from the run's accepted-length histogram and prompt count alone;
the error |predicted / measured − 1| of every point is written to ``results/regimes/check/check-<draft>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.paths import REPO_ROOT
from mtad.decoding import DecoderConfig
from mtad.harness.rows import environment_info
from mtad.harness.runner import run_interleaved
from mtad.harness.sweep import compose_job
from mtad.measure.costmodel import NEVER_EOS, Profile
from mtad.measure.simulate import CostProfile, predict
from mtad.measure.timing import Shape, time_decodes, time_forwards
from mtad.models.load import ModelConfig, load_pair
from mtad.report import stats
from mtad.study.stats import prompt_interval
from mtad.tasks.base import TaskConfig, get_task

log = logging.getLogger("regime_check")
PAIRS = {  # draft name -> Hydra overrides of the bf16 pair (results/regimes/drafts.tsv names)
    "run5": ["model=smollm2_bf16_feature"],
    "token": ["model=smollm2_bf16_feature", "model.draft=models/smollm2-draft"],
    "int8": ["model=smollm2_bf16_int8draft"],
    "skip2": ["model=smollm2_bf16_skip2"],
}
DECODERS = {
    "sampling": ["decoder=sampling"],
    "speculative": ["decoder=speculative"],
    "block": ["decoder=block"],
    "mtad": ["decoder=mtad"],
}
GAMMA, W = 4, 4


def measure_profile(pair, prompt_len: int, context: int = 128, seconds: float = 8.0) -> Profile:
    """The shapes the simulator reads (target 1 and γ+1 tokens, draft 1 row and W rows at ``context``; both
    prefills of ``prompt_len``) and the harness time per step of each decoder (short decodes)."""
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    tokens = torch.randint(
        3, vocab, (max(context, prompt_len) + 8,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    shapes = {
        "target:seq:1": [
            Shape("target", context, 1),
            Shape("target", context, GAMMA + 1),
            Shape("target", 0, prompt_len),
        ],
        "draft:seq:1": [Shape("draft", context, 1), Shape("draft", 0, prompt_len)],
        f"draft:seq:{W}": [Shape("draft", context, 1, rows=W)],
    }
    jobs = {
        (k, i): (pair.target if s.role == "target" else pair.draft, s)
        for k, ss in shapes.items()
        for i, s in enumerate(ss)
    }
    sec = time_forwards(jobs, tokens, reps=5, min_seconds=seconds)
    costs = {
        k: sorted([[s.new if s.context else s.new, 1e3 * sec[(k, i)]] for i, s in enumerate(ss)])
        for k, ss in shapes.items()
    }
    # a prefill of P tokens from an empty cache sits on the same curve as "P new tokens" (costmodel convention)
    prompt = tokens[:prompt_len]
    overhead = {}
    for name, cfg in {
        "sampling": DecoderConfig(name="sampling", max_new_tokens=24, eos_token_id=NEVER_EOS),
        "speculative": DecoderConfig(name="speculative", max_new_tokens=24, eos_token_id=NEVER_EOS),
        "block": DecoderConfig(name="speculative", accept="block", max_new_tokens=24, eos_token_id=NEVER_EOS),
        "mtad": DecoderConfig(name="mtad", max_new_tokens=24, eos_token_id=NEVER_EOS),
    }.items():
        tot = time_decodes(pair, cfg, [prompt] * 2, [1, 2])
        overhead[name] = 1e3 * max(0.0, tot["wall_s"] - tot["forward_s"]) / max(tot["target_forwards"], 1)
    env = environment_info([pair.device])
    return Profile(
        hardware=env["device_name"],
        pair=pair.name,
        costs_ms=costs,
        overhead_ms=overhead,
        num_threads=torch.get_num_threads(),
        context_tokens=context,
        reps=5,
        measured=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def mean_profile(a: CostProfile, b: CostProfile) -> CostProfile:
    return a.replace(
        label="mean of the profiles before and after the runs",
        t1=(a.t1 + b.t1) / 2,
        c=(a.c + b.c) / 2,
        c_W=(a.c_W + b.c_W) / 2,
        v=(a.v + b.v) / 2,
        prefill=(a.prefill + b.prefill) / 2,
        overhead={k: (a.overhead[k] + b.overhead[k]) / 2 for k in a.overhead},
    )


def records(row: dict, search) -> dict:
    return stats.samples_for([row.get("run_dir")], None, search) or {}


def check(name: str, prompts: int, tokens: int, out_dir: Path) -> dict:
    overrides = [
        *PAIRS[name],
        "task=gsm8k",
        f"task.n_prompts={prompts}",
        "task.few_shot=0",
        f"decoder.max_new_tokens={tokens}",
        "num_threads=1",
        "warmup=1",
        f"name=regime_check_{name}",
        "progress=false",
        f"results_dir={out_dir}",
    ]
    cfgs = [compose_job([*DECODERS[d], *overrides]) for d in DECODERS]
    mcfg = ModelConfig.from_any(OmegaConf.to_container(cfgs[0], resolve=True)["model"])
    pair = load_pair(mcfg)
    task_cfg = OmegaConf.to_container(cfgs[0], resolve=True)["task"]
    task = get_task(TaskConfig.from_any(task_cfg))
    P = int(statistics.mean(len(task.encode(s, pair.tokenizer, 0, (), mcfg.chat_template).ids) for s in task.samples()))
    t0 = time.perf_counter()
    before = measure_profile(pair, prompt_len=P)
    log.info("%s: profile before, %.0f s", name, time.perf_counter() - t0)
    rows = run_interleaved(cfgs)
    log.info("%s: interleaved runs done, %.0f s", name, time.perf_counter() - t0)
    recs = [records(r, [out_dir]) for r in rows]
    after = measure_profile(pair, prompt_len=P)
    log.info("%s: profile after, %.0f s", name, time.perf_counter() - t0)
    profs = {
        k: CostProfile.from_profile(p, GAMMA, W, prompt_tokens=P) for k, p in (("before", before), ("after", after))
    }
    profs["mean"] = mean_profile(profs["before"], profs["after"])
    points = []
    for d, row, rec in zip(DECODERS, rows, recs):
        m = row["metrics"]
        hist = {1: m["total_tokens"]} if d == "sampling" else m["acceptance_profile"]["acceptance_length_histogram"]
        t = [x["time_s"] * 1e3 for x in rec.values()]
        n = [x["n_tokens"] for x in rec.values()]
        measured = prompt_interval(t, n)
        pred = {k: predict(hist, d, p, GAMMA, prompts=m["n_samples"]) for k, p in profs.items()}
        points.append(
            {
                "draft": name,
                "decoder": d,
                "measured_ms_per_token": measured,
                "predicted_ms_per_token": pred["mean"],
                "predicted_before": pred["before"],
                "predicted_after": pred["after"],
                "error": pred["mean"] / measured[0] - 1,
                "block_efficiency": m["block_efficiency"],
                "acceptance_rate": m["acceptance_rate"],
                "mean_accept_length": (m["acceptance_profile"] or {}).get("mean_accept_length"),
                "histogram": {str(k): v for k, v in hist.items()},
                "n_prompts": m["n_samples"],
                "tokens": m["total_tokens"],
                "distinct_2": m.get("distinct_2"),
                "per_prompt": [[x["time_s"], x["n_tokens"]] for x in rec.values()],
            }
        )
    base = {p["decoder"]: p for p in points}
    for p, rec in zip(points, recs):
        for ref in ("sampling", "speculative"):
            if p["decoder"] == ref:
                continue
            iv = stats.compare("speedup", rec, recs[list(DECODERS).index(ref)])
            pred = base[ref]["predicted_ms_per_token"] / p["predicted_ms_per_token"]
            meas = iv.point if iv is not None else None
            p[f"speedup_vs_{ref}"] = {
                "measured": [meas, iv.low, iv.high] if iv is not None else None,
                "predicted": pred,
                "error": pred / meas - 1 if meas else None,
            }
    out = {
        "draft": name,
        "overrides": overrides,
        "points": points,
        "profiles": {k: vars(v) | {"overhead": dict(v.overhead)} for k, v in profs.items()},
        "raw_profiles": {"before": json.loads(before.to_json()), "after": json.loads(after.to_json())},
        "prompt_tokens_mean": P,
        "seconds": time.perf_counter() - t0,
        "command": "python experiments/regime_check.py " + " ".join(sys.argv[1:]),
    }
    (out_dir / f"check-{name}.json").write_text(json.dumps(out, indent=1, default=float))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", action="append", choices=sorted(PAIRS), required=True)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", default=str(REPO_ROOT / "results" / "regimes" / "check"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.pair:
        if (out / f"check-{name}.json").is_file():
            log.info("%s: already checked (%s)", name, out / f"check-{name}.json")
            continue
        r = check(name, args.prompts, args.tokens, out)
        for p in r["points"]:
            log.info(
                "%s %s: measured %.1f ms/token, predicted %.1f (error %+.1f %%)",
                name,
                p["decoder"],
                p["measured_ms_per_token"][0],
                p["predicted_ms_per_token"],
                100 * p["error"],
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The temperature-matched control, for speed: is MTAD faster than sampling colder with a lossless speculative
decoder?

    .venv/bin/python experiments/regime_temperature.py [--prompts 10] [--tokens 48] [--temps 0.6 0.7 0.8 0.9]

One interleaved run (``mtad.harness.runner.run_interleaved``, prompt by prompt in rotating order) on the bf16
feature pair, GSM8K: MTAD (τ = 0.5, T = 1), lossless speculative decoding at T = 1 and at each colder T (its
output has exactly the law of sampling at that T). The temperature whose output perplexity matches MTAD's is
read off the sweep (linear interpolation of log perplexity in T; the nearest swept T is the comparison run);
MTAD is compared with speculative decoding at that T in speed, perplexity and distinct-2 with paired 95 %
intervals over prompts. Writes ``results/regimes/temperature/temperature.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.paths import REPO_ROOT  # noqa: E402
from mtad.harness.runner import run_interleaved  # noqa: E402
from mtad.harness.sweep import compose_job  # noqa: E402
from mtad.measure.metrics import distinct_n  # noqa: E402
from mtad.report import stats  # noqa: E402


def distinct2_diff(a: list[list[int]], b: list[list[int]], n_boot: int = 2000, seed: int = 0) -> list[float]:
    """distinct-2 of a's outputs minus b's, [point, lo, hi], resampling prompts (paired: same indices)."""
    rng = np.random.default_rng(seed)
    point = distinct_n(a, 2) - distinct_n(b, 2)
    dist = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(a), len(a))
        dist.append(distinct_n([a[i] for i in idx], 2) - distinct_n([b[i] for i in idx], 2))
    return [point, float(np.quantile(dist, 0.025)), float(np.quantile(dist, 0.975))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--temps", type=float, nargs="+", default=[0.6, 0.7, 0.8, 0.9])
    ap.add_argument("--out", default=str(REPO_ROOT / "results" / "regimes" / "temperature"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["model=smollm2_bf16_feature", "task=gsm8k", f"task.n_prompts={args.prompts}", "task.few_shot=0",
              f"decoder.max_new_tokens={args.tokens}", "num_threads=1", "warmup=1", "name=regime_temperature",
              "progress=false", "perplexity=true", f"results_dir={out}"]
    runs = {"mtad": ["decoder=mtad", "decoder.tau=0.5"], "speculative T=1": ["decoder=speculative"]}
    runs |= {f"speculative T={t:g}": ["decoder=speculative", f"decoder.temperature={t}"] for t in args.temps}
    rows = run_interleaved([compose_job([*v, *common]) for v in runs.values()])
    recs = {k: stats.samples_for([r.get("run_dir")], None, [out]) for k, r in zip(runs, rows)}
    samples = {k: stats.read_samples(stats.resolve_run_dir(r.get("run_dir"), [out])) for k, r in zip(runs, rows)}
    ppl = {k: r["metrics"].get("ppl_mean_logprob") for k, r in zip(runs, rows)}
    temps = sorted([1.0, *args.temps])
    logp = [math.log(ppl["speculative T=1" if t == 1.0 else f"speculative T={t:g}"]) for t in temps]
    target = math.log(ppl["mtad"])
    t_star = float(np.interp(target, logp, temps)) if logp == sorted(logp) else None
    nearest = min(temps, key=lambda t: abs(logp[temps.index(t)] - target))
    ref = "speculative T=1" if nearest == 1.0 else f"speculative T={nearest:g}"
    ids = sorted(set(s["id"] for s in samples["mtad"]) & set(s["id"] for s in samples[ref]))
    outs = {k: [next(s["output_ids"] for s in samples[k] if s["id"] == i) for i in ids] for k in ("mtad", ref)}
    res = {"ppl": ppl, "t_star_interpolated": t_star, "matched_run": ref,
           "ms_per_token": {k: r["metrics"]["ms_per_token"] for k, r in zip(runs, rows)},
           "distinct_2": {k: r["metrics"].get("distinct_2") for k, r in zip(runs, rows)},
           "block_efficiency": {k: r["metrics"].get("block_efficiency") for k, r in zip(runs, rows)}}
    for base in ("speculative T=1", ref):
        sp = stats.compare("speedup", recs["mtad"], recs[base])
        pc = stats.compare("ppl_change", recs["mtad"], recs[base])
        res[f"mtad_vs_{base}"] = {"speedup": [sp.point, sp.low, sp.high], "ppl_change": [pc.point, pc.low, pc.high],
                                  "distinct_2_diff": distinct2_diff(outs["mtad"], outs[ref]) if base == ref else None}
    (out / "temperature.json").write_text(json.dumps(res, indent=1, default=float))
    print(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())

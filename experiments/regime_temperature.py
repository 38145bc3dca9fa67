"""The temperature-matched control, for speed: is MTAD faster than sampling colder with a lossless speculative
decoder?

    .venv/bin/python experiments/regime_temperature.py [--prompts 30] [--tokens 48] [--temps 0.7 0.8 0.9]
    .venv/bin/python experiments/regime_temperature.py --from results/published/NAME.jsonl   # re-render

One interleaved run (``mtad.harness.runner.run_interleaved``, prompt by prompt in rotating order) on the bf16
feature pair, GSM8K: MTAD (τ = 0.5, T = 1), lossless speculative decoding at T = 1 and at each colder T (its
output has exactly the law of sampling at that T). The temperature whose output perplexity matches MTAD's is
read off the sweep (linear interpolation of log perplexity in T where it is monotone); MTAD is compared with
speculative decoding at every T — speed in CPU time (little moved by other processes on a shared machine) and
in wall time, perplexity, distinct-2 — with paired 95 % intervals over prompts from the project's bootstrap
(``mtad.report.stats``). Writes ``temperature.{json,md}`` beside the rows; ``--from`` re-renders both from
(published) rows and their per-prompt records.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.paths import REPO_ROOT, repo_relative  # noqa: E402
from mtad.decoding.config import MIN_TEMPERATURE  # noqa: E402
from mtad.harness import clicheck  # noqa: E402
from mtad.report import stats  # noqa: E402
from mtad.report.markdown import DASH, table  # noqa: E402

KINDS = (("cpu_speedup", "speed-up, CPU time"), ("speedup", "speed-up, wall time"),
         ("ppl_change", "perplexity change"), ("distinct2_diff", "distinct-2 difference"))


def jobs(prompts: int, tokens: int, temps: list[float], out: Path) -> list[list[str]]:
    """The control's runs as Hydra overrides: MTAD, speculative decoding at T = 1 and at each of ``temps``."""
    common = ["model=smollm2_bf16_feature", "task=gsm8k", f"task.n_prompts={prompts}", "task.few_shot=0",
              f"decoder.max_new_tokens={tokens}", "num_threads=1", "warmup=1", "name=regime_temperature",
              "progress=false", "perplexity=true", f"results_dir={repo_relative(out)}"]
    runs = [["decoder=mtad", "decoder.tau=0.5"], ["decoder=speculative"]]
    runs += [["decoder=speculative", f"decoder.temperature={t}"] for t in temps]
    return [[*v, *common] for v in runs]


def label(row: dict) -> str:
    d = row["decoder"]
    return "mtad" if d["name"] == "mtad" else f"speculative T={float(d.get('temperature', 1.0)):g}"


def analyze(rows: list[dict], search: list[Path]) -> dict:
    """The control from the rows and their per-prompt records: the matched temperature and every comparison."""
    by = {label(r): r for r in rows}
    recs = {k: stats.samples_for([r.get("run_dir")], None, search) for k, r in by.items()}
    if any(v is None for v in recs.values()):
        raise SystemExit("per-prompt records not found for " + ", ".join(k for k, v in recs.items() if v is None)
                         + ": pass the folder holding the run directories")
    ppl = {k: r["metrics"]["ppl_mean_logprob"] for k, r in by.items()}
    temps = sorted(float(k.split("=")[1]) for k in by if k != "mtad")
    logp = [math.log(ppl[f"speculative T={t:g}"]) for t in temps]
    target = math.log(ppl["mtad"])
    monotone = all(a < b for a, b in zip(logp, logp[1:]))
    t_star = float(np.interp(target, logp, temps)) if monotone and logp[0] <= target <= logp[-1] else None
    nearest = min(temps, key=lambda t: abs(logp[temps.index(t)] - target))
    comps = {}
    for t in temps:
        ref = f"speculative T={t:g}"
        comps[ref] = {}
        for kind, _ in KINDS:
            iv = stats.compare(kind, recs["mtad"], recs[ref])
            comps[ref][kind] = stats.judged(iv)  # [point, low, high, verdict], the interval settled
    m = {k: r["metrics"] for k, r in by.items()}
    return {"perplexity": ppl, "t_matched_interpolated": t_star, "perplexity_monotone_in_T": monotone,
            "nearest_T": nearest, "comparisons": comps,
            "block_efficiency": {k: v.get("block_efficiency") for k, v in m.items()},
            "distinct_2": {k: v.get("distinct_2") for k, v in m.items()},
            "cpu_ms_per_token": {k: 1e3 * v["total_cpu_s"] / v["total_tokens"] if v.get("total_cpu_s") else None
                                 for k, v in m.items()},
            "n_prompts": {k: v["n_samples"] for k, v in m.items()},
            "tokens": {k: v["total_tokens"] for k, v in m.items()},
            "git_sha": sorted({r.get("git_sha") for r in rows}),
            "git_dirty": sorted({r.get("git_dirty") for r in rows}),
            "timing": rows[0].get("timing")}


def render(res: dict, pair: str) -> str:
    n = res["n_prompts"]["mtad"]
    t = res["t_matched_interpolated"]
    matched = (f"T ≈ {t:.2f} (interpolated in log perplexity); nearest swept T = {res['nearest_T']:g}" if t is not None
               else f"perplexity is not monotone in the swept T, or MTAD's lies outside it: nearest swept "
                    f"T = {res['nearest_T']:g}")
    out = ["# Temperature-matched control: MTAD against lossless speculative decoding at a colder temperature", "",
           f"{pair}; GSM8K, {n} prompts, decoded interleaved (prompt by prompt, rotating order), one thread. MTAD "
           "τ = 0.5 at T = 1; speculative decoding at T has exactly the law of sampling at T. Paired 95 % "
           "intervals over prompts (the project's bootstrap); a speed-up above 1 means MTAD is faster; CPU time is "
           "the process's CPU seconds, little moved by other processes on a shared machine.", "",
           f"Output perplexity of MTAD matched by speculative decoding at: {matched}.", ""]
    rows = []
    for k in ["mtad", *sorted(res["comparisons"])]:
        cpu = res["cpu_ms_per_token"].get(k)
        rows.append([k, f"{res['perplexity'][k]:.3f}", f"{res['distinct_2'][k]:.3f}",
                     f"{res['block_efficiency'][k]:.2f}", f"{cpu:.1f}"] if cpu else [k, *[DASH] * 4])
    out += table(["run", "output perplexity", "distinct-2", "block efficiency", "CPU ms/token"], rows)
    rows = [[ref + (" (matched)" if float(ref.split("=")[1]) == res["nearest_T"] else ""),
             *(stats.printed_interval(c[k], k) for k, _ in KINDS)] for ref, c in sorted(res["comparisons"].items())]
    out += ["", "MTAD against each:", "", *table(["against", *(h for _, h in KINDS)], rows)]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = clicheck.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=clicheck.positive_int, default=30)
    ap.add_argument("--tokens", type=clicheck.positive_int, default=48, help="new tokens per prompt")
    ap.add_argument("--temps", type=clicheck.real(MIN_TEMPERATURE), nargs="+", default=[0.7, 0.8, 0.9],
                    help="the colder temperatures of speculative decoding")
    ap.add_argument("--out", default=str(REPO_ROOT / "results" / "regimes" / "temperature"))
    ap.add_argument("--from", dest="rows", type=clicheck.rows_file("give a results .jsonl written by this "
                                                                   "script's runs (results/published/NAME.jsonl)"),
                    help="re-render from these rows (a results .jsonl) and their records")
    args = ap.parse_args(argv)
    out = clicheck.check_or_exit(ap, clicheck.writable_dir, args.out, "--out").resolve()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.rows:
        rows = [json.loads(x) for x in Path(args.rows).read_text().splitlines() if x.strip()]
        search = [Path(args.rows).parent, out]
    else:
        os.chdir(REPO_ROOT)  # the runs' results_dir is recorded relative to the repository
        from mtad.harness.runner import run_interleaved
        from mtad.harness.sweep import compose_job

        rows = run_interleaved([compose_job(job) for job in jobs(args.prompts, args.tokens, args.temps, out)])
        search = [out]
    res = analyze(rows, search)
    pair = rows[0].get("model", {}).get("name", "the bf16 feature pair")
    hw = rows[0].get("device_name", "")
    (out / "temperature.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    (out / "temperature.md").write_text(render(res, f"{pair} on {hw}".strip()))
    print(render(res, pair))
    return 0


if __name__ == "__main__":
    sys.exit(main())

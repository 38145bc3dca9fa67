"""The forecast's ex-ante check: forecasts written and committed first, the measurements that check them after.

    .venv/bin/python experiments/forecast_check.py replay                # hardware-free acceptance (no timing)
    .venv/bin/python -m mtad.study.forecast calibrate model=<pair>       # each pair's cost profile (own process)
    .venv/bin/python experiments/forecast_check.py register              # -> results/regimes/forecast/forecasts.jsonl
    git commit                                                           # the forecasts, before any measurement
    .venv/bin/python experiments/forecast_check.py measure               # interleaved runs, CPU time
    .venv/bin/python experiments/forecast_check.py render --from results/published/forecast_check-<date>.jsonl

Every forecast reads only (a) the setting's replay on GSM8K *train* prompts 0-19 (:mod:`mtad.study.forecast.replay`)
and (b) the pair's profile, calibrated by its own command on GSM8K train prompts from 1000 on, at settings listed
in the profile (:data:`mtad.study.forecast.costs.CALIBRATION`); the checked settings are outside that list. The
measurement decodes GSM8K *test* prompts 0-19 with every setting of a draft interleaved (prompt by prompt, rotating
order, one thread), as ``python -m mtad`` runs; its CPU ms/token and speed-ups carry paired 95 % intervals. ``render``
compares them: how many forecasts the measured intervals contain, every error, the largest.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.io import atomic_write  # noqa: E402
from mtad._util.paths import REPO_ROOT, repo_relative  # noqa: E402
from mtad.study.forecast.spec import parse  # noqa: E402

OUT = REPO_ROOT / "results" / "regimes" / "forecast"
STORE = OUT / "acceptance"
PROMPTS, TOKENS = 20, 48
BASELINES = ("sampling", "speculative:gamma=4")
DRAFTS = {  # name -> (pair overrides, the settings checked; every draft also runs BASELINES and mtad's default)
    "feature": (("model=smollm2_feature",),
                ("speculative:gamma=3", "speculative:gamma=6", "mtad:gamma=6,W=2", "mtad:gamma=3,W=6",
                 "mtad:tau=0.3", "mtad:tau=0.9", "mmtad:gamma=4,W=4", "specinfer:tree=4.2.2",
                 "specinfer:tree=2.2.2.2")),
    "int8": (("model=smollm2_int8draft",),
             ("speculative:gamma=6", "mtad:gamma=6,W=2", "mmtad:gamma=4,W=4", "specinfer:tree=4.2.2")),
}
REFERENCE = "mtad:gamma=4,W=4"  # MTAD's preset: a calibrated setting, forecast and measured as a reference


def settings(name: str) -> list[str]:
    return [str(parse(s)) for s in (*BASELINES, REFERENCE, *DRAFTS[name][1])]


def workload(name: str, split: str = "train"):
    from mtad.study.forecast.replay import Workload

    return Workload(pair=DRAFTS[name][0], task="gsm8k", split=split, offset=0, count=PROMPTS, tokens=TOKENS)


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cmd_replay(args) -> int:
    from mtad.study.forecast.replay import Replayer

    for name in args.draft:
        rep = Replayer(workload(name), STORE)
        for s in settings(name):
            rep.records(parse(s))
            logging.info("%s: %s replayed", name, s)
    return 0


def profile_file(name: str) -> Path:
    from mtad.harness.rows import environment_info
    from mtad.study.forecast import costs
    from mtad.study.forecast.replay import model_config

    return costs.profile_path(environment_info()["device_name"], model_config(DRAFTS[name][0]).name, 1)


def cmd_register(args) -> int:
    from mtad.study.forecast.costs import CostProfile
    from mtad.study.forecast.predict import forecast
    from mtad.study.forecast.replay import Replayer, cached

    path = OUT / "forecasts.jsonl"
    if path.exists():
        raise SystemExit(f"{repo_relative(path)} exists: forecasts are registered once and never re-fitted; "
                         "a new check registers under a new --out")
    lines = []
    for name in args.draft:
        pfile = profile_file(name)
        prof = CostProfile.load(pfile)
        rep = Replayer(workload(name), STORE)
        recs = {s: cached(rep.pair, rep.mcfg, rep.items, parse(s), rep.w, STORE) for s in settings(name)}
        base = {"sampling": (recs[str(parse("sampling"))][0], "sampling"),
                "speculative": (recs[str(parse("speculative:gamma=4"))][0], "speculative")}
        for s in settings(name):
            spec = parse(s)
            rs, rpath = recs[s]
            lines.append({"draft": name, "pair": rep.mcfg.name, "setting": s,
                          "role": "baseline" if s in map(str, map(parse, BASELINES)) else
                          "reference" if s == str(parse(REFERENCE)) else "check",
                          "calibrated": s in prof.calibration["settings"],
                          "acceptance": {"file": repo_relative(rpath), "sha256": sha(rpath),
                                         "workload": rep.w.label()},
                          "profile": {"file": repo_relative(pfile), "sha256": sha(pfile), "label": prof.label,
                                      "terms": prof.summary()},
                          "forecast": forecast(rs, spec.name, prof, base)})
    atomic_write(path, "".join(json.dumps(x, default=float) + "\n" for x in lines))
    print(f"wrote {repo_relative(path)}: {sum(x['role'] == 'check' for x in lines)} checked settings, "
          f"{len(lines)} forecasts")
    for x in lines:
        f = x["forecast"]
        print(f"  {x['draft']:8s} {x['setting']:28s} {f['ms_per_token'][0]:7.1f} ms/token  vs sampling "
              f"{f['speedup_vs_sampling'][0]:.2f}x  vs speculative {f['speedup_vs_speculative'][0]:.2f}x")
    return 0


def jobs(name: str, out: Path) -> list[list[str]]:
    common = [*DRAFTS[name][0], "task=gsm8k", f"task.n_prompts={PROMPTS}", "task.few_shot=0",
              f"decoder.max_new_tokens={TOKENS}", "num_threads=1", "warmup=1", "name=forecast_check",
              "progress=false", "perplexity=true", f"results_dir={repo_relative(out)}"]
    return [[*parse(s).overrides(), *common] for s in settings(name)]


def cmd_measure(args) -> int:
    from mtad.harness.runner import run_interleaved
    from mtad.harness.sweep import compose_job

    if not (OUT / "forecasts.jsonl").is_file():
        raise SystemExit("no registered forecasts: run `register` and commit them before measuring")
    os.chdir(REPO_ROOT)  # the runs' results_dir is recorded relative to the repository
    for name in args.draft:
        logging.info("measuring %s: %s", name, ", ".join(settings(name)))
        run_interleaved([compose_job(j) for j in jobs(name, OUT)])
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("verb", choices=("replay", "register", "measure", "render"))
    ap.add_argument("--draft", action="append", choices=sorted(DRAFTS))
    ap.add_argument("--from", dest="rows", help="render: the measured rows (a results .jsonl) and their records")
    args = ap.parse_args(argv)
    args.draft = args.draft or list(DRAFTS)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import torch

    torch.set_num_threads(1)
    if args.verb == "render":
        from mtad.study.forecast.check import render_check

        return render_check(OUT, Path(args.rows) if args.rows else None)
    return {"replay": cmd_replay, "register": cmd_register, "measure": cmd_measure}[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())

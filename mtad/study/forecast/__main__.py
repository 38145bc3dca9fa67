"""``python -m mtad.study.forecast``: calibrate a machine's cost profile, forecast any decoder setting, rank
settings. Nothing here times the decoders it forecasts (docs/RUNNING.md, "Forecasts").

    python -m mtad.study.forecast calibrate model=smollm2_feature
    python -m mtad.study.forecast predict model=smollm2_feature --decoder mtad:gamma=6,W=2 \\
        --profile results/profiles/forecast/<file>.json --profile gpu:llama8b_1b
    python -m mtad.study.forecast rank model=smollm2_feature --profile gpu:llama8b_1b --top 5
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

from mtad.harness.rows import environment_info
from mtad.report.markdown import interval
from mtad.report.markdown import table as md_table
from mtad.study.forecast import costs, declared
from mtad.study.forecast.predict import forecast
from mtad.study.forecast.replay import STORE, Replayer, Workload
from mtad.study.forecast.spec import parse

BASELINES = {"sampling": "sampling", "speculative": "speculative:gamma=4"}
CAL_OFFSET = 1000  # calibration prompts: GSM8K train from here, far from the replays' (from 0)
# the settings `rank` compares when none are named: every decoder over its usual range
GRID = (["speculative:gamma=%d" % g for g in (2, 3, 4, 5, 6, 8)]
        + ["block:gamma=%d" % g for g in (3, 4, 6)]
        + ["mtad:gamma=%d,W=%d,tau=%s" % (g, w, t) for g in (3, 4, 6) for w in (2, 4, 6) for t in (0.3, 0.5, 0.9)]
        + ["mmtad:gamma=%d,W=%d" % (g, w) for g in (3, 4) for w in (2, 4)]
        + ["specinfer:tree=%s" % t for t in ("2.2.2", "4.2.2", "2.2.2.2", "3.3")])


def positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def nonnegative(text: str) -> int:
    v = int(text) if text.lstrip("-").isdigit() else -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return v


def spec_arg(text: str):
    try:
        return parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def profile_arg(text: str) -> costs.CostProfile:
    """``gpu:<key>[:term=value,...]`` (declared) or a measured profile's file."""
    try:
        if text.startswith("gpu:"):
            key, _, rest = text[4:].partition(":")
            values = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
            return declared.profile(key, **{k: _finite(v, k) for k, v in values.items()})
        return costs.CostProfile.load(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _finite(v: str, k: str) -> float:
    x = float(v)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{k}={v}: a term must be a finite number >= 0")
    return x


def workload_args(ap: argparse.ArgumentParser, prompts: int, offset: int, split: str) -> None:
    ap.add_argument("pair", nargs="+", help="Hydra overrides of the pair, e.g. model=smollm2_feature")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--split", default=split)
    ap.add_argument("--prompts", type=positive, default=prompts)
    ap.add_argument("--offset", type=nonnegative, default=offset)
    ap.add_argument("--tokens", type=positive, default=48)
    ap.add_argument("--seed", type=nonnegative, default=0)
    ap.add_argument("--store", default=str(STORE), help="replay cache folder")


def workload(args) -> Workload:
    bad = [p for p in args.pair if "=" not in p or not p.split("=", 1)[0].startswith("model")]
    if bad:
        raise ValueError(f"{' '.join(bad)}: name the pair with model overrides (model=<pair> [model.draft=...])")
    return Workload(pair=tuple(args.pair), task=args.task, split=args.split, offset=args.offset,
                    count=args.prompts, tokens=args.tokens, seed=args.seed)


def table(results: list[dict]) -> str:
    rows = []
    for r in results:
        f, q = r["forecast"], r["forecast"].get("quality_vs_sampling") or {}
        rows.append([r["setting"], r["profile_label"], interval(f["ms_per_token"], 1),
                     interval(f.get("speedup_vs_sampling"), unit="×"),
                     interval(f.get("speedup_vs_speculative"), unit="×"), interval(f["tokens_per_step"]),
                     interval(q.get("ppl_change"), 1, unit=" %"), interval(q.get("distinct2_diff"), 3)])
    return "\n".join(md_table(["setting", "profile", "ms/token", "vs sampling", "vs speculative γ=4",
                               "tokens/step", "perplexity vs sampling", "distinct-2 vs sampling"], rows)) + "\n"


def run_forecasts(rep: Replayer, specs, profiles) -> list[dict]:
    base = {label: (rep.records(parse(s)), parse(s).name) for label, s in BASELINES.items()}
    out = []
    for spec in specs:
        recs = rep.records(spec)
        for prof in profiles:
            out.append({"setting": str(spec), "pair": rep.mcfg.name, "workload": rep.w.label(),
                        "profile": prof.pair if prof.kind == "declared" else prof.label, "profile_kind": prof.kind,
                        "profile_label": prof.label, "forecast": forecast(recs, spec.name, prof, base)})
    return out


def cmd_calibrate(args) -> int:
    w = workload(args)
    rep = Replayer(w, Path(args.store))
    hardware = environment_info()["device_name"]
    prof = costs.calibrate(rep, args.setting or costs.CALIBRATION, hardware)
    path = Path(args.out) if args.out else costs.profile_path(hardware, prof.pair, prof.num_threads)
    if path.exists() and not args.force:
        raise ValueError(f"{path} exists: a profile is calibrated once; pass --force to replace it or --out "
                         "to write another")
    costs.write(prof, path)
    s = prof.summary()
    print(f"wrote {path}: t1 {s['t1_ms']:.2f} ms, c {s['c']:.3f}, c_W(4)/c {s['cW_over_c']:.3f}, v(5) "
          f"{s['v']:.3f}, tree of 17 nodes {s['v_tree']:.3f} target steps; in-sample error per setting "
          + ", ".join(f"{k} {100 * v:+.1f} %" for k, v in prof.calibration["in_sample_error"].items()))
    return 0


def cmd_predict(args) -> int:
    rep = Replayer(workload(args), Path(args.store))
    results = run_forecasts(rep, args.decoder, args.profile)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r, default=float) + "\n" for r in results))
    print(f"Forecast for {rep.mcfg.name} on {rep.w.label()} (acceptance replayed, nothing timed; 95 % intervals "
          "over prompts):\n")
    print(table(results))
    return 0


def cmd_rank(args) -> int:
    rep = Replayer(workload(args), Path(args.store))
    specs = args.decoder or [parse(s) for s in GRID]
    out = [0]
    for prof in args.profile:
        results = sorted(run_forecasts(rep, specs, [prof]), key=lambda r: r["forecast"]["ms_per_token"][0])
        print(f"Fastest settings for {rep.mcfg.name} under {prof.label} ({rep.w.label()}):\n")
        print(table(results[:args.top]))
        out.append(results)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r, default=float) + "\n" for rs in out[1:] for r in rs))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.study.forecast", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("calibrate", help="measure this machine's cost profile of a pair (once)")
    workload_args(c, 4, CAL_OFFSET, "train")
    c.add_argument("--setting", action="append", type=str, help="calibration settings (default: a spread)")
    c.add_argument("--out", help="profile file (default: results/profiles/forecast/<hardware>-<threads>t-<pair>.json)")
    c.add_argument("--force", action="store_true")
    for name, hlp in (("predict", "forecast settings under profiles"), ("rank", "rank settings under a profile")):
        p = sub.add_parser(name, help=hlp)
        workload_args(p, 20, 0, "train")
        p.add_argument("--decoder", action="append", type=spec_arg, required=name == "predict",
                       help="a setting, e.g. mtad:gamma=6,W=2 (repeatable)")
        p.add_argument("--profile", action="append", type=profile_arg, required=True,
                       help="a measured profile's file or gpu:<key>[:term=value,...] (repeatable)")
        p.add_argument("--json", help="also write the forecasts here, one JSON line each")
        if name == "rank":
            p.add_argument("--top", type=positive, default=5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if getattr(args, "setting", None):
        for s in args.setting:
            try:
                parse(s)
            except ValueError as err:
                ap.error(str(err))
    try:
        return {"calibrate": cmd_calibrate, "predict": cmd_predict, "rank": cmd_rank}[args.verb](args)
    except ValueError as err:
        print(f"{ap.prog} {args.verb}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``python -m mtad.study verifiers [options] [key=value ...]``: the common-random-numbers verifier study
(VERIFIERS.md §6; :mod:`mtad.study.verifiers`) on an embedded pair and a few tasks, written as a table
(Markdown, JSONL, CSV) and one figure to ``--out`` (default ``results/published/verifiers``).

Example (the published study, ~20 minutes on one thread):
``python -m mtad.study verifiers --model smollm2_feature --tasks gsm8k mt_bench --prompts 30``.
Trailing ``key=value`` arguments are Hydra overrides of the model and task configs (``task.max_prompt_tokens=256``).
Bad input (an unknown model, task or option value) ends with one ``mtad.study: error:`` line and exit status 2.
"""
from __future__ import annotations

import argparse
import logging
import pickle
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from hydra.errors import HydraException
from omegaconf import OmegaConf

from mtad._util.io import writable_dir, writable_file
from mtad._util.paths import REPO_ROOT, recorded_command
from mtad.decoding import DecoderConfig
from mtad.decoding.config import MIN_TEMPERATURE
from mtad.harness.clicheck import (
    ArgumentParser,
    nonnegative_int,
    pickle_file,
    positive_int,
    real,
    terminate_like_interrupt,
)
from mtad.harness.rows import environment_info, git_info
from mtad.harness.sweep import compose_job
from mtad.models.load import ModelConfig, load_pair
from mtad.study import output
from mtad.study import verifiers as study_verifiers
from mtad.study.verifiers import N_BOOT, from_plain, pairing_failures, rules, run_task, summarize, to_plain
from mtad.tasks.base import TaskConfig, get_task

log = logging.getLogger("mtad.study")
STUDIES = ("verifiers",)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m mtad.study", description=__doc__.split("\n\n")[0])
    p.add_argument("study", choices=STUDIES, help="verifiers: every accept rule on the same drafts and uniforms")
    p.add_argument("--model", default="smollm2_feature", help="a conf/model/ pair with a draft")
    p.add_argument("--tasks", nargs="+", default=["gsm8k", "mt_bench"], help="conf/task/ names")
    p.add_argument("--prompts", type=positive_int, default=30, help="prompts per task")
    p.add_argument("--tokens", type=positive_int, default=64,
                   help="continuation tokens per prompt (contexts lie on it)")
    p.add_argument("--stride", type=positive_int, default=4, help="a context every this many continuation tokens")
    p.add_argument("--continuation", choices=("sampled", "greedy"), default="sampled",
                   help="the target's own sampled (T, top-k, top-p below) or greedy continuation")
    p.add_argument("--gamma", type=positive_int, default=4, help="K, draft tokens per block")
    p.add_argument("--temperature", type=real(MIN_TEMPERATURE), default=1.0, help="T > 0 (at T = 0 every rule is "
                                                                                   "exact matching)")
    p.add_argument("--top-k", type=nonnegative_int, default=10, help="0 keeps the whole vocabulary")
    p.add_argument("--top-p", type=real(0, 1, low_open=True), default=0.9)
    p.add_argument("--tv-contexts", type=nonnegative_int, default=4,
                   help="fixed contexts for the TV estimate (one per prompt)")
    p.add_argument("--tv-draws", type=positive_int, default=400, help="fresh drafts per fixed context")
    p.add_argument("--mtad-taus", type=real(0, 1, low_open=True), nargs="+", default=[0.1, 0.5, 0.9],
                   help="MTAD joint-rule τ values")
    p.add_argument("--oracle-mix", type=real(0, 1), default=None,
                   help="λ: draft from the oracle mixture λ·q + (1−λ)·p (hardware-free accepted lengths only)")
    p.add_argument("--continuation-cache", default=None,
                   help="a JSON file that keeps the target's continuations for runs that differ in the draft only")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads")
    p.add_argument("--out", default=str(REPO_ROOT / "results" / "published" / "verifiers"))
    p.add_argument("--name", default=None, help="file stem (default verifier_study-<model>)")
    p.add_argument("--save-raw", default=None, help="also pickle the per-context measurements here (re-render)")
    p.add_argument("--render-raw", default=None, type=pickle_file("give a file written with --save-raw"),
                   help="write the outputs from a --save-raw file; run nothing")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the model/task configs")
    args = p.parse_intermixed_args(argv)  # Hydra overrides may come before or after options
    if args.tv_contexts > args.prompts:
        p.error(f"--tv-contexts={args.tv_contexts} is out of range: 0 to --prompts ({args.prompts})")
    return args


def verifiers(args: argparse.Namespace, argv: Sequence[str]) -> list[Path]:
    torch.set_num_threads(args.threads)
    if args.continuation_cache:
        study_verifiers.CONTINUATION_CACHE = args.continuation_cache
    dec = DecoderConfig(name="speculative", gamma=args.gamma, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, max_new_tokens=args.tokens)
    if dec.temperature == 0:
        raise ValueError("--temperature=0 is out of range for this study: at T = 0 every rule is exact matching")
    models, results, pairing, t0 = None, [], {}, time.perf_counter()
    sha, dirty = git_info(REPO_ROOT)  # the code that runs: read before the (long) study, not after
    rule_list = rules(mtad_taus=tuple(args.mtad_taus))
    configs = [OmegaConf.to_container(compose_job([f"model={args.model}", f"task={task_name}",
                                                   f"task.n_prompts={args.prompts}", "task.few_shot=0",
                                                   "task.max_prompt_tokens=512", *args.overrides]), resolve=True)
               for task_name in args.tasks]  # every task's config before the first decodes: a typo is one line
    for task_name, cfg in zip(args.tasks, configs):
        mcfg = ModelConfig(**cfg["model"])
        if not mcfg.draft:
            raise ValueError(f"model={args.model} has no draft: the study judges a draft model's blocks")
        task = get_task(TaskConfig.from_any(cfg["task"]))
        samples = task.samples()
        if models is None:
            models = load_pair(mcfg)
        prompts = [p.ids for p in (task.encode(s, models.tokenizer, 0, (), mcfg.chat_template) for s in samples)
                   if p.ids]
        res = run_task(models, prompts, task_name, rule_list, dec, tokens=args.tokens, stride=args.stride,
                       how=args.continuation, tv_contexts=min(args.tv_contexts, len(prompts)),
                       tv_draws=args.tv_draws, seed=args.seed, mix=args.oracle_mix)
        pairing[task_name] = pairing_failures(res)
        if pairing[task_name]:
            raise RuntimeError(f"{task_name}: the lossless replica disagrees in {pairing[task_name]} contexts: "
                               "the rules were not handed the same draws")
        results.append(res)
    env = environment_info([next(models.target.parameters()).device])
    meta = {"pair": args.model, "device_name": env["device_name"], "num_threads": env["num_threads"],
            "versions": env["versions"], "git_sha": sha, "git_dirty": dirty, "seconds": time.perf_counter() - t0,
            "command": "python -m mtad.study " + " ".join(recorded_command(list(argv))),  # no machine path
            "gamma": args.gamma, "tokens": args.tokens,
            "stride": args.stride, "continuation": args.continuation, "temperature": args.temperature,
            "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed, "n_boot": N_BOOT, "pairing": pairing,
            "tasks": args.tasks, "prompts": args.prompts, "mtad_taus": list(args.mtad_taus),
            "oracle_mix": args.oracle_mix}
    if args.save_raw:
        Path(args.save_raw).write_bytes(pickle.dumps({"meta": meta, "tasks": [to_plain(r) for r in results]}))
    return write(results, meta, args)


def write(results, meta: dict, args: argparse.Namespace) -> list[Path]:
    rows = [row for res in results for row in summarize(res, meta["gamma"], seed=meta["seed"])]
    return output.write_all(rows, meta, Path(args.out), args.name or f"verifier_study-{meta['pair']}")


def render_raw(args: argparse.Namespace) -> list[Path]:
    """The outputs from a ``--save-raw`` file (our own pickle: load only files this command wrote)."""
    try:
        saved = pickle.loads(Path(args.render_raw).read_bytes())
        taus = tuple(saved["meta"].get("mtad_taus", (0.1, 0.5, 0.9)))
        studied = [from_plain(d, rules(mtad_taus=taus)) for d in saved["tasks"]]
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, KeyError, IndexError, TypeError) as err:
        raise ValueError(f"--render-raw {args.render_raw} is not a study's --save-raw file ({type(err).__name__}: "
                         f"{err}): give a file written with --save-raw") from None
    return write(studied, saved["meta"], args)


def check_outputs(args: argparse.Namespace) -> None:
    """Where the study writes, checked before it runs (20-35 minutes): ``--out`` a writable folder (created
    with its parents), ``--save-raw`` a file whose folder is created and writable, ``--render-raw`` a file."""
    writable_dir(args.out, "--out")
    stem = args.name or f"verifier_study-{args.model}"
    writable_file(Path(args.out) / f"{stem}.jsonl", "--name")
    if args.save_raw:
        writable_file(args.save_raw, "--save-raw")
    if args.render_raw and not Path(args.render_raw).is_file():
        raise ValueError(f"--render-raw {args.render_raw} is not a file: give a file written with --save-raw")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except SystemExit as stop:  # --help, or a bad argument (its one line printed): the status, as every exit here
        return stop.code
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    terminate_like_interrupt()
    try:
        check_outputs(args)
        paths = render_raw(args) if args.render_raw else verifiers(args, argv)
    except KeyboardInterrupt:
        print("mtad.study: interrupted: nothing was written", file=sys.stderr)
        return 130
    except (ValueError, OSError, HydraException) as err:  # Hydra: an unknown model or task name
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"mtad.study: error: {first}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())

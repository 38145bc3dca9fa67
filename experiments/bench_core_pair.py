"""``make bench-core``'s overhead shares on a real pair: the share of CPU time outside model forwards per decoder.

    .venv/bin/python experiments/bench_core_pair.py [--pair smollm2_bf16_feature] [--decoders speculative mtad mmtad]

The pair is a ``conf/model/`` name (default: the default pair); the prompts are three fixed instructions (a word
problem, a story, an explanation; no dataset needed) in the pair's chat template, each decoded once after one
untimed warm-up (:func:`mtad.measure.overhead.bench_one`); one thread by default.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.paths import REPO_ROOT  # noqa: E402
from mtad.harness import clicheck  # noqa: E402
from mtad.harness.sweep import compose_job  # noqa: E402
from mtad.measure.overhead import DECODERS, bench_one, format_table  # noqa: E402
from mtad.models.load import load_pair  # noqa: E402

PROMPTS = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
    "did Natalia sell altogether in April and May? Solve it step by step.",
    "Write a short story about a robot who learns to paint, in about one hundred words.",
    "Explain to a ten-year-old why the sky is blue and why sunsets are red.",
)


def encode(pair, chat: bool) -> list[list[int]]:
    """The fixed prompts as token ids, in the tokenizer's chat template when the pair asks for one."""
    tok = pair.tokenizer
    if chat and getattr(tok, "chat_template", None):
        return [list(map(int, tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))) for t in PROMPTS]
    return [tok(t)["input_ids"] for t in PROMPTS]


def main(argv=None) -> list[dict]:
    ap = clicheck.ArgumentParser(description=__doc__.split("\n")[0])
    known = sorted(p.stem for p in (REPO_ROOT / "conf" / "model").glob("*.yaml"))
    ap.add_argument("--pair", default="smollm2_bf16_feature", help="a conf/model/ name")
    ap.add_argument("--decoders", nargs="*", default=["sampling", "speculative", "mtad", "mmtad", "specinfer"],
                    help=f"subset of {[d for d, _ in DECODERS]}")
    ap.add_argument("--new", type=clicheck.positive_int, default=48, help="max_new_tokens per prompt")
    ap.add_argument("--threads", type=clicheck.positive_int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    if args.pair not in known:
        ap.error(f"--pair {args.pair}: no conf/model/{args.pair}.yaml (choose from {', '.join(known)})")
    unknown = sorted(set(args.decoders) - {d for d, _ in DECODERS})
    if unknown:
        ap.error(f"unknown decoder(s) {unknown}: valid are {[d for d, _ in DECODERS]}")
    torch.set_num_threads(args.threads)
    mcfg = OmegaConf.to_container(compose_job([f"model={args.pair}"]), resolve=True)["model"]
    pair = load_pair(mcfg)
    prompts = encode(pair, bool(mcfg.get("chat_template")))
    t0, rows = time.perf_counter(), []
    for label, overrides in DECODERS:
        if label in args.decoders:
            rows.append(dict(decoder=label, **bench_one(pair, overrides, prompts, args.new)))
    print(f"pair {args.pair}, {len(prompts)} fixed prompts x {args.new} tokens; threads {args.threads}; "
          f"torch {torch.__version__}; total {time.perf_counter() - t0:.1f} s")
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()

"""Micro-benchmark of the decoding core's overhead: the share of decode time spent outside model forwards.

Run ``python -m mtad.measure.overhead [--json PATH]``. Random llama models built in-process (no files, no hub):
by default a target of hidden 256 x 4 layers and a draft of hidden 64 x 1 layer over a 4096-token
vocabulary, so that one forward costs about what a small real model's does on CPU. Each decoder decodes
``--prompts`` prompts of ``--new`` tokens after one untimed warm-up (:func:`mtad.measure.timing.time_decodes`);
the table reports wall time, time inside model forwards (``DecodeResult.forward_time_s``), the overhead share
``1 - forward / wall``, the same share in CPU seconds (``cpu ovh``: ``1 - Σ call_cpu_s / cpu_time_s``, which other
processes on a shared machine barely move; with the default one thread it is the wall share of a quiet
machine), tokens/s and block efficiency (tokens per target forward). The aim: overhead at most 10% for
``speculative``, ``mtad`` and ``mmtad`` on CPU.

Random weights make the draft a poor predictor (acceptance near 0); ``--draft same`` uses the target as
its own draft (acceptance near 1), the other extreme of the loop's bookkeeping. These tiny models are a stress
test: one target forward costs about 1 ms, some 20 times less than the embedded SmolLM2 pair's on a CPU, so the
harness's fixed per-step costs weigh more here than in any real decode. ``experiments/bench_core_pair.py``
measures the same shares on a real pair (:func:`bench_one`), and ``experiments/overhead_floor.py`` the share of a
bare speculative loop on these models.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from mtad._util.cli import ArgumentParser, check_or_exit, positive_int
from mtad._util.io import writable_file
from mtad.measure.timing import time_decodes
from mtad.models.pair import ModelPair

# (label, decoder config overrides); paper defaults otherwise (T=1, top_k=10, top_p=0.9, gamma=4, W=4)
DECODERS = [
    ("greedy", dict(name="greedy")),
    ("sampling", dict(name="sampling")),
    ("speculative", dict(name="speculative")),
    ("speculative-threshold", dict(name="speculative", accept="threshold")),
    ("mtad", dict(name="mtad")),
    ("mmtad", dict(name="mmtad")),
    ("specinfer", dict(name="specinfer")),
    ("mtjd-beam", dict(name="mtjd", mode="beam")),
    ("mtjd-exhaustive", dict(name="mtjd", mode="exhaustive", gamma=3)),
]


def random_llama(vocab: int, hidden: int, layers: int, seed: int, std: float = 0.1):
    """A float32 random llama in eval mode with no EOS (so every decode runs to ``max_new_tokens``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(hidden // 64, 1) * 4, num_key_value_heads=max(hidden // 64, 1) * 2,
                      max_position_embeddings=2048, initializer_range=std, bos_token_id=0, eos_token_id=None,
                      pad_token_id=None, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = None
    return model.eval()


def build_pair(args) -> ModelPair:
    target = random_llama(args.vocab, args.hidden, args.layers, seed=1)
    draft = target if args.draft == "same" else random_llama(args.vocab, args.draft_hidden, args.draft_layers, seed=2)
    return ModelPair(target, draft, name="bench-random-llama")


def bench_one(pair: ModelPair, overrides: dict, prompts: list[list[int]], new: int) -> dict:
    """Decode every prompt once (after one untimed warm-up) and sum the costs."""
    tot = time_decodes(pair, dict(overrides, max_new_tokens=new), prompts, range(len(prompts)),
                       warmup=dict(overrides, max_new_tokens=8))
    tot["overhead_share"] = 1.0 - tot["forward_s"] / tot["wall_s"]
    tot["cpu_overhead_share"] = 1.0 - tot["forward_cpu_s"] / tot["cpu_s"]
    tot["tokens_per_s"] = tot["tokens"] / tot["wall_s"]
    tot["block_efficiency"] = tot["tokens"] / max(tot["target_forwards"], 1)
    return tot


def format_table(rows: list[dict]) -> str:
    cols = [("decoder", "{:<22}"), ("wall_s", "{:>8.3f}"), ("forward_s", "{:>9.3f}"), ("overhead_share", "{:>8.1%}"),
            ("cpu_overhead_share", "{:>8.1%}"),
            ("tokens_per_s", "{:>8.1f}"), ("block_efficiency", "{:>6.2f}"), ("target_forwards", "{:>6d}"),
            ("draft_forwards", "{:>6d}")]
    heads = ["decoder", "wall s", "fwd s", "overhead", "cpu ovh", "tok/s", "BE", "tgt fw", "dft fw"]
    widths = [len(f.format(rows[0][c])) if rows else 8 for c, f in cols]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    lines += ["  ".join(f.format(r[c]) for c, f in cols) for r in rows]
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    ap = ArgumentParser(prog="python -m mtad.measure.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--decoders", nargs="*", default=[d for d, _ in DECODERS],
                    help=f"subset of {[d for d, _ in DECODERS]}")
    ap.add_argument("--prompts", type=positive_int, default=3)
    ap.add_argument("--prompt-len", type=positive_int, default=16)
    ap.add_argument("--new", type=positive_int, default=64, help="max_new_tokens per prompt")
    ap.add_argument("--vocab", type=positive_int, default=4096)
    ap.add_argument("--hidden", type=positive_int, default=256)
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--draft-hidden", type=positive_int, default=64)
    ap.add_argument("--draft-layers", type=positive_int, default=1)
    ap.add_argument("--draft", choices=["random", "same"], default="random")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch.set_num_threads")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.decoders) - {d for d, _ in DECODERS})
    if unknown:
        ap.error(f"unknown decoder(s) {unknown}: valid are {[d for d, _ in DECODERS]}")
    if args.json is not None:
        check_or_exit(ap, writable_file, args.json, "--json")
    return args


def main(argv=None) -> list[dict]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    pair = build_pair(args)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(args.vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]
    rows = []
    t0 = time.perf_counter()
    for label, overrides in DECODERS:
        if label in args.decoders:
            rows.append(dict(decoder=label, **bench_one(pair, overrides, prompts, args.new)))
    print(f"random llama target h{args.hidden} x{args.layers}, draft "
          f"{'= target' if args.draft == 'same' else f'h{args.draft_hidden} x{args.draft_layers}'}, "
          f"vocab {args.vocab}; {args.prompts} prompts x {args.new} tokens; threads {args.threads}; "
          f"torch {torch.__version__}; total {time.perf_counter() - t0:.1f} s")
    print(format_table(rows))
    if args.json:
        meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": meta, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()

"""Speed benchmark against Hugging Face generation (``make bench``), on the embedded pair and GSM8K prompts.

Comparisons, each run interleaved A B A B over the same prompts (warm-up first, wall time around the whole
call for both sides, tokens/s = generated tokens / seconds summed over prompts and repeats):

- ``speculative`` (ours) vs HF assisted generation (``target.generate(..., assistant_model=draft,
  do_sample=True)``) with the same T / top-k / top-p and the same fixed draft length gamma: set on the DRAFT's
  ``generation_config`` (transformers 5.24 reads assisted settings from the assistant's config):
  ``num_assistant_tokens=gamma``, ``num_assistant_tokens_schedule="constant"``,
  ``assistant_confidence_threshold=0`` (no early stop of the draft: the criterion is only added when > 0);
  with ``do_sample=True`` and draft logits HF runs the same lossless rule (Leviathan et al., Alg. 1);
- ``greedy`` (ours) vs HF greedy ``generate`` (token equality is reported too);
- ``mtad`` vs our ``speculative``.

Then, per speculative-family decoder, its measured speed-up over our autoregressive ``sampling`` divided by
the analytic bound of Leviathan et al. (2023):

    E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha)        expected tokens per iteration
    cost            = gamma * c + v                               per iteration, in target single-token steps
    bound           = E / cost

alpha is the per-token acceptance probability of that analysis (accept each draft token independently until
the first rejection), estimated from the decodes as accepted / (accepted + rejections); it is not the
table's ``acceptance_rate`` = accepted / proposed, which with the same decodes is smaller (both are kept).
c = (one draft step) / (one KV-cached target step). mtad's first draft step runs once on the prefix and its
other gamma - 1 steps carry W beams, so its draft cost is c + (gamma - 1) c_W instead of gamma c. v = (one
target pass over gamma + 1 new tokens) / (one target step): Leviathan et al. take v = 1 (verification as
cheap as one step, true on a GPU); on a CPU v is about 2, so we measure it.
Costs come from a micro-benchmark of the models (``mtad.measure.timing.time_forwards``) at the mean prompt
length. The bound models decoding steps only, so the measured speed-up it is compared with has the prompt
prefill of every call (also micro-benchmarked) taken out of both sides; the raw ratio is kept as
``measured_speedup_with_prefill``. A fraction near 1 means the implementation reaches what its acceptance rate
allows; below 1 is per-iteration overhead (filtering, acceptance, cache surgery); above 1 means the
per-token cost of autoregressive sampling exceeds one bare forward step (framework overhead, which dominates
the tiny models of ``--quick``).

Rows are appended to ``results/bench.jsonl`` (``--out``); ``--quick`` is a smoke run on the tiny random pair.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

from mtad._util.cli import ArgumentParser, check_or_exit, nonnegative_int, positive_int, real
from mtad._util.io import writable_file
from mtad.decoding.config import MIN_TEMPERATURE
from mtad.measure.timing import Shape, time_forwards, timed
from mtad.models.draft_head import HEAD_MODES
from mtad.models.load import DTYPES
from mtad.models.quantize import QUANTIZE

log = logging.getLogger("bench_hf")


# ----------------------------------------------------------------------------------------------- setup
def load(quick: bool, draft: str, draft_head: str = "full", quantize: str = "none", dtype: str = "float32"):
    """(pair, message): the tiny pair, or the embedded SmolLM2 pair (target only, with a message, when the
    draft has not been trained yet)."""
    from mtad.models.load import ModelConfig, load_pair

    if quick:
        return load_pair(ModelConfig(name="tiny", kind="tiny", device="cpu", quantize=quantize, dtype=dtype)), None
    try:
        return load_pair(ModelConfig(name="smollm2", kind="smollm2", draft=draft, device="cpu", chat_template=True,
                                     draft_head=draft_head, quantize=quantize, dtype=dtype)), None
    except FileNotFoundError as err:
        msg = (f"the SmolLM2 draft is not there yet ({err}). Train it with `make train-draft`; "
               "until then only greedy is compared with Hugging Face.")
        return load_pair(ModelConfig(name="smollm2", kind="smollm2", draft=None, device="cpu",
                                     chat_template=True, dtype=dtype)), msg


def prompts(pair, n: int, quick: bool) -> list[list[int]]:
    """The first ``n`` GSM8K test questions, zero-shot, in the pair's prompt format."""
    from mtad.tasks.base import TaskConfig, get_task

    cfg = TaskConfig(name="gsm8k", n_prompts=n, few_shot=0, max_prompt_tokens=384 if quick else 512,
                     on_long_prompt="truncate")
    task = get_task(cfg)
    chat = bool(pair.info.get("chat_template", True))
    return [task.encode(s, pair.tokenizer, 0, (), chat).ids for s in task.samples()]


# ----------------------------------------------------------------------------------------------- methods
def ours(name: str, args):
    import mtad

    cfg = {"name": name, "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, "beam_width": args.beam_width,
           "tau": args.tau, "temperature": 0.0 if name == "greedy" else args.temperature, "top_k": args.top_k,
           "top_p": args.top_p}

    def call(pair, ids, seed):
        r = mtad.generate(pair, ids, cfg, torch.Generator().manual_seed(seed))
        rejections = sum(a < n for a, n in zip(r.accepted, r.proposed))
        return r.tokens, {"accepted": sum(r.accepted), "proposed": sum(r.proposed), "rejections": rejections,
                          "iterations": len(r.proposed), "target_forwards": r.target_forwards}

    return call


def hf(kind: str, args):
    """HF ``generate``: greedy, or assisted generation with the draft at a fixed gamma."""

    def call(pair, ids, seed):
        torch.manual_seed(seed)  # HF samples from the global generator
        x = torch.tensor([ids])  # (1, T)
        kw = {"max_new_tokens": args.max_new_tokens, "attention_mask": torch.ones_like(x),
              "pad_token_id": pair.tokenizer.pad_token_id or pair.tokenizer.eos_token_id}
        if kind == "greedy":
            kw.update(do_sample=False)
        else:
            configure_assistant(pair.draft, args.gamma)
            kw.update(do_sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                      assistant_model=pair.draft)
        with torch.inference_mode():
            out = pair.target.generate(x, **kw)
        return out[0, len(ids):].tolist(), {}

    return call


def configure_assistant(draft, gamma: int) -> None:
    gc = draft.generation_config
    gc.num_assistant_tokens = gamma
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0


# ----------------------------------------------------------------------------------------------- timing
def interleaved(pair, plist, fns: dict, repeats: int) -> dict:
    """Run the methods in turn (A B C A B C ...) over prompts x repeats, after one untimed warm-up each;
    totals per method name."""
    tot = {name: {"tokens": 0, "seconds": 0.0, "outputs": [], "accepted": 0, "proposed": 0, "rejections": 0,
                  "iterations": 0, "target_forwards": 0} for name in fns}
    for fn in fns.values():
        fn(pair, plist[0], 12345)
    for rep in range(repeats):
        for i, ids in enumerate(plist):
            for name, fn in fns.items():
                seconds, (toks, extra) = timed(fn, pair, ids, 1000 * rep + i, device=pair.device)
                tot[name]["seconds"] += seconds
                tot[name]["tokens"] += len(toks)
                tot[name]["outputs"].append(toks)
                for k, v in extra.items():
                    tot[name][k] += v
    return tot


def tps(side: dict) -> float:
    return side["tokens"] / side["seconds"] if side["seconds"] else float("nan")


def step_costs(pair, plist, gamma: int, W: int, reps: int = 12) -> dict:
    """Seconds of: a prefill of the mean prompt length, a target step, a target pass over gamma + 1 tokens, a
    draft step, a W-beam draft step, after a context of the mean prompt length (``reps`` interleaved rounds,
    trimmed means: :func:`mtad.measure.timing.time_forwards`)."""
    L = int(statistics.mean(len(p) for p in plist))
    jobs = {"target_prefill": (pair.target, Shape("target", 0, L)),
            "target_step": (pair.target, Shape("target", L, 1)),
            "target_verify": (pair.target, Shape("target", L, gamma + 1, keep=gamma + 1))}
    if pair.draft is not None:
        jobs |= {"draft_prefill": (pair.draft, Shape("draft", 0, L)), "draft_step": (pair.draft, Shape("draft", L, 1)),
                 "draft_beam_step": (pair.draft, Shape("draft", L, 1, rows=W))}
    return time_forwards(jobs, plist[0], reps)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per iteration (Leviathan et al., eq. 1)."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def leviathan_bound(alpha: float, gamma: int, c: float, v: float) -> float:
    """E(alpha, gamma) / (gamma c + v): the expected speed-up over autoregressive decoding."""
    return expected_tokens(alpha, gamma) / (gamma * c + v)


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run on the tiny random pair")
    p.add_argument("--prompts", type=positive_int, default=None, help="GSM8K test prompts (default 4; quick 2)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="default 64; quick 16")
    p.add_argument("--repeats", type=positive_int, default=None, help="interleaved repeats (default 2; quick 1)")
    p.add_argument("--gamma", type=positive_int, default=4)
    p.add_argument("--beam-width", type=positive_int, default=4)
    p.add_argument("--tau", type=real(0, 1, low_open=True), default=0.5)
    p.add_argument("--temperature", type=real(MIN_TEMPERATURE), default=1.0, help="T > 0 (the benchmark samples)")
    p.add_argument("--top-k", type=nonnegative_int, default=10, help="0 keeps the whole vocabulary")
    p.add_argument("--top-p", type=real(0, 1, low_open=True), default=0.9)
    p.add_argument("--threads", type=positive_int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--draft", default="models/smollm2-draft", help="the SmolLM2 draft directory")
    p.add_argument("--draft-head", default="full", choices=HEAD_MODES, help="model.draft_head of the draft")
    p.add_argument("--quantize", default="none", choices=QUANTIZE, help="model.quantize of the target")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="model.dtype of both models (bfloat16: AVX512-BF16 CPUs)")
    p.add_argument("--costs", action="store_true",
                   help="only the step-cost table: target fp32/int8 (1 and gamma+1 tokens), draft per head mode")
    p.add_argument("--cost-reps", type=positive_int, default=15, help="interleaved rounds of the cost table")
    p.add_argument("--out", default="results/bench.jsonl", help="JSONL file the rows are appended to")
    a = p.parse_args(argv)
    check_or_exit(p, writable_file, a.out, "--out")
    a.prompts = a.prompts or (2 if a.quick else 4)
    a.max_new_tokens = a.max_new_tokens or (16 if a.quick else 64)
    a.repeats = a.repeats or (1 if a.quick else 2)
    return a


def run(args) -> list[dict]:
    from mtad._util.paths import REPO_ROOT
    from mtad.harness.rows import environment_info, git_info

    torch.set_num_threads(args.threads)
    if args.costs:
        return cost_table(args)
    pair, message = load(args.quick, args.draft, args.draft_head, args.quantize, args.dtype)
    if message:
        print(f"bench_hf: {message}", file=sys.stderr)
    plist = prompts(pair, args.prompts, args.quick)
    sha, dirty = git_info(REPO_ROOT)
    base = {"timestamp": datetime.now(UTC).isoformat(timespec="seconds"), "pair": pair.name,
            "draft": None if args.quick else (args.draft if pair.draft is not None else None),
            "quick": args.quick, "n_prompts": len(plist), "repeats": args.repeats,
            "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, "beam_width": args.beam_width,
            "tau": args.tau, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
            "draft_head": args.draft_head, "quantize": args.quantize, "dtype": args.dtype,
            "git_sha": sha, "git_dirty": dirty, **environment_info([pair.device])}
    # Interleaved blocks; each ratio is taken inside one block (same time window, same prompts).
    blocks = [({"greedy": ours("greedy", args), "hf_greedy": hf("greedy", args)}, [("greedy", "hf_greedy")])]
    if pair.draft is not None and not getattr(pair.draft, "reads_target_features", False):
        # HF assisted generation cannot feed a feature draft the target's hidden states (mtad.models.feature_draft)
        blocks += [({"speculative": ours("speculative", args), "hf_assisted": hf("assisted", args)},
                    [("speculative", "hf_assisted")])]
    if pair.draft is not None:
        blocks += [({"sampling": ours("sampling", args), "speculative": ours("speculative", args),
                     "mtad": ours("mtad", args)},
                    [("mtad", "speculative"), ("speculative", "sampling"), ("mtad", "sampling")])]
    rows, last = [], {}
    for fns, ratios in blocks:
        last = interleaved(pair, plist, fns, args.repeats)
        for a_name, b_name in ratios:
            ta, tb = last[a_name], last[b_name]
            row = {**base, "bench": "ratio", "a": a_name, "b": b_name, "a_tokens": ta["tokens"],
                   "b_tokens": tb["tokens"], "a_seconds": ta["seconds"], "b_seconds": tb["seconds"],
                   "a_tokens_per_s": tps(ta), "b_tokens_per_s": tps(tb), "ratio": tps(ta) / tps(tb)}
            if a_name == "greedy":
                row["same_tokens"] = sum(x == y for x, y in zip(ta["outputs"], tb["outputs"])) / len(ta["outputs"])
            rows.append(row)
    if pair.draft is not None:
        rows += bounds(pair, plist, args, last, base)  # the sampling / speculative / mtad block
    return rows


def decode_tps(side: dict, calls: int, prefill_s: float) -> float:
    """Tokens/s with the prompt prefill of every call taken out (the bound models decoding steps only)."""
    return side["tokens"] / max(side["seconds"] - calls * prefill_s, 1e-9)


def bounds(pair, plist, args, measured: dict, base: dict) -> list[dict]:
    costs = step_costs(pair, plist, args.gamma, args.beam_width)
    v = costs["target_verify"] / costs["target_step"]
    calls = len(plist) * args.repeats
    ar = decode_tps(measured["sampling"], calls, costs["target_prefill"])
    out = []
    for name in ("speculative", "mtad"):
        m = measured[name]
        # Leviathan's alpha: per-token acceptance, each iteration a run of accepts ended by one rejection or by
        # the end of the block; its estimate is accepts / (accepts + rejections).
        alpha = m["accepted"] / (m["accepted"] + m["rejections"]) if m["accepted"] + m["rejections"] else float("nan")
        c = costs["draft_step"] / costs["target_step"]
        # mtad's first draft step runs the prefix once; the other gamma - 1 steps run W beams in one batch.
        c_w = costs["draft_beam_step"] / costs["target_step"] if name == "mtad" else c
        draft_cost = c + (args.gamma - 1) * c_w
        speedup = decode_tps(m, calls, costs["target_prefill"] + costs["draft_prefill"]) / ar
        bound = float("nan") if math.isnan(alpha) else leviathan_bound(alpha, args.gamma, draft_cost / args.gamma, v)
        out.append({**base, "bench": "bound", "decoder": name, "alpha": alpha,
                    "acceptance_rate": m["accepted"] / m["proposed"] if m["proposed"] else None,
                    "c": c, "c_beams": c_w if name == "mtad" else None, "v": v,
                    "tokens_per_iteration": m["tokens"] / max(m["iterations"], 1),
                    "expected_tokens_per_iteration": expected_tokens(alpha, args.gamma) if not math.isnan(alpha)
                    else float("nan"),
                    "bound": bound, "measured_speedup_vs_sampling": speedup, "fraction_of_bound": speedup / bound,
                    "measured_speedup_with_prefill": tps(m) / tps(measured["sampling"]),
                    "step_seconds": costs})
    return out


def cost_table(args) -> list[dict]:
    """Step costs in one interleaved run (each round times every variant once, trimmed means over rounds):
    target 1-token step and (gamma+1)-token verify pass, fp32, int8 and bf16; draft 1-token step for every head
    mode (and bf16 layers with the reduced int8 head). Ratios are to the fp32 target step of the same run."""
    from mtad._util.paths import REPO_ROOT
    from mtad.harness.rows import environment_info, git_info
    from mtad.models import smollm2
    from mtad.models.draft_head import install_head
    from mtad.models.load import ModelConfig, load_pair, load_tied_draft, resolve_local
    from mtad.models.quantize import quantize_target

    pair = load_pair(ModelConfig(name="smollm2", kind="smollm2", draft=args.draft, device="cpu", chat_template=True))
    plist = prompts(pair, args.prompts, False)
    L = int(statistics.mean(len(p) for p in plist))
    targets = {"fp32": pair.target, "int8": quantize_target(smollm2.load(dtype="float32", device="cpu")[0], "int8"),
               "bf16": smollm2.load(dtype="bfloat16", device="cpu")[0]}
    path = resolve_local(args.draft)
    drafts = {}
    for mode in ("full", "int8", "reduced", "reduced_int8"):
        d = load_tied_draft(path, pair.target)
        try:
            install_head(d, mode, path)
        except FileNotFoundError:
            continue  # a draft without a reduced head
        drafts[mode] = d
    if "reduced_int8" in drafts:  # the bf16 pair's draft: bf16 layers, int8 reduced head
        drafts["bf16_reduced_int8"] = load_tied_draft(path, targets["bf16"], "bfloat16")
        install_head(drafts["bf16_reduced_int8"], "reduced_int8", path)
    g = args.gamma + 1
    jobs = {}
    for name, model in targets.items():
        jobs[f"target_{name}_step"] = (model, Shape("target", L, 1))
        jobs[f"target_{name}_verify"] = (model, Shape("target", L, g, keep=g))
    for mode, model in drafts.items():
        jobs[f"draft_{mode}_step"] = (model, Shape("draft", L, 1))
    secs = time_forwards(jobs, plist[0], args.cost_reps)
    ref = secs["target_fp32_step"]
    sha, dirty = git_info(REPO_ROOT)
    row = {"timestamp": datetime.now(UTC).isoformat(timespec="seconds"), "pair": "smollm2", "bench": "costs",
           "draft": args.draft, "context_tokens": L, "gamma": args.gamma, "reps": args.cost_reps,
           "seconds": secs, "ratio_to_fp32_step": {k: v / ref for k, v in secs.items()},
           "verify_over_step": {q: secs[f"target_{q}_verify"] / secs[f"target_{q}_step"] for q in targets},
           "git_sha": sha, "git_dirty": dirty, **environment_info([pair.device])}
    return [row]


def report_costs(row: dict) -> str:
    lines = [f"step costs at {row['context_tokens']} context tokens, trimmed means of {row['reps']} interleaved rounds",
             f"{'step':<26} {'ms':>8} {'/ fp32 target step':>19}"]
    for k, v in row["seconds"].items():
        lines.append(f"{k:<26} {1e3 * v:>8.2f} {row['ratio_to_fp32_step'][k]:>19.3f}")
    lines += [f"{q} target: {row['gamma'] + 1}-token verify / 1-token step = {r:.2f}"
              for q, r in row["verify_over_step"].items()]
    return "\n".join(lines)


def report(rows: list[dict]) -> str:
    if rows and rows[0]["bench"] == "costs":
        return report_costs(rows[0])
    lines = [f"{'A':<12} {'B':<12} {'A tok/s':>8} {'B tok/s':>8} {'A/B':>6}  note"]
    for r in rows:
        if r["bench"] == "ratio":
            note = f"same greedy tokens: {r['same_tokens']:.0%}" if "same_tokens" in r else ""
            lines.append(f"{r['a']:<12} {r['b']:<12} {r['a_tokens_per_s']:>8.2f} {r['b_tokens_per_s']:>8.2f} "
                         f"{r['ratio']:>5.2f}×  {note}")
    bound_rows = [r for r in rows if r["bench"] == "bound"]
    if bound_rows:
        lines += ["", "bound = E / (draft cost + v), E = (1 - alpha^(gamma+1)) / (1 - alpha)  [Leviathan et al. 2023];",
                  "draft cost = gamma c (speculative), c + (gamma - 1) c_W (mtad: W beams after the first step)",
                  "measured: decode-only speed-up over our sampling (prompt prefill taken out of both sides)",
                  f"{'decoder':<12} {'alpha':>6} {'c':>6} {'c_W':>6} {'v':>6} {'E':>5} {'tok/it':>6} {'bound':>6} "
                  f"{'measured':>9} {'fraction':>9}"]
        for r in bound_rows:
            cw = f"{r['c_beams']:.3f}" if r["c_beams"] is not None else "-"
            lines.append(f"{r['decoder']:<12} {r['alpha']:>6.3f} {r['c']:>6.3f} {cw:>6} {r['v']:>6.2f} "
                         f"{r['expected_tokens_per_iteration']:>5.2f} {r['tokens_per_iteration']:>6.2f} "
                         f"{r['bound']:>5.2f}× {r['measured_speedup_vs_sampling']:>8.2f}× "
                         f"{r['fraction_of_bound']:>9.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    rows = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.writelines(json.dumps(r, default=str) + "\n" for r in rows)
    r = rows[0]
    if r["bench"] == "costs":
        print(report(rows))
        print(f"rows appended to {out}")
        return 0
    print(f"{r['pair']} on {r['device_name']}, {r['num_threads']} thread(s), {r['n_prompts']} GSM8K prompts x "
          f"{r['repeats']} repeats, {r['max_new_tokens']} new tokens, gamma={r['gamma']}:")
    print(report(rows))
    print(f"rows appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far a cheaper target moves from the fp32 one: ``model.quantize=int8`` or a half-precision dtype.

``agreement(ref, other, sequences)`` measures the cheaper target against the fp32 one on the same token
sequences: mean / max total variation of the filtered next-token distributions (T, top-k, top-p: the
decoders' ``filter_probs``), top-1 agreement and each model's perplexity. ``python -m mtad.measure.agreement``
runs it on held-out WikiText-2 **test** text and on the target's own answers to GSM8K test questions and writes
``results/quantize_agreement.json``; ``--other bfloat16`` measures a bf16 target (``model.dtype=bfloat16``,
fast on CPUs with AVX512-BF16) the same way and writes ``results/dtype_agreement_bfloat16.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import torch

from mtad._util.paths import REPO_ROOT, default_data_dir, recorded_path
from mtad.decoding import generate
from mtad.decoding.filter import filter_probs
from mtad.models import smollm2
from mtad.models.load import ModelConfig, load_pair
from mtad.models.quantize import LAYER_KINDS, quantize_target

log = logging.getLogger(__name__)


@torch.no_grad()
def agreement(ref, other, sequences: list[list[int]], temperature: float = 1.0, top_k: int = 10,
              top_p: float = 0.9) -> dict:
    """Agreement of ``other`` with ``ref`` on next-token prediction over every position of ``sequences``."""
    tv, top1, nll_ref, nll_other, n = [], [], 0.0, 0.0, 0
    for ids in sequences:
        x = torch.tensor([ids])  # (1, T)
        a = ref(input_ids=x).logits[0, :-1].float()  # (T-1, V)
        b = other(input_ids=x).logits[0, :-1].float()
        pa, pb = filter_probs(a, temperature, top_k, top_p), filter_probs(b, temperature, top_k, top_p)
        tv += (0.5 * (pa - pb).abs().sum(-1)).tolist()
        top1 += (a.argmax(-1) == b.argmax(-1)).float().tolist()
        y = x[0, 1:]
        nll_ref -= float(torch.log_softmax(a, -1).gather(1, y[:, None]).sum())
        nll_other -= float(torch.log_softmax(b, -1).gather(1, y[:, None]).sum())
        n += len(y)
    return {"positions": n, "tv_mean": float(sum(tv) / n), "tv_max": float(max(tv)), "top1": float(sum(top1) / n),
            "ppl_ref": math.exp(nll_ref / n), "ppl_other": math.exp(nll_other / n),
            "ppl_ratio": math.exp((nll_other - nll_ref) / n), "filter": [temperature, top_k, top_p]}


def wikitext_sequences(tokenizer, data_dir: Path, n: int, length: int) -> list[list[int]]:
    """``n`` windows of ``length`` tokens, evenly spaced through WikiText-2 test (never used for training)."""
    path = Path(data_dir) / "wikitext2" / "test.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: set $MTAD_DATA_DIR to the shared data")
    ids = tokenizer(path.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    if len(ids) < n * length:
        raise ValueError(f"{path} has {len(ids)} tokens, fewer than {n} x {length}")
    step = len(ids) // n
    return [ids[i * step:i * step + length] for i in range(n)]


def gsm8k_sequences(pair, data_dir: Path, n: int, new_tokens: int) -> list[list[int]]:
    """Prompt + the fp32 target's own sampled answer for ``n`` GSM8K test questions (chat template)."""
    rows = [json.loads(line) for line in open(Path(data_dir) / "gsm8k" / "test.jsonl", encoding="utf-8")]
    out = []
    for i in range(n):
        q = rows[i * len(rows) // n]["question"]
        ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"]
        r = generate(pair, ids, {"name": "sampling", "max_new_tokens": new_tokens},
                          torch.Generator().manual_seed(i))
        out.append(list(ids) + r.tokens)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="int8 (or bf16/fp16) vs fp32 agreement of the embedded SmolLM2 target")
    p.add_argument("--other", choices=["int8", "bfloat16", "float16"], default="int8",
                   help="the cheaper target: model.quantize=int8, or model.dtype=bfloat16 / float16")
    p.add_argument("--windows", type=int, default=8, help="WikiText-2 test windows")
    p.add_argument("--length", type=int, default=256, help="tokens per window")
    p.add_argument("--gsm8k", type=int, default=4, help="GSM8K test questions (target's own answers)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sensitivity", action="store_true",
                   help="also quantise one kind of layer at a time (WikiText windows only)")
    p.add_argument("--out", default=None, help="default: results/quantize_agreement.json (int8), "
                   "results/dtype_agreement_<dtype>.json otherwise")
    a = p.parse_args(argv)
    if a.out is None:
        name = "quantize_agreement.json" if a.other == "int8" else f"dtype_agreement_{a.other}.json"
        a.out = str(REPO_ROOT / "results" / name)
    if a.sensitivity and a.other != "int8":
        p.error("--sensitivity quantises one kind of layer at a time: it needs --other int8")
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(a.threads)
    pair = load_pair(ModelConfig(name="smollm2", kind="smollm2", draft=None, device="cpu", chat_template=True))
    ref = pair.target

    if a.other == "int8":
        other = quantize_target(smollm2.load(dtype="float32", device="cpu")[0], "int8")
    else:
        other = smollm2.load(dtype=a.other, device="cpu")[0]
    data = default_data_dir()
    wiki = wikitext_sequences(pair.tokenizer, data, a.windows, a.length)
    result = {"wikitext2_test": agreement(ref, other, wiki)}
    if a.gsm8k:
        result["gsm8k_test_answers"] = agreement(ref, other, gsm8k_sequences(pair, data, a.gsm8k, a.new_tokens))
    if a.sensitivity:
        del other
        result["sensitivity_wikitext2_test"] = {
            kind: agreement(ref, quantize_target(smollm2.load(dtype="float32", device="cpu")[0], "int8", suffixes),
                            wiki)
            for kind, suffixes in LAYER_KINDS.items()}
    result["settings"] = {**vars(a), "out": recorded_path(a.out)}  # no machine path in the file
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

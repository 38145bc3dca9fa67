"""Held-out evaluation: the target's own sampled continuations of GSM8K test questions and HumanEval prompts
(never training data), teacher-forced through the student. Reports top-1 agreement, alpha = E[sum min(p~, q~)]
under the verification filter (``mtad.decoding.filter``), KL(p || q), the reduced head's coverage and the
i.i.d. block efficiency. Shapes: B rows, G generated positions, L positions, V vocabulary, D hidden."""
from __future__ import annotations

import gzip
import json
from typing import Optional

import torch
import torch.nn.functional as F

from mtad.decoding.filter import filter_probs
from mtad.models.draft_head import FILL, DraftHead
from mtad.train.config import TrainDraftConfig
from mtad.train.corpus import CODE_INSTRUCTION, Corpus, read_jsonl
from mtad.train.losses import shift_features
from mtad.train.teacher import before_eos, left_pad, rng_devices

EVAL_KEYS = ("top1", "alpha", "kl", "coverage", "alpha_d2", "alpha_d3")
FEATURE_DEPTHS = 3  # held-out alpha of a feature draft at block depths 1..3


def eval_prompts(corpus: Corpus, n_gsm8k: int, n_humaneval: int) -> list[tuple[str, str]]:
    """(domain, prompt text): evenly spaced GSM8K test questions and HumanEval prompts, chat template."""
    out = []
    if n_gsm8k:
        rows = read_jsonl(corpus.data_dir / "gsm8k" / "test.jsonl")
        out += [("gsm8k", corpus.chat(rows[i]["question"])) for i in _spaced(len(rows), n_gsm8k)]
    if n_humaneval:
        path = corpus.data_dir / "humaneval" / "HumanEval.jsonl.gz"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: set $MTAD_DATA_DIR to the shared data")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        out += [("humaneval", corpus.chat(CODE_INSTRUCTION.format(code=rows[i]["prompt"])))
                for i in _spaced(len(rows), n_humaneval)]
    return out


def _spaced(n: int, k: int) -> list[int]:
    return sorted({int(i * n / k) for i in range(min(k, n))})


def build_eval_set(cfg: TrainDraftConfig, corpus: Corpus, teacher, tok, device) -> dict:
    """The target's own sampled continuations of held-out prompts (one batch), with its logits on them."""
    prompts = eval_prompts(corpus, cfg.eval_gsm8k, cfg.eval_humaneval)
    rows = [tok(text, add_special_tokens=False)["input_ids"] for _, text in prompts]
    enc = left_pad(rows, tok.pad_token_id, device)
    with torch.no_grad(), torch.random.fork_rng(devices=rng_devices(device)):
        torch.manual_seed(cfg.seed)
        out = teacher.generate(**enc, do_sample=True, temperature=1.0, top_k=cfg.gen_top_k, top_p=cfg.gen_top_p,
                               max_new_tokens=cfg.eval_tokens, output_logits=True, return_dict_in_generate=True,
                               pad_token_id=tok.pad_token_id)
    P = enc["input_ids"].shape[1]
    gen = out.sequences[:, P:]  # (B, G)
    keep = before_eos(gen, teacher.generation_config.eos_token_id).sum(1).tolist()
    p_logits = torch.stack(out.logits, dim=1)  # (B, G, V)
    items = []
    for b, ((domain, _), ids) in enumerate(zip(prompts, rows)):
        k = int(keep[b])
        items.append({"domain": domain, "ids": torch.tensor(ids + gen[b, :k].tolist()), "prompt_len": len(ids),
                      "log_p": F.log_softmax(p_logits[b, :k].float(), -1).half().cpu()})
    return {"items": items, "top_k": cfg.gen_top_k, "top_p": cfg.gen_top_p}


@torch.no_grad()
def evaluate(student, eval_set: dict, gamma: int = 4) -> dict:
    """Top-1 agreement, alpha = E[sum_v min(p~, q~)], KL(p||q) and the i.i.d. block efficiency per domain."""
    per: dict[str, dict[str, list]] = {}
    for item in eval_set["items"]:
        if len(item["ids"]) > item["prompt_len"]:
            d = per.setdefault(item["domain"], {k: [] for k in EVAL_KEYS})
            _score(student, item, eval_set["top_k"], eval_set["top_p"], d)
    per["all"] = {k: sum((d[k] for d in per.values()), []) for k in EVAL_KEYS}
    return {domain: _summary(d, gamma) for domain, d in per.items()}


def _score(student, item: dict, top_k: int, top_p: float, d: dict[str, list]) -> None:
    """Append one held-out continuation's per-position figures to ``d`` (lists keyed by ``EVAL_KEYS``)."""
    device = next(student.parameters()).device
    ids, P = item["ids"].to(device), item["prompt_len"]
    log_p = item["log_p"].to(device).float()  # (G, V)
    pw = filter_probs(log_p, 1.0, top_k, top_p)  # p~ (G, V)
    if getattr(student, "reads_target_features", False):  # depth 1 reads the target's features; depth k the
        fin = shift_features(item["feat"].to(device).float()[None, :-1])  # draft's own from depth k - 1
        for depth in range(FEATURE_DEPTHS):
            h = student.hidden(ids[None, :-1], fin)  # (1, L, D)
            if depth:
                qk = filter_probs(F.log_softmax(student.lm_head(h[0, P - 1:]).float(), -1), 1.0, top_k, top_p)
                d[f"alpha_d{depth + 1}"] += torch.minimum(pw, qk).sum(-1).tolist()
            else:
                logits = student.lm_head(h[0, P - 1:]).float()  # (G, V)
            fin = shift_features(h)
    else:
        logits = student(input_ids=ids[None, :-1]).logits[0, P - 1:].float()  # (G, V)
    log_q = F.log_softmax(logits, -1)
    qw = filter_probs(log_q, 1.0, top_k, top_p)  # q~ (G, V)
    d["top1"] += (log_p.argmax(-1) == log_q.argmax(-1)).float().tolist()
    d["alpha"] += torch.minimum(pw, qw).sum(-1).tolist()
    # a reduced head gives q = 0 outside its vocabulary: KL over the head's vocabulary (p renormalised
    # there), and coverage = p~ mass inside it (an upper bound on alpha)
    inside = logits > FILL / 2  # (G, V)
    lp_in = torch.where(inside, log_p, torch.full_like(log_p, -float("inf"))).log_softmax(-1)
    d["kl"] += (lp_in.exp() * (lp_in - log_q)).where(inside, torch.zeros_like(log_q)).sum(-1).tolist()
    d["coverage"] += (pw * inside).sum(-1).tolist()


def _summary(d: dict[str, list], gamma: int) -> dict:
    """Means of one domain's lists, and the block efficiency for ``gamma`` drafted tokens: 1 + a1 + a1 a2 + ...
    with depth j's alpha a_j (the deepest measured one beyond; a token draft's alpha does not depend on the
    depth, teacher-forced)."""
    alpha = mean(d["alpha"])
    r = {"top1": mean(d["top1"]), "alpha": alpha, "kl": mean(d["kl"]), "coverage": mean(d["coverage"]),
         "positions": len(d["top1"])}
    depth_alpha = [alpha] + [mean(d[f"alpha_d{k}"]) for k in range(2, FEATURE_DEPTHS + 1) if d[f"alpha_d{k}"]]
    for k, a in enumerate(depth_alpha[1:], start=2):
        r[f"alpha_d{k}"] = a
    e, run = 1.0, 1.0
    for j in range(gamma):
        run *= depth_alpha[min(j, len(depth_alpha) - 1)]
        e += run
    r["block_efficiency"] = e
    return r


def mean(xs: list) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def evaluate_heads(student, target_head: torch.Tensor, kept: Optional[torch.Tensor], eval_set: dict) -> dict:
    """Held-out results of ``student`` with each inference head of ``mtad.models.draft_head`` (CPU): ``full``
    and ``int8`` over the target's head rows ``target_head`` (V, D), ``reduced`` and ``reduced_int8`` over the
    ``kept`` ids of a reduced training head. The trained head (and its bias) is put back afterwards."""
    trained = student.lm_head
    bias = trained.bias.detach() if hasattr(trained, "compact") and trained.bias is not None else None
    out = {}
    try:
        for mode, ids, int8 in (("full", None, False), ("int8", None, True),
                                ("reduced", kept, False), ("reduced_int8", kept, True)):
            if mode.startswith("reduced") and ids is None:
                continue
            b = bias
            if bias is not None and ids is None and kept is not None:
                b = torch.zeros(target_head.shape[0], device=bias.device).index_copy_(0, kept.to(bias.device), bias)
            student.lm_head = DraftHead(target_head, None if ids is None else ids.to(target_head.device), b, int8=int8)
            out[mode] = evaluate(student, eval_set)
    finally:
        student.lm_head = trained
    return out

"""Distil the embedded target (SmolLM2-135M-Instruct) into a small draft that shares its tokenizer.

Run: ``python -m mtad.train_draft [key=value ...]`` (config ``conf/train_draft.yaml``).

Recipe (DRAFT.md): the student is the target's architecture cut to ``layers`` decoder layers, initialised
from target layers ``init_layers`` and the target's final norm; the embedding and the tied output head are
the target's own, frozen (the exported draft stores only the other weights). The loss is the forward KL
``KL(p || q)`` from the target's temperature-1 distribution ``p`` to the student's ``q`` over the whole
vocabulary, on two kinds of step:

* offline: packed windows of training text (GSM8K train in the chat template, Python standard-library
  source, Alpaca seed tasks in the chat template, WikiText-2 valid); ``p`` from one teacher forward pass;
* on-policy: the target samples answers (T=1, top-k 10, top-p 0.9, the decoders' warping) to training-split
  prompts (GSM8K train questions, Alpaca seed instructions, standard-library function heads); ``p`` is the
  raw logits that ``generate`` produced for each sampled token, so the student learns on the target's own
  outputs at no extra teacher cost.

No evaluation prompt (GSM8K test, HumanEval, MT-Bench, Spider, ...) is in the training data; GSM8K test and
HumanEval prompts are the held-out evaluation set. Checkpoints (atomic) go to ``ckpt_dir`` and a rerun
resumes from them; ``max_minutes`` stops the run cleanly, evaluates and exports to ``out_dir``.
"""
from __future__ import annotations

import ast
import gzip
import json
import logging
import math
import os
import random
import re
import shutil
import sysconfig
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from mtad.loading import tie_to_target
from mtad.paths import REPO_ROOT, cache_dir, default_data_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainDraftConfig:
    target: str = "smollm2"  # smollm2 | tiny (a random tiny llama: tests and smoke runs)
    out_dir: str = "models/smollm2-draft"  # repo-relative or absolute; "" = do not export
    ckpt_dir: Optional[str] = None  # None: mtad.paths.cache_dir()/train_draft
    data_dir: Optional[str] = None  # None: mtad.paths.default_data_dir()
    layers: int = 2
    init_layers: List[int] = field(default_factory=lambda: [0, 1])
    seq_len: int = 256  # offline window length
    batch_size: int = 2  # offline windows per step
    onpolicy_frac: float = 0.05  # share of data batches sampled from the target (each gives several steps)
    gen_batch: int = 12
    gen_tokens: int = 96
    gen_prompt_len: int = 192  # prompts are cut to their last gen_prompt_len tokens
    gen_rows_per_step: int = 6  # an on-policy batch gives gen_batch / gen_rows_per_step optimizer steps
    gen_top_k: int = 10
    gen_top_p: float = 0.9
    mix: Dict[str, float] = field(default_factory=lambda: {
        "gsm8k": 0.40, "python": 0.35, "alpaca": 0.08, "wikitext": 0.17})
    onpolicy_mix: Dict[str, float] = field(default_factory=lambda: {
        "gsm8k": 0.45, "code": 0.40, "alpaca": 0.15})
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_steps: int = 1_000_000
    max_minutes: float = 70.0  # wall budget of this invocation's training (resumed time counts too)
    max_tokens: int = 0  # 0 = no token limit
    ckpt_minutes: float = 5.0
    eval_minutes: float = 20.0  # 0 = evaluate only at the start and the end
    eval_gsm8k: int = 10  # held-out GSM8K test prompts
    eval_humaneval: int = 10  # held-out HumanEval prompts
    eval_tokens: int = 64
    log_every: int = 5
    threads: int = 1  # CPU threads (0 = leave torch's default)
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    resume: bool = True
    tiny_hidden: int = 64  # target=tiny only
    tiny_layers: int = 4

    def __post_init__(self) -> None:
        if self.target not in ("smollm2", "tiny"):
            raise ValueError(f"train_draft.target={self.target!r}: allowed 'smollm2' or 'tiny'")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"train_draft.device={self.device!r}: allowed 'auto', 'cpu' or 'cuda'")
        if len(self.init_layers) != self.layers:
            raise ValueError(f"train_draft.init_layers={list(self.init_layers)} must name one target layer "
                             f"per student layer (layers={self.layers})")
        if not 0.0 <= self.onpolicy_frac <= 1.0:
            raise ValueError(f"train_draft.onpolicy_frac={self.onpolicy_frac}: allowed 0 <= x <= 1")
        for name, mix, known in (("mix", self.mix, TEXT_SOURCES), ("onpolicy_mix", self.onpolicy_mix, PROMPT_SOURCES)):
            bad = sorted(set(mix) - set(known))
            if bad or not any(w > 0 for w in mix.values()):
                raise ValueError(f"train_draft.{name}={dict(mix)}: keys must be among {known} "
                                 "with at least one positive weight")


TEXT_SOURCES = ("gsm8k", "python", "alpaca", "wikitext")
PROMPT_SOURCES = ("gsm8k", "code", "alpaca")
CODE_INSTRUCTION = "Complete the following Python function.\n\n```python\n{code}```"


# ----------------------------------------------------------------------------- data

class Corpus:
    """Training documents and prompts, read lazily from the shared data and the interpreter's stdlib."""

    def __init__(self, tokenizer, data_dir: Path):
        self.tok = tokenizer
        self.data_dir = data_dir
        self._docs: dict[str, list[str]] = {}
        self._ids: dict[tuple[str, int], list[int]] = {}
        self._heads: dict[int, list[str]] = {}

    def chat(self, user: str, assistant: str | None = None) -> str:
        messages = [{"role": "user", "content": user}]
        if assistant is not None:
            messages.append({"role": "assistant", "content": assistant})
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=assistant is None)

    def docs(self, source: str) -> list[str]:
        if source not in self._docs:
            self._docs[source] = getattr(self, f"_read_{source}")()
            log.info("source %s: %d documents", source, len(self._docs[source]))
        return self._docs[source]

    def _read_gsm8k(self) -> list[str]:
        rows = _jsonl(self.data_dir / "gsm8k" / "train.jsonl")
        return [self.chat(r["question"], _clean_gsm8k(r["answer"])) for r in rows]

    def _read_alpaca(self) -> list[str]:
        rows = _jsonl(self.data_dir / "alpaca_seed_tasks" / "seed_tasks.jsonl")
        return [self.chat(_alpaca_prompt(r["instruction"], inst["input"]), inst["output"])
                for r in rows for inst in r["instances"]]

    def _read_wikitext(self) -> list[str]:
        text = (self.data_dir / "wikitext2" / "valid.txt").read_text(encoding="utf-8")
        articles = re.split(r"\n(?= = [^=].* = \n)", text)  # split before each top-level heading
        return [a.strip("\n") for a in articles if len(a) > 200]

    def _read_python(self) -> list[str]:
        return [str(p) for p in stdlib_files()]  # paths: read on demand

    def ids(self, source: str, i: int) -> list[int]:
        key = (source, i)
        if key not in self._ids:
            doc = self.docs(source)[i]
            if source == "python":
                doc = Path(doc).read_text(encoding="utf-8", errors="replace")
            self._ids[key] = self.tok(doc, add_special_tokens=False)["input_ids"]
        return self._ids[key]

    def window(self, source: str, rng: random.Random, length: int) -> list[int]:
        """``length`` tokens: a random document continued by further random documents, EOS between."""
        eos = self.tok.eos_token_id
        n = len(self.docs(source))
        first = self.ids(source, rng.randrange(n))
        chat = source in ("gsm8k", "alpaca")  # chat documents start at their beginning
        start = 0 if chat or len(first) <= length else rng.randrange(len(first) - length + 1)
        out = list(first[start:start + length])
        while len(out) < length:
            out += [eos] + self.ids(source, rng.randrange(n))
        return out[:length]

    def prompt(self, source: str, rng: random.Random) -> str:
        if source == "gsm8k":
            rows = self._gsm8k_questions()
            return self.chat(rows[rng.randrange(len(rows))])
        if source == "alpaca":
            rows = self._alpaca_instructions()
            return self.chat(rows[rng.randrange(len(rows))])
        head = self._code_head(rng)
        return head if rng.random() < 0.5 else self.chat(CODE_INSTRUCTION.format(code=head))

    def _gsm8k_questions(self) -> list[str]:
        if "gsm8k_q" not in self._docs:
            self._docs["gsm8k_q"] = [r["question"] for r in _jsonl(self.data_dir / "gsm8k" / "train.jsonl")]
        return self._docs["gsm8k_q"]

    def _alpaca_instructions(self) -> list[str]:
        if "alpaca_q" not in self._docs:
            rows = _jsonl(self.data_dir / "alpaca_seed_tasks" / "seed_tasks.jsonl")
            self._docs["alpaca_q"] = [_alpaca_prompt(r["instruction"], inst["input"])
                                      for r in rows for inst in r["instances"]]
        return self._docs["alpaca_q"]

    def _code_head(self, rng: random.Random) -> str:
        """A documented standard-library function cut after its docstring, like a HumanEval prompt."""
        files = self.docs("python")
        for _ in range(100):
            i = rng.randrange(len(files))
            if i not in self._heads:
                self._heads[i] = function_heads(Path(files[i]).read_text(encoding="utf-8", errors="replace"))
            if self._heads[i]:
                return rng.choice(self._heads[i])
        raise RuntimeError("found no documented functions in the standard library sources")


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: set $MTAD_DATA_DIR or train_draft.data_dir to the shared data")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _clean_gsm8k(answer: str) -> str:
    """Drop the calculator annotations ``<<48/2=24>>`` and spell out the final ``#### 72``."""
    answer = re.sub(r"<<[^>]*>>", "", answer)
    return re.sub(r"\n?#### *(.*)$", r"\nThe answer is \1.", answer.strip())


def _alpaca_prompt(instruction: str, inp: str) -> str:
    return f"{instruction}\n\n{inp}" if inp else instruction


def stdlib_files() -> list[Path]:
    """Python sources shipped with the interpreter, without test suites and demos."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}")
    return files


def function_heads(source: str, max_lines: int = 30) -> list[str]:
    """Signature + docstring of every documented function in ``source``, dedented, ending in a newline."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    heads = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)) or len(node.body) < 2:
            continue
        span = lines[node.lineno - 1:doc.end_lineno]
        if len(span) <= max_lines:
            heads.append(textwrap.dedent("\n".join(span)) + "\n")
    return heads


# ----------------------------------------------------------------------------- models

def load_teacher(cfg: TrainDraftConfig, device: torch.device):
    """(teacher, tokenizer): the embedded SmolLM2 or, for tests, a tiny random llama."""
    if cfg.target == "tiny":
        from mtad.tiny import tiny_model, tiny_tokenizer

        teacher = tiny_model("llama", hidden=cfg.tiny_hidden, layers=cfg.tiny_layers, seed=cfg.seed,
                             max_positions=max(cfg.seq_len, cfg.gen_prompt_len + cfg.gen_tokens) + 8)
        tok = tiny_tokenizer()
    else:
        from mtad import smollm2

        teacher, tok = smollm2.load(dtype="float32", device="cpu")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.to(device).eval(), tok


def build_student(teacher, layers: int, init_layers: list[int]):
    """The teacher's architecture with ``layers`` layers copied from ``init_layers``; embedding/head shared, frozen."""
    from transformers import AutoModelForCausalLM

    n = teacher.config.num_hidden_layers
    if any(not 0 <= i < n for i in init_layers):
        raise ValueError(f"init_layers={list(init_layers)} out of range for a target with {n} layers")
    config = teacher.config.__class__.from_dict(teacher.config.to_dict())
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:layers]
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for dst, src in zip(student.model.layers, init_layers):
        dst.load_state_dict(teacher.model.layers[src].state_dict())
    student.model.norm.load_state_dict(teacher.model.norm.state_dict())
    tie_to_target(student, teacher)
    return student.to(teacher.device)


def trainable_state(student) -> dict[str, torch.Tensor]:
    """The student's own weights: everything but the shared embedding and head."""
    shared = {"model.embed_tokens.weight", "lm_head.weight"}
    return {k: v for k, v in student.state_dict().items() if k not in shared}


# ----------------------------------------------------------------------------- loss

def forward_kl(student, input_ids, attention_mask, position_ids, select, p_logits) -> torch.Tensor:
    """Mean over selected positions of KL(p || q) = sum_v p (log p - log q), full vocabulary.

    ``select`` (B, S) marks the positions whose next-token prediction is supervised; ``p_logits`` (M, V)
    holds the teacher's logits for those positions in row-major order.
    """
    h = student.model(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids).last_hidden_state  # (B, S, D)
    log_q = F.log_softmax(student.lm_head(h[select]).float(), dim=-1)  # (M, V)
    log_p = F.log_softmax(p_logits.float(), dim=-1)  # (M, V)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def offline_batch(cfg, corpus: Corpus, rng: random.Random, teacher, device):
    """Packed windows from the text mix and the teacher's logits on every position."""
    sources, weights = zip(*cfg.mix.items())
    rows, used = [], []
    for _ in range(cfg.batch_size):
        src = rng.choices(sources, weights)[0]
        rows.append(corpus.window(src, rng, cfg.seq_len))
        used.append(src)
    ids = torch.tensor(rows, device=device)  # (B, S)
    with torch.no_grad():
        p_logits = teacher(input_ids=ids).logits  # (B, S, V)
    select = torch.ones_like(ids, dtype=torch.bool)
    return dict(input_ids=ids, attention_mask=None, position_ids=None, select=select,
                p_logits=p_logits.reshape(-1, p_logits.shape[-1])), used


def onpolicy_batch(cfg, corpus: Corpus, rng: random.Random, teacher, tok, device, gen_seed: int):
    """The teacher samples answers to training prompts; ``p`` is the raw logits of each sampled step."""
    sources, weights = zip(*cfg.onpolicy_mix.items())
    used = [rng.choices(sources, weights)[0] for _ in range(cfg.gen_batch)]  # one source per row
    prompts = [corpus.prompt(src, rng) for src in used]
    enc = _left_pad([tok(p, add_special_tokens=False)["input_ids"][-cfg.gen_prompt_len:] for p in prompts],
                    tok.pad_token_id, device)
    with torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(device)):
        torch.manual_seed(gen_seed)  # local: fork_rng restores the global generator afterwards
        out = teacher.generate(**enc, do_sample=True, temperature=1.0, top_k=cfg.gen_top_k,
                               top_p=cfg.gen_top_p, max_new_tokens=cfg.gen_tokens, output_logits=True,
                               return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    P = enc["input_ids"].shape[1]
    gen = out.sequences[:, P:]  # (B, G)
    valid = _before_eos(gen, teacher.generation_config.eos_token_id)  # (B, G)
    p_logits = torch.stack(out.logits, dim=1)[:, :gen.shape[1]]  # (B, G, V)
    seq = out.sequences[:, :-1]  # (B, P+G-1): the last token is never an input
    mask = torch.cat([enc["attention_mask"], torch.ones_like(gen)], dim=1)[:, :-1]  # (B, P+G-1)
    select = torch.zeros_like(seq, dtype=torch.bool)
    select[:, P - 1:] = valid
    return dict(input_ids=seq, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                select=select, p_logits=p_logits[valid]), used


def split_rows(batch: dict, used: list[str], rows: int) -> list[tuple[dict, list[str]]]:
    """Cut a batch into chunks of ``rows`` rows; ``p_logits`` follows its rows' selected positions."""
    counts = batch["select"].sum(1).tolist()
    out, start = [], 0
    for r0 in range(0, len(counts), rows):
        r1 = min(r0 + rows, len(counts))
        n = int(sum(counts[r0:r1]))
        if n:
            out.append(({k: (v[r0:r1] if k != "p_logits" else v[start:start + n]) for k, v in batch.items()},
                        used[r0:r1]))
        start += n
    return out


def _rng_devices(device: torch.device) -> list:
    return [device.index or 0] if device.type == "cuda" else []


def _left_pad(rows: list[list[int]], pad: int, device) -> dict:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)  # (B, P)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)  # (B, P)
    return {"input_ids": ids, "attention_mask": mask}


def _before_eos(gen: torch.Tensor, eos) -> torch.Tensor:
    """(B, G) mask of generated positions up to and including the first EOS."""
    eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=gen.device)
    is_eos = torch.isin(gen, eos_ids).int()
    return (is_eos.cumsum(1) - is_eos) == 0


# ----------------------------------------------------------------------------- held-out evaluation

def warp(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """T=1 probabilities restricted to the top-k tokens and then to the top-p nucleus, renormalised."""
    probs = F.softmax(logits.float(), dim=-1)  # (M, V)
    if top_k:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # keep the smallest prefix reaching top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


def eval_prompts(corpus: Corpus, n_gsm8k: int, n_humaneval: int) -> list[tuple[str, str]]:
    """(domain, prompt text): evenly spaced GSM8K test questions and HumanEval prompts, chat template."""
    out = []
    if n_gsm8k:
        rows = _jsonl(corpus.data_dir / "gsm8k" / "test.jsonl")
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


def build_eval_set(cfg, corpus: Corpus, teacher, tok, device) -> dict:
    """The target's own sampled continuations of held-out prompts (one batch), with its logits on them."""
    prompts = eval_prompts(corpus, cfg.eval_gsm8k, cfg.eval_humaneval)
    rows = [tok(text, add_special_tokens=False)["input_ids"] for _, text in prompts]
    enc = _left_pad(rows, tok.pad_token_id, device)
    with torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(device)):
        torch.manual_seed(cfg.seed)
        out = teacher.generate(**enc, do_sample=True, temperature=1.0, top_k=cfg.gen_top_k, top_p=cfg.gen_top_p,
                               max_new_tokens=cfg.eval_tokens, output_logits=True, return_dict_in_generate=True,
                               pad_token_id=tok.pad_token_id)
    P = enc["input_ids"].shape[1]
    gen = out.sequences[:, P:]  # (B, G)
    keep = _before_eos(gen, teacher.generation_config.eos_token_id).sum(1).tolist()
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
    device = next(student.parameters()).device
    for item in eval_set["items"]:
        ids, P = item["ids"].to(device), item["prompt_len"]
        if len(ids) <= P:
            continue
        logits = student(input_ids=ids[None, :-1]).logits[0, P - 1:].float()  # (G, V)
        log_p = item["log_p"].to(device).float()  # (G, V)
        log_q = F.log_softmax(logits, -1)
        pw = warp(log_p, eval_set["top_k"], eval_set["top_p"])
        qw = warp(log_q, eval_set["top_k"], eval_set["top_p"])
        d = per.setdefault(item["domain"], {"top1": [], "alpha": [], "kl": []})
        d["top1"] += (log_p.argmax(-1) == log_q.argmax(-1)).float().tolist()
        d["alpha"] += torch.minimum(pw, qw).sum(-1).tolist()
        d["kl"] += (log_p.exp() * (log_p - log_q)).sum(-1).tolist()
    per["all"] = {k: sum((d[k] for d in per.values()), []) for k in ("top1", "alpha", "kl")}
    result = {}
    for domain, d in per.items():
        alpha = _mean(d["alpha"])
        result[domain] = {"top1": _mean(d["top1"]), "alpha": alpha, "kl": _mean(d["kl"]),
                          "positions": len(d["top1"]),
                          "block_efficiency": (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1}
    return result


def _mean(xs: list) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


# ----------------------------------------------------------------------------- checkpoint and export

def atomic_save(obj, path: Path) -> None:
    """torch.save to a temp file beside ``path``, then rename over it (a crash leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def export(student, out_dir: Path, meta: dict) -> Path:
    """Write config.json, the non-embedding weights (fp16 safetensors), draft.json and MODEL_CARD.md atomically.

    The embedding and the tied output head are not stored: ``mtad.loading`` re-ties them from the target.
    """
    from safetensors.torch import save_file

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)
        weights = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in trainable_state(student).items()}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        student.config.save_pretrained(tmp)
        (tmp / "draft.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        (tmp / "MODEL_CARD.md").write_text(model_card(meta))
        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out_dir.exists():
            out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported the draft to %s", out_dir)
    return out_dir


def model_card(meta: dict) -> str:
    ev, ev0 = meta.get("eval", {}), meta.get("eval_init", {})

    def row(name, e):
        return (f"| {name} | {e.get('top1', float('nan')):.3f} | {e.get('alpha', float('nan')):.3f} | "
                f"{e.get('kl', float('nan')):.3f} | {e.get('block_efficiency', float('nan')):.2f} | "
                f"{e.get('positions', 0)} |")

    tokens = meta["tokens"]
    mix = ", ".join(f"{k} {v:.0%}" for k, v in meta["config"]["mix"].items())
    onmix = ", ".join(f"{k} {v:.0%}" for k, v in meta["config"]["onpolicy_mix"].items())
    by_src = ", ".join(f"{k} {v:,}" for k, v in sorted(meta["tokens_by_source"].items()))
    table = "\n".join([row(f"trained, {d}", ev[d]) for d in ev] + [row(f"initial (step 0), {d}", ev0[d]) for d in ev0])
    return f"""# smollm2-draft: a {meta['layers']}-layer draft for SmolLM2-135M-Instruct

Generated by `python -m mtad.train_draft` at export; rerun it to reproduce (command below).

## Architecture
- Llama decoder, d = {meta['hidden']}, {meta['layers']} layers (initialised from target layers
  {meta['config']['init_layers']}), {meta['heads']} query / {meta['kv_heads']} KV heads, vocabulary {meta['vocab']:,}
  (the target's tokenizer, unchanged).
- Parameters: {meta['own_params']:,} stored here (layers + final norm, fp16, `model.safetensors`), plus the
  target's {meta['shared_params']:,}-parameter embedding, which is also the tied output head. **The embedding
  is not stored**: `mtad.loading.load_pair` (kind `smollm2`) builds the draft from `config.json`, loads these
  weights and points its embedding/head at the target's own tensor (shared memory when the dtypes agree).
  Total at run time: {meta['own_params'] + meta['shared_params']:,} parameters.
- Why this shape (DRAFT.md): initialising from the target's embedding/head and first layers beat a fresh
  d=256 × 4 model at equal tokens (α 0.271 vs 0.234), and storing only the non-embedding weights keeps the
  committed file at {meta['file_mb']:.1f} MB.

## Training
- Loss: forward KL(p ‖ q) from the target's temperature-1 distribution, full vocabulary; AdamW, lr
  {meta['config']['lr']} with warm-up and cosine decay to {meta['config']['min_lr_frac']:g}×; embedding/head frozen.
- Steps: {meta['steps']:,} ({meta['onpolicy_steps']:,} on-policy); supervised positions: {tokens:,}
  ({by_src}); wall time {meta['train_minutes']:.1f} min on {meta['device_desc']}.
- Offline text mix (share of windows of {meta['config']['seq_len']} tokens): {mix}. GSM8K **train** in the chat
  template (calculator annotations removed), Python standard-library sources shipped with the interpreter
  (tests excluded), Alpaca self-instruct seed tasks in the chat template, WikiText-2 **valid**.
- On-policy share of data batches: {meta['config']['onpolicy_frac']:.0%} (each split into optimizer steps of
  {meta['config']['gen_rows_per_step']} rows): the target samples
  (T = 1, top-k {meta['config']['gen_top_k']}, top-p {meta['config']['gen_top_p']}, ≤ {meta['config']['gen_tokens']} tokens) answers to
  training prompts ({onmix}; code = standard-library function signature + docstring, raw or wrapped in the
  chat template) and the student learns the target's logits on those samples.
- No evaluation prompts in the data: GSM8K test, HumanEval, MT-Bench, Spider, Spec-Bench, WikiText-2 test
  and the ChatGPT prompts are never read by the trainer.
- Final distillation loss (KL, nats/token, mean of the last {meta['loss_window']} steps): {meta['final_loss']:.3f}.

## Held-out agreement with the target
The target's own sampled continuations ({meta['config']['eval_tokens']} tokens, T = 1, top-k
{meta['config']['gen_top_k']}, top-p {meta['config']['gen_top_p']}) of {meta['config']['eval_gsm8k']} GSM8K test questions and
{meta['config']['eval_humaneval']} HumanEval prompts, both in the chat template; teacher-forced. top-1 = argmax agreement;
α = mean Σ_v min(p̃, q̃) under the same warping; block efficiency = (1 − α^5)/(1 − α), the i.i.d. estimate
for γ = 4.

| draft, domain | top-1 | α | KL(p‖q) | block eff. (est.) | positions |
| --- | --- | --- | --- | --- | --- |
{table}

## Speculative / MTAD figures
- Measured acceptance rate and block efficiency of `speculative` (γ = 4) on GSM8K / HumanEval: **TO BE MEASURED**
- MTAD (W = 4, τ = 0.5) acceptance and block efficiency: **TO BE MEASURED**
- ms/token vs. target-only sampling on CPU: **TO BE MEASURED**

## Reproduce
`{meta['command']}`
"""


# ----------------------------------------------------------------------------- training loop

class Trainer:
    """One distillation run: state, step, checkpoint, evaluation, export."""

    def __init__(self, cfg: TrainDraftConfig):
        self.cfg = cfg
        self.device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if cfg.device == "auto" else cfg.device))
        if cfg.threads and self.device.type == "cpu":
            torch.set_num_threads(cfg.threads)
        self.ckpt_dir = _resolve(cfg.ckpt_dir) if cfg.ckpt_dir else cache_dir() / "train_draft"
        self.teacher, self.tok = load_teacher(cfg, self.device)
        self.corpus = Corpus(self.tok, Path(cfg.data_dir) if cfg.data_dir else default_data_dir())
        self.student = build_student(self.teacher, cfg.layers, list(cfg.init_layers))
        params = [p for p in self.student.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.state = {"step": 0, "tokens": 0, "seconds": 0.0, "onpolicy_steps": 0, "tokens_by_source": {},
                      "losses": [], "evals": []}
        self.eval_set = None

    # -- checkpoint
    def ckpt_path(self) -> Path:
        return self.ckpt_dir / "state.pt"

    def save(self) -> None:
        atomic_save({"student": trainable_state(self.student), "opt": self.opt.state_dict(),
                     "state": self.state, "config": asdict(self.cfg)}, self.ckpt_path())
        log.info("checkpoint: step %d -> %s", self.state["step"], self.ckpt_path())

    def maybe_resume(self) -> bool:
        path = self.ckpt_path()
        if not (self.cfg.resume and path.is_file()):
            return False
        ck = torch.load(path, map_location=self.device, weights_only=False)
        old = ck["config"]
        for key in ("target", "layers", "init_layers", "tiny_hidden", "tiny_layers"):
            if old.get(key) != getattr(self.cfg, key) and not (key == "init_layers" and list(old[key]) == list(self.cfg.init_layers)):
                raise ValueError(f"checkpoint {path} was trained with {key}={old.get(key)!r}, not "
                                 f"{getattr(self.cfg, key)!r}: delete it or set train_draft.resume=false")
        missing, unexpected = self.student.load_state_dict(ck["student"], strict=False)
        if unexpected or set(missing) - {"model.embed_tokens.weight", "lm_head.weight"}:
            raise ValueError(f"checkpoint {path} does not fit the student: missing {missing}, unexpected {unexpected}")
        self.opt.load_state_dict(ck["opt"])
        self.state = ck["state"]
        log.info("resumed from %s at step %d (%.1f min trained)", path, self.state["step"], self.state["seconds"] / 60)
        return True

    # -- schedule
    def progress(self) -> float:
        cfg, s = self.cfg, self.state
        parts = [s["step"] / cfg.max_steps, s["seconds"] / (60 * cfg.max_minutes) if cfg.max_minutes > 0 else 0.0]
        if cfg.max_tokens:
            parts.append(s["tokens"] / cfg.max_tokens)
        return max(parts)

    def lr(self) -> float:
        cfg, step = self.cfg, self.state["step"]
        warm = min(1.0, (step + 1) / max(cfg.warmup_steps, 1))
        cos = 0.5 * (1 + math.cos(math.pi * min(self.progress(), 1.0)))
        return cfg.lr * warm * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)

    # -- one step
    def round(self) -> list[float]:
        """One data batch and the optimizer steps on it (on-policy batches are split into row chunks)."""
        cfg, s = self.cfg, self.state
        seed = cfg.seed * 1_000_003 + s["step"]  # the data after optimizer step n depends on n alone
        rng = random.Random(seed)
        onpolicy = rng.random() < cfg.onpolicy_frac
        if onpolicy:
            t0 = time.monotonic()
            batch, used = onpolicy_batch(cfg, self.corpus, rng, self.teacher, self.tok, self.device, gen_seed=seed)
            chunks = split_rows(batch, used, cfg.gen_rows_per_step)
            log.info("on-policy batch: the target sampled %d tokens in %.0f s (%s)", int(batch["select"].sum()),
                     time.monotonic() - t0, ", ".join(sorted(set(used))))
        else:
            chunks = [offline_batch(cfg, self.corpus, rng, self.teacher, self.device)]
        losses = [self.optimize(batch, used, "gen" if onpolicy else "text") for batch, used in chunks]
        s["onpolicy_steps"] += len(chunks) if onpolicy else 0
        return losses

    def optimize(self, batch: dict, used: list[str], kind: str) -> float:
        s = self.state
        self.student.eval()  # these models have no dropout; eval mode keeps inference numerics
        for group in self.opt.param_groups:
            group["lr"] = self.lr()
        loss = forward_kl(self.student, **batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.student.parameters() if p.requires_grad], self.cfg.grad_clip)
        self.opt.step()
        for src, n in zip(used, batch["select"].sum(1).tolist()):
            key = f"{kind}:{src}"
            s["tokens_by_source"][key] = s["tokens_by_source"].get(key, 0) + int(n)
        s["step"] += 1
        s["tokens"] += int(batch["select"].sum())
        s["losses"] = (s["losses"] + [loss.item()])[-200:]
        return loss.item()

    # -- evaluation
    def get_eval_set(self) -> dict:
        if self.eval_set is None:
            path = self.ckpt_dir / "eval_set.pt"
            key = (self.cfg.target, self.cfg.eval_gsm8k, self.cfg.eval_humaneval, self.cfg.eval_tokens,
                   self.cfg.gen_top_k, self.cfg.gen_top_p, self.cfg.seed)
            if path.is_file():
                cached = torch.load(path, weights_only=False)
                if cached.get("key") == key:
                    self.eval_set = cached
            if self.eval_set is None:
                log.info("building the held-out evaluation set (target samples on GSM8K test / HumanEval)")
                self.eval_set = build_eval_set(self.cfg, self.corpus, self.teacher, self.tok, self.device)
                self.eval_set["key"] = key
                atomic_save(self.eval_set, path)
        return self.eval_set

    def evaluate(self) -> dict:
        result = evaluate(self.student, self.get_eval_set())
        self.state["evals"].append({"step": self.state["step"], "tokens": self.state["tokens"], **result})
        log.info("eval step %d: %s", self.state["step"],
                 "  ".join(f"{d}: top1 {r['top1']:.3f} alpha {r['alpha']:.3f} kl {r['kl']:.3f}" for d, r in result.items()))
        return result

    # -- the run
    def run(self) -> dict:
        self.maybe_resume()  # replaces self.state: bind `s` only afterwards
        cfg, s = self.cfg, self.state
        if not s["evals"]:
            self.evaluate()
        start, last_ckpt, last_eval = time.monotonic(), time.monotonic(), time.monotonic()
        window_t, window_tok = time.monotonic(), 0
        base_seconds = s["seconds"]
        while self.progress() < 1.0:
            tokens0, step0 = s["tokens"], s["step"]
            loss = self.round()[-1]
            s["seconds"] = base_seconds + time.monotonic() - start
            window_tok += s["tokens"] - tokens0
            if s["step"] // cfg.log_every != step0 // cfg.log_every:
                now = time.monotonic()
                log.info("step %d  loss %.4f (avg20 %.4f)  lr %.2e  tokens %d  %.0f tok/s  %.1f/%.1f min",
                         s["step"], loss, _mean(s["losses"][-20:]), self.lr(), s["tokens"],
                         window_tok / max(now - window_t, 1e-9), s["seconds"] / 60, cfg.max_minutes)
                window_t, window_tok = now, 0
            if time.monotonic() - last_ckpt > 60 * cfg.ckpt_minutes:
                self.save()
                last_ckpt = time.monotonic()
            if cfg.eval_minutes and time.monotonic() - last_eval > 60 * cfg.eval_minutes:
                self.evaluate()
                last_eval = time.monotonic()
        if not s["evals"] or s["evals"][-1]["step"] != s["step"]:
            self.evaluate()
        self.save()
        return self.finish()

    def finish(self) -> dict:
        cfg, s = self.cfg, self.state
        c = self.student.config
        own = sum(v.numel() for v in trainable_state(self.student).values())
        window = min(20, len(s["losses"]))
        meta = {
            "config": asdict(cfg), "steps": s["step"], "onpolicy_steps": s["onpolicy_steps"], "tokens": s["tokens"],
            "tokens_by_source": s["tokens_by_source"], "train_minutes": s["seconds"] / 60,
            "final_loss": _mean(s["losses"][-window:]), "loss_window": window,
            "eval": s["evals"][-1] if s["evals"] else {}, "eval_init": s["evals"][0] if s["evals"] else {},
            "layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "vocab": c.vocab_size, "own_params": own,
            "shared_params": self.student.get_input_embeddings().weight.numel(),
            "tied_embedding_from": "smollm2-135m-instruct" if cfg.target == "smollm2" else "tiny",
            "file_mb": own * 2 / 2**20, "device_desc": self._device_desc(),
            "command": "python -m mtad.train_draft " + " ".join(_overrides(cfg)),
        }
        for key in ("eval", "eval_init"):
            meta[key] = {k: v for k, v in meta[key].items() if isinstance(v, dict)}
        if cfg.out_dir:
            export(self.student, _resolve(cfg.out_dir), meta)
        return meta

    def _device_desc(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return f"CPU, {torch.get_num_threads()} thread(s)"


def _overrides(cfg: TrainDraftConfig) -> list[str]:
    """The command-line overrides that differ from the defaults (for the model card's reproduce line)."""
    default = TrainDraftConfig()
    out = []
    for key, value in asdict(cfg).items():
        if key in ("ckpt_dir", "data_dir", "resume"):
            continue
        if value != getattr(default, key):
            out.append(f"{key}={json.dumps(value).replace(' ', '')}")
    return out


def train(cfg: TrainDraftConfig) -> dict:
    """Train (resuming when a checkpoint exists), evaluate and export; returns the export metadata."""
    return Trainer(cfg).run()


def _register() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    # A frozen dataclass gives a read-only node that YAML could not fill: keep the types, drop read-only.
    node = OmegaConf.structured(TrainDraftConfig)
    OmegaConf.set_readonly(node, False)
    ConfigStore.instance().store(name="train_draft_schema", node=node)


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    _register()

    @hydra.main(config_path="../conf", config_name="train_draft", version_base="1.3")
    def _run(dcfg) -> None:
        cfg = OmegaConf.to_object(dcfg)
        log.info("train_draft config: %s", asdict(cfg))
        meta = train(cfg)
        log.info("done: %d steps, %d tokens, final loss %.4f, eval %s", meta["steps"], meta["tokens"],
                 meta["final_loss"], json.dumps(meta["eval"].get("all", {})))

    _run()


if __name__ == "__main__":
    main()

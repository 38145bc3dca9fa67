"""Distil the embedded target (SmolLM2-135M-Instruct) into a small draft that shares its tokenizer.

Run: ``python -m mtad.train.trainer [key=value ...]`` (config ``conf/train_draft.yaml``).

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

``data=cache`` (issue 9) replaces both by cached on-policy data: the target samples answers in batches
(``sample_topk``, its own batched KV-cached loop: training code, not a decoder, so it does not go through
``mtad.decoding.kv``) and its top-``cache_topk`` log-probs at every position are written to shards (format
above ``CACHE_FORMAT``); training steps read random cached rows only, so several epochs cost no teacher pass.
The loss is then taken against the *filtered* target distribution p~ (T=1, top-k, top-p: the verification
filter, computed exactly from the cached top-K): ``ce_filtered`` (-sum p~ log q), ``tv_filtered``
(1 - sum min(p~, q~) = 1 - alpha) or ``ce_tv`` (both). ``head_vocab=N`` trains a head over the N most frequent
tokens (``mtad.models.draft_head``; q = 0 elsewhere), ``head_bias`` a per-token bias on it, ``init_from`` warm-starts
the layers from an exported draft, ``export_only`` exports the latest checkpoint while a run continues.
``gen_dtype=bfloat16`` lets a bf16 copy of the target sample and label the shards (on an AVX512-BF16 CPU
2.4x the fp32 rate at batch 32: 11k against 4.7k answer tokens a minute on one thread; its filtered
distribution is within TV 0.02 of fp32's, ``mtad.measure.agreement --other bfloat16``) **[choice: the labels are the
bf16 teacher's, not re-scored in fp32, which would cost a second teacher pass per row]**; the held-out
evaluation and the text shards keep the fp32 teacher. An arch=feature shard stores the teacher's features
read off the same passes.

No evaluation prompt (GSM8K test, HumanEval, MT-Bench, Spider, ...) is in the training data; GSM8K test and
HumanEval prompts are the held-out evaluation set. Checkpoints (atomic) go to ``ckpt_dir`` and a rerun
resumes from them; ``max_minutes`` stops the run cleanly, evaluates and exports to ``out_dir``.
"""
from __future__ import annotations

import ast
import copy
import gzip
import json
import logging
import math
import random
import re
import shlex
import sysconfig
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from mtad._util.io import atomic_replace_dir, atomic_write
from mtad._util.paths import REPO_ROOT, cache_dir, default_data_dir
from mtad.decoding.filter import filter_probs
from mtad.models import smollm2
from mtad.models.draft_head import FILL, HEAD_FILE, DraftHead, full_bias, read_head_file
from mtad.models.feature_draft import FeatureDraft, feature_config
from mtad.models.load import tie_to_target
from mtad.models.tiny import tiny_model, tiny_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainDraftConfig:
    target: str = "smollm2"  # smollm2 | tiny (a random tiny llama: tests and smoke runs)
    out_dir: str = "models/smollm2-draft"  # repo-relative or absolute; "" = do not export
    ckpt_dir: Optional[str] = None  # None: mtad._util.paths.cache_dir()/train_draft
    data_dir: Optional[str] = None  # None: mtad._util.paths.default_data_dir()
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
    gen_dtype: str = "float32"  # the generating teacher's dtype: bfloat16 samples ~2.4x faster on AVX512-BF16
    mix: Dict[str, float] = field(default_factory=lambda: {
        "gsm8k": 0.40, "python": 0.35, "alpaca": 0.08, "wikitext": 0.17})
    onpolicy_mix: Dict[str, float] = field(default_factory=lambda: {
        "gsm8k": 0.45, "code": 0.40, "alpaca": 0.15})
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    lr_schedule: str = "cosine"  # cosine (over the run's budget) | constant (after warm-up: runs resumed for longer)
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
    data_seed: int = -1  # seed of the cached shards (-1: ``seed``); another value draws fresh data, same eval set
    resume: bool = True
    tiny_hidden: int = 64  # target=tiny only
    tiny_layers: int = 4
    # --- cached on-policy pipeline (data=cache): see the module docstring and DRAFT.md
    data: str = "live"  # live: a teacher pass every step | cache: train on cached on-policy teacher top-k
    loss: str = "kl"  # kl (full vocabulary, data=live) | ce_filtered | tv_filtered | ce_tv
    tv_weight: float = 1.0  # loss=ce_tv: ce + tv_weight * tv
    cache_dir: Optional[str] = None  # shards of teacher samples; None: <ckpt_dir>/onpolicy
    cache_topk: int = 16  # teacher log-probs stored per position (>= gen_top_k)
    cache_tokens: int = 0  # stop generating once the cache holds this many answer tokens (0 = never stop)
    train_per_gen: float = 2.0  # answer tokens trained per answer token generated (epochs over new data)
    cache_rows: int = 8  # cached rows per optimizer step
    prompt_weight: float = 0.0  # loss weight of the prompt positions (their teacher top-k is cached too)
    head_vocab: int = 0  # 0: full-vocabulary head; N: a head over the N most frequent tokens (q = 0 elsewhere)
    head_bias: bool = False  # train a per-token bias on the (reduced) head
    init_from: Optional[str] = None  # warm-start the layers from this exported draft (e.g. models/smollm2-draft)
    export_only: bool = False  # evaluate + export the latest checkpoint (no training, checkpoint untouched)
    # --- feature drafts (arch=feature, mtad.models.feature_draft; data=cache only)
    arch: str = "token"  # token: reads tokens only | feature: also reads the target's final hidden states
    unroll: int = 1  # extra training passes that feed the draft its own features (depth 2, 3, ... of a block)
    feat_weight: float = 0.5  # weight of the feature regression (smooth L1 of the draft's output to the target's)
    # --- teacher-forced text shards beside the on-policy cache (data=cache; built before training)
    text_shards: int = 0  # shards of training text with the teacher's top-K log-probs and features
    text_rows: int = 64  # windows per text shard
    text_len: int = 256  # tokens per window
    text_mix: Dict[str, float] = field(default_factory=lambda: {"gsm8k": 0.5, "python": 0.4, "alpaca": 0.1})

    def __post_init__(self) -> None:
        if self.target not in ("smollm2", "tiny"):
            raise ValueError(f"train_draft.target={self.target!r}: allowed 'smollm2' or 'tiny'")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"train_draft.device={self.device!r}: allowed 'auto', 'cpu' or 'cuda'")
        if len(self.init_layers) != self.layers:
            raise ValueError(f"train_draft.init_layers={list(self.init_layers)} must name one target layer "
                             f"per student layer (layers={self.layers})")
        if self.lr_schedule not in ("cosine", "constant"):
            raise ValueError(f"train_draft.lr_schedule={self.lr_schedule!r}: allowed 'cosine' or 'constant'")
        if self.gen_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"train_draft.gen_dtype={self.gen_dtype!r}: allowed 'float32' or 'bfloat16'")
        if self.gen_dtype != "float32" and self.data != "cache":
            raise ValueError("train_draft.gen_dtype=bfloat16 needs data=cache (it is the cache's generating teacher)")
        if self.arch not in ("token", "feature"):
            raise ValueError(f"train_draft.arch={self.arch!r}: allowed 'token' or 'feature'")
        if self.arch == "feature" and self.data != "cache":
            raise ValueError("train_draft.arch=feature needs data=cache (features are cached beside the shards)")
        if self.unroll < 0 or self.feat_weight < 0:
            raise ValueError("train_draft.unroll >= 0 and feat_weight >= 0 are required")
        if self.data not in ("live", "cache"):
            raise ValueError(f"train_draft.data={self.data!r}: allowed 'live' or 'cache'")
        if self.loss not in LOSSES:
            raise ValueError(f"train_draft.loss={self.loss!r}: allowed {LOSSES}")
        if self.data == "cache" and self.loss == "kl":
            raise ValueError("train_draft.loss=kl needs the full teacher distribution: with data=cache use "
                             "ce_filtered, tv_filtered or ce_tv")
        if self.data == "live" and (self.head_vocab or self.head_bias or self.loss != "kl"):
            raise ValueError("train_draft.head_vocab/head_bias/loss other than kl need data=cache")
        if self.cache_topk < self.gen_top_k:
            raise ValueError(f"train_draft.cache_topk={self.cache_topk} must be >= gen_top_k={self.gen_top_k}")
        if self.head_vocab < 0 or self.cache_rows < 1 or self.train_per_gen < 0:
            raise ValueError("train_draft.head_vocab >= 0, cache_rows >= 1 and train_per_gen >= 0 are required")
        if not 0.0 <= self.onpolicy_frac <= 1.0:
            raise ValueError(f"train_draft.onpolicy_frac={self.onpolicy_frac}: allowed 0 <= x <= 1")
        if self.text_shards and self.data != "cache":
            raise ValueError("train_draft.text_shards needs data=cache")
        for name, mix, known in (("mix", self.mix, TEXT_SOURCES), ("onpolicy_mix", self.onpolicy_mix, PROMPT_SOURCES),
                                 ("text_mix", self.text_mix, TEXT_SOURCES)):
            bad = sorted(set(mix) - set(known))
            if bad or not any(w > 0 for w in mix.values()):
                raise ValueError(f"train_draft.{name}={dict(mix)}: keys must be among {known} "
                                 "with at least one positive weight")


LOSSES = ("kl", "ce_filtered", "tv_filtered", "ce_tv")
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
        teacher = tiny_model("llama", hidden=cfg.tiny_hidden, layers=cfg.tiny_layers, seed=cfg.seed,
                             max_positions=max(cfg.seq_len, cfg.gen_prompt_len + cfg.gen_tokens) + 8)
        tok = tiny_tokenizer()
    else:
        teacher, tok = smollm2.load(dtype="float32", device="cpu")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.to(device).eval(), tok


def build_student(teacher, layers: int, init_layers: list[int], arch: str = "token"):
    """The teacher's architecture with ``layers`` layers copied from ``init_layers``; embedding/head shared, frozen.
    ``arch=feature``: a :class:`mtad.models.feature_draft.FeatureDraft` (Llama layers) whose ``fc`` starts as
    [identity, 0] (it reads the token embedding only: at step 0 it is the token draft it was built from)."""
    from transformers import AutoModelForCausalLM

    n = teacher.config.num_hidden_layers
    if any(not -1 <= i < n for i in init_layers):
        raise ValueError(f"init_layers={list(init_layers)} out of range for a target with {n} layers (-1: random)")
    if arch == "feature":
        config = feature_config(teacher.config, layers)
        config._attn_implementation = "sdpa"
        student = FeatureDraft(config).float()
        D = config.hidden_size
        with torch.no_grad():
            student.fc.weight.zero_()
            student.fc.weight[:, :D] = torch.eye(D)
            student.fc.bias.zero_()
    else:
        config = teacher.config.__class__.from_dict(teacher.config.to_dict())
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = config.layer_types[:layers]
        student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for dst, src in ((d, i) for d, i in zip(student.model.layers, init_layers) if i >= 0):  # -1 keeps the random init
        dst.load_state_dict(teacher.model.layers[src].state_dict())
    student.model.norm.load_state_dict(teacher.model.norm.state_dict())
    tie_to_target(student, teacher)
    return student.to(teacher.device)


def trainable_state(student) -> dict[str, torch.Tensor]:
    """The student's own weights: everything but the shared embedding and head (a head bias is kept)."""
    shared = {"model.embed_tokens.weight", "lm_head.weight"}
    return {k: v for k, v in student.state_dict().items() if k not in shared}


def layer_state(student) -> dict[str, torch.Tensor]:
    """What ``model.safetensors`` stores: the layers and the final norm (no head parameters)."""
    return {k: v for k, v in trainable_state(student).items() if not k.startswith("lm_head.")}


def init_from_draft(student, path: Path) -> None:
    """Copy an exported draft's layers and norm into ``student`` (same shape required)."""
    from safetensors.torch import load_file

    f = path / "model.safetensors"
    if not f.is_file():
        raise FileNotFoundError(f"train_draft.init_from={str(path)!r}: {f} is missing")
    weights = load_file(str(f))
    own = layer_state(student)
    if not any(k.startswith("fc.") for k in weights):  # a token draft into a feature student: fc stays [I, 0]
        own = {k: v for k, v in own.items() if not k.startswith("fc.")}
    if set(weights) != set(own) or any(weights[k].shape != own[k].shape for k in own):
        raise ValueError(f"train_draft.init_from={str(path)!r} does not fit the student (layers/shape differ)")
    student.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)


def install_train_head(student, kept: Optional[torch.Tensor], bias: bool) -> None:
    """A ``DraftHead`` over ``kept`` (None: all ids) on the student's shared embedding; trainable bias optional."""
    head = student.get_output_embeddings().weight  # the target's head (its embedding when tied)
    student.lm_head = DraftHead(head, kept, None, trainable_bias=bias)


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


# ----------------------------------------------------------------------------- cached on-policy data
#
# Cache format (``cache_dir``, default ``<ckpt_dir>/onpolicy``; format CACHE_FORMAT): one file per shard,
# ``shard-00000.pt`` ... written atomically (torch.save of a dict), shard i generated with seed
# ``data_seed * 1_000_003 + 7919 * (i + 1)`` (``data_seed``: ``seed`` unless set; so a resumed run regenerates
# nothing and a lost shard regenerates the same text), plus ``meta.json`` (the generation settings; a
# mismatching cache is refused). A shard:
#   {"format": 1, "index": i, "rows": [{"source": str, "ids": int32 (L,) prompt + answer (up to its EOS),
#     "gen_from": int P - 1 (first position whose next token is an answer token),
#     "topk_ids": int32 (L - 1, K), "topk_logp": float16 (L - 1, K)}, ...]}
# where row t of topk_* is the teacher's top-K raw (T = 1) log-softmax at position t, i.e. its distribution
# of token t + 1, sorted descending. The verification filter (top-k <= K, then top-p) is computed exactly from
# these K values, so several epochs on the cache cost no teacher pass. A feature draft's shard i also has
# ``feat-shard-0000i.pt`` beside it: {"format": 1, "stem", "feats": [float16 (L, D) per row]}, the teacher's
# final hidden state at every position, read off the generating passes (``sample_topk(features=True)``).
CACHE_FORMAT = 1


def data_seed(cfg) -> int:
    return cfg.seed if cfg.data_seed < 0 else cfg.data_seed


def shard_seed(cfg, index: int) -> int:
    return data_seed(cfg) * 1_000_003 + 7919 * (index + 1)


def cache_meta(cfg) -> dict:
    extra = {} if cfg.gen_dtype == "float32" else {"gen_dtype": cfg.gen_dtype}  # older caches stay valid
    return extra | {"format": CACHE_FORMAT, "target": cfg.target, "gen_top_k": cfg.gen_top_k, "gen_top_p": cfg.gen_top_p,
            "gen_tokens": cfg.gen_tokens, "gen_prompt_len": cfg.gen_prompt_len, "gen_batch": cfg.gen_batch,
            "cache_topk": cfg.cache_topk, "onpolicy_mix": dict(sorted(cfg.onpolicy_mix.items())), "seed": data_seed(cfg),
            "tiny": [cfg.tiny_hidden, cfg.tiny_layers] if cfg.target == "tiny" else None}


@torch.no_grad()
def sample_topk(teacher, rows: list[list[int]], pad: int, eos, max_new: int, top_k: int, top_p: float, K: int,
                gen: torch.Generator, features: bool = False) -> list[dict]:
    """The teacher samples (T=1, top-k, top-p: ``mtad.decoding.filter``) up to ``max_new`` tokens after each
    prompt, batched with left padding; returns per row the ids and the top-K log-probs at every position.
    ``features``: also the teacher's final hidden state at every position of the row (``feat``, fp16 (L, D),
    what ``teacher_features`` computes teacher-forced), read off the same passes (one extra step feeds the
    last sampled token), so a feature draft's shard needs no second teacher pass."""
    from transformers import DynamicCache

    device = teacher.get_input_embeddings().weight.device
    enc = _left_pad(rows, pad, device)
    ids, mask = enc["input_ids"], enc["attention_mask"]  # (B, P)
    B, P = ids.shape
    eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
    cache = DynamicCache(config=teacher.config)
    h = teacher.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                      use_cache=True).last_hidden_state  # (B, P, D)
    prompt_top, prompt_h, steps_h = [], [], []
    if features:
        prompt_h = [h[b, P - len(r):].to("cpu", torch.float16) for b, r in enumerate(rows)]
    for b, r in enumerate(rows):
        logp = F.log_softmax(teacher.lm_head(h[b, P - len(r):]).float(), -1)  # (len r, V)
        prompt_top.append(logp.topk(K, dim=-1))
    last = torch.stack([t.values[-1] for t in prompt_top]), torch.stack([t.indices[-1] for t in prompt_top])
    steps_v, steps_i, toks = [], [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    vals, idx = last  # (B, K)
    for step in range(max_new):
        if step:
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=device)], 1)
            pos = pos[:, -1:] + 1
            h = teacher.model(input_ids=toks[-1][:, None], attention_mask=mask, position_ids=pos,
                              cache=cache, use_cache=True).last_hidden_state[:, -1]  # (B, D)
            if features:
                steps_h.append(h.to("cpu", torch.float16))  # the feature of answer token step - 1
            vals, idx = F.log_softmax(teacher.lm_head(h).float(), -1).topk(K, dim=-1)  # (B, K)
        steps_v.append(vals)
        steps_i.append(idx)
        probs = filter_probs(vals, 1.0, top_k, top_p)  # (B, K): the filter needs only the top-k values
        choice = torch.multinomial(probs, 1, generator=gen)[:, 0]  # (B,)
        tok = idx.gather(1, choice[:, None])[:, 0]
        tok = torch.where(done, torch.full_like(tok, pad), tok)
        toks.append(tok)
        done |= torch.isin(tok, eos_ids)
        if bool(done.all()):
            break
    gen_ids = torch.stack(toks, 1)  # (B, G)
    valid = _before_eos(gen_ids, eos)  # (B, G)
    if features:  # the last sampled token's feature: one more step
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=device)], 1)
        h = teacher.model(input_ids=toks[-1][:, None], attention_mask=mask, position_ids=pos[:, -1:] + 1,
                          cache=cache, use_cache=True).last_hidden_state[:, -1]
        steps_h.append(h.to("cpu", torch.float16))
        sh = torch.stack(steps_h, 1)  # (B, G, D): answer tokens 0..G-1
    sv, si = torch.stack(steps_v, 1), torch.stack(steps_i, 1)  # (B, G, K)
    out = []
    for b, r in enumerate(rows):
        g = int(valid[b].sum())
        if g == 0:
            continue
        # positions 0..len(r)-1 (prompt, last one predicts answer token 0), then answer tokens 0..g-2
        tv = torch.cat([prompt_top[b].values, sv[b, 1:g]], 0)  # (len r + g - 1, K)
        ti = torch.cat([prompt_top[b].indices, si[b, 1:g]], 0)
        out.append({"ids": torch.tensor(r + gen_ids[b, :g].tolist(), dtype=torch.int32),
                    "gen_from": len(r) - 1, "topk_ids": ti.to(torch.int32).cpu(),
                    "topk_logp": tv.to(torch.float16).cpu()})
        if features:
            out[-1]["feat"] = torch.cat([prompt_h[b], sh[b, :g]], 0)  # (len r + g, D)
    return out


class OnPolicyCache:
    """Shards of the teacher's own answers with its top-K log-probs (format above); loaded into memory."""

    def __init__(self, cfg, directory: Path):
        self.cfg, self.dir = cfg, directory
        self.rows: list[dict] = []
        self.loaded: set[int] = set()
        self.by_shard: dict[str, list[dict]] = {}  # file stem -> its rows
        self.dir.mkdir(parents=True, exist_ok=True)
        meta, path = cache_meta(cfg), self.dir / "meta.json"
        if path.is_file():
            old = json.loads(path.read_text())
            if old != meta:
                raise ValueError(f"{self.dir} was generated with other settings ({old}), not {meta}: set "
                                 "train_draft.cache_dir to another directory or delete that one")
        else:
            path.write_text(json.dumps(meta, indent=1))

    def shard_path(self, i: int) -> Path:
        return self.dir / f"shard-{i:05d}.pt"

    def n_shards(self) -> int:
        i = 0
        while self.shard_path(i).is_file():
            i += 1
        return i

    def load(self) -> None:
        for i in range(self.n_shards()):
            if i not in self.loaded:
                shard = torch.load(self.shard_path(i), weights_only=False)
                if shard.get("format") != CACHE_FORMAT:
                    raise ValueError(f"{self.shard_path(i)} has cache format {shard.get('format')}, not {CACHE_FORMAT}")
                self.rows += shard["rows"]
                self.loaded.add(i)
                self.by_shard[self.shard_path(i).stem] = shard["rows"]
        i = 0
        while self.text_path(i).is_file():
            if self.text_path(i).stem not in self.by_shard:
                self._add_text(torch.load(self.text_path(i), weights_only=False))
            i += 1

    def answer_tokens(self) -> int:
        return sum(len(r["ids"]) - 1 - r["gen_from"] for r in self.rows)

    def generate(self, corpus: Corpus, teacher, tok) -> dict:
        """Generate the next shard (``gen_batch`` prompts from ``onpolicy_mix``) and add it to memory."""
        cfg, i = self.cfg, self.n_shards()
        seed = shard_seed(cfg, i)
        rng = random.Random(seed)
        sources, weights = zip(*cfg.onpolicy_mix.items())
        used = [rng.choices(sources, weights)[0] for _ in range(cfg.gen_batch)]
        prompts = [tok(corpus.prompt(s, rng), add_special_tokens=False)["input_ids"][-cfg.gen_prompt_len:]
                   for s in used]
        gen = torch.Generator(device=teacher.get_input_embeddings().weight.device).manual_seed(seed)
        rows = sample_topk(teacher, prompts, tok.pad_token_id, teacher.generation_config.eos_token_id,
                           cfg.gen_tokens, cfg.gen_top_k, cfg.gen_top_p, cfg.cache_topk, gen,
                           features=cfg.arch == "feature")
        kept = [dict(r, source=s) for r, s in zip(rows, used)] if len(rows) == len(used) else \
            [dict(r, source=s) for r, s in zip(rows, [u for u, p in zip(used, prompts) if p])]
        shard = {"format": CACHE_FORMAT, "index": i, "rows": [{k: v for k, v in r.items() if k != "feat"}
                                                              for r in kept]}
        if cfg.arch == "feature":  # the features beside the shard, as attach_features would write them
            atomic_save({"format": CACHE_FORMAT, "stem": self.shard_path(i).stem, "feats": [r["feat"] for r in kept]},
                        self.feat_path(self.shard_path(i).stem))
        atomic_save(shard, self.shard_path(i))
        self.rows += kept
        self.loaded.add(i)
        self.by_shard[self.shard_path(i).stem] = kept
        return shard

    # text shards (``text-00000.pt``, ...): teacher-forced windows of training text, same row format with
    # gen_from = 0 (every position supervised) and the teacher's features (``feat``) stored in the row
    def text_path(self, i: int) -> Path:
        return self.dir / f"text-{i:05d}.pt"

    def n_text(self) -> int:
        return sum(1 for k in self.by_shard if k.startswith("text-"))

    def _add_text(self, shard: dict) -> None:
        if shard.get("format") != CACHE_FORMAT:
            raise ValueError(f"text shard {shard.get('index')} has cache format {shard.get('format')}, not {CACHE_FORMAT}")
        self.rows += shard["rows"]
        self.by_shard[self.text_path(shard["index"]).stem] = shard["rows"]

    def generate_text(self, corpus: Corpus, teacher) -> dict:
        """The next text shard: ``text_rows`` windows of ``text_len`` tokens from ``text_mix`` (training text
        only), the teacher's top-K log-probs and final hidden states at every position (one pass)."""
        cfg, i = self.cfg, self.n_text()
        seed = shard_seed(cfg, i) + 500_009  # apart from the on-policy shards' seeds
        rng = random.Random(seed)
        sources, weights = zip(*cfg.text_mix.items())
        used = [rng.choices(sources, weights)[0] for _ in range(cfg.text_rows)]
        seqs = [torch.tensor(corpus.window(src, rng, cfg.text_len), dtype=torch.int32) for src in used]
        rows = teacher_topk(teacher, seqs, cfg.cache_topk)
        shard = {"format": CACHE_FORMAT, "index": i, "rows": [dict(r, source=f"text:{src}") for r, src in zip(rows, used)],
                 "settings": {"text_len": cfg.text_len, "text_mix": dict(cfg.text_mix), "seed": seed}}
        atomic_save(shard, self.text_path(i))
        self._add_text(shard)
        return shard

    def feat_path(self, stem: str) -> Path:
        return self.dir / f"feat-{stem}.pt"

    def attach_features(self, teacher) -> None:
        """Give every loaded row its teacher features (``feat``, arch=feature): read ``feat-<i>.pt`` beside
        shard i, or compute it (one teacher-forced pass, ``teacher_features``) and write it atomically."""
        for stem, rows in sorted(self.by_shard.items()):
            if all("feat" in r for r in rows):
                continue
            path = self.feat_path(stem)
            feats = None
            if path.is_file():
                saved = torch.load(path, weights_only=False)
                if saved.get("format") == CACHE_FORMAT and [len(f) for f in saved["feats"]] == [len(r["ids"]) for r in rows]:
                    feats = saved["feats"]
            if feats is None:
                t0 = time.monotonic()
                feats = teacher_features(teacher, [r["ids"] for r in rows])
                atomic_save({"format": CACHE_FORMAT, "stem": stem, "feats": feats}, path)
                log.info("cache %s: teacher features for %d rows in %.0f s", stem, len(rows), time.monotonic() - t0)
            for r, f in zip(rows, feats):
                r["feat"] = f


@torch.no_grad()
def teacher_features(teacher, sequences: list[torch.Tensor], batch: int = 8) -> list[torch.Tensor]:
    """The teacher's final hidden state (after its last norm: what ``Session`` hands a feature draft) at every
    position of each sequence, teacher-forced: fp16 CPU tensors (L, D). Rows of similar length are batched
    with right padding, which causal attention keeps out of every real position."""
    device = teacher.get_input_embeddings().weight.device
    out: list = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        x = torch.zeros(len(idx), max(len(sequences[i]) for i in idx), dtype=torch.long)
        for b, i in enumerate(idx):
            x[b, :len(sequences[i])] = sequences[i].long()
        h = teacher.model(input_ids=x.to(device)).last_hidden_state  # (B, L, D)
        for b, i in enumerate(idx):
            out[i] = h[b, :len(sequences[i])].to("cpu", torch.float16)
    return out


@torch.no_grad()
def teacher_topk(teacher, sequences: list[torch.Tensor], K: int, batch: int = 8) -> list[dict]:
    """Teacher-forced rows of the cache format (gen_from = 0) for equal-length ``sequences``: the teacher's
    top-K raw log-probs at every position and its final hidden states (``feat``, fp16)."""
    device = teacher.get_input_embeddings().weight.device
    out = []
    for start in range(0, len(sequences), batch):
        x = torch.stack(sequences[start:start + batch]).long().to(device)  # (B, L)
        h = teacher.model(input_ids=x).last_hidden_state  # (B, L, D)
        top = F.log_softmax(teacher.lm_head(h[:, :-1]).float(), -1).topk(K, dim=-1)  # (B, L-1, K)
        for b in range(x.shape[0]):
            out.append({"ids": x[b].to("cpu", torch.int32), "gen_from": 0,
                        "topk_ids": top.indices[b].to("cpu", torch.int32), "topk_logp": top.values[b].to("cpu", torch.float16),
                        "feat": h[b].to("cpu", torch.float16)})
    return out


def shift_features(f: torch.Tensor) -> torch.Tensor:
    """(B, L, D) features at positions t -> each position's parent feature (t - 1; zeros at t = 0)."""
    return torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], 1)


def feature_targets(rows: list[dict], device) -> torch.Tensor:
    """(B, L, D) the teacher features aligned with ``cache_batch``'s inputs (row t: the feature at t)."""
    L = max(len(r["ids"]) for r in rows) - 1
    f = torch.zeros(len(rows), L, rows[0]["feat"].shape[-1])
    for b, r in enumerate(rows):
        f[b, :len(r["ids"]) - 1] = r["feat"][:-1].float()
    return f.to(device)


def filtered_targets(topk_logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """p~ on the cached top-K ids: (M, K) raw log-probs sorted descending -> (M, K) filtered probabilities."""
    return filter_probs(topk_logp.float(), 1.0, top_k, top_p)  # exactly the decoders' filter (top-k <= K)


def filtered_loss(z: torch.Tensor, tgt_ids: torch.Tensor, p_f: torch.Tensor, loss: str, top_k: int, top_p: float,
                  tv_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-position loss (M,), per-position alpha (M,)) of student logits ``z`` (M, N) against p~.

    ``tgt_ids`` (M, K) are the cached ids mapped to head columns (-1: outside the head, dropped), ``p_f``
    (M, K) their filtered probabilities p~. ``ce_filtered`` = -sum p~ log q (= KL(p~ || q) + const; p~ is
    renormalised over the ids the head can output); ``tv_filtered`` = 1 - sum min(p~, q~) = TV(p~, q~) with
    q~ the student's own filtered distribution (its support mask carries no gradient); ``ce_tv`` = both.
    alpha = sum min(p~, q~) is the verification acceptance of this position (p~ unrenormalised).
    """
    inside = tgt_ids >= 0  # (M, K)
    cols = tgt_ids.clamp(min=0).long()
    log_q = F.log_softmax(z.float(), -1)  # (M, N)
    # q~: the student's top-k then top-p filter; membership by value (>= its smallest kept value)
    q = log_q.exp()
    qv, _ = q.topk(min(top_k, q.shape[-1]), dim=-1)  # (M, k) sorted
    keep_v = _nucleus_mask(qv.detach(), top_p)  # (M, k)
    thresh = torch.where(keep_v, qv.detach(), torch.full_like(qv, float("inf"))).min(-1).values  # (M,)
    z_q = (qv * keep_v).sum(-1)  # (M,) normaliser of q~
    q_at = q.gather(1, cols)  # (M, K)
    q_f = torch.where(inside & (q_at >= thresh[:, None]), q_at / z_q[:, None], torch.zeros_like(q_at))
    alpha = torch.minimum(p_f * inside, q_f).sum(-1)  # (M,)
    ce = -(p_f * inside * log_q.gather(1, cols)).sum(-1) / (p_f * inside).sum(-1).clamp(min=1e-6)
    if loss == "ce_filtered":
        out = ce
    elif loss == "tv_filtered":
        out = 1 - alpha
    elif loss == "ce_tv":
        out = ce + tv_weight * (1 - alpha)
    else:
        raise ValueError(f"filtered_loss: unknown loss {loss!r}")
    return out, alpha.detach()


def _nucleus_mask(sorted_p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask of the smallest prefix of descending ``sorted_p`` (unnormalised) whose share reaches top_p."""
    total = sorted_p.sum(-1, keepdim=True)
    before = (sorted_p.cumsum(-1) - sorted_p) / total
    return before < top_p if top_p < 1.0 else torch.ones_like(sorted_p, dtype=torch.bool)


def cache_batch(rows: list[dict], col_of: Optional[torch.Tensor], cfg, device) -> dict:
    """Right-padded inputs and the supervised positions' cached targets for a list of cached rows."""
    L = max(len(r["ids"]) for r in rows) - 1
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    select = torch.zeros(len(rows), L, dtype=torch.bool)
    weight = torch.zeros(len(rows), L)
    t_ids, t_lp = [], []
    for b, r in enumerate(rows):
        n = len(r["ids"]) - 1
        ids[b, :n] = r["ids"][:-1].long()
        first = 0 if cfg.prompt_weight > 0 else r["gen_from"]
        select[b, first:n] = True
        weight[b, first:n] = 1.0
        weight[b, first:r["gen_from"]] = cfg.prompt_weight
        t_ids.append(r["topk_ids"][first:n].long())
        t_lp.append(r["topk_logp"][first:n])
    t_ids = torch.cat(t_ids)  # (M, K)
    cols = t_ids if col_of is None else col_of[t_ids]
    return {"input_ids": ids.to(device), "select": select.to(device), "weight": weight[select].to(device),
            "cols": cols.to(device), "p_f": filtered_targets(torch.cat(t_lp), cfg.gen_top_k, cfg.gen_top_p).to(device)}


def head_vocab_ids(corpus: Corpus, rows: list[dict], n: int, vocab: int, special: list[int]) -> torch.Tensor:
    """The ``n`` ids kept by a reduced head: special tokens, then by frequency in the teacher's cached top-10
    supports (on-policy training prompts) and in the training text (GSM8K train, Alpaca seeds, stdlib)."""
    counts = torch.zeros(vocab, dtype=torch.float64)
    for r in rows:
        counts += torch.bincount(r["topk_ids"][:, :10].reshape(-1).long(), minlength=vocab).double() * 4.0
    rng = random.Random(0)
    for source in ("gsm8k", "alpaca", "python"):
        docs = corpus.docs(source)
        for i in rng.sample(range(len(docs)), min(len(docs), 400)):
            counts += torch.bincount(torch.tensor(corpus.ids(source, i), dtype=torch.long), minlength=vocab).double()
    counts[torch.tensor(sorted(set(special)), dtype=torch.long)] = float("inf")
    n = min(n, vocab)
    return counts.argsort(descending=True, stable=True)[:n].sort().values


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


def _filtered(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The decoders' filter (``filter_probs``: exactly top_k tokens, then the nucleus; no full-vocabulary
    sort when top_k > 0); ``warp`` for top_k = 0."""
    return filter_probs(logits, 1.0, top_k, top_p) if top_k else warp(logits, top_k, top_p)


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
    feature = getattr(student, "reads_target_features", False)
    for item in eval_set["items"]:
        ids, P = item["ids"].to(device), item["prompt_len"]
        if len(ids) <= P:
            continue
        log_p = item["log_p"].to(device).float()  # (G, V)
        pw = _filtered(log_p, eval_set["top_k"], eval_set["top_p"])
        d = per.setdefault(item["domain"], {k: [] for k in EVAL_KEYS})
        if feature:  # depth 1 reads the target's features; depth k the draft's own from depth k - 1
            fin = shift_features(item["feat"].to(device).float()[None, :-1])
            for depth in range(FEATURE_DEPTHS):
                h = student.hidden(ids[None, :-1], fin)  # (1, L, D)
                if depth:
                    qk = _filtered(F.log_softmax(student.lm_head(h[0, P - 1:]).float(), -1),
                                   eval_set["top_k"], eval_set["top_p"])
                    d[f"alpha_d{depth + 1}"] += torch.minimum(pw, qk).sum(-1).tolist()
                else:
                    logits = student.lm_head(h[0, P - 1:]).float()  # (G, V)
                fin = shift_features(h)
        else:
            logits = student(input_ids=ids[None, :-1]).logits[0, P - 1:].float()  # (G, V)
        log_q = F.log_softmax(logits, -1)
        qw = _filtered(log_q, eval_set["top_k"], eval_set["top_p"])
        d["top1"] += (log_p.argmax(-1) == log_q.argmax(-1)).float().tolist()
        d["alpha"] += torch.minimum(pw, qw).sum(-1).tolist()
        # a reduced head gives q = 0 outside its vocabulary: KL over the head's vocabulary (p renormalised
        # there), and coverage = p~ mass inside it (an upper bound on alpha)
        inside = logits > FILL / 2  # (G, V)
        lp_in = torch.where(inside, log_p, torch.full_like(log_p, -float("inf"))).log_softmax(-1)
        d["kl"] += (lp_in.exp() * (lp_in - log_q)).where(inside, torch.zeros_like(log_q)).sum(-1).tolist()
        d["coverage"] += (pw * inside).sum(-1).tolist()
    per["all"] = {k: sum((d[k] for d in per.values()), []) for k in EVAL_KEYS}
    result = {}
    for domain, d in per.items():
        alpha = _mean(d["alpha"])
        r = {"top1": _mean(d["top1"]), "alpha": alpha, "kl": _mean(d["kl"]), "coverage": _mean(d["coverage"]),
             "positions": len(d["top1"])}
        # block efficiency for gamma drafted tokens: 1 + a1 + a1 a2 + ..., depth j's alpha a_j (the deepest
        # measured one beyond); a token draft's alpha does not depend on the depth (teacher-forced)
        depth_alpha = [alpha] + [_mean(d[f"alpha_d{k}"]) for k in range(2, FEATURE_DEPTHS + 1) if d[f"alpha_d{k}"]]
        for k, a in enumerate(depth_alpha[1:], start=2):
            r[f"alpha_d{k}"] = a
        e, run = 1.0, 1.0
        for j in range(gamma):
            run *= depth_alpha[min(j, len(depth_alpha) - 1)]
            e += run
        r["block_efficiency"] = e
        result[domain] = r
    return result


EVAL_KEYS = ("top1", "alpha", "kl", "coverage", "alpha_d2", "alpha_d3")
FEATURE_DEPTHS = 3  # held-out alpha of a feature draft at block depths 1..3


def _mean(xs: list) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


# ----------------------------------------------------------------------------- checkpoint and export

def atomic_save(obj, path: Path) -> None:
    """torch.save to a temp file beside ``path``, then rename over it (a crash leaves the old file)."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def head_tensors(student) -> dict[str, torch.Tensor]:
    """What ``head.safetensors`` stores for a trained ``DraftHead``: kept ids (int64) and bias (fp32), or {}."""
    head = student.lm_head
    if not hasattr(head, "compact"):
        return {}
    V = head.vocab_size
    kept = head.kept_ids if head.kept_ids is not None else torch.arange(V)
    out = {"kept_ids": kept.detach().to("cpu", torch.int64).contiguous()}
    if head.bias is not None:
        out["bias"] = head.bias.detach().to("cpu", torch.float32).contiguous()
    return out


def export(student, out_dir: Path, meta: dict) -> Path:
    """Write config.json, the non-embedding weights (fp16 safetensors), draft.json and MODEL_CARD.md atomically.

    The embedding and the tied output head are not stored: ``mtad.models.load`` re-ties them from the target.
    """
    from safetensors.torch import save_file


    def build(tmp: Path) -> None:
        weights = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in layer_state(student).items()}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        head = head_tensors(student)
        if head:
            save_file(head, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        student.config.save_pretrained(tmp)
        (tmp / "draft.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        (tmp / "MODEL_CARD.md").write_text(model_card(meta))
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors/mkstemp may leave 0600: committed files are world-readable

    atomic_replace_dir(out_dir, build)
    log.info("exported the draft to %s", out_dir)
    return out_dir


def _card_cached(meta: dict) -> str:
    """The model card of a draft trained on the cached on-policy pipeline (data=cache)."""
    c = meta["config"]
    ev, ev0, heads = meta.get("eval", {}), meta.get("eval_init", {}), meta.get("eval_heads", {})

    def row(name, e):
        return (f"| {name} | {e.get('top1', float('nan')):.3f} | {e.get('alpha', float('nan')):.3f} | "
                f"{e.get('coverage', float('nan')):.3f} | {e.get('block_efficiency', float('nan')):.2f} | "
                f"{e.get('positions', 0)} |")

    table = "\n".join([row(f"trained, {d}", ev[d]) for d in ev] + [row(f"initial (step 0), {d}", ev0[d]) for d in ev0])
    head_rows = "\n".join(
        f"| `{mode}` | " + " | ".join(f"{r[d]['alpha']:.3f}" for d in ("gsm8k", "humaneval", "all") if d in r) + " |"
        for mode, r in heads.items())
    curve = "\n".join(f"| {e['step']:,} | {e['tokens']:,} | {e.get('gsm8k', float('nan')):.3f} | "
                      f"{e.get('humaneval', float('nan')):.3f} | {e.get('all', float('nan')):.3f} |"
                      for e in meta.get("alpha_vs_tokens", []))
    onmix = ", ".join(f"{k} {v:.0%}" for k, v in c["onpolicy_mix"].items())
    by_src = ", ".join(f"{k} {v:,}" for k, v in sorted(meta["tokens_by_source"].items()))
    head = (f"a reduced head over the {meta['head_vocab']:,} most frequent tokens (`head.safetensors`: kept ids"
            f"{' + a trained per-token bias' if c['head_bias'] else ''}; q = 0 outside them)"
            if c["head_vocab"] else "the full-vocabulary tied head")
    return f"""# smollm2-draft: a {meta['layers']}-layer draft for SmolLM2-135M-Instruct

Generated by `python -m mtad.train.trainer` at export; rerun it to reproduce (command below).

## Architecture
- Llama decoder, d = {meta['hidden']}, {meta['layers']} layers, {meta['heads']} query / {meta['kv_heads']} KV heads,
  the target's tokenizer (vocabulary {meta['vocab']:,}); output: {head}.
- Stored: {meta['own_params']:,} parameters (layers + final norm in fp16 `model.safetensors`, head ids/bias in
  `head.safetensors`), {meta['file_mb']:.1f} MB. The embedding and the head rows are the target's own tensor,
  re-tied at load (`mtad.models.load.load_pair`, kind `smollm2`); `model.draft_head` picks the inference head
  (`full` | `int8` | `reduced` | `reduced_int8`, `mtad.models.draft_head`).

## Training (cached on-policy distillation)
- Warm start: {c['init_from'] or 'target layers ' + str(c['init_layers'])}.
- Data: the target's own answers (T = 1, top-k {c['gen_top_k']}, top-p {c['gen_top_p']}, ≤ {c['gen_tokens']} tokens) to
  training-split prompts ({onmix}; code = standard-library function signature + docstring, raw or in the
  chat template; GSM8K **train** questions; Alpaca seed instructions), generated in batches of {c['gen_batch']}{' by a ' + c['gen_dtype'] + ' copy of the target (its own top-K labels them)' if c.get('gen_dtype', 'float32') != 'float32' else ''} and
  cached with the target's top-{c['cache_topk']} log-probs at every position ({meta['cache_rows']:,} answers,
  {meta['cache_answer_tokens']:,} answer tokens; generation took {meta['gen_minutes']:.0f} min). Training reads only
  the cache: {c['train_per_gen']:g} trained tokens per generated token, no teacher pass.
- Loss `{c['loss']}` against the **filtered** target distribution p̃ (T = 1, top-k {c['gen_top_k']}, top-p {c['gen_top_p']}, the
  verification filter): cross-entropy −Σ p̃ log q{' + ' + format(c['tv_weight'], 'g') + ' × TV(p̃, q̃)' if c['loss'] == 'ce_tv' else ''}
  (TV = 1 − Σ min(p̃, q̃) = 1 − α with q̃ the student's own filtered distribution); AdamW, lr {c['lr']}
  ({c['lr_schedule']}); embedding frozen.
- Steps: {meta['steps']:,}; supervised answer positions: {meta['tokens']:,} ({by_src});
  wall time {meta['train_minutes']:.1f} min on {meta['device_desc']}, shared with other jobs.
- No evaluation prompts in the data: GSM8K test, HumanEval, MT-Bench, Spider, Spec-Bench, WikiText-2 test
  and the ChatGPT prompts are never read by the trainer.
- Final loss (mean of the last {meta['loss_window']} steps): {meta['final_loss']:.3f}; training-batch α {meta['train_alpha']:.3f}.

## Held-out agreement with the target
The target's own sampled continuations ({c['eval_tokens']} tokens, T = 1, top-k {c['gen_top_k']}, top-p {c['gen_top_p']}) of
{c['eval_gsm8k']} GSM8K test questions and {c['eval_humaneval']} HumanEval prompts, chat template; teacher-forced.
top-1 = argmax agreement; α = mean Σ_v min(p̃, q̃) under the same filter; coverage = p̃ mass inside the
draft's vocabulary (an upper bound on α); block efficiency = (1 − α^5)/(1 − α), the i.i.d. estimate for γ = 4.

| draft, domain | top-1 | α | coverage | block eff. (est.) | positions |
| --- | --- | --- | --- | --- | --- |
{table}

α by inference head (`model.draft_head`):

| head | α GSM8K | α HumanEval | α all |
| --- | --- | --- | --- |
{head_rows}

α against training tokens (held-out, during this run):

| step | answer tokens trained | α GSM8K | α HumanEval | α all |
| --- | --- | --- | --- | --- |
{curve}

## Speculative / MTAD figures
- Not measured at export. Decode with this draft to measure them (block efficiency, acceptance, ms/token against
  sampling, output perplexity): `make reproduce-table PROFILE=cpu ARGS="model.draft=<this directory>"`, then add
  the figures here.

## Reproduce
`{meta['command']}`
"""


def model_card(meta: dict) -> str:
    if meta["config"].get("data") == "cache":
        return _card_cached(meta)
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

Generated by `python -m mtad.train.trainer` at export; rerun it to reproduce (command below).

## Architecture
- Llama decoder, d = {meta['hidden']}, {meta['layers']} layers (initialised from target layers
  {meta['config']['init_layers']}), {meta['heads']} query / {meta['kv_heads']} KV heads, vocabulary {meta['vocab']:,}
  (the target's tokenizer, unchanged).
- Parameters: {meta['own_params']:,} stored here (layers + final norm, fp16, `model.safetensors`), plus the
  target's {meta['shared_params']:,}-parameter embedding, which is also the tied output head. **The embedding
  is not stored**: `mtad.models.load.load_pair` (kind `smollm2`) builds the draft from `config.json`, loads these
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
- Not measured at export. Decode with this draft to measure them (block efficiency, acceptance, ms/token against
  sampling, output perplexity): `make reproduce-table PROFILE=cpu ARGS="model.draft=<this directory>"`, then add
  the figures here.

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
        # the cache's sampler: the teacher, or a bf16 copy (its top-K and features label the shards; the
        # held-out evaluation and text shards keep the fp32 teacher)
        self.gen_teacher = self.teacher if cfg.gen_dtype == "float32" else \
            copy.deepcopy(self.teacher).to(getattr(torch, cfg.gen_dtype))
        self.corpus = Corpus(self.tok, Path(cfg.data_dir) if cfg.data_dir else default_data_dir())
        self.student = build_student(self.teacher, cfg.layers, list(cfg.init_layers), cfg.arch)
        self.init_head = None  # the exported head (kept ids, bias) of init_from, carried into a continued run
        if cfg.init_from:
            init_from_draft(self.student, _resolve(cfg.init_from))
            if (_resolve(cfg.init_from) / HEAD_FILE).is_file():
                self.init_head = read_head_file(_resolve(cfg.init_from))
        self.cache, self.kept, self.col_of = None, None, None
        if cfg.data == "cache":
            self.cache = OnPolicyCache(cfg, _resolve(cfg.cache_dir) if cfg.cache_dir else self.ckpt_dir / "onpolicy")
            self.cache.load()
            self._setup_head()
            self._attach_features()
            self._build_text()
        params = [p for p in self.student.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.state = {"step": 0, "tokens": 0, "seconds": 0.0, "onpolicy_steps": 0, "tokens_by_source": {},
                      "losses": [], "evals": [], "gen_seconds": 0.0, "train_alpha": []}
        self.eval_set = None

    def _setup_head(self) -> None:
        """Reduced head: its kept ids come from the checkpoint, else from the first shard + training text."""
        cfg = self.cfg
        if not (cfg.head_vocab or cfg.head_bias):
            return
        kept = None
        if cfg.head_vocab:
            path = self.ckpt_path()
            if cfg.resume and path.is_file():
                kept = torch.load(path, map_location="cpu", weights_only=False).get("kept_ids")
            if kept is None and self.init_head is not None and len(self.init_head["kept_ids"]) == cfg.head_vocab:
                kept = self.init_head["kept_ids"]  # continue an exported draft with its own head
            if kept is None:
                if not self.cache.rows:
                    self._generate()
                V = self.teacher.config.vocab_size
                special = [i for i in (self.tok.eos_token_id, self.tok.bos_token_id, self.tok.pad_token_id)
                           if i is not None] + list(getattr(self.tok, "all_special_ids", []))
                kept = head_vocab_ids(self.corpus, self.cache.rows, cfg.head_vocab, V, special)
            self.kept = kept.long()
            self.col_of = torch.full((self.teacher.config.vocab_size,), -1, dtype=torch.long)
            self.col_of[self.kept] = torch.arange(len(self.kept))
        install_train_head(self.student, None if self.kept is None else self.kept.to(self.device), cfg.head_bias)
        init = self.init_head
        if cfg.head_bias and init is not None and init["bias"] is not None:
            src = full_bias(init, self.teacher.config.vocab_size)  # another id set keeps the shared ids' bias
            src = src if self.kept is None else src[self.kept.cpu()]
            bias = self.student.lm_head.bias
            with torch.no_grad():
                bias.copy_(src.to(bias.device, bias.dtype))

    def _build_text(self) -> None:
        """Build the missing text shards (``text_shards``); each is written atomically, so a rerun resumes."""
        while self.cache.n_text() < self.cfg.text_shards:
            t0 = time.monotonic()
            shard = self.cache.generate_text(self.corpus, self.teacher)
            n = sum(len(r["ids"]) for r in shard["rows"])
            log.info("text shard %d: %d teacher-forced tokens in %.0f s; cache %d rows", shard["index"], n,
                     time.monotonic() - t0, len(self.cache.rows))

    def _attach_features(self) -> None:
        if self.cfg.arch == "feature":
            self.cache.attach_features(self.teacher)

    def _generate(self) -> int:
        t0 = time.monotonic()
        shard = self.cache.generate(self.corpus, self.gen_teacher, self.tok)
        self._attach_features()
        dt = time.monotonic() - t0
        n = sum(len(r["ids"]) - 1 - r["gen_from"] for r in shard["rows"])
        if hasattr(self, "state"):
            self.state["gen_seconds"] = self.state.get("gen_seconds", 0.0) + dt
        log.info("cache shard %d: the target sampled %d answer tokens in %.0f s (%.1f tok/s); cache %d tokens",
                 shard["index"], n, dt, n / max(dt, 1e-9), self.cache.answer_tokens())
        return n

    # -- checkpoint
    def ckpt_path(self) -> Path:
        return self.ckpt_dir / "state.pt"

    def save(self) -> None:
        atomic_save({"student": trainable_state(self.student), "opt": self.opt.state_dict(),
                     "state": self.state, "config": asdict(self.cfg), "kept_ids": self.kept}, self.ckpt_path())
        log.info("checkpoint: step %d -> %s", self.state["step"], self.ckpt_path())

    def maybe_resume(self) -> bool:
        path = self.ckpt_path()
        if not (self.cfg.resume and path.is_file()):
            return False
        ck = torch.load(path, map_location=self.device, weights_only=False)
        old = ck["config"]
        for key in ("target", "layers", "init_layers", "tiny_hidden", "tiny_layers", "head_vocab", "head_bias", "arch"):
            if old.get(key, TrainDraftConfig.__dataclass_fields__[key].default) != getattr(self.cfg, key) and not (key == "init_layers" and list(old[key]) == list(self.cfg.init_layers)):
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
        if cfg.lr_schedule == "constant":
            return cfg.lr * warm
        cos = 0.5 * (1 + math.cos(math.pi * min(self.progress(), 1.0)))
        return cfg.lr * warm * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)

    # -- one step
    def round(self) -> list[float]:
        """One data batch and the optimizer steps on it (on-policy batches are split into row chunks)."""
        cfg, s = self.cfg, self.state
        if cfg.data == "cache":
            return self.round_cached()
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

    def wants_shard(self) -> bool:
        """Generate when the cache is empty or training has used ``train_per_gen`` x the cached answers."""
        cfg, n = self.cfg, self.cache.answer_tokens()
        if cfg.cache_tokens and n >= cfg.cache_tokens and self.cache.rows:
            return False
        return not self.cache.rows or self.state["tokens"] >= cfg.train_per_gen * n

    def round_cached(self) -> list[float]:
        """Generate a shard when due, else one optimizer step on ``cache_rows`` random cached rows."""
        cfg, s = self.cfg, self.state
        if self.wants_shard():
            self._generate()
            return [s["losses"][-1] if s["losses"] else float("nan")]
        rng = random.Random(cfg.seed * 1_000_003 + s["step"])
        rows = [self.cache.rows[rng.randrange(len(self.cache.rows))] for _ in range(cfg.cache_rows)]
        batch = cache_batch(rows, self.col_of, cfg, self.device)
        for group in self.opt.param_groups:
            group["lr"] = self.lr()
        self.student.eval()
        if cfg.arch == "feature":
            per, alpha = self.feature_loss(batch, feature_targets(rows, self.device))
        else:
            h = self.student.model(input_ids=batch["input_ids"]).last_hidden_state  # (B, L, D)
            per, alpha = filtered_loss(self._head(h[batch["select"]]), batch["cols"], batch["p_f"], cfg.loss,
                                       cfg.gen_top_k, cfg.gen_top_p, cfg.tv_weight)
        w = batch["weight"]
        loss = (per * w).sum() / w.sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.student.parameters() if p.requires_grad], cfg.grad_clip)
        self.opt.step()
        answer = w == 1.0
        n = int(answer.sum())
        for r in rows:
            key = f"cache:{r['source']}"
            s["tokens_by_source"][key] = s["tokens_by_source"].get(key, 0) + len(r["ids"]) - 1 - r["gen_from"]
        s["step"] += 1
        s["onpolicy_steps"] += 1
        s["tokens"] += n
        s["losses"] = (s["losses"] + [loss.item()])[-200:]
        s["train_alpha"] = (s.get("train_alpha", []) + [float(alpha[answer].mean()) if n else float("nan")])[-200:]
        return [loss.item()]

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        head = self.student.lm_head
        return head.compact(h) if hasattr(head, "compact") else head(h)  # (M, N)

    def feature_loss(self, batch: dict, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position loss and depth-1 alpha of a feature draft: the filtered loss at depth 1 (inputs: the
        teacher's features ``f`` (B, L, D) at each parent) and at depths 2..1+unroll (inputs: the draft's own
        outputs of the previous depth, as in a drafted block; gradients flow through them), averaged, plus
        ``feat_weight`` x the smooth-L1 distance of the depth-1 output to the teacher's feature."""
        cfg, sel = self.cfg, batch["select"]
        h = self.student.hidden(batch["input_ids"], shift_features(f))  # (B, L, D)
        per, alpha = filtered_loss(self._head(h[sel]), batch["cols"], batch["p_f"], cfg.loss, cfg.gen_top_k,
                                   cfg.gen_top_p, cfg.tv_weight)
        reg = F.smooth_l1_loss(h[sel], f[sel], reduction="none").mean(-1)  # (M,)
        for _ in range(cfg.unroll):
            h = self.student.hidden(batch["input_ids"], shift_features(h))
            per = per + filtered_loss(self._head(h[sel]), batch["cols"], batch["p_f"], cfg.loss, cfg.gen_top_k,
                                      cfg.gen_top_p, cfg.tv_weight)[0]
        return per / (1 + cfg.unroll) + cfg.feat_weight * reg, alpha

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
            items = self.eval_set["items"]
            if self.cfg.arch == "feature" and any("feat" not in it for it in items):
                for it, f in zip(items, teacher_features(self.teacher, [it["ids"] for it in items])):
                    it["feat"] = f
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
        if cfg.export_only:  # e.g. while a background run keeps training from the same checkpoint
            if not s["evals"] or s["evals"][-1]["step"] != s["step"]:
                self.evaluate()
            return self.finish()
        if not s["evals"]:
            self.evaluate()
        base_seconds = s["seconds"]
        stop = _StopFlag()
        try:
            self._loop(stop, base_seconds)
        finally:
            stop.restore()
        if not s["evals"] or s["evals"][-1]["step"] != s["step"]:
            self.evaluate()
        self.save()
        return self.finish()

    def _loop(self, stop: "_StopFlag", base_seconds: float) -> None:
        cfg, s = self.cfg, self.state
        start, last_ckpt, last_eval = time.monotonic(), time.monotonic(), time.monotonic()
        window_t, window_tok = time.monotonic(), 0
        while self.progress() < 1.0:
            if stop.raised:
                self.save()
                log.info("stopped by signal %s at step %d: checkpoint saved, rerun the same command to resume",
                         stop.raised, s["step"])
                raise SystemExit(0)
            tokens0, step0 = s["tokens"], s["step"]
            loss = self.round()[-1]
            s["seconds"] = base_seconds + time.monotonic() - start
            window_tok += s["tokens"] - tokens0
            if s["step"] // cfg.log_every != step0 // cfg.log_every:
                now = time.monotonic()
                log.info("step %d  loss %.4f (avg20 %.4f)  train alpha %.3f  lr %.2e  tokens %d  %.0f tok/s  "
                         "%.1f/%.1f min", s["step"], loss, _mean(s["losses"][-20:]),
                         _mean(s.get("train_alpha", [])[-20:]), self.lr(), s["tokens"],
                         window_tok / max(now - window_t, 1e-9), s["seconds"] / 60, cfg.max_minutes)
                window_t, window_tok = now, 0
            if time.monotonic() - last_ckpt > 60 * cfg.ckpt_minutes:
                self.save()
                last_ckpt = time.monotonic()
            if cfg.eval_minutes and time.monotonic() - last_eval > 60 * cfg.eval_minutes:
                self.evaluate()
                last_eval = time.monotonic()

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
            "command": "python -m mtad.train.trainer " + " ".join(_overrides(cfg)),
            "alpha_vs_tokens": [{"step": e["step"], "tokens": e["tokens"],
                                 **{d: round(e[d]["alpha"], 4) for d in ("gsm8k", "humaneval", "all") if d in e}}
                                for e in s["evals"]],
            "head_vocab": int(self.kept.numel()) if self.kept is not None else c.vocab_size,
            "cache_answer_tokens": self.cache.answer_tokens() if self.cache is not None else 0,
            "cache_rows": len(self.cache.rows) if self.cache is not None else 0,
            "gen_minutes": s.get("gen_seconds", 0.0) / 60,
            "train_alpha": _mean(s.get("train_alpha", [])[-window:]),
        }
        if self.device.type == "cpu":
            meta["eval_heads"] = self.evaluate_heads()
        for key in ("eval", "eval_init"):
            meta[key] = {k: v for k, v in meta[key].items() if isinstance(v, dict)}
        if cfg.out_dir:
            export(self.student, _resolve(cfg.out_dir), meta)
        return meta

    def evaluate_heads(self) -> dict:
        """Held-out results ('all') of the student with each inference head of ``mtad.models.draft_head`` (CPU)."""
        trained = self.student.lm_head
        emb = self.teacher.get_output_embeddings().weight  # the student's head rows are the target's
        bias = trained.bias.detach() if hasattr(trained, "compact") and trained.bias is not None else None
        out = {}
        try:
            for mode, kept, int8 in (("full", None, False), ("int8", None, True),
                                     ("reduced", self.kept, False), ("reduced_int8", self.kept, True)):
                if mode.startswith("reduced") and kept is None:
                    continue
                b = bias
                if bias is not None and kept is None and self.kept is not None:
                    b = torch.zeros(emb.shape[0], device=bias.device).index_copy_(0, self.kept.to(bias.device), bias)
                self.student.lm_head = DraftHead(emb, None if kept is None else kept.to(emb.device), b, int8=int8)
                out[mode] = evaluate(self.student, self.get_eval_set())
        finally:
            self.student.lm_head = trained
        return out

    def _device_desc(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return f"CPU, {torch.get_num_threads()} thread(s)"


class _StopFlag:
    """SIGTERM / SIGINT set ``raised`` (the loop then checkpoints and exits) instead of killing mid-step."""

    def __init__(self):
        import signal
        import threading

        self.raised, self._old = None, {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._set)

    def _set(self, signum, frame) -> None:
        self.raised = signum

    def restore(self) -> None:
        import signal

        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _overrides(cfg: TrainDraftConfig) -> list[str]:
    """The command-line overrides that differ from the defaults (for the model card's reproduce line), each
    quoted for a POSIX shell and in Hydra's grammar (dict keys unquoted: ``'mix={gsm8k:0.5,code:0.5}'``)."""
    def value_text(v) -> str:
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{value_text(x)}" for k, x in v.items()) + "}"
        return json.dumps(v).replace(" ", "")

    default = TrainDraftConfig()
    out = []
    for key, value in asdict(cfg).items():
        if key in ("ckpt_dir", "data_dir", "resume", "export_only", "out_dir", "cache_dir"):
            continue
        if value != getattr(default, key):
            out.append(shlex.quote(f"{key}={value_text(value)}"))
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

    @hydra.main(config_path="../../conf", config_name="train_draft", version_base="1.3")
    def _run(dcfg) -> None:
        cfg = OmegaConf.to_object(dcfg)
        log.info("train_draft config: %s", asdict(cfg))
        meta = train(cfg)
        log.info("done: %d steps, %d tokens, final loss %.4f, eval %s", meta["steps"], meta["tokens"],
                 meta["final_loss"], json.dumps(meta["eval"].get("all", {})))

    _run()


if __name__ == "__main__":
    main()

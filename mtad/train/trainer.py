"""Distil the embedded target (SmolLM2-135M-Instruct) into a small draft that shares its tokenizer.

Run: ``python -m mtad.train [recipe=<name>] [key=value ...]`` (``conf/train/draft.yaml``; the recipes, under
``conf/train/recipe/``, are the commands that produced the committed drafts: ``feature_cache`` is the default).

The student (``student.py``) is the target's architecture cut to ``layers`` decoder layers, initialised from
target layers ``init_layers`` (or from an exported draft, ``init_from``); the embedding and the tied head are the
target's own, frozen. Two pipelines:

* ``data=cache`` (``onpolicy.py``): the target samples answers to training-split prompts in batches and its
  top-``cache_topk`` log-probs at every position are cached in shards; a step reads random cached rows only
  and learns the *filtered* target distribution (``losses.filtered_loss``: ``ce_filtered``, ``tv_filtered``,
  ``ce_tv``). ``arch=feature`` also caches the target's final hidden states (``losses.feature_loss``).
  ``gen_dtype=bfloat16`` lets a bf16 copy of the target sample and label the shards (on an AVX512-BF16 CPU
  2.4x the fp32 rate; its filtered distribution is within TV 0.02 of fp32's, ``mtad.measure.agreement --other
  bfloat16``) **[choice: the labels are the bf16 teacher's, not re-scored in fp32, which would cost a second
  teacher pass per row]**; the held-out evaluation and the text shards keep the fp32 teacher.
* ``data=live`` (``live.py``, superseded): a teacher pass every step, full-vocabulary forward KL.

No evaluation prompt is in the training data (``corpus.py``); the held-out set (``heldout.py``) is GSM8K test
and HumanEval. Checkpoints (atomic) go to ``ckpt_dir`` and a rerun resumes from them; ``max_minutes`` stops the
run cleanly, evaluates and exports to ``out_dir`` (``export.py``; ``out_dir=`` exports nothing).
"""
from __future__ import annotations

import copy
import logging
import math
import random
import runpy
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch

from mtad._util.paths import cache_dir, default_data_dir, recorded_path
from mtad.models.draft_head import HEAD_FILE, full_bias, read_head_file
from mtad.train.config import TrainDraftConfig, reproduce_command, resolve
from mtad.train.corpus import Corpus
from mtad.train.export import export
from mtad.train.heldout import build_eval_set, evaluate, evaluate_heads, mean
from mtad.train.live import offline_batch, onpolicy_batch, split_rows
from mtad.train.losses import feature_loss, filtered_loss, forward_kl, head_logits
from mtad.train.onpolicy import OnPolicyCache, atomic_save, cache_batch, feature_targets
from mtad.train.student import build_student, head_vocab_ids, init_from_draft, install_train_head, trainable_state
from mtad.train.teacher import load_teacher, teacher_features

log = logging.getLogger(__name__)
PATH_KEYS = ("ckpt_dir", "data_dir", "out_dir", "cache_dir", "resume", "init_from")  # recorded by recorded_path

# what a checkpoint's student shape depends on: resuming with another value is refused
SHAPE_KEYS = ("target", "layers", "init_layers", "tiny_hidden", "tiny_layers", "head_vocab", "head_bias", "arch")


class Trainer:
    """One distillation run: state, step, checkpoint, evaluation, export."""

    def __init__(self, cfg: TrainDraftConfig):
        self.cfg = cfg
        self.device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if cfg.device == "auto" else cfg.device))
        if cfg.threads and self.device.type == "cpu":
            torch.set_num_threads(cfg.threads)
        self.ckpt_dir = resolve(cfg.ckpt_dir) if cfg.ckpt_dir else cache_dir() / "train_draft"
        self.teacher, self.tok = load_teacher(cfg, self.device)
        # the cache's sampler: the teacher, or a bf16 copy (its top-K and features label the shards; the
        # held-out evaluation and text shards keep the fp32 teacher)
        self.gen_teacher = self.teacher if cfg.gen_dtype == "float32" else \
            copy.deepcopy(self.teacher).to(getattr(torch, cfg.gen_dtype))
        self.corpus = Corpus(self.tok, Path(cfg.data_dir) if cfg.data_dir else default_data_dir())
        self.student = build_student(self.teacher, cfg.layers, list(cfg.init_layers), cfg.arch)
        self.init_head = None  # the exported head (kept ids, bias) of init_from, carried into a continued run
        if cfg.init_from:
            init_from_draft(self.student, resolve(cfg.init_from))
            if (resolve(cfg.init_from) / HEAD_FILE).is_file():
                self.init_head = read_head_file(resolve(cfg.init_from))
        self.cache, self.kept, self.col_of = None, None, None
        if cfg.data == "cache":
            self.cache = OnPolicyCache(cfg, resolve(cfg.cache_dir) if cfg.cache_dir else self.ckpt_dir / "onpolicy")
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
        for key in SHAPE_KEYS:
            was, now = old.get(key, TrainDraftConfig.__dataclass_fields__[key].default), getattr(self.cfg, key)
            if key == "init_layers":
                was, now = list(was), list(now)  # a list config value may come back as a ListConfig
            if was != now:
                raise ValueError(f"checkpoint {path} was trained with {key}={old.get(key)!r}, not "
                                 f"{now!r}: delete it or set train_draft.resume=false")
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
            per, alpha = feature_loss(self.student, batch, feature_targets(rows, self.device), cfg)
        else:
            h = self.student.model(input_ids=batch["input_ids"]).last_hidden_state  # (B, L, D)
            z = head_logits(self.student, h[batch["select"]])  # (M, N)
            per, alpha = filtered_loss(z, batch["cols"], batch["p_f"], cfg.loss, cfg.gen_top_k, cfg.gen_top_p,
                                       cfg.tv_weight)
        w = batch["weight"]
        loss = (per * w).sum() / w.sum()
        self._descend(loss)
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

    def optimize(self, batch: dict, used: list[str], kind: str) -> float:
        s = self.state
        self.student.eval()  # these models have no dropout; eval mode keeps inference numerics
        for group in self.opt.param_groups:
            group["lr"] = self.lr()
        loss = forward_kl(self.student, **batch)
        self._descend(loss)
        for src, n in zip(used, batch["select"].sum(1).tolist()):
            key = f"{kind}:{src}"
            s["tokens_by_source"][key] = s["tokens_by_source"].get(key, 0) + int(n)
        s["step"] += 1
        s["tokens"] += int(batch["select"].sum())
        s["losses"] = (s["losses"] + [loss.item()])[-200:]
        return loss.item()

    def _descend(self, loss: torch.Tensor) -> None:
        """One optimizer step on ``loss`` (gradients clipped to ``grad_clip``)."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.student.parameters() if p.requires_grad], self.cfg.grad_clip)
        self.opt.step()

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
                 "  ".join(f"{d}: top1 {r['top1']:.3f} alpha {r['alpha']:.3f} kl {r['kl']:.3f}"
                           for d, r in result.items()))
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
                         "%.1f/%.1f min", s["step"], loss, mean(s["losses"][-20:]),
                         mean(s.get("train_alpha", [])[-20:]), self.lr(), s["tokens"],
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
            "config": {k: recorded_path(v) if k in PATH_KEYS and isinstance(v, str) else v  # no machine path
                       for k, v in asdict(cfg).items()},
            "steps": s["step"], "onpolicy_steps": s["onpolicy_steps"], "tokens": s["tokens"],
            "tokens_by_source": s["tokens_by_source"], "train_minutes": s["seconds"] / 60,
            "final_loss": mean(s["losses"][-window:]), "loss_window": window,
            "eval": s["evals"][-1] if s["evals"] else {}, "eval_init": s["evals"][0] if s["evals"] else {},
            "layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "vocab": c.vocab_size, "own_params": own,
            "shared_params": self.student.get_input_embeddings().weight.numel(),
            "tied_embedding_from": "smollm2-135m-instruct" if cfg.target == "smollm2" else "tiny",
            "file_mb": own * 2 / 2**20, "device_desc": self._device_desc(),
            "command": reproduce_command(cfg),
            "alpha_vs_tokens": [{"step": e["step"], "tokens": e["tokens"],
                                 **{d: round(e[d]["alpha"], 4) for d in ("gsm8k", "humaneval", "all") if d in e}}
                                for e in s["evals"]],
            "head_vocab": int(self.kept.numel()) if self.kept is not None else c.vocab_size,
            "cache_answer_tokens": self.cache.answer_tokens() if self.cache is not None else 0,
            "cache_rows": len(self.cache.rows) if self.cache is not None else 0,
            "gen_minutes": s.get("gen_seconds", 0.0) / 60,
            "train_alpha": mean(s.get("train_alpha", [])[-window:]),
        }
        if self.device.type == "cpu":
            meta["eval_heads"] = evaluate_heads(self.student, self.teacher.get_output_embeddings().weight, self.kept,
                                                self.get_eval_set())
        for key in ("eval", "eval_init"):
            meta[key] = {k: v for k, v in meta[key].items() if isinstance(v, dict)}
        if cfg.out_dir:
            export(self.student, resolve(cfg.out_dir), meta)
        return meta

    def _device_desc(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return f"CPU, {torch.get_num_threads()} thread(s)"


class _StopFlag:
    """SIGTERM / SIGINT set ``raised`` (the loop then checkpoints and exits) instead of killing mid-step."""

    def __init__(self):
        self.raised, self._old = None, {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._set)

    def _set(self, signum, frame) -> None:
        self.raised = signum

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def train(cfg: TrainDraftConfig) -> dict:
    """Train (resuming when a checkpoint exists), evaluate and export; returns the export metadata."""
    return Trainer(cfg).run()


if __name__ == "__main__":  # the entry point's old name: run `python -m mtad.train` (Hydra needs its file)
    runpy.run_module("mtad.train", run_name="__main__", alter_sys=True)

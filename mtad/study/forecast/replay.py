"""Hardware-free acceptance: a decoder's own drafting and verification replayed on recorded prompts, no timing.

Each prompt of a :class:`Workload` is decoded by the real decoder (:func:`mtad.decoding.generate`: beams for
MTAD and MMTAD, token trees for SpecInfer, chains for speculative decoding) from the seed ``seed + i`` of prompt
``i``, the same for every decoder (common random numbers), and one record is kept per prompt:

    id, prompt_tokens, n_tokens, steps, hist {L: steps committing L tokens}, calls {forward shape: count},
    mean_logprob (the output under the raw target: perplexity), output_ids (distinct-2)

Nothing here depends on the machine: the records are what a decode *does*, and a cost profile says what that
costs (:mod:`.predict`). Records are cached per (pair, setting, prompts, seeds, tokens) under
``<store>/<pair>/`` (:func:`cached`), so a setting is replayed once and every later forecast reads it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from mtad._util.io import atomic_write
from mtad._util.paths import REPO_ROOT
from mtad.decoding import generate
from mtad.harness.sweep import compose_job
from mtad.measure.metrics import sequence_logprobs
from mtad.models.load import ModelConfig, load_pair
from mtad.study.forecast.spec import Spec
from mtad.tasks.base import TaskConfig, get_task

log = logging.getLogger("mtad.study.forecast")
STORE = REPO_ROOT / "results" / "forecast" / "acceptance"
VERSION = 1  # bump when a record's meaning changes: older cache files are then not read


@dataclass(frozen=True)
class Workload:
    """Which prompts a replay decodes: ``count`` prompts of ``task``'s ``split`` from index ``offset``, each
    to ``tokens`` new tokens, prompt ``i`` from seed ``seed + i``; on the pair that ``pair`` (Hydra
    ``model=`` overrides) composes."""

    pair: tuple[str, ...]
    task: str = "gsm8k"
    split: str = "train"
    offset: int = 0
    count: int = 20
    tokens: int = 48
    seed: int = 0

    def label(self) -> str:
        return f"{self.task} {self.split} [{self.offset}, {self.offset + self.count}), {self.tokens} tokens"


def compose(pair: tuple[str, ...], task: str = "gsm8k"):
    """The composed run config of a pair's overrides on a task (a misspelt option: one-line ValueError)."""
    return compose_job([*pair, f"task={task}", "task.few_shot=0", "num_threads=1"])


def model_config(pair: tuple[str, ...]) -> ModelConfig:
    return ModelConfig.from_any(OmegaConf.to_container(compose(pair), resolve=True)["model"])


def pair_identity(mcfg: ModelConfig) -> dict:
    """What makes two pairs decode alike (the device and the label aside)."""
    d = asdict(mcfg)
    return {k: d[k] for k in sorted(d) if k not in ("device", "gpus")}


def prompts(w: Workload, tokenizer, mcfg: ModelConfig) -> list[tuple[str, list[int]]]:
    """``(id, prompt ids)`` of the workload's prompts, rendered as the runs render them."""
    cfg = OmegaConf.to_container(compose(w.pair, w.task), resolve=True)["task"]
    cfg.update(split=w.split, n_prompts=w.offset + w.count, few_shot=0)
    task = get_task(TaskConfig.from_any(cfg))
    samples = task.samples()[w.offset:w.offset + w.count]
    if len(samples) < w.count:
        raise ValueError(f"{w.task} {w.split} has {len(samples) + w.offset} prompts: fewer than offset + count "
                         f"= {w.offset + w.count}; lower --prompts or --offset")
    return [(str(s.id), task.encode(s, tokenizer, 0, (), mcfg.chat_template).ids) for s in samples]


def key_of(mcfg: ModelConfig, spec: Spec, w: Workload, ids: list[list[int]]) -> dict:
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    return {"version": VERSION, "pair": pair_identity(mcfg), "decoder": str(spec), "task": w.task,
            "split": w.split, "offset": w.offset, "count": w.count, "tokens": w.tokens, "seed": w.seed,
            "prompts_sha": digest}


def path_of(store: Path, key: dict) -> Path:
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    slug = re.sub(r"[^a-z0-9]+", "-", key["decoder"].lower()).strip("-")
    return Path(store) / key["pair"]["name"] / f"{slug}-{key['task']}-{h}.json"


def record(pair, prompt_id: str, ids: list[int], result) -> dict:
    """One prompt's hardware-free record (module docstring)."""
    steps = len(result.accepted) if result.accepted else result.num_tokens
    hist = Counter(a + 1 for a in result.accepted) if result.accepted else Counter({1: result.num_tokens})
    with torch.inference_mode():
        lp = sequence_logprobs(pair.target, ids, result.tokens) if result.tokens else None
    return {"id": prompt_id, "prompt_tokens": len(ids), "n_tokens": result.num_tokens, "steps": steps,
            "hist": {str(k): v for k, v in sorted(hist.items())}, "calls": dict(sorted(result.calls.items())),
            "mean_logprob": float(lp.mean()) if lp is not None and len(lp) else None,
            "output_ids": list(result.tokens)}


def replay(pair, items: list[tuple[str, list[int]]], spec: Spec, w: Workload) -> list[dict]:
    """Decode every prompt with ``spec`` (seed ``w.seed + i``) and return the records."""
    cfg = spec.decoder(w.tokens)
    out = []
    with torch.inference_mode():
        for i, (pid, ids) in enumerate(items):
            res = generate(pair, ids, cfg, torch.Generator().manual_seed(w.seed + i))
            out.append(record(pair, pid, ids, res))
    return out


def load_cached(path: Path, key: dict) -> list[dict] | None:
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
    except ValueError:
        raise ValueError(f"{path}: not a replay file (unreadable JSON); move it away to replay again") from None
    return d["records"] if d.get("key") == key else None


def cached(pair, mcfg: ModelConfig, items, spec: Spec, w: Workload, store: Path = STORE) -> tuple[list[dict], Path]:
    """The records of ``spec`` on the workload: from the store when replayed before, else replayed now and
    stored (atomically)."""
    key = key_of(mcfg, spec, w, [ids for _, ids in items])
    path = path_of(store, key)
    recs = load_cached(path, key)
    if recs is None:
        log.info("replaying %s on %s (%s)", spec, mcfg.name, w.label())
        recs = replay(pair, items, spec, w)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"key": key, "records": recs}, separators=(",", ":")) + "\n")
    return recs, path


class Replayer:
    """One loaded pair and workload, replaying (or reading) any number of settings."""

    def __init__(self, w: Workload, store: Path = STORE):
        self.w, self.store = w, Path(store)
        self.mcfg = model_config(w.pair)
        self._pair = None
        self._items = None

    @property
    def pair(self):
        if self._pair is None:
            torch.set_num_threads(1)
            self._pair = load_pair(self.mcfg)
        return self._pair

    @property
    def items(self):
        if self._items is None:
            self._items = prompts(self.w, self.pair.tokenizer, self.mcfg)
        return self._items

    def records(self, spec: Spec) -> list[dict]:
        return cached(self.pair, self.mcfg, self.items, spec, self.w, self.store)[0]

"""Cached on-policy teacher data (``data=cache``): shards of the target's own answers with its top-K log-probs,
written once and read for several epochs, so a training step needs no teacher pass.

Cache format (``cache_dir``, default ``<ckpt_dir>/onpolicy``; format CACHE_FORMAT): one file per shard,
``shard-00000.pt`` ... written atomically (torch.save of a dict), shard i generated with seed
``data_seed * 1_000_003 + 7919 * (i + 1)`` (``data_seed``: ``seed`` unless set; so a resumed run regenerates
nothing and a lost shard regenerates the same text), plus ``meta.json`` (the generation settings; a
mismatching cache is refused). A shard:
  {"format": 1, "index": i, "rows": [{"source": str, "ids": int32 (L,) prompt + answer (up to its EOS),
    "gen_from": int P - 1 (first position whose next token is an answer token),
    "topk_ids": int32 (L - 1, K), "topk_logp": float16 (L - 1, K)}, ...]}
where row t of topk_* is the teacher's top-K raw (T = 1) log-softmax at position t, i.e. its distribution
of token t + 1, sorted descending. The verification filter (top-k <= K, then top-p) is computed exactly from
these K values, so several epochs on the cache cost no teacher pass. A feature draft's shard i also has
``feat-shard-0000i.pt`` beside it: {"format": 1, "stem", "feats": [float16 (L, D) per row]}, the teacher's
final hidden state at every position, read off the generating passes (``sample_topk(features=True)``).
"""
from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Optional

import torch

from mtad._util.io import atomic_write
from mtad.train.config import TrainDraftConfig
from mtad.train.corpus import Corpus
from mtad.train.losses import filtered_targets
from mtad.train.teacher import sample_topk, teacher_features, teacher_topk

log = logging.getLogger(__name__)

CACHE_FORMAT = 1


def atomic_save(obj, path: Path) -> None:
    """torch.save to a temp file beside ``path``, then rename over it (a crash leaves the old file)."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def data_seed(cfg: TrainDraftConfig) -> int:
    return cfg.seed if cfg.data_seed < 0 else cfg.data_seed


def shard_seed(cfg: TrainDraftConfig, index: int) -> int:
    return data_seed(cfg) * 1_000_003 + 7919 * (index + 1)


def cache_meta(cfg: TrainDraftConfig) -> dict:
    """The generation settings a cache was made with (``meta.json``): a cache of other settings is refused."""
    extra = {} if cfg.gen_dtype == "float32" else {"gen_dtype": cfg.gen_dtype}  # older caches stay valid
    return extra | {
        "format": CACHE_FORMAT, "target": cfg.target, "gen_top_k": cfg.gen_top_k, "gen_top_p": cfg.gen_top_p,
        "gen_tokens": cfg.gen_tokens, "gen_prompt_len": cfg.gen_prompt_len, "gen_batch": cfg.gen_batch,
        "cache_topk": cfg.cache_topk, "onpolicy_mix": dict(sorted(cfg.onpolicy_mix.items())), "seed": data_seed(cfg),
        "tiny": [cfg.tiny_hidden, cfg.tiny_layers] if cfg.target == "tiny" else None}


class OnPolicyCache:
    """Shards of the teacher's own answers with its top-K log-probs (format above); loaded into memory."""

    def __init__(self, cfg: TrainDraftConfig, directory: Path):
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
                shard = _check_format(torch.load(self.shard_path(i), weights_only=False), self.shard_path(i))
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
        kept = [dict(r, source=s) for r, s in zip(rows, used, strict=True)]  # every row samples >= 1 token
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
        _check_format(shard, f"text shard {shard.get('index')}")
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
        shard = {"format": CACHE_FORMAT, "index": i,
                 "rows": [dict(r, source=f"text:{src}") for r, src in zip(rows, used)],
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
                lengths = [len(f) for f in saved["feats"]]
                if saved.get("format") == CACHE_FORMAT and lengths == [len(r["ids"]) for r in rows]:
                    feats = saved["feats"]
            if feats is None:
                t0 = time.monotonic()
                feats = teacher_features(teacher, [r["ids"] for r in rows])
                atomic_save({"format": CACHE_FORMAT, "stem": stem, "feats": feats}, path)
                log.info("cache %s: teacher features for %d rows in %.0f s", stem, len(rows), time.monotonic() - t0)
            for r, f in zip(rows, feats):
                r["feat"] = f


def _check_format(shard: dict, what) -> dict:
    if shard.get("format") != CACHE_FORMAT:
        raise ValueError(f"{what} has cache format {shard.get('format')}, not {CACHE_FORMAT}")
    return shard


def feature_targets(rows: list[dict], device) -> torch.Tensor:
    """(B, L, D) the teacher features aligned with ``cache_batch``'s inputs (row t: the feature at t)."""
    L = max(len(r["ids"]) for r in rows) - 1
    f = torch.zeros(len(rows), L, rows[0]["feat"].shape[-1])
    for b, r in enumerate(rows):
        f[b, :len(r["ids"]) - 1] = r["feat"][:-1].float()
    return f.to(device)


def cache_batch(rows: list[dict], col_of: Optional[torch.Tensor], cfg: TrainDraftConfig, device) -> dict:
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

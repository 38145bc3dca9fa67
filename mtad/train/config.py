"""The trainer's configuration: one flat frozen dataclass (its keys are the CLI), the recipes under
``conf/train/recipe/`` and the one-line command that reproduces a run.

A recipe is a preset of these keys (``python -m mtad.train recipe=token_cache``); ``conf/train/draft.yaml``
picks the default one. ``recipe_config`` composes a recipe the way Hydra does (the dataclass defaults, then the
recipe's keys), so ``reproduce_command`` can print only what a run changed on top of its recipe.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from omegaconf import OmegaConf

from mtad._util.paths import REPO_ROOT

CONF_DIR = REPO_ROOT / "conf" / "train"  # Hydra reads it as config_path="../../conf/train" from mtad/train/
LOSSES = ("kl", "ce_filtered", "tv_filtered", "ce_tv")
TEXT_SOURCES = ("gsm8k", "python", "alpaca", "wikitext")
PROMPT_SOURCES = ("gsm8k", "code", "alpaca")
# keys that name places, not the recipe: left out of the reproduce command
LOCAL_KEYS = ("ckpt_dir", "data_dir", "resume", "export_only", "out_dir", "cache_dir", "recipe")


@dataclass(frozen=True)
class TrainDraftConfig:
    recipe: str = "live"  # the preset these values start from (set by conf/train/recipe/<name>.yaml)
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
    # --- cached on-policy pipeline (data=cache, mtad.train.onpolicy)
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
        for check in (_check_choices, _check_pipeline, _check_ranges, _check_mixes):
            check(self)


def _allowed(cfg: TrainDraftConfig, key: str, options: tuple) -> None:
    if getattr(cfg, key) not in options:
        raise ValueError(f"train_draft.{key}={getattr(cfg, key)!r}: allowed {' or '.join(map(repr, options))}")


def _check_choices(cfg: TrainDraftConfig) -> None:
    _allowed(cfg, "target", ("smollm2", "tiny"))
    _allowed(cfg, "device", ("auto", "cpu", "cuda"))
    _allowed(cfg, "lr_schedule", ("cosine", "constant"))
    _allowed(cfg, "gen_dtype", ("float32", "bfloat16"))
    _allowed(cfg, "arch", ("token", "feature"))
    _allowed(cfg, "data", ("live", "cache"))
    if cfg.loss not in LOSSES:
        raise ValueError(f"train_draft.loss={cfg.loss!r}: allowed {LOSSES}")
    if len(cfg.init_layers) != cfg.layers:
        raise ValueError(f"train_draft.init_layers={list(cfg.init_layers)} must name one target layer "
                         f"per student layer (layers={cfg.layers})")


def _check_pipeline(cfg: TrainDraftConfig) -> None:
    """Keys that only the cached pipeline (data=cache) reads, and the loss each pipeline can take."""
    if cfg.gen_dtype != "float32" and cfg.data != "cache":
        raise ValueError("train_draft.gen_dtype=bfloat16 needs data=cache (it is the cache's generating teacher)")
    if cfg.arch == "feature" and cfg.data != "cache":
        raise ValueError("train_draft.arch=feature needs data=cache (features are cached beside the shards)")
    if cfg.data == "cache" and cfg.loss == "kl":
        raise ValueError("train_draft.loss=kl needs the full teacher distribution: with data=cache use "
                         "ce_filtered, tv_filtered or ce_tv")
    if cfg.data == "live" and (cfg.head_vocab or cfg.head_bias or cfg.loss != "kl"):
        raise ValueError("train_draft.head_vocab/head_bias/loss other than kl need data=cache")
    if cfg.text_shards and cfg.data != "cache":
        raise ValueError("train_draft.text_shards needs data=cache")


def _check_ranges(cfg: TrainDraftConfig) -> None:
    if cfg.unroll < 0 or cfg.feat_weight < 0:
        raise ValueError("train_draft.unroll >= 0 and feat_weight >= 0 are required")
    if cfg.cache_topk < cfg.gen_top_k:
        raise ValueError(f"train_draft.cache_topk={cfg.cache_topk} must be >= gen_top_k={cfg.gen_top_k}")
    if cfg.head_vocab < 0 or cfg.cache_rows < 1 or cfg.train_per_gen < 0:
        raise ValueError("train_draft.head_vocab >= 0, cache_rows >= 1 and train_per_gen >= 0 are required")
    if not 0.0 <= cfg.onpolicy_frac <= 1.0:
        raise ValueError(f"train_draft.onpolicy_frac={cfg.onpolicy_frac}: allowed 0 <= x <= 1")


def _check_mixes(cfg: TrainDraftConfig) -> None:
    for name, known in (("mix", TEXT_SOURCES), ("onpolicy_mix", PROMPT_SOURCES), ("text_mix", TEXT_SOURCES)):
        mix = getattr(cfg, name)
        bad = sorted(set(mix) - set(known))
        if bad or not any(w > 0 for w in mix.values()):
            raise ValueError(f"train_draft.{name}={dict(mix)}: keys must be among {known} "
                             "with at least one positive weight")


def schema():
    """The dataclass as a writable OmegaConf node (a frozen dataclass gives a read-only one YAML cannot fill)."""
    node = OmegaConf.structured(TrainDraftConfig)
    OmegaConf.set_readonly(node, False)
    return node


def register() -> None:
    """Store the schema as ``train_draft_schema``, the first entry of ``conf/train/draft.yaml``'s defaults."""
    from hydra.core.config_store import ConfigStore  # hydra: only the CLI and the config tests need it

    ConfigStore.instance().store(name="train_draft_schema", node=schema())


def recipes() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml"))


def recipe_config(name: str) -> TrainDraftConfig:
    """The config ``python -m mtad.train recipe=<name>`` composes with no other override."""
    path = CONF_DIR / "recipe" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"train_draft.recipe={name!r}: no {path} (recipes: {recipes()})")
    return OmegaConf.to_object(OmegaConf.merge(schema(), OmegaConf.load(path)))


def reproduce_command(cfg: TrainDraftConfig) -> str:
    """``python -m mtad.train recipe=<recipe> k=v ...``: the keys that differ from the recipe, each quoted for a
    POSIX shell and in Hydra's grammar (dict keys unquoted: ``'mix={gsm8k:0.5,code:0.5}'``)."""
    base = recipe_config(cfg.recipe)
    changed = [shlex.quote(f"{key}={_hydra_value(value)}") for key, value in asdict(cfg).items()
               if key not in LOCAL_KEYS and value != getattr(base, key)]
    return " ".join(["python -m mtad.train", f"recipe={cfg.recipe}", *changed])


def _hydra_value(v) -> str:
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v).replace(" ", "")


def resolve(path: str) -> Path:
    """A config path: absolute, or relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p

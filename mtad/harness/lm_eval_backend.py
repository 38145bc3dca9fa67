"""lm-eval backend: ``--model mtad`` answers generate-until tasks with any mtad decoder.

One small :class:`~lm_eval.models.huggingface.HFLM` subclass, registered as ``mtad``, that overrides only
generation (STYLE.md). What goes where:

- ``generate_until`` requests (GSM8K, HumanEval, ...) are decoded one prompt at a time (decoders are
  batch-1) by :func:`mtad.generate` with the decoder named in ``model_args``; the text is cut at the first
  ``until`` string, as HFLM does.
- ``loglikelihood`` / ``loglikelihood_rolling`` requests (multiple-choice tasks, perplexity tasks) are
  HFLM's own code on the **target** model, unchanged: there is nothing to decode, so no decoder and no
  draft takes part.

``model_args``::

    pair=tiny | pair=smollm2          a conf/model/<name>.yaml, loaded by mtad.models.load.load_pair
    target=<hub id/path>[,draft=...]  or the two models named directly
    decoder=mtad                      a conf/decoder/<name>.yaml preset, else a registered decoder name
    gamma=4,tau=0.5,temperature=1,... any DecoderConfig field (overrides the preset)
    seed=0                            request i of a generate_until call samples with seed + i
    max_gen_toks=256                  default length when a task gives none
    dtype=..., plus HFLM options that make sense for a loaded model (max_length, add_bos_token, ...)

A task's ``gen_kwargs`` decide the temperature when they state one: ``do_sample=False`` or
``temperature=0`` give T=0 (every decoder then reproduces greedy); ``temperature>0`` replaces the decoder's
T; ``top_k``/``top_p`` replace the decoder's filter. Other generation keys (``num_beams``, ...) have no
meaning for these decoders and are ignored with a warning. The decode always runs to ``max_gen_toks`` or
EOS; ``until`` strings only cut the text afterwards, so decode statistics count every generated token.

lm-eval does not import plugins by itself, so the ``lm_eval`` command does not know ``--model mtad`` until
this module is imported. Use ``python -m mtad.harness.lm_eval_backend <lm_eval arguments>`` (same arguments as
``lm_eval``), or ``import mtad.harness.lm_eval_backend`` before ``lm_eval.simple_evaluate(model="mtad", ...)``.
See docs/LM_EVAL.md.
"""
from __future__ import annotations

from mtad.models.load import ModelConfig, load_pair

if __name__ == "__main__":
    # `python -m mtad.harness.lm_eval_backend`: run the importable module's main(), so the model class is registered
    # once, under its real module name (a second class registered as "mtad" would be refused by lm-eval).
    from mtad.harness.lm_eval_backend import main

    raise SystemExit(main())

import logging
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

# lm_eval.models must be imported before anything is registered: lm-eval fills its registry with its own
# models only when the registry is still empty, so an early registration would hide "hf" and the rest.
import lm_eval.models  # noqa: F401
import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from mtad._util.paths import REPO_ROOT
from mtad.decoding import DECODERS, DecoderConfig, DecodeResult, generate
from mtad.decoding.core import needs_draft
from mtad.measure.metrics import run_metrics
from mtad.models.pair import ModelPair

log = logging.getLogger(__name__)

CONF_DIR = REPO_ROOT / "conf"
DECODER_KEYS = {f.name for f in fields(DecoderConfig)} - {"name", "max_new_tokens"}
# HFLM arguments that still mean something once the model is already loaded (the rest configure loading).
HFLM_KEYS = {"backend", "truncation", "logits_cache", "max_length", "softmax_dtype", "mixed_precision_dtype",
             "max_batch_size", "add_bos_token", "prefix_token_id", "think_end_token", "enable_thinking",
             "chat_template_args"}
# ModelConfig fields settable from model_args besides pair/device/dtype (``seed`` is the sampling seed here).
MODEL_KEYS = {"target", "draft", "draft_dtype", "device_map", "attn_implementation", "tiny_arch"}
SAMPLING_KEYS = {"until", "do_sample", "temperature", "top_k", "top_p", "max_gen_toks", "max_new_tokens",
                 "max_tokens", "max_completion_tokens"}


@register_model("mtad")
class MTADLM(HFLM):
    """HFLM whose ``generate_until`` is an mtad decoder; likelihoods stay HFLM's, on the target.

    After a run, :meth:`decode_stats` aggregates the decodes (block efficiency, acceptance rate, ms/token;
    ALGORITHMS.md METRICS) and :attr:`decode_results` holds one :class:`DecodeResult` per request.
    """

    def __init__(self, pair: str | None = None, decoder: str = "greedy", seed: int = 0, max_gen_toks: int = 256,
                 device: str | None = None, dtype: str | None = None, batch_size: int | str = 1,
                 **kwargs: Any) -> None:
        decoder_over = {k: kwargs.pop(k) for k in list(kwargs) if k in DECODER_KEYS}
        model_over = {k: kwargs.pop(k) for k in list(kwargs) if k in MODEL_KEYS}
        _check_keys(kwargs)
        if int(max_gen_toks) < 1:
            raise ValueError(f"max_gen_toks={max_gen_toks} must be >= 1")
        self.decoder_cfg = decoder_config(decoder, max_new_tokens=int(max_gen_toks), **decoder_over)
        self.models = load_models(pair=pair, device=device, dtype=dtype, **model_over)
        if needs_draft(self.decoder_cfg) and self.models.draft is None:
            raise ValueError(f"decoder={self.decoder_cfg.name} needs a draft model but pair {self.models.name!r} "
                             "has none: give draft=<hub id or path> or a pair with a draft")
        super().__init__(pretrained=self.models.target, tokenizer=self.models.tokenizer, batch_size=batch_size,
                         **kwargs)
        self.seed = int(seed)
        self.decode_results: list[DecodeResult] = []
        self._warned: set[str] = set()
        log.info("mtad backend: pair %s, decoder %s", self.models.name, self.decoder_cfg)

    @property
    def max_gen_toks(self) -> int:
        return self.decoder_cfg.max_new_tokens

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode every request alone with the configured decoder; cut each text at its ``until`` strings."""
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        out = []
        for i, req in enumerate(tqdm(requests, disable=disable_tqdm or self.rank != 0,
                                     desc=f"{self.decoder_cfg.name} generate_until")):
            context, gen_kwargs = req.args
            text = self._generate_one(context, gen_kwargs, eos, self.seed + i)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        stats = self.decode_stats()
        log.info("mtad decode stats (%s, %d requests): block efficiency %s, acceptance rate %s, %s ms/token",
                 self.decoder_cfg.name, stats["n_samples"], _fmt(stats["block_efficiency"]),
                 _fmt(stats["acceptance_rate"]), _fmt(stats["ms_per_token"]))
        return out

    def _generate_one(self, context: str, gen_kwargs: dict, eos: str, seed: int) -> str:
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        cfg = self.request_config(gen_kwargs, kwargs.pop("max_gen_toks"))
        if cfg.max_new_tokens >= self.max_length:
            raise ValueError(f"max_gen_toks={cfg.max_new_tokens} leaves no room for a prompt in the target's "
                             f"{self.max_length}-token context: lower max_gen_toks")
        ids, _ = self.tok_batch_encode([context], left_truncate_len=self.max_length - cfg.max_new_tokens,
                                       truncation=self.truncation)  # (1, T), HFLM's own encoding
        rng = torch.Generator(device=self.models.device).manual_seed(seed)
        result = generate(self.models, ids[0].tolist(), cfg, rng)
        self.decode_results.append(result)
        tokens = result.tokens
        if isinstance(self.think_end_token, int) and self.think_end_token in tokens:
            tokens = tokens[len(tokens) - tokens[::-1].index(self.think_end_token):]
        text = self.tok_decode(tokens)
        think = self.think_end_token if isinstance(self.think_end_token, str) else None
        return postprocess_generated_text(text, until, think)

    def request_config(self, gen_kwargs: dict | None, max_new_tokens: int) -> DecoderConfig:
        """The decoder config for one request: the model_args config, updated by the task's gen_kwargs."""
        raw = dict(gen_kwargs or {})
        ignored = sorted(set(raw) - SAMPLING_KEYS - self._warned)
        if ignored:
            log.warning("mtad backend ignores gen_kwargs %s (no meaning for mtad decoders)", ignored)
            self._warned.update(ignored)
        over: dict[str, Any] = {"max_new_tokens": int(max_new_tokens)}
        temp = raw.get("temperature")
        if raw.get("do_sample") is False or (temp is not None and float(temp) == 0.0):
            over["temperature"] = 0.0
        elif temp is not None:
            over["temperature"] = float(temp)
        for key in ("top_k", "top_p"):
            if raw.get(key) is not None:
                over[key] = type(getattr(self.decoder_cfg, key))(raw[key])
        return DecoderConfig.from_any(self.decoder_cfg, **over)

    def decode_stats(self) -> dict:
        """Aggregate of every decode so far (ratios of sums, :func:`mtad.measure.metrics.run_metrics`)."""
        stats = run_metrics(self.decode_results)
        stats["decoder"] = self.decoder_cfg.name
        return stats

    def get_model_info(self) -> dict:
        """Run facts for lm-eval's ``results["config"]``, without asking the hub (the models may be local)."""
        return {"model_num_parameters": sum(p.numel() for p in self.models.target.parameters()),
                "model_dtype": str(next(self.models.target.parameters()).dtype),
                "mtad_pair": self.models.name, "mtad_pair_info": dict(self.models.info),
                "mtad_decoder": asdict(self.decoder_cfg), "mtad_seed": self.seed,
                "mtad_decode_stats": self.decode_stats()}


def decoder_config(name: str, **overrides: Any) -> DecoderConfig:
    """``conf/decoder/<name>.yaml`` (with its ``defaults`` chain) if it exists, else ``DecoderConfig(name=...)``
    for a registered decoder; ``overrides`` win. A bad name or key is a ValueError naming the choices."""
    path = CONF_DIR / "decoder" / f"{name}.yaml"
    if path.is_file():
        base = _load_preset(path)
    elif name in DECODERS:
        base = {"name": name}
    else:
        presets = sorted(p.stem for p in (CONF_DIR / "decoder").glob("*.yaml"))
        raise ValueError(f"decoder={name!r} is unknown: use a preset {presets} or a decoder {sorted(DECODERS)}")
    base.pop("max_new_tokens", None)  # the length is max_gen_toks: the task's, else model_args'
    if "k_config" in overrides and isinstance(overrides["k_config"], str):  # "4-2-2": commas split model_args
        overrides["k_config"] = [int(k) for k in overrides["k_config"].split("-")]
    return DecoderConfig.from_any(base, **overrides)


def _load_preset(path: Path) -> dict:
    """A ``conf/<group>/<name>.yaml`` as a dict, its Hydra ``defaults`` (sibling files, ``_self_``) merged in
    order."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    merged: dict = {}
    own = {k: v for k, v in node.items() if k != "defaults"}
    for entry in node.get("defaults", ["_self_"]):
        if isinstance(entry, str) and "@" in entry:  # placed in another package (model=tiny's task settings)
            continue
        merged.update(own if entry == "_self_" else _load_preset(path.parent / f"{entry}.yaml"))
    if "_self_" not in node.get("defaults", ["_self_"]):
        merged.update(own)
    return merged


def load_models(pair: str | None = None, device: str | None = None, dtype: str | None = None,
                **model_over: Any) -> ModelPair:
    """The target/draft pair through :func:`mtad.models.load.load_pair`.

    ``pair`` names ``conf/model/<pair>.yaml``; without it ``target`` (and ``draft``) are hub ids or local
    directories (``kind: hf``). ``model_over`` are further ModelConfig fields (``draft=null`` drops the
    draft). ``device`` is lm-eval's (``cuda:0`` is the CLI default): CUDA when asked and present, else the
    CPU with a warning, as HFLM does. ``dtype="auto"`` keeps the YAML's dtype.
    """
    if pair:
        path = CONF_DIR / "model" / f"{pair}.yaml"
        if not path.is_file():
            names = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
            raise FileNotFoundError(f"pair={pair!r}: no {path.relative_to(REPO_ROOT)}; choose one of {names} "
                                    "or give target=<hub id or path>")
        base = _load_preset(path)
    elif model_over.get("target"):
        base = {"name": str(model_over["target"]).rstrip("/").split("/")[-1], "kind": "hf"}
    else:
        raise ValueError("model_args needs pair=<conf/model name, e.g. tiny> or target=<hub id or path>")
    if device:
        base["device"] = _device(device)
    if dtype and dtype != "auto":
        base["dtype"] = str(dtype).removeprefix("torch.")
    models = load_pair(ModelConfig.from_any(base, **model_over))
    if "draft" in model_over and model_over["draft"] is None:
        models.draft = None  # draft=none: target only, for every kind (the tiny kind always builds one)
    return models


def _device(device: str) -> str:
    """lm-eval's device string as a ModelConfig device (auto | cpu | cuda)."""
    device = str(device)
    if device in ("auto", "cpu"):
        return device
    if device in ("cuda", "cuda:0"):
        if torch.cuda.is_available():
            return "cuda"
        log.warning("device=%s requested but CUDA is not available: using the CPU", device)
        return "cpu"
    raise ValueError(f"device={device!r} is not supported by the mtad backend: use cpu, cuda, cuda:0 or auto "
                     "(pick a GPU with CUDA_VISIBLE_DEVICES; shard a big target with device_map=auto)")


def _check_keys(kwargs: dict) -> None:
    unknown = sorted(set(kwargs) - HFLM_KEYS)
    if unknown:
        raise ValueError(f"unknown mtad model_args {unknown}: valid keys are pair, decoder, seed, max_gen_toks, "
                         f"device, dtype, batch_size, the model fields {sorted(MODEL_KEYS)}, the decoder fields "
                         f"{sorted(DECODER_KEYS)} and the HFLM options {sorted(HFLM_KEYS)}")


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    """``python -m mtad.harness.lm_eval_backend ARGS``: lm-eval's command line with ``--model mtad`` registered."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()
    return 0

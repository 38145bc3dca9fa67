"""The shared decode loop state, the decoder registry and :func:`generate`.

Every decoder is ``fn(models, run, cfg, rng)``: it loops ``draft -> score -> accept -> commit`` until
``run.done`` and reports through ``run.commit`` and ``run.stats``. :func:`generate` owns validation,
timing and the result record, so no decoder repeats them.

**Device rule.** One ``generate`` call has one *decode device*: the device of its generator ``rng``
(default: the target's first parameter's device). Every Session of the call returns its logits there
(:meth:`Run.session`), whichever GPU the model's last layer is on, so every probability, index, uniform and
draw that a decoder combines lives on that one device; a decoder creates index tensors with
``device=run.device`` and never moves tensors itself. :func:`mtad.decoding.filter.draw` and the rules of
:mod:`mtad.decoding.accept` refuse operands on other devices with an error naming this rule.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

import torch

from mtad.decoding.config import DecoderConfig
from mtad.decoding.filter import canonical_device, draw, filter_probs
from mtad.decoding.kv import Session, Stats, check_tree_support
from mtad.decoding.result import DecodeResult

log = logging.getLogger(__name__)

Decoder = Callable[..., None]
DECODERS: dict[str, Decoder] = {}
NEEDS_DRAFT: set[str] = set()
NEEDS_TREE: dict[str, tuple[str, ...]] = {}  # decoder -> roles whose model must take a 4D tree mask
CHECKS: dict[str, Callable[..., None]] = {}  # decoder -> check(models, cfg) run before any work


def register(name: str, draft: bool = False, tree: tuple[str, ...] = (), check: Callable[..., None] | None = None):
    """Register a decoder under ``name`` (the stable ``decoder.name`` key of results); ``check(models, cfg)``
    refuses a call the decoder cannot serve before any work, so the core never names a decoder."""

    def wrap(fn: Decoder) -> Decoder:
        DECODERS[name] = fn
        if draft:
            NEEDS_DRAFT.add(name)
        if tree:
            NEEDS_TREE[name] = tree
        if check is not None:
            CHECKS[name] = check
        return fn

    return wrap


class PromptTooLong(ValueError):
    """The prompt plus the tokens to generate does not fit the model's context window."""


class Run:
    """Committed tokens of one call and the stop rule (EOS kept, nothing after it; at most
    ``max_new_tokens``; an over-long block is truncated **[choice: the reference overshoots]**)."""

    def __init__(self, prompt: list[int], cfg: DecoderConfig, eos: set[int], device: torch.device | str = "cpu"):
        self.tokens = list(prompt)
        self.prompt_len, self.cfg, self.eos = len(prompt), cfg, eos
        self.device = canonical_device(device)  # the decode device (module docstring, "Device rule")
        self.stop_reason: str | None = None
        self.stats = Stats()

    def session(self, model, role: str) -> Session:
        """``model``'s cache for this call; its logits come back on the decode device."""
        return Session(model, self.stats, role, out_device=self.device)

    @property
    def remaining(self) -> int:
        return self.cfg.max_new_tokens - (len(self.tokens) - self.prompt_len)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def blocks(self, models, rng: torch.Generator, depth: int | None = None):
        """The speculative-family loop: creates the target and draft sessions of this call, then yields
        ``(target, draft, K)`` once per iteration, where K is the draft depth (``depth`` or gamma) shortened
        so the block and its bonus token fit. When no block fits, the tail is plain target steps.
        A feature draft (``reads_target_features``, :mod:`mtad.models.feature_draft`) is linked to the target.
        With ``proposer: ngram`` no draft session is made (``draft`` is None) and a pair's draft stays unused."""
        target, draft = self.session(models.target, "target"), None
        if self.cfg.proposer == "draft":
            draft = self.session(models.draft, "draft")
            if getattr(models.draft, "reads_target_features", False):
                draft.link(target)
        while not self.done:
            K = min(depth or self.cfg.gamma, self.remaining - 1)
            if K < 1:
                self.sample_step(target, rng)
                continue
            yield target, draft, K

    def filt(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return filter_probs(logits, c.temperature, c.top_k, c.top_p)

    def pending(self, session: Session) -> list[int]:
        """Roll ``session`` back to the committed text and return the tokens it has not seen yet."""
        session.sync(self.tokens)
        return self.tokens[len(session.ids):]

    def commit(self, ids: Sequence[int]) -> None:
        ids = [int(t) for t in ids][: self.remaining]
        for i, t in enumerate(ids):
            if t in self.eos:
                ids, self.stop_reason = ids[: i + 1], "eos"
                break
        self.tokens.extend(ids)
        if self.stop_reason is None and self.remaining <= 0:
            self.stop_reason = "max_new_tokens"

    def sample_step(self, target: Session, rng: torch.Generator) -> None:
        """One plain target step: the autoregressive baseline, and the tail of every block decoder."""
        p = self.filt(target.forward(self.pending(target))[-1])  # (V,)
        self.commit([int(draw(p, rng))])


def _eos_ids(models, cfg: DecoderConfig) -> set[int]:
    if cfg.eos_token_id is not None:
        return {cfg.eos_token_id}
    eos = getattr(getattr(models.target, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(models.target.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def vocab_size(model) -> int:
    head = model.get_output_embeddings()
    # mtad.models.draft_head.DraftHead and torch's (int8) Linear know their output width; other heads by weight rows
    n = getattr(head, "vocab_size", None) or getattr(head, "out_features", None)
    return int(n) if n else head.weight.shape[0]


def context_limit(model) -> int | None:
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(c, "max_position_embeddings", None)


def check(models, prompt: list[int], cfg: DecoderConfig) -> None:
    """Refuse bad calls before any work (no partial result)."""
    if cfg.name not in DECODERS:
        raise ValueError(f"unknown decoder '{cfg.name}': valid decoders are {sorted(DECODERS)}")
    if not prompt:
        raise ValueError("empty prompt: generate needs at least one prompt token")
    needs_draft = cfg.name in NEEDS_DRAFT and cfg.proposer == "draft"  # proposer=ngram: no draft model
    if needs_draft and models.draft is None:
        raise ValueError(f"decoder '{cfg.name}' needs a draft model; use a model pair with a draft")
    if needs_draft:
        vt, vd = vocab_size(models.target), vocab_size(models.draft)
        if vt != vd:
            raise ValueError(f"draft and target vocabularies differ (target {vt} tokens, draft {vd}): "
                             "the draft must share the target's tokenizer")
    for role in NEEDS_TREE.get(cfg.name, ()):
        check_tree_support(getattr(models, role), role)
    limit = context_limit(models.target)
    # blocks are shortened near the end, so no position ever exceeds prompt + max_new_tokens
    if limit is not None and len(prompt) + cfg.max_new_tokens > limit:
        raise PromptTooLong(f"prompt of {len(prompt)} tokens + max_new_tokens={cfg.max_new_tokens} "
                            f"exceeds the target's context of {limit} tokens; "
                            "shorten the prompt or lower max_new_tokens")
    if cfg.name in CHECKS:
        CHECKS[cfg.name](models, cfg)


def _sync_cuda(models) -> None:
    if torch.cuda.is_available():
        for m in (models.target, models.draft):
            if m is not None and next(m.parameters()).is_cuda:
                torch.cuda.synchronize()
                return


def generate(models, prompt_ids, cfg=None, rng: torch.Generator | None = None, **overrides) -> DecodeResult:
    """Decode one prompt with the decoder named by ``cfg.name``; see ALGORITHMS.md.

    models: a :class:`mtad.models.pair.ModelPair` (``target``, optional ``draft``); prompt_ids: a list of ids or a
    (1, T) / (T,) tensor; cfg: a :class:`DecoderConfig`, dict or OmegaConf node (``overrides`` win);
    rng: the explicit generator for all randomness (default: seed 0 on the target's first device); its
    device is the call's decode device (module docstring): keep it on the models' GPU, since a CPU
    generator with GPU models is correct but copies every logit row to the CPU.
    """
    cfg = DecoderConfig.from_any(cfg, **overrides)
    prompt = torch.as_tensor(prompt_ids).flatten().tolist()
    check(models, prompt, cfg)
    if rng is None:
        rng = torch.Generator(device=next(models.target.parameters()).device).manual_seed(0)
    run = Run(prompt, cfg, _eos_ids(models, cfg), rng.device)
    with torch.inference_mode():
        _sync_cuda(models)
        t0 = time.perf_counter()
        DECODERS[cfg.name](models, run, cfg, rng)
        _sync_cuda(models)
        wall = time.perf_counter() - t0
    s = run.stats
    return DecodeResult(
        tokens=run.tokens[run.prompt_len:], stop_reason=run.stop_reason or "max_new_tokens",
        target_forwards=s.target_forwards, draft_forwards=s.draft_forwards, accepted=s.accepted,
        proposed=s.proposed, position_accepts=s.position_accepts, position_proposals=s.position_proposals,
        wall_time_s=wall, forward_time_s=s.forward_time_s, calls=dict(s.calls))

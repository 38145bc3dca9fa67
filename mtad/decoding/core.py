"""The shared decode loop state, the decoder registry and :func:`generate`.

Every decoder is ``fn(models, batch, cfg, rng)``, one loop over the rows of a :class:`Batch` (one prompt is a
batch of one): it loops ``draft -> score -> accept -> commit`` until ``batch.done`` and reports through each
row's ``run.commit`` and ``run.stats``. :func:`generate` owns validation,
timing and the result record, so no decoder repeats them.

**Device rule.** One ``generate`` call has one *decode device*: the device of its generator ``rng``
(default: the target's first parameter's device). Every Session of the call returns its logits there
(:meth:`Batch.session`), whichever GPU the model's last layer is on, so every probability, index, uniform and
draw that a decoder combines lives on that one device; a decoder creates index tensors with
``device=run.device`` and never moves tensors itself. :func:`mtad.decoding.filter.draw` and the rules of
:mod:`mtad.decoding.accept` refuse operands on other devices with an error naming this rule.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import torch

from mtad.decoding.attention import check_tree_support
from mtad.decoding.config import DecoderConfig
from mtad.decoding.filter import Top, canonical_device, draw, filter_probs, filter_top
from mtad.decoding.kv import Session, Stats
from mtad.decoding.propose import PROPOSERS
from mtad.decoding.result import DecodeResult

log = logging.getLogger(__name__)

Decoder = Callable[..., None]
DECODERS: dict[str, Decoder] = {}
NEEDS_DRAFT: set[str] = set()
NEEDS_TREE: dict[str, tuple[str, ...]] = {}  # decoder -> roles whose model must take a 4D tree mask
CHECKS: dict[str, Callable[..., None]] = {}  # decoder -> check(models, cfg) run before any work
READS: dict[str, Callable[[DecoderConfig], tuple[str, ...]]] = {}  # decoder -> the config keys it reads, for cfg
# every decoder reads these (greedy ignores the filter, ALGORITHMS.md §1), so a row may always record them as set
SHARED_KEYS = ("name", "max_new_tokens", "temperature", "top_k", "top_p", "eos_token_id")
# gamma, the block length (Batch.blocks' depth, mtjd's block), is read by every decoder but these: greedy and sampling
# emit one token a step and specinfer drafts len(k_config) deep, so their gamma changes nothing they decode and is
# refused like any other key they do not read (ALGORITHMS.md, "Keys each decoder reads")
GAMMA_UNREAD = frozenset({"greedy", "sampling", "specinfer"})


def register(name: str, draft: bool = False, tree: tuple[str, ...] = (), check: Callable[..., None] | None = None,
             reads: Callable[[DecoderConfig], tuple[str, ...]] = lambda cfg: ()):
    """Register the decoder ``fn(models, batch, cfg, rng)`` under ``name`` (the stable ``decoder.name`` key of
    results): its one loop over the rows of a :class:`Batch`, a batch of one being the one-prompt call.
    ``check(models, cfg)`` refuses a call the decoder cannot serve before any work, so the core never names a
    decoder; ``reads(cfg)`` names the config keys beyond :data:`SHARED_KEYS` that it reads with ``cfg``
    (:func:`unread_keys`)."""

    def wrap(fn: Decoder) -> Decoder:
        DECODERS[name] = fn
        READS[name] = reads
        if draft:
            NEEDS_DRAFT.add(name)
        if tree:
            NEEDS_TREE[name] = tree
        if check is not None:
            CHECKS[name] = check
        return fn

    return wrap


def needs_draft(cfg: DecoderConfig) -> bool:
    """The call drafts with the pair's draft model: a drafted decoder whose proposer is a model (not prompt
    lookup). The one answer to "load, fingerprint and check a draft?" for decoding and the harness."""
    return cfg.name in NEEDS_DRAFT and PROPOSERS[cfg.proposer].model


def read_keys(cfg: DecoderConfig) -> set[str]:
    """Every config key that ``cfg``'s decoder reads with ``cfg``: :data:`SHARED_KEYS`, ``gamma`` (unless
    :data:`GAMMA_UNREAD`), and what its ``reads`` names (the accept rule's and the proposer's keys)."""
    own = set(READS[cfg.name](cfg)) if cfg.name in READS else set()
    return set(SHARED_KEYS) | own | (set() if cfg.name in GAMMA_UNREAD else {"gamma"})


def unread_keys(cfg: DecoderConfig) -> dict[str, object]:
    """The settings of ``cfg`` away from their defaults that its decoder does not read (they cannot change
    what it decodes)."""
    read = read_keys(cfg)
    base = DecoderConfig()
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name not in read and getattr(cfg, f.name) != getattr(base, f.name)}


def check_keys(cfg: DecoderConfig) -> None:
    """Refuse a setting the decoder does not read: its row would record and hash a variant that did not run
    (``decoder=mtad decoder.accept=fuzzy`` decodes plain MTAD). The harness calls this before any work."""
    unread = unread_keys(cfg)
    if unread:
        gates = [f"{k}={getattr(cfg, k)}" for k in ("accept", "proposer", "mode", "select")
                 if k in read_keys(cfg)]
        where = f"decoder={cfg.name}" + (f" ({', '.join(gates)})" if gates else "")
        keys = ", ".join(f"decoder.{k}={v!r}" for k, v in unread.items())
        raise ValueError(f"{keys} {'has' if len(unread) == 1 else 'have'} no effect with {where}, so the row would "
                         f"record a setting that did not run: drop {'it' if len(unread) == 1 else 'them'} "
                         "(ALGORITHMS.md, \"Keys each decoder reads\")")


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

    @property
    def remaining(self) -> int:
        return self.cfg.max_new_tokens - (len(self.tokens) - self.prompt_len)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def filt(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return filter_probs(logits, c.temperature, c.top_k, c.top_p)

    def law(self, logits: torch.Tensor) -> "torch.Tensor | Top":
        """:meth:`filt` kept on its top-k support (:class:`~mtad.decoding.filter.Top`) where a top-k applies."""
        c = self.cfg
        return filter_top(logits, c.temperature, c.top_k, c.top_p) or self.filt(logits)

    def commit(self, ids: Sequence[int]) -> None:
        ids = [int(t) for t in ids][: self.remaining]
        for i, t in enumerate(ids):
            if t in self.eos:
                ids, self.stop_reason = ids[: i + 1], "eos"
                break
        self.tokens.extend(ids)
        if self.stop_reason is None and self.remaining <= 0:
            self.stop_reason = "max_new_tokens"


class Batch:
    """The prompts of one call, decoded together: one :class:`Run` per row (its own tokens, stop rule and stats).
    Every decoder loops over a Batch; one prompt is a batch of one. Each model has one
    :class:`mtad.decoding.kv.Session` over the rows (:meth:`session`); a batch of one has no padding, so it decodes
    exactly as a single prompt always has. Each iteration first drops the rows that stopped from every session
    (:meth:`active`), so a finished row costs nothing more; rows never wait for each other. Randomness: one
    generator, and every draw and uniform has a row dimension (B, ...) or is drawn per row, so rows are
    independent."""

    def __init__(self, prompts: list[list[int]], cfg: DecoderConfig, eos: set[int], device="cpu"):
        self.runs = [Run(p, cfg, eos, device) for p in prompts]
        self.cfg, self.device = cfg, canonical_device(device)

    @property
    def done(self) -> bool:
        return all(r.done for r in self.runs)

    def session(self, model, role: str) -> Session:
        """``model``'s cache for this call's rows; logits come back on the decode device."""
        return Session(model, [r.stats for r in self.runs], role, out_device=self.device)

    def filt(self, logits: torch.Tensor) -> torch.Tensor:
        return self.runs[0].filt(logits)

    def law(self, logits: torch.Tensor) -> "torch.Tensor | Top":
        return self.runs[0].law(logits)

    def active(self, *sessions: Session | None) -> list[Run]:
        """Drop finished rows from ``sessions`` (which hold the same rows); the runs still going, in batch order."""
        keep = [i for i, r in enumerate(sessions[0].row) if not self.runs[r].done]
        for s in sessions:
            if s is not None:
                s.keep(keep)
        return [self.runs[r] for r in sessions[0].row]

    def pending(self, session: Session) -> list[list[int]]:
        """Roll each row of ``session`` back to its committed text; the tokens it has not seen, per row."""
        return session.sync([self.runs[r].tokens for r in session.row])

    def steps(self, models):
        """The plain loop: yields ``(target, runs)`` until every row stopped."""
        target = self.session(models.target, "target")
        while not self.done:
            yield target, self.active(target)

    def blocks(self, models, rng: torch.Generator, depth: int | None = None):
        """The speculative-family loop: creates the target and draft sessions of this call, then yields
        ``(target, draft, runs, K)`` once per iteration, with K[b] the draft depth of row b (``depth`` or gamma)
        shortened so its block and bonus token fit. K[b] = 0 is a plain target step for that row within the same
        forward; a batch of one takes that step here, so a yielded K is >= 1 there. A feature draft
        (``reads_target_features``, :mod:`mtad.models.feature_draft`) is linked to the target, row by row.
        ``draft`` is None with a proposer that needs no model (``proposer: ngram``)."""
        target = self.session(models.target, "target")
        draft = self.session(models.draft, "draft") if needs_draft(self.cfg) else None
        if draft is not None and getattr(models.draft, "reads_target_features", False):
            draft.link(target)
        while not self.done:
            runs = self.active(target, draft)
            K = [max(0, min(depth or self.cfg.gamma, r.remaining - 1)) for r in runs]
            if len(self.runs) == 1 and K[0] < 1:  # no block fits: the tail is plain target steps
                self.sample_step(target, runs, rng)
                continue
            yield target, draft, runs, K

    def sample_step(self, target: Session, runs: list[Run], rng: torch.Generator) -> None:
        """One plain target step per row: the autoregressive baseline, and the tail of every block decoder."""
        p = self.filt(target.forward(self.pending(target))[:, -1])  # (B, V)
        self.commit(runs, draw(p, rng).tolist())

    @staticmethod
    def commit(runs: list[Run], blocks: list[list[int]]) -> None:
        for run, ids in zip(runs, blocks):
            run.commit(ids)


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
    drafted = needs_draft(cfg)  # proposer=ngram: no draft model
    if drafted and models.draft is None:
        raise ValueError(f"decoder '{cfg.name}' needs a draft model; use a model pair with a draft")
    if drafted:
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


def is_batch(prompt_ids) -> bool:
    """A list of prompts (lists or 1-D tensors) or a (B, T) tensor with B > 1; anything else is one prompt."""
    if isinstance(prompt_ids, torch.Tensor):
        return prompt_ids.dim() == 2 and prompt_ids.shape[0] > 1
    if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
        return False
    first = prompt_ids[0]
    return isinstance(first, (list, tuple)) or isinstance(first, torch.Tensor) and first.dim() > 0


def generate_rows(models, prompts: list, cfg: DecoderConfig, rng: torch.Generator | None) -> list[DecodeResult]:
    """:func:`generate` on a list of prompts: one result per prompt, in order. Each result's ``wall_time_s``
    and ``forward_time_s`` are its equal share of the batch's (their sum over the batch is the batch's)."""
    prompts = [torch.as_tensor(p).flatten().tolist() for p in prompts]
    for p in prompts:
        check(models, p, cfg)
    rng = rng if rng is not None else _default_rng(models)
    batch = Batch(prompts, cfg, _eos_ids(models, cfg), rng.device)
    wall, cpu = _timed(models, lambda: DECODERS[cfg.name](models, batch, cfg, rng))
    return [_result(run, wall / len(prompts), cpu / len(prompts)) for run in batch.runs]


def _default_rng(models) -> torch.Generator:
    return torch.Generator(device=next(models.target.parameters()).device).manual_seed(0)


def _timed(models, decode) -> tuple[float, float]:
    """Wall and CPU seconds of ``decode()`` in inference mode, CUDA synchronised before and after."""
    with torch.inference_mode():
        _sync_cuda(models)
        t0, c0 = time.perf_counter(), time.process_time()
        decode()
        _sync_cuda(models)
        return time.perf_counter() - t0, time.process_time() - c0


def _result(run: Run, wall: float, cpu: float) -> DecodeResult:
    s = run.stats
    return DecodeResult(
        tokens=run.tokens[run.prompt_len:], stop_reason=run.stop_reason or "max_new_tokens",
        target_forwards=s.target_forwards, draft_forwards=s.draft_forwards, accepted=s.accepted,
        proposed=s.proposed, position_accepts=s.position_accepts, position_proposals=s.position_proposals,
        wall_time_s=wall, forward_time_s=s.forward_time_s, calls=dict(s.calls), cpu_time_s=cpu,
        call_cpu_s=dict(s.call_cpu_s))


def generate(models, prompt_ids, cfg=None, rng: torch.Generator | None = None, **overrides):
    """Decode one prompt with the decoder named by ``cfg.name``; see ALGORITHMS.md. A list of prompts (of any
    lengths) is decoded together and gives a list of results in the same order (:func:`generate_rows`).

    models: a :class:`mtad.models.pair.ModelPair` (``target``, optional ``draft``); prompt_ids: a list of ids or a
    (1, T) / (T,) tensor; cfg: a :class:`DecoderConfig`, dict or OmegaConf node (``overrides`` win);
    rng: the explicit generator for all randomness (default: seed 0 on the target's first device); its
    device is the call's decode device (module docstring): keep it on the models' GPU, since a CPU
    generator with GPU models is correct but copies every logit row to the CPU.
    """
    cfg = DecoderConfig.from_any(cfg, **overrides)
    if is_batch(prompt_ids):
        return generate_rows(models, list(prompt_ids), cfg, rng)
    return generate_rows(models, [prompt_ids], cfg, rng)[0]  # a batch of one

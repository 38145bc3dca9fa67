"""One way to time things: a forward pass of a given shape, a callable, a batch of decodes.

Every per-forward cost in the package (the cost model's profiles, the benchmark's step costs and Leviathan
bound, its cost table) is :func:`time_forwards`: the forwards of a set of :class:`Shape` s run in rounds
(every shape once per round; an untimed warm-up round first, then at least ``reps`` rounds and at least
``min_seconds``), each through the decoders' own :class:`mtad.decoding.kv.Session` call, with the cache put
back to the shape's context before every forward (untimed) and the device synchronised around it (CUDA), and
the cost of a shape is the 10 %-trimmed mean of its rounds (:func:`trimmed_mean`) **[choice: a run's
ms/token is a mean too, preemptions on a shared machine included; the median would leave them out of the
costs but not out of the runs]**. Timing in rounds means a change in the machine's load shifts every shape
alike. Whole decodes are timed by the decoding core itself (``DecodeResult.wall_time_s`` and
``forward_time_s``); :func:`time_decodes` sums them after a warm-up decode.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from mtad.decoding import generate
from mtad.decoding.kv import Session, Stats
from mtad.models.feature_draft import ZeroSource, timing_session

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
TRIM = 0.1  # share of rounds cut at each end by the estimator
WARMUP_SEED = 12345


@dataclass(frozen=True)
class Shape:
    """A forward of ``rows`` x ``new`` tokens by the ``role`` model after ``context`` cached tokens.

    ``context=0`` is a prefill into an empty cache; ``rows > 1`` is one new token in each of B beam rows
    (the batch dimension); ``tree`` is one pass of N = ``new`` nodes, each a child of the last context token
    (a 4D mask). ``keep``: logits kept of the last positions (0 = all)."""

    role: str  # "target" | "draft" (the Session's role)
    context: int
    new: int = 1  # S (a tree: N)
    rows: int = 1  # B
    tree: bool = False
    keep: int = 1

    def __post_init__(self):
        if self.rows > 1 and (self.new != 1 or self.tree):
            raise ValueError(f"{self}: beam rows take one new token each, in a linear pass")
        if self.tree and self.context < 1:
            raise ValueError(f"{self}: a tree hangs off a context token")

    @property
    def key(self) -> str:
        """The shape as the forward counts name it (``Stats.calls``): ``<role>:<seq|tree>:<rows>x<new>``."""
        return f"{self.role}:{'tree' if self.tree else 'seq'}:{self.rows}x{self.new}"


def trimmed_mean(xs: Sequence[float], cut: float = TRIM) -> float:
    """Mean without the lowest and highest ``cut`` share (one stray preemption does not decide a cost)."""
    xs = sorted(xs)
    k = int(len(xs) * cut)
    return statistics.fmean(xs[k:len(xs) - k] if len(xs) > 2 * k else xs)


def sync(device: torch.device | None) -> None:
    """Wait for the device's queued work (CUDA); a no-op elsewhere."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[..., T], *args, device: torch.device | None = None) -> tuple[float, T]:
    """(seconds, result) of one call ``fn(*args)``, the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    out = fn(*args)
    sync(device)
    return time.perf_counter() - t0, out


def cycle(tokens: Sequence[int], start: int, n: int) -> list[int]:
    """``n`` ids from position ``start`` of ``tokens`` repeated end to end."""
    return [int(tokens[i % len(tokens)]) for i in range(start, start + n)]


class _Forward:
    """One shape's timed forward: :meth:`prep` (untimed) puts a Session in the state before it, :meth:`run`
    is the forward. Seq and tree sessions are rolled back (``sync``, ``keep_path``); a prefill or a beam
    step gets a fresh session each time (a beam step grows every row, and rows cannot be rolled back)."""

    def __init__(self, model, shape: Shape, tokens: Sequence[int]):
        self.model, self.shape = model, shape
        self.ctx = cycle(tokens, 0, shape.context)
        self.new = cycle(tokens, shape.context, shape.rows * shape.new)
        self.device = model.get_input_embeddings().weight.device
        self.session = None

    def fresh(self):
        s = timing_session(self.model, Stats(), self.shape.role)
        if self.ctx:
            s.forward([self.ctx])
        if self.shape.rows > 1:
            s.expand(self.shape.rows)
        return s

    def prep(self) -> None:
        if self.session is None or self.shape.rows > 1 or not self.ctx:
            self.session = self.fresh()
        elif self.shape.tree:
            self.session.keep_path([[]])  # drop the last pass's nodes
        else:
            self.session.sync([self.ctx + [-1]])  # the cache back to exactly ctx

    def run(self) -> torch.Tensor:
        s, shape = self.session, self.shape
        if shape.rows > 1:
            return s.forward_beams(torch.tensor(self.new))  # (B, V)
        if shape.tree:
            return s.forward_tree([self.new], [[len(self.ctx) - 1] * shape.new], shape.keep)[0]  # (N or keep, V)
        return s.forward([self.new], shape.keep)[0]  # (keep, V)


def time_forwards(jobs: Mapping[K, tuple[Any, Shape]], tokens: Sequence[int], reps: int = 10,
                  min_seconds: float = 0.0) -> dict[K, float]:
    """Seconds per forward of each job ``(model, shape)``, timed in rounds (module docstring): a warm-up
    round, then ``reps`` rounds and more until ``min_seconds`` have passed; the trimmed mean per job.
    ``tokens``: the ids the context and new tokens are taken from (cycled)."""
    cases = {k: _Forward(model, shape, tokens) for k, (model, shape) in jobs.items()}
    times: dict[K, list[float]] = {k: [] for k in cases}
    start, r = time.perf_counter(), 0
    with torch.inference_mode():
        while r <= reps or time.perf_counter() - start < min_seconds:  # round 0 warms up
            for k, case in cases.items():
                case.prep()
                seconds, _ = timed(case.run, device=case.device)
                if r:
                    times[k].append(seconds)
            r += 1
    return {k: trimmed_mean(ts) for k, ts in times.items()}


def time_forward(model, shape: Shape, tokens: Sequence[int], reps: int = 10, min_seconds: float = 0.0) -> float:
    """Seconds of one forward of ``shape`` (:func:`time_forwards` of one job)."""
    return time_forwards({0: (model, shape)}, tokens, reps, min_seconds)[0]


def time_decodes(pair, cfg, prompts: Sequence[Sequence[int]], seeds: Sequence[int], warmup=None) -> dict:
    """Decode ``prompts[i]`` with seed ``seeds[i]`` after one untimed warm-up decode of ``prompts[0]``
    (config ``warmup``, default ``cfg``); totals of wall and forward seconds (the core's own timers), the same
    two in CPU seconds (``cpu_s``, ``forward_cpu_s``), tokens and forward counts."""
    def decode(prompt, c, seed):
        return generate(pair, prompt, c, torch.Generator(device=pair.device).manual_seed(seed))

    decode(prompts[0], cfg if warmup is None else warmup, WARMUP_SEED)
    tot = dict(wall_s=0.0, forward_s=0.0, cpu_s=0.0, forward_cpu_s=0.0, tokens=0, target_forwards=0,
               draft_forwards=0)
    for prompt, seed in zip(prompts, seeds, strict=True):
        r = decode(prompt, cfg, seed)
        tot["wall_s"] += r.wall_time_s
        tot["forward_s"] += r.forward_time_s
        tot["cpu_s"] += r.cpu_time_s
        tot["forward_cpu_s"] += sum(r.call_cpu_s.values())
        tot["tokens"] += r.num_tokens
        tot["target_forwards"] += r.target_forwards
        tot["draft_forwards"] += r.draft_forwards
    return tot


def time_rows(model, role: str, rows: int, new: int, context: int, tokens: Sequence[int], reps: int = 10,
              min_seconds: float = 0.0) -> float:
    """Seconds of one forward of ``new`` tokens in each of ``rows`` prompts after ``context`` cached tokens
    each (a batched decode's shape, :class:`mtad.decoding.kv.Session`; ``<role>:seq:<rows>x<new>``): the cache is
    filled once and rolled back after every timed forward; the trimmed mean over ``reps`` rounds or more."""
    ctx, step = cycle(tokens, 0, context), cycle(tokens, context, new)
    session = Session(model, [Stats() for _ in range(rows)], role)
    device = model.get_input_embeddings().weight.device
    if getattr(model, "reads_target_features", False):  # a feature draft timed alone: zero features per row
        session.link(ZeroSource(model.config.hidden_size, device, rows))
    times, start, r = [], time.perf_counter(), 0
    with torch.inference_mode():
        session.forward([ctx] * rows)
        while r <= reps or time.perf_counter() - start < min_seconds:  # round 0 warms up
            session.sync([ctx + [-1]] * rows)  # the cache back to exactly ctx
            seconds, _ = timed(session.forward, [step] * rows, new, device=device)
            if r:
                times.append(seconds)
            r += 1
    return trimmed_mean(times)

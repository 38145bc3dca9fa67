"""A cost model that explains each measured speed: per-forward costs x each run's forward counts.

``python -m mtad.harness.profile profile model=<pair> [num_threads=1] [model.device=cuda] [--reps 10]`` measures,
once per hardware and model pair, what one forward pass costs for every shape the decoders use, and writes
``results/profiles/<hardware>-<pair>.json`` (:class:`Profile`; :func:`measure`, every forward timed by
:func:`mtad.measure.timing.time_forwards`):

- target and draft, one row, ``S`` new tokens: S = 1..gamma+2 (decode and verify widths) and prompt
  lengths up to 512 (prefill, from an empty cache);
- one new token in each of ``B`` rows (beams in the batch dimension), B = 1..W;
- a token tree of ``N`` nodes in one pass (MMTAD, SpecInfer, MTJD exhaustive), N up to 64;
- the harness time outside forwards (filtering, drawing, acceptance), per target forward, per decoder,
  from a short decode of each decoder.

Decode-width costs are measured at a fixed context (``context_tokens``, stated in the profile); the
cost of a shape between measured points is interpolated linearly (and extrapolated from the last two).

Every run records its forward shapes (``metrics.forward_calls``: ``"<role>:<seq|tree>:<rows>x<new>"`` ->
count, :class:`mtad.decoding.kv.Stats`), which do not depend on the hardware. :func:`predict` turns them into
ms/token under a profile: under the profile of the hardware the run was measured on this is the *predicted*
figure beside the measured one; under another profile (a GPU's, or :func:`declared_profile`, "a target pass
of any width = 1 step, a draft pass = c steps") it is a **projection**, never a measurement.
"""
from __future__ import annotations

import json
import logging
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from mtad.decoding import DecoderConfig
from mtad.decoding.core import DECODERS, NEEDS_DRAFT, context_limit
from mtad.measure.timing import Shape, time_decodes, time_forwards, time_rows

log = logging.getLogger("mtad.measure.costmodel")

PROFILE_DIR = Path("results") / "profiles"
SEQ_EXTRA = (8, 16, 32, 64, 128, 256, 384, 512)  # prefill lengths, measured from an empty cache
TREE_SIZES = (1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64)
MIN_SECONDS = 10.0  # cheap models get more rounds than `reps`: at least this long per model
DECLARED_DRAFT_COST = 0.1  # c: a draft pass costs a tenth of a target pass (~ Llama-3.2-1B vs Llama-3.1-8B)
_KEY = re.compile(r"^(target|draft):(seq|tree):(\d+)x(\d+)$")


@dataclass
class Profile:
    """Per-forward costs of one (hardware, pair). ``costs_ms["<role>:<kind>:<rows>"]`` is a list of
    ``[new tokens, ms]`` sorted by tokens; ``overhead_ms`` is harness time per target forward per decoder."""

    hardware: str
    pair: str
    costs_ms: dict[str, list[list[float]]]
    overhead_ms: dict[str, float] = field(default_factory=dict)
    num_threads: int | None = None
    context_tokens: int = 128
    reps: int = 0
    measured: str = ""  # UTC time of the measurement; "" for a declared profile
    kind: str = "measured"  # measured | declared
    unit: str = "ms"  # "step" for a declared profile
    note: str = ""

    # ---- lookup ---------------------------------------------------------------------------------
    def cost(self, role: str, kind: str, rows: int, new: int) -> float:
        """Cost of one forward of ``rows`` x ``new`` tokens (a tree: 1 x N nodes)."""
        curves = {int(k.rsplit(":", 1)[1]): v for k, v in self.costs_ms.items() if k.startswith(f"{role}:{kind}:")}
        if kind == "tree" and not curves:  # no tree curve: a tree pass of N nodes costs a pass of N tokens
            curves = {int(k.rsplit(":", 1)[1]): v for k, v in self.costs_ms.items() if k.startswith(f"{role}:seq:")}
        if not curves:
            raise ValueError(f"profile {self.hardware}/{self.pair} has no {role} costs: profile the pair with its "
                             f"draft (python -m mtad.harness.profile profile model={self.pair})")
        if rows in curves:
            return _interp(curves[rows], new)
        # rows not measured: linear in the row count through the measured ones (constant with only one)
        return _interp([[b, _interp(curves[b], new)] for b in sorted(curves)], rows)

    def overhead(self, decoder: str | None) -> float:
        if not self.overhead_ms:
            return 0.0
        if decoder in self.overhead_ms:
            return self.overhead_ms[decoder]
        return statistics.median(self.overhead_ms.values())

    def label(self) -> str:
        if self.kind == "declared":
            return self.note
        threads = f", {self.num_threads} thread{'s' if self.num_threads != 1 else ''}" if self.num_threads else ""
        return f"{self.hardware}{threads}, {self.pair} (measured {self.measured[:10]})"

    def matches(self, hardware: str, pair: str, num_threads) -> bool:
        threads_ok = self.num_threads is None or num_threads is None or _int(num_threads) == self.num_threads
        return self.kind == "measured" and self.hardware == hardware and self.pair == pair and threads_ok

    # ---- files ----------------------------------------------------------------------------------
    def to_json(self) -> str:
        """Indented JSON with one line per cost curve."""
        d = asdict(self)
        curves = ",\n".join(f"  {json.dumps(k)}: {json.dumps([[a, round(b, 5)] for a, b in v])}"
                             for k, v in d.pop("costs_ms").items())
        head = json.dumps(d, indent=1)
        return head[:-2] + f',\n "costs_ms": {{\n{curves}\n }}\n}}'

    @classmethod
    def from_dict(cls, d: Mapping) -> "Profile":
        names = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - names)
        if unknown or "costs_ms" not in d:
            raise ValueError(f"not a cost profile: unknown keys {unknown}" if unknown else
                             "not a cost profile: no costs_ms (write one with python -m mtad.harness.profile profile)")
        return cls(**dict(d))

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: {err}") from err


def _int(x) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _interp(points: Sequence[Sequence[float]], x: float) -> float:
    """Piecewise-linear through (tokens, cost) points; linear extrapolation from the two end points."""
    pts = sorted((float(a), float(b)) for a, b in points)
    if len(pts) == 1:
        return pts[0][1]
    if x <= pts[0][0]:
        (x0, y0), (x1, y1) = pts[0], pts[1]
    elif x >= pts[-1][0]:
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
    else:
        i = next(i for i in range(1, len(pts)) if pts[i][0] >= x)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def declared_profile(c: float = DECLARED_DRAFT_COST) -> Profile:
    """The memory-bound idealisation: a target pass costs 1 step whatever its width (verify of gamma+1
    tokens, a tree, a prefill), a draft pass costs ``c`` steps; no harness time. A projection only."""
    return Profile(hardware="declared", pair="any", kind="declared", unit="step",
                   costs_ms={"target:seq:1": [[1, 1.0]], "draft:seq:1": [[1, c]]},
                   note=f"declared: target pass = 1 step at any width, draft pass = {c:g} step, no harness time")


# ------------------------------------------------------------------------------------------- prediction
def parse_calls(calls: Mapping[str, float]) -> list[tuple[str, str, int, int, float]]:
    out = []
    for key, n in calls.items():
        m = _KEY.match(str(key))
        if m is None:
            raise ValueError(f"bad forward-call key {key!r}: expected '<target|draft>:<seq|tree>:<rows>x<new>'")
        if n:
            out.append((m[1], m[2], int(m[3]), int(m[4]), float(n)))
    return out


def predict(calls: Mapping[str, float], tokens: int, profile: Profile, decoder: str | None = None) -> float | None:
    """Cost per generated token (ms under a measured profile, steps under a declared one) of a run with
    these forward counts: sum of count x cost(shape), plus the profile's harness time per target forward."""
    if not tokens or not calls:
        return None
    parsed = parse_calls(calls)
    total = sum(n * profile.cost(role, kind, rows, new) for role, kind, rows, new, n in parsed)
    total += profile.overhead(decoder) * sum(n for role, *_, n in parsed if role == "target")
    return total / tokens


def find_profiles(dirs: Sequence[str | Path]) -> list[Profile]:
    """Every ``*.json`` profile under ``dirs`` (missing folders are fine; a bad file is an error)."""
    out = []
    for d in dirs:
        d = Path(d)
        if d.is_dir():
            out += [Profile.load(f) for f in sorted(d.glob("*.json"))]
    return out


# ------------------------------------------------------------------------------------------- files
def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def profile_path(out_dir: str | Path, hardware: str, pair: str, num_threads: int | None, cuda: bool) -> Path:
    threads = "" if cuda or not num_threads else f"-{num_threads}t"
    return Path(out_dir) / f"{_slug(hardware)}{threads}-{_slug(pair)}.json"


# ------------------------------------------------------------------------------------------- measuring
def profile_shapes(role: str, gamma: int, W: int, context: int, max_positions: int | None) -> list[Shape]:
    """The forwards a profile measures for one model (module docstring), in curve order."""
    limit = max_positions or 10 ** 9
    return ([Shape(role, context, n) for n in range(1, gamma + 3)]  # decode and verify widths
            + [Shape(role, 0, n) for n in SEQ_EXTRA if n <= limit]  # prefills
            + [Shape(role, context, 1, rows=B) for B in range(2, W + 1)]  # one token in each of B beam rows
            + [Shape(role, context, N, tree=True, keep=0)  # a star of N nodes below the last context token
               for N in TREE_SIZES if N <= limit - context - 2])


def measure_model(model, role: str, gamma: int, W: int, context: int, reps: int, vocab: int,
                  max_positions: int | None) -> dict[str, list[list[float]]]:
    """The cost curves of one model, ``{"<role>:<seq|tree>:<rows>": [[new tokens, ms], ...]}``: every shape
    of :func:`profile_shapes` timed in rounds (``reps`` rounds, more until ``MIN_SECONDS`` have passed, so
    that millisecond forwards are averaged over many rounds), over random context tokens."""
    tokens = torch.randint(3, vocab, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    shapes = profile_shapes(role, gamma, W, context, max_positions)
    seconds = time_forwards({i: (model, s) for i, s in enumerate(shapes)}, tokens, reps, MIN_SECONDS)
    costs: dict[str, list[list[float]]] = {}
    for i, shape in enumerate(shapes):
        curve, new = shape.key.rsplit("x", 1)
        costs.setdefault(curve, []).append([int(new), 1e3 * seconds[i]])
    return costs


NEVER_EOS = 2**31 - 1  # an id no vocabulary has: timed decodes never stop early


def measure_overheads(pair, decoders: Sequence[str], context: int, new_tokens: int = 24,
                      decodes: int = 2) -> dict[str, float]:
    """Harness ms per target forward of each decoder: (wall - time inside forwards) / target forwards,
    pooled over ``decodes`` short decodes of one random prompt after a warm-up one."""
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    prompt = torch.randint(3, vocab, (context,), generator=torch.Generator().manual_seed(1)).tolist()
    out = {}
    for name in decoders:
        cfg = DecoderConfig(name=name, max_new_tokens=new_tokens, temperature=0.0 if name == "greedy" else 1.0,
                            eos_token_id=NEVER_EOS)
        tot = time_decodes(pair, cfg, [prompt] * decodes, range(1, decodes + 1))
        out[name] = 1e3 * max(0.0, tot["wall_s"] - tot["forward_s"]) / max(tot["target_forwards"], 1)
    return out


def measure(pair, hardware: str, num_threads: int | None, gamma: int = 4, W: int = 4, context: int = 128,
            reps: int = 10, decoders: Sequence[str] | None = None) -> Profile:
    """Measure a :class:`Profile` of a loaded pair (``gamma``/``W``: the widest verify and beam counts)."""
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    limit = context_limit(pair.target)
    if limit is not None and context + 64 > limit:
        context = max(8, limit // 2)
    costs = {}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is not None:
            log.info("measuring %s forwards", role)
            costs.update(measure_model(model, role, gamma, W, context, reps, vocab, limit))
    if decoders is None:
        decoders = [d for d in sorted(DECODERS) if pair.draft is not None or d not in NEEDS_DRAFT]
    log.info("measuring harness overhead of %s", ", ".join(decoders))
    overhead = measure_overheads(pair, decoders, context)
    return Profile(hardware=hardware, pair=pair.name, costs_ms=costs, overhead_ms=overhead,
                   num_threads=num_threads, context_tokens=context, reps=reps,
                   measured=datetime.now(timezone.utc).isoformat(timespec="seconds"))


# ------------------------------------------------------------------------------------------- batch width
def measure_batch(pair, batches: Sequence[int], gamma: int = 4, W: int = 4, context: int = 128, prompt: int = 0,
                  reps: int = 5, min_seconds: float = 2.0) -> dict[str, list[list[float]]]:
    """Cost curves over batch width for :func:`batch_cost_per_token`: ``target:seq:<B>`` at 1 and gamma+1 new
    tokens, ``draft:seq:<B>`` and ``draft:seq:<B*W>`` (MTAD's beams) at 1, after ``context`` cached tokens, and
    with ``prompt`` > 0 both models' prefill of ``prompt`` tokens (after one cached token), for every B in
    ``batches`` (the keys of :class:`Profile` ``costs_ms``, so a profile can carry them)."""
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    tokens = torch.randint(3, vocab, (context + max(gamma + 1, prompt),),
                           generator=torch.Generator().manual_seed(0)).tolist()
    jobs = {("target", B, n, context) for B in batches for n in (1, gamma + 1)}
    jobs |= {("target", B, prompt, 1) for B in batches if prompt}
    if pair.draft is not None:
        jobs |= {("draft", R, 1, context) for B in batches for R in (B, B * W)}
        jobs |= {("draft", B, prompt, 1) for B in batches if prompt}
    costs: dict[str, list[list[float]]] = {}
    for role, rows, new, ctx in sorted(jobs):
        model = pair.target if role == "target" else pair.draft
        ms = 1e3 * time_rows(model, role, rows, new, ctx, tokens, reps, min_seconds)
        costs.setdefault(f"{role}:seq:{rows}", []).append([new, ms])
    return {k: sorted(v) for k, v in costs.items()}


def batch_cost_per_token(profile: Profile, decoder: str, B: int, gamma: int = 4, W: int = 4,
                         tokens_per_iteration: float = 1.0, prompt_tokens: int = 0, new_tokens: int = 0) -> float:
    """Predicted cost per generated token of ``decoder`` decoding B prompts together (steady state, one row
    of B per prompt, ``tokens_per_iteration`` = block efficiency per row, assumed not to depend on B):

        sampling     t(B, 1) / B
        speculative  (gamma d(B, 1) + t(B, gamma+1)) / (B E)
        mtad         (d(B, 1) + (gamma - 1) d(B W, 1) + t(B, gamma+1)) / (B E)

    t, d: the profile's target and draft forward costs of B rows x S new tokens (interpolated in B and S,
    :meth:`Profile.cost`); no harness time. With ``prompt_tokens`` P and ``new_tokens`` N, each token also
    carries its share of the prefill, (t(B, P) [+ d(B, P) with a draft]) / (B N). Where a wider pass costs
    nearly the same (memory-bound: a GPU at small B) the draft's extra forwards are cheap; once t(B, gamma+1)
    grows like B (gamma+1) (compute-bound) speculation stops paying (:func:`speculation_stops_paying`)."""
    t1, tv = profile.cost("target", "seq", B, 1), profile.cost("target", "seq", B, gamma + 1)
    roles = ("target",) if decoder == "sampling" else ("target", "draft")
    prefill = sum(profile.cost(r, "seq", B, prompt_tokens) for r in roles) / (B * new_tokens) \
        if prompt_tokens and new_tokens else 0.0
    if decoder == "sampling":
        return t1 / B + prefill
    if decoder == "speculative":
        draft = gamma * profile.cost("draft", "seq", B, 1)
    elif decoder == "mtad":
        draft = profile.cost("draft", "seq", B, 1) + (gamma - 1) * profile.cost("draft", "seq", B * W, 1)
    else:
        raise ValueError(f"batch_cost_per_token models sampling, speculative and mtad, not {decoder!r}")
    return (draft + tv) / (B * tokens_per_iteration) + prefill


def speculation_stops_paying(profile: Profile, decoder: str, tokens_per_iteration: float, gamma: int = 4,
                             W: int = 4, max_batch: int = 256, prompt_tokens: int = 0,
                             new_tokens: int = 0) -> int | None:
    """The smallest batch width B <= ``max_batch`` at which ``decoder`` is predicted to cost at least as much per
    token as sampling (None: it pays at every width up to ``max_batch``; 1: it never pays)."""
    for B in range(1, max_batch + 1):
        if batch_cost_per_token(profile, decoder, B, gamma, W, tokens_per_iteration, prompt_tokens, new_tokens) >= \
                batch_cost_per_token(profile, "sampling", B, gamma, W, 1.0, prompt_tokens, new_tokens):
            return B
    return None

"""The one result record every decoder returns (ALGORITHMS.md, "Every decoder works on one prompt")."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeResult:
    """What one ``generate`` call produced and what it cost.

    tokens:            generated ids only (prompt excluded); EOS kept if hit, nothing after it.
    stop_reason:       "eos" or "max_new_tokens".
    target_forwards:   target forward passes during the decode (prefill counted).
    draft_forwards:    draft forward passes during the decode (prefill counted).
    accepted:          accepted draft length per iteration (speculative family; empty otherwise).
    proposed:          draft tokens proposed per iteration (gamma, or fewer near max_new_tokens).
    position_accepts:  per draft position j=1..gamma, how many iterations accepted position j.
    position_proposals: per draft position j, how many iterations proposed a token at position j.
    wall_time_s:       wall time of the decode alone (synchronised on GPU).
    forward_time_s:    time spent inside model forward passes (for the overhead benchmark).
    calls:             forward shapes, "<role>:<seq|tree>:<rows>x<new tokens>" -> count (mtad.measure.costmodel).
    cpu_time_s:        CPU seconds of the decode (this process, every thread): unlike wall time, barely moved by
                       other processes on a shared machine; with one thread (``num_threads=1``), the wall time
                       of a quiet machine (with more, idle OpenMP workers spinning count too).
    call_cpu_s:        CPU seconds of the forwards of each shape in ``calls`` (the simulator's cost profile).
    """

    tokens: list[int] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"
    target_forwards: int = 0
    draft_forwards: int = 0
    accepted: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)
    position_accepts: list[int] = field(default_factory=list)
    position_proposals: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    forward_time_s: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    cpu_time_s: float = 0.0
    call_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def block_efficiency(self) -> float:
        """Generated tokens per target forward pass (prefill excluded from neither: see METRICS)."""
        return self.num_tokens / max(self.target_forwards, 1)

    @property
    def acceptance_rate(self) -> float | None:
        total = sum(self.proposed)
        return sum(self.accepted) / total if total else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(num_tokens=self.num_tokens, block_efficiency=self.block_efficiency,
                 acceptance_rate=self.acceptance_rate)
        return d


@dataclass
class Stats:
    """Forward counts and time inside model forwards, shared by the sessions of one call."""

    target_forwards: int = 0
    draft_forwards: int = 0
    forward_time_s: float = 0.0
    accepted: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)
    position_accepts: list[int] = field(default_factory=list)
    position_proposals: list[int] = field(default_factory=list)
    # forward shapes for the cost model (mtad.measure.costmodel): "<role>:<seq|tree>:<rows>x<new tokens>" -> count
    calls: dict[str, int] = field(default_factory=dict)
    call_cpu_s: dict[str, float] = field(default_factory=dict)  # the same keys -> CPU seconds of those calls

    def count_call(self, role: str, kind: str, rows: int, new: int, cpu_s: float = 0.0) -> None:
        key = f"{role}:{kind}:{rows}x{new}"
        self.calls[key] = self.calls.get(key, 0) + 1
        self.call_cpu_s[key] = self.call_cpu_s.get(key, 0.0) + cpu_s

    def record(self, proposed: int, accepted: int) -> None:
        """One speculative iteration: ``proposed`` draft positions, the first ``accepted`` of them kept."""
        self.proposed.append(proposed)
        self.accepted.append(accepted)
        for store in (self.position_accepts, self.position_proposals):
            store.extend([0] * (proposed - len(store)))
        for j in range(proposed):
            self.position_proposals[j] += 1
            self.position_accepts[j] += j < accepted

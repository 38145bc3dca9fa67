"""Decoder parameters: one frozen dataclass for every strategy, validated on construction.

The same instance drives the draft's and the target's warping (STYLE.md, "State"), so the two models are
always filtered identically. Paper defaults (ALGORITHMS.md, Notation): T=1, top_k=10, top_p=0.9, gamma=4,
W=4, tau=0.5, sampling with replacement in the beam step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional

from mtad._util.cfg import field_values


@dataclass(frozen=True)
class DecoderConfig:
    name: str = "greedy"
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 10  # 0 = keep all
    top_p: float = 0.9
    gamma: int = 4  # draft block length (also MTJD block length)
    beam_width: int = 4  # W
    tau: float = 0.5
    replacement: bool = True  # beam step draws (beam, token) pairs with replacement
    accept: str = "lossless"  # speculative: lossless | threshold
    mode: str = "beam"  # mtjd: exhaustive | beam
    select: str = "argmax"  # mtjd exhaustive: argmax | nucleus
    block_top_p: float = 0.9  # mtjd exhaustive/nucleus: joint mass kept
    node_budget: int = 4096  # mtjd exhaustive: refuse trees larger than this
    reference: str = "max"  # mmtad: max (R_d = best draft joint at depth d) | own
    k_config: List[int] = field(default_factory=lambda: [4, 2, 2])  # specinfer static tree
    eos_token_id: Optional[int] = None  # None: take it from the target's generation_config

    def __post_init__(self) -> None:
        def bad(param: str, allowed: str) -> None:
            raise ValueError(f"decoder.{param}={getattr(self, param)!r} is out of range: allowed {allowed}")

        if self.max_new_tokens < 1:
            bad("max_new_tokens", "an integer >= 1")
        if self.temperature < 0:
            bad("temperature", "T >= 0 (0 means greedy argmax)")
        if self.top_k < 0:
            bad("top_k", "an integer >= 0 (0 keeps the whole vocabulary)")
        if not 0 < self.top_p <= 1:
            bad("top_p", "0 < top_p <= 1")
        if self.gamma < 1:
            bad("gamma", "an integer >= 1")
        if self.beam_width < 1:
            bad("beam_width", "W >= 1")
        if not 0 < self.tau <= 1:
            bad("tau", "0 < tau <= 1")
        if self.accept not in ("lossless", "threshold"):
            bad("accept", "'lossless' or 'threshold'")
        if self.mode not in ("exhaustive", "beam"):
            bad("mode", "'exhaustive' or 'beam'")
        if self.select not in ("argmax", "nucleus"):
            bad("select", "'argmax' or 'nucleus'")
        if not 0 < self.block_top_p <= 1:
            bad("block_top_p", "0 < block_top_p <= 1")
        if self.node_budget < 1:
            bad("node_budget", "an integer >= 1")
        if self.reference not in ("max", "own"):
            bad("reference", "'max' or 'own'")
        if not self.k_config or any(int(k) < 1 for k in self.k_config):
            bad("k_config", "a non-empty list of branching factors, each >= 1, e.g. [4, 2, 2]")

    @classmethod
    def from_any(cls, cfg: "DecoderConfig | Mapping[str, Any] | None" = None, **overrides) -> "DecoderConfig":
        """Build from a dataclass, a dict or an OmegaConf node; unknown keys are an error naming the key."""
        base = field_values(cls, cfg, overrides, "decoder")
        if "k_config" in base:
            base["k_config"] = [int(k) for k in base["k_config"]]
        return cls(**base)


"""Decoder parameters: one frozen dataclass for every strategy, validated on construction.

The same instance drives the draft's and the target's warping (STYLE.md, "State"), so the two models are
always filtered identically. Paper defaults (ALGORITHMS.md, Notation): T=1, top_k=10, top_p=0.9, gamma=4,
W=4, tau=0.5, sampling with replacement in the beam step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional

from mtad._util.cfg import field_values
from mtad.decoding.propose import PROPOSERS
from mtad.decoding.rules import ACCEPT_RULES
from mtad.decoding.verifiers import DIVERGENCES

NGRAM_DECODERS = PROPOSERS["ngram"].decoders  # decoders that take proposer=ngram (one chain, no tree)
# proposer=draft names the pair's draft model, which each drafted decoder drafts from by its own step (speculative:
# the proposer's chain; mtad: beam sampling, ALGORITHMS.md §5 step 1; mmtad, specinfer: trees). Only these decoders
# draft with another model-based proposer's own chain; any other would swap it for its own step (recording and
# hashing a proposer that never ran), so it is refused.
OWN_DRAFT = "draft"
MODEL_PROPOSER_DECODERS = ("speculative",)
DYNTREE_ACCEPT = ("lossless", "joint")  # dyntree's rules on its tree (ALGORITHMS.md §8), not the chain table's
FINITE_RANGES = {"temperature": "T >= 0", "top_p": "0 < top_p <= 1", "tau": "0 < tau <= 1",
                 "typical_threshold": "0 <= typical_threshold <= 1", "typical_alpha": "typical_alpha >= 0",
                 "block_top_p": "0 < block_top_p <= 1"}
# Below these a value underflows in float32 arithmetic (logits / T overflows; a probability rounds to 0) and the
# decode ends in NaN after the model has loaded: refused up front (docs/RUNNING.md, "When something is wrong").
MIN_TEMPERATURE = 1e-6  # T is 0 (greedy) or at least this
MIN_PROBABILITY = 1e-30  # top_p, block_top_p are at least this (a nucleus below it keeps nothing)


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
    accept: str = "lossless"  # speculative: lossless | threshold | block | typical | fuzzy (VERIFIERS.md §1-§3);
    # dyntree: lossless | joint (ALGORITHMS.md §8)
    proposer: str = "draft"  # speculative, mtad: draft (the draft model) | ngram (prompt lookup, VERIFIERS.md §4)
    ngram_max: int = 2  # proposer=ngram: longest n-gram matched (HF's max_matching_ngram_size)
    typical_threshold: float = 0.09  # accept=typical: epsilon, Medusa's posterior_threshold
    typical_alpha: float = 0.3  # accept=typical: delta, Medusa's posterior_alpha
    fuzzy_divergence: str = "js"  # accept=fuzzy: js | kl (draft || target) | tv, on the filtered p, q
    fuzzy_threshold: float = 0.4  # accept=fuzzy: accept while the divergence is <= this (FSD's README, with js)
    mode: str = "beam"  # mtjd: exhaustive | beam
    select: str = "argmax"  # mtjd exhaustive: argmax | nucleus
    block_top_p: float = 0.9  # mtjd exhaustive/nucleus: joint mass kept
    node_budget: int = 4096  # mtjd exhaustive: refuse trees larger than this
    reference: str = "max"  # mmtad: max (R_d = best draft joint at depth d) | own
    k_config: List[int] = field(default_factory=lambda: [4, 2, 2])  # specinfer static tree
    tree_width: int = 4  # dyntree: nodes expanded per depth, and children per expanded node
    tree_nodes: int = 16  # dyntree: the best nodes kept (by cumulative draft probability) and verified
    eos_token_id: Optional[int] = None  # None: take it from the target's generation_config

    def __post_init__(self) -> None:
        def bad(param: str, allowed: str) -> None:
            raise ValueError(f"decoder.{param}={getattr(self, param)!r} is out of range: allowed {allowed}")

        for key in ("temperature", "top_p", "tau", "typical_threshold", "typical_alpha", "block_top_p"):
            if not math.isfinite(getattr(self, key)):  # nan/inf pass every comparison below or break later
                bad(key, "a finite number (" + FINITE_RANGES[key] + ")")
        if math.isnan(self.fuzzy_threshold):
            bad("fuzzy_threshold", "fuzzy_threshold >= 0 (inf accepts every draft token)")
        if self.eos_token_id is not None and self.eos_token_id < 0:
            bad("eos_token_id", "null (the target's own) or a token id >= 0")
        if self.max_new_tokens < 1:
            bad("max_new_tokens", "an integer >= 1")
        if self.temperature < 0 or 0 < self.temperature < MIN_TEMPERATURE:
            bad("temperature", f"T >= 0: 0 (greedy argmax) or at least {MIN_TEMPERATURE:g} (a smaller T overflows "
                               "float32 logits)")
        for key in ("top_p", "block_top_p"):
            if 0 < getattr(self, key) < MIN_PROBABILITY:
                bad(key, f"{key} >= {MIN_PROBABILITY:g} (smaller values round to 0 in float32; top_k=1 keeps one "
                         "token)")
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
        accepts = DYNTREE_ACCEPT if self.name == "dyntree" else ACCEPT_RULES
        if self.accept not in accepts:
            bad("accept", " | ".join(accepts) + (" (with decoder=dyntree)" if self.name == "dyntree" else ""))
        if self.proposer not in PROPOSERS:
            bad("proposer", " or ".join(f"'{p}'" for p in PROPOSERS))
        takers = PROPOSERS[self.proposer].decoders
        if takers is not None and self.name not in takers:
            bad("proposer", f"'draft' with decoder={self.name} ('{self.proposer}' only with decoder="
                            f"{' or '.join(takers)})")
        if PROPOSERS[self.proposer].model and self.proposer != OWN_DRAFT and self.name not in MODEL_PROPOSER_DECODERS:
            takers = " or ".join(f"decoder={d}" for d in MODEL_PROPOSER_DECODERS)
            raise ValueError(f"decoder.proposer={self.proposer!r} is not used by decoder={self.name}, so the row would "
                             f"record a proposer that never ran: only {takers} drafts a model-based proposer's own "
                             f"chain (the others draft from the draft model by their own step, which proposer="
                             f"{OWN_DRAFT} names, or not at all); use proposer={OWN_DRAFT}, or {takers}")
        if self.ngram_max < 1:
            bad("ngram_max", "an integer >= 1")
        if not 0 <= self.typical_threshold <= 1:
            bad("typical_threshold", "0 <= typical_threshold <= 1")
        if not 0 <= self.typical_alpha < math.inf:
            bad("typical_alpha", "a finite typical_alpha >= 0")
        if self.fuzzy_divergence not in DIVERGENCES:
            bad("fuzzy_divergence", " | ".join(DIVERGENCES))
        if not self.fuzzy_threshold >= 0:
            bad("fuzzy_threshold", "fuzzy_threshold >= 0 (inf accepts every draft token)")
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
        if self.tree_width < 1:
            bad("tree_width", "an integer >= 1 (nodes expanded per depth, children per node)")
        if self.tree_nodes < 1:
            bad("tree_nodes", "an integer >= 1 (tree nodes verified)")

    @classmethod
    def from_any(cls, cfg: "DecoderConfig | Mapping[str, Any] | None" = None, **overrides) -> "DecoderConfig":
        """Build from a dataclass, a dict or an OmegaConf node; unknown keys are an error naming the key."""
        base = field_values(cls, cfg, overrides, "decoder")
        if "k_config" in base:
            base["k_config"] = [int(k) for k in base["k_config"]]
        return cls(**base)


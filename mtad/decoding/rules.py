"""The accept-rule table: every verification rule of a drafted chain, by name (ALGORITHMS.md §3, §5, §7;
VERIFIERS.md §1-§3). The decoders (``speculative``'s ``accept``, ``mtad``'s joint rule) and the verifier study
(:mod:`mtad.study.verifiers`) judge through this one table, so a rule is named, parametrised and dispatched
in one place. The rules themselves stay pure functions in :mod:`mtad.decoding.accept` and
:mod:`mtad.decoding.verifiers`.

A rule's ``judge(p, q, x, u, cfg) -> (n accepted, law of the token after them)`` takes p (K+1, V) and q (K, V),
both filtered, x (K,) the drafted tokens, u (K,) uniforms (None for the rules that draw none) and the
:class:`mtad.decoding.config.DecoderConfig` holding its parameters (``keys``). The ``mtad`` joint rule reads
q only at the drafted tokens, so it also takes q as (K,) = q̃(x̂_j) (beam sampling keeps nothing else).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from mtad.decoding.accept import mtad_accept, speculative_accept, threshold_accept
from mtad.decoding.verifiers import block_accept, fuzzy_accept, typical_accept

Verdict = tuple[int, torch.Tensor]  # (n accepted, law of the next token (V,))


@dataclass(frozen=True)
class AcceptRule:
    name: str
    judge: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor], Any], Verdict]
    keys: tuple[str, ...] = ()  # decoder config keys the rule reads
    lossless: bool = False  # the committed text has exactly the target's law
    uniforms: bool = False  # judges with K uniforms u
    accept: bool = True  # a value of ``decoder.accept`` (speculative); False: a decoder's own rule (mtad)


def _joint(p, q, x, u, cfg) -> Verdict:
    """MTAD's joint rule (ALGORITHMS.md §5 step 3): the longest prefix with Σ log p̃/q̃ > log tau, next from p̃."""
    j = torch.arange(x.shape[0], device=p.device)
    q_x = q if q.dim() == 1 else q[j, x]  # (K,)
    a = mtad_accept(p[j, x].log(), q_x.log(), cfg.tau)
    return a, p[a]


RULES: dict[str, AcceptRule] = {r.name: r for r in (
    AcceptRule("lossless", lambda p, q, x, u, cfg: speculative_accept(p, q, x, u), lossless=True, uniforms=True),
    AcceptRule("threshold", lambda p, q, x, u, cfg: threshold_accept(p, q, x, cfg.tau), keys=("tau",)),
    AcceptRule("block", lambda p, q, x, u, cfg: block_accept(p, q, x, u), lossless=True, uniforms=True),
    AcceptRule("typical", lambda p, q, x, u, cfg: typical_accept(p, x, cfg.typical_threshold, cfg.typical_alpha),
               keys=("typical_threshold", "typical_alpha")),
    AcceptRule("fuzzy", lambda p, q, x, u, cfg: fuzzy_accept(p, q, x, cfg.fuzzy_threshold, cfg.fuzzy_divergence),
               keys=("fuzzy_threshold", "fuzzy_divergence")),
    AcceptRule("mtad", _joint, keys=("tau",), accept=False),
)}
ACCEPT_RULES = tuple(name for name, r in RULES.items() if r.accept)  # the values of decoder.accept

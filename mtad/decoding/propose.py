"""The proposer registry: what drafts a chain of tokens for ``speculative`` and ``mtad`` (``decoder.proposer``).

A :class:`Proposer` says whether it drafts with the pair's draft model (``model``: the runner loads and
fingerprints the draft only then, :func:`mtad.decoding.core.needs_draft`), which decoder keys it reads, which
decoders take it, and how it drafts a chain for the rows of a batch (``rows``; a batch of one is one prompt).
``mtad`` with the draft model proposes by beam sampling instead (ALGORITHMS.md §5 step 1), its own draft step.

- ``draft``: K tokens x̂_j ~ q̃ from the draft model, autoregressively (ALGORITHMS.md §3 step 1);
- ``ngram``: prompt lookup over the committed text, a deterministic draft with one-hot q (VERIFIERS.md §4).

Adding a proposer is one entry here (and its decoders' tests).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from mtad.decoding.filter import Top, dense, draw
from mtad.decoding.ngram import NgramLookup


def draft_chain(draft, batch, K: int, rng: torch.Generator) -> tuple[list[int], torch.Tensor]:
    """:func:`draft_rows` for a batch of one: K tokens and q̃_1..K (K, V). The verifier study's draw
    (:mod:`mtad.study.verifiers`)."""
    x, q = draft_rows(draft, batch, [K], rng)
    return x[0], q[0]  # (K, V)


def draft_rows(draft, batch, K: list[int], rng: torch.Generator) -> tuple[list[list[int]], torch.Tensor]:
    """K tokens x̂_j ~ q̃ autoregressively for every row at once: max(K) draft passes; row b keeps its first K[b].
    Returns the tokens per row and q̃ (B, max K, V)."""
    ids, x, q = batch.pending(draft), [], []
    for _ in range(max(K)):
        law = batch.law(draft.forward(ids)[:, -1])  # (B, V), or its top-k support
        q.append(dense(law))  # (B, V)
        x.append(law.draw(rng) if isinstance(law, Top) else draw(law, rng))  # (B, 1): one draw per row
        ids = x[-1].tolist()
    if not q:
        return [[] for _ in K], torch.zeros(len(K), 0, 1, device=batch.device)
    x = torch.cat(x, 1).tolist()  # (B, max K)
    return [row[:k] for row, k in zip(x, K)], torch.stack(q, 1)  # (B, max K, V)


def ngram_rows(lookup: dict, runs, K: list[int], V: int, device) -> tuple[list[list[int]], torch.Tensor]:
    """Up to K[b] prompt-lookup tokens per row (none when nothing matches; ``lookup``: id(run) -> its table)
    and their one-hot q (B, max K', V), VERIFIERS.md §4."""
    x = [lookup[id(run)].propose(run.tokens, k) if k else [] for run, k in zip(runs, K)]
    q = torch.zeros(len(x), max(map(len, x)), V, device=device)  # (B, max K', V)
    for b, xb in enumerate(x):
        q[b, torch.arange(len(xb)), torch.tensor(xb, dtype=torch.long)] = 1.0
    return x, q


@dataclass(frozen=True)
class Proposer:
    name: str
    model: bool  # drafts with the pair's draft model (a draft session)
    keys: tuple[str, ...] = ()  # decoder config keys it reads
    decoders: Optional[tuple[str, ...]] = None  # the decoders that take it (None: every drafted decoder)
    table: Optional[Callable[[Any, set], Any]] = None  # (cfg, eos) -> one prompt's state (None: no state)
    # (states by id(run), draft rows, batch, runs, K per row, rng, V) -> (x per row, q (B, max K', V))
    rows: Callable[..., tuple[list[list[int]], torch.Tensor]] = None  # type: ignore[assignment]

    def states(self, cfg, runs) -> dict | None:
        """One state per row of a batch (prompt-lookup tables), by id(run); None for a stateless proposer."""
        return None if self.table is None else {id(r): self.table(cfg, r.eos) for r in runs}


PROPOSERS: dict[str, Proposer] = {p.name: p for p in (
    Proposer("draft", model=True,
             rows=lambda states, draft, batch, runs, K, rng, V: draft_rows(draft, batch, K, rng)),
    Proposer("ngram", model=False, keys=("ngram_max",), decoders=("speculative", "mtad"),
             table=lambda cfg, eos: NgramLookup(cfg.ngram_max, eos),
             rows=lambda states, draft, batch, runs, K, rng, V: ngram_rows(states, runs, K, V, batch.device)),
)}

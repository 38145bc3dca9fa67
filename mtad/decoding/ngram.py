"""The draft-free proposer ``proposer: ngram``: prompt lookup over the committed text (VERIFIERS.md §4).

No model and no cache: the committed text (prompt + generated so far) is indexed in one table per n-gram
length n = 1..``max_n``, each mapping an n-gram to its earliest start, and the tables grow with every
committed token (ANPD's online multi-level tables). A proposal backs off from the longest n-gram ending the
text to the shortest; the first level whose last n-gram occurred earlier proposes the up to K tokens that
followed that earliest occurrence (Hugging Face's ``PromptLookupCandidateGenerator``), cut before the first
EOS. No match proposes nothing, and the decoder takes an ordinary target step. **[choice]** the continuation
is copied from the earliest occurrence (HF), not ANPD's most frequent next token per level.

A proposal is deterministic, so its q is one-hot: verified by ``speculative`` it is lossless (VERIFIERS.md
§4: accept with probability p(x), residual = p without x); under ``mtad`` the joint rule tests the target's
joint probability of the prefix.
"""
from __future__ import annotations


class NgramLookup:
    """Prompt lookup with multi-level back-off over one call's committed text."""

    def __init__(self, max_n: int, eos: set[int] = frozenset()):
        self.max_n, self.eos = max_n, eos
        self.first: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n)]  # [n - 1]: n-gram -> start
        self.indexed = 0  # tokens of the text indexed so far

    def update(self, text: list[int]) -> None:
        """Index the n-grams that end at the tokens committed since the last call (the text only grows)."""
        for end in range(self.indexed, len(text)):
            for n in range(1, min(self.max_n, end + 1) + 1):
                self.first[n - 1].setdefault(tuple(text[end - n + 1:end + 1]), end - n + 1)
        self.indexed = len(text)

    def propose(self, text: list[int], K: int) -> list[int]:
        """Up to K tokens that followed the earliest earlier occurrence of the longest matching n-gram."""
        self.update(text)
        L = len(text)
        for n in range(min(self.max_n, L - 1), 0, -1):
            s = self.first[n - 1].get(tuple(text[L - n:]))
            if s is not None and s + n < L:  # the earliest occurrence is not the text's own end
                draft = text[s + n:min(s + n + K, L)]
                return next((draft[:i] for i, t in enumerate(draft) if t in self.eos), draft)
        return []

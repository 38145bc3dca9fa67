"""The target/draft model pair that every decoder receives."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class ModelPair:
    """A loaded target model `p`, an optional draft model `q`, and their shared tokenizer.

    Decoders only read ``target`` and ``draft``; caches live per ``generate`` call, never here.
    """

    target: Any
    draft: Any | None = None
    tokenizer: Any | None = None
    name: str = "unnamed"
    info: dict = field(default_factory=dict)  # free-form facts for result rows (ids, dtypes, devices)

    @property
    def device(self):
        return next(self.target.parameters()).device

    def without_draft(self) -> "ModelPair":
        """The same loaded target and tokenizer with no draft (a draft-free proposer's view of the pair): what
        ``load_pair`` gives for the config with ``draft=None``, without loading the target again."""
        info = {**self.info, "draft": None, "draft_params": 0, "draft_own_params": 0}
        if "draft_head" in info:
            info["draft_head"] = "full"
        return replace(self, draft=None, info=info)

"""The target/draft model pair that every decoder receives."""
from __future__ import annotations

from dataclasses import dataclass, field
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

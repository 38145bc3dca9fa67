"""One helper shared by the frozen config dataclasses (decoder, model): build from anything, strictly."""
from __future__ import annotations

from dataclasses import fields
from typing import Any


def plain(cfg: Any) -> Any:
    """An OmegaConf node as plain containers (interpolations resolved); anything else unchanged."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def field_values(cls: type, cfg: Any, overrides: dict, group: str) -> dict:
    """Field values for ``cls`` from an instance, a mapping or an OmegaConf node, with ``overrides`` on top;
    an unknown key is a ValueError naming it and listing the valid ones."""
    known = [f.name for f in fields(cls)]
    base = {k: getattr(cfg, k) for k in known} if isinstance(cfg, cls) else dict(plain(cfg) or {})
    base.update(overrides)
    unknown = sorted(set(base) - set(known))
    if unknown:
        raise ValueError(f"unknown {group} key(s) {unknown}; valid keys: {sorted(known)}")
    return base

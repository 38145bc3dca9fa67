"""Default locations; every one can be overridden by config or environment, none is absolute."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_data_dir() -> Path:
    """``$MTAD_DATA_DIR``, else ``../shared/data`` beside the repository (where CI lays it)."""
    env = os.environ.get("MTAD_DATA_DIR")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data")


def cache_dir() -> Path:
    """``$MTAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/mtad`` (``~/.cache/mtad``): converted weights live here."""
    env = os.environ.get("MTAD_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mtad"


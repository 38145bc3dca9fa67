"""Default locations; every one can be overridden by config or environment, none is absolute."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


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


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes (as stored, so a .gz file is hashed compressed), read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()

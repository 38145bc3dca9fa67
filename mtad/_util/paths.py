"""Default locations; every one can be overridden by config or environment, none is absolute."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the repository when it lies inside it, else as given: a location recorded in a
    result (a run's ``results_dir``) then holds no machine's absolute path and travels with the checkout."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def recorded_path(path: str | Path) -> str:
    """``path`` as a result or a command records it: as given when relative, relative to the repository when it lies
    inside it, else ``.../<name>``: no machine's absolute path is written into what the repository ships."""
    if not os.path.isabs(path):
        return str(path)
    rel = repo_relative(path)
    return rel if not os.path.isabs(rel) else f".../{Path(path).name}"


def recorded_command(argv: list[str]) -> list[str]:
    """Command-line arguments with every absolute path (an argument, or the value of ``key=value``) as
    :func:`recorded_path` writes it."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        out.append(f"{key}={recorded_path(value)}" if eq and os.path.isabs(value) else recorded_path(arg))
    return out


def default_data_dir() -> Path:
    """``$MTAD_DATA_DIR``, else ``../shared/data`` beside the repository (where CI lays it)."""
    env = os.environ.get("MTAD_DATA_DIR")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data")


def cache_dir() -> Path:
    """``$MTAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/mtad`` (``~/.cache/mtad``): converted weights live here.
    NotADirectoryError (one line naming the variable) when that path, or a folder above it, is a file."""
    env = os.environ.get("MTAD_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    path = Path(env) if env else (Path(xdg) if xdg else Path.home() / ".cache") / "mtad"
    probe = path
    while not os.path.exists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        var = "MTAD_CACHE_DIR" if env else "XDG_CACHE_HOME" if xdg else "HOME"
        raise NotADirectoryError(f"the cache folder {path} cannot be used: {probe} is a file, not a folder; set "
                                 f"{var} (MTAD_CACHE_DIR for mtad alone) to a folder")
    return path


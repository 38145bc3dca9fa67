"""Experiment tracking: W&B or nothing (STYLE.md, "Results").

The local result row is the record; W&B is a mirror. Every W&B call goes through ``_guard``: a W&B failure
(no network, bad key, a bug in wandb) logs a warning, turns the tracker into a no-op, and never raises into
the runner. The run summary is the result row flattened (``metrics.ms_per_token``), the same dict that
``results.append_row`` writes.

Runner usage::

    tracker = make_tracker(cfg.tracking, run_dir)
    tracker.start(resolved_config, name=run_name)
    tracker.log_samples(sample_rows)
    tracker.finish(row.to_dict(), result_file)
"""
from __future__ import annotations

import functools
import json
import logging
import netrc
import os
import re
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional

from mtad.harness.rows import flatten_dict

log = logging.getLogger(__name__)

BACKENDS = ("none", "wandb")
MODES = ("online", "offline", "disabled")
INIT_SLACK_S = 2.0  # importing wandb and starting its service, on top of tracking.init_timeout_s


@dataclass(frozen=True)
class TrackingConfig:
    """Config group ``tracking/``. ``mode: null`` picks "online" when a W&B API key is configured
    (``WANDB_API_KEY`` or a netrc entry for the W&B host) and "offline" otherwise; a ``WANDB_MODE``
    environment variable, when set, wins over that guess. ``dir: null`` puts W&B files in the run directory.
    ``init_timeout_s`` bounds ``wandb.init`` (an unreachable server): after it (plus ``INIT_SLACK_S`` for
    importing wandb) the run goes on untracked and its local row is written as always. The bound is ours,
    not only W&B's setting, whose retries may run past it."""

    backend: str = "none"
    project: str = "mtad"
    entity: Optional[str] = None
    mode: Optional[str] = None
    dir: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    group: Optional[str] = None
    init_timeout_s: float = 15.0  # online: give up on an unreachable server after this (W&B's own: 90)

    def __post_init__(self) -> None:
        if not 0 < self.init_timeout_s < float("inf"):  # nan too
            raise ValueError(f"tracking.init_timeout_s={self.init_timeout_s!r} is out of range: a finite number "
                             "of seconds > 0")
        if self.backend not in BACKENDS:
            raise ValueError(f"tracking.backend={self.backend!r} is not one of {list(BACKENDS)}")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"tracking.mode={self.mode!r} is not one of {list(MODES)} (or null for auto)")

    @classmethod
    def from_any(cls, cfg: "TrackingConfig | Mapping[str, Any] | None" = None) -> "TrackingConfig":
        """From a dataclass, a dict or an OmegaConf node; unknown keys are an error naming the key."""
        if isinstance(cfg, TrackingConfig):
            return cfg
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            pass
        d = dict(cfg or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown tracking key(s) {unknown}; valid keys: {sorted(known)}")
        if d.get("tags") is not None:
            d["tags"] = [str(t) for t in d["tags"]]
        return cls(**d)


def _wandb_host(env: Mapping[str, str]) -> str:
    base = env.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    return re.sub(r"^https?://", "", base).split("/")[0].split(":")[0]


def has_api_key(env: Mapping[str, str] | None = None) -> bool:
    """``WANDB_API_KEY`` is set, or ``$NETRC`` / ``~/.netrc`` has an entry for the W&B host."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return True
    netrc_file = Path(env["NETRC"]) if env.get("NETRC") else Path.home() / ".netrc"
    try:
        return netrc.netrc(str(netrc_file)).authenticators(_wandb_host(env)) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: Optional[str], env: Mapping[str, str] | None = None) -> str:
    """An explicit mode, else ``$WANDB_MODE``, else "online" with an API key and "offline" without."""
    env = os.environ if env is None else env
    if mode is not None:
        return mode
    if env.get("WANDB_MODE") in MODES:
        return env["WANDB_MODE"]
    return "online" if has_api_key(env) else "offline"


class Tracker:
    """The interface the runner calls; this base class (``NoneTracker``) records nothing."""

    def start(self, resolved_config: dict, name: str) -> None:
        pass

    def log_samples(self, rows: list[dict]) -> None:
        pass

    def finish(self, row: Optional[dict] = None, result_file: Path | str | None = None,
               exit_code: int = 0) -> None:
        pass


class NoneTracker(Tracker):
    """``tracking.backend: none``."""


def _guard(method: Callable) -> Callable:
    """Run a W&B call; on any error warn, drop the run, and return None (the local row is never lost)."""

    @functools.wraps(method)
    def wrapper(self: "WandbTracker", *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - W&B must never take a run down
            log.warning("W&B %s failed, tracking disabled for this run (local results unaffected): %s: %s",
                        method.__name__, type(exc).__name__, exc)
            self.broken = True
            self._close_quietly()
            return None

    return wrapper


class WandbTracker(Tracker):
    """``tracking.backend: wandb``: one W&B run per experiment run."""

    def __init__(self, cfg: TrackingConfig, run_dir: Path | str):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.mode = resolve_mode(cfg.mode)
        self.run: Any = None
        self.broken = False

    @_guard
    def start(self, resolved_config: dict, name: str) -> None:
        wandb_dir = Path(self.cfg.dir) if self.cfg.dir else self.run_dir
        wandb_dir.mkdir(parents=True, exist_ok=True)
        kwargs = dict(project=self.cfg.project, entity=self.cfg.entity, mode=self.mode, dir=str(wandb_dir),
                      name=name, group=self.cfg.group, tags=list(self.cfg.tags) or None, config=dict(resolved_config),
                      reinit="finish_previous")
        self.run = _bounded_init(kwargs, float(self.cfg.init_timeout_s))
        log.info("W&B run %s (%s) in %s", name, self.mode, wandb_dir)

    @_guard
    def log_samples(self, rows: list[dict]) -> None:
        if self.run is None or not rows:
            return
        import wandb

        columns = list(dict.fromkeys(k for r in rows for k in r))
        data = [[_cell(r.get(c)) for c in columns] for r in rows]
        self.run.log({"samples": wandb.Table(columns=columns, data=data, allow_mixed_types=True)})

    @_guard
    def finish(self, row: Optional[dict] = None, result_file: Path | str | None = None,
               exit_code: int = 0) -> None:
        if self.run is None:
            return
        import wandb

        if row:
            self.run.summary.update(flatten_dict(row))
        if result_file is not None and Path(result_file).is_file():
            stem = (row or {}).get("experiment") or Path(result_file).stem
            artifact = wandb.Artifact(name=_artifact_name(f"results-{stem}"), type="results")
            artifact.add_file(str(result_file))
            self.run.log_artifact(artifact)
        run, self.run = self.run, None
        run.finish(exit_code=exit_code)

    def _close_quietly(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001 - already failing; nothing more to report
                pass


def _bounded_init(kwargs: dict, timeout_s: float) -> Any:
    """``wandb.init(**kwargs)`` in a thread, waited for ``timeout_s + INIT_SLACK_S`` at most: past that a
    TimeoutError (the thread is left behind; a run it starts late is finished at once)."""
    box: dict = {}
    lock = threading.Lock()

    def init() -> None:
        try:
            import wandb  # heavy optional dependency: only W&B tracking needs it

            run = wandb.init(**kwargs, settings=wandb.Settings(init_timeout=timeout_s))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
            return
        with lock:
            box["run"] = run
            late = box.get("abandoned", False)
        if late:
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001 - nobody is waiting for this run any more
                pass

    thread = threading.Thread(target=init, name="mtad-wandb-init", daemon=True)
    thread.start()
    thread.join(timeout_s + INIT_SLACK_S)
    with lock:
        if "run" not in box and "error" not in box:
            box["abandoned"] = True
            raise TimeoutError(f"W&B did not start within {timeout_s:g} s (tracking.init_timeout_s) plus "
                               f"{INIT_SLACK_S:g} s")
    if "error" in box:
        raise box["error"]
    return box["run"]


def _cell(v: Any) -> Any:
    """Table cells are scalars; lists and dicts become JSON text."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return json.dumps(v, default=str)


def _artifact_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:128]


def make_tracker(cfg: TrackingConfig | Mapping[str, Any] | None, run_dir: Path | str) -> Tracker:
    """The tracker named by ``cfg.backend``; ``None`` or backend "none" gives a ``NoneTracker``."""
    cfg = TrackingConfig.from_any(cfg)
    if cfg.backend == "none":
        return NoneTracker()
    return WandbTracker(cfg, run_dir)

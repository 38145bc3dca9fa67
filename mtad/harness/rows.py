"""The result row: one run in ``results/<experiment>.jsonl``, one versioned schema (STYLE.md, "Results").

- ``ResultRow``: the schema (``SCHEMA_VERSION``). The same dict goes to the W&B run summary.
- ``config_hash``: sha256 of the canonical JSON of the resolved config minus volatile keys, so a rerun of
  the same settings is recognised (``mtad.harness.store.existing_hashes``) whatever the key order or output
  directory.
- Provenance: ``git_info`` (HEAD sha, dirty tree) and ``environment_info`` (versions, device, threads).
- Non-finite floats (NaN, inf) are never written: JSON has no such values, so every row and sample line
  must parse with a strict reader. ``to_json_line`` makes them ``null`` and lists them in the row's
  ``non_finite`` (``{"metrics.ppl_mean_logprob": "nan"}``) with a warning.
- ``flatten_dict``: a row as flat dotted columns (``metrics.ms_per_token``), for frames and W&B.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import platform
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from mtad._util.late import LATE_KEYS
from mtad._util.paths import REPO_ROOT
from mtad._util.version import __version__

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# Keys that change where or how a run is recorded, not what it measures.
VOLATILE_KEYS = ("results_dir", "force", "tracking", "hydra", "progress")  # progress: display only


@dataclass(frozen=True)
class ResultRow:
    """One run. ``metrics`` holds ``run_metrics`` + ``perplexity`` + the task score + energy."""

    run_id: str
    config_hash: str
    experiment: str
    timestamp: str  # UTC, ISO 8601
    git_sha: Optional[str]
    git_dirty: Optional[bool]
    versions: dict  # python, torch, transformers, mtad
    device_name: str  # CUDA device name(s), else the CPU model string
    num_threads: int  # torch intra-op threads
    seed: Optional[int]
    decoder: dict
    model: dict
    task: dict
    metrics: dict
    n_prompts: int  # prompts decoded and scored
    n_skipped: int
    skip_reasons: dict = field(default_factory=dict)  # reason -> count
    run_dir: Optional[str] = None
    non_finite: dict = field(default_factory=dict)  # dotted key -> "nan"/"inf"/"-inf", written as null
    schema_version: int = SCHEMA_VERSION
    # how the timings were taken (timing_info): interleaved with other configs or not, and the machine's load
    # average at the start and end of the run; None in rows written before it was recorded
    timing: Optional[dict] = None
    # set by the publish step (mtad.harness.publish): the publication, what was checked, any override's reason
    publication: Optional[dict] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ResultRow":
        check_version(d.get("schema_version"), "row")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown, missing = sorted(set(d) - names), sorted(n for n in names if n not in d
                                                          and _required(cls, n))
        if unknown or missing:
            raise ValueError(f"not a schema-{SCHEMA_VERSION} result row: unknown keys {unknown}, "
                             f"missing keys {missing}")
        return cls(**dict(d))

    @classmethod
    def build(cls, cfg: Mapping[str, Any], *, experiment: str, metrics: dict, decoder: Mapping,
              model: Mapping, task: Mapping, seed: Optional[int], n_prompts: int,
              skip_reasons: Mapping[str, int] | None = None, run_dir: str | Path | None = None,
              devices: Iterable[Any] = (), repo_root: str | Path | None = None,
              run_id: Optional[str] = None) -> "ResultRow":
        """Fill the bookkeeping fields (hash, time, git, versions, device) around a run's numbers.
        ``cfg`` is the resolved config (dict or DictConfig); ``devices`` the torch devices the models use."""
        sha, dirty = git_info(repo_root if repo_root is not None else REPO_ROOT)
        now = datetime.now(timezone.utc)
        skips = {str(k): int(v) for k, v in (skip_reasons or {}).items()}
        return cls(
            run_id=run_id or f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}",
            config_hash=config_hash(cfg), experiment=experiment,
            timestamp=now.isoformat(timespec="seconds"), git_sha=sha, git_dirty=dirty,
            seed=seed, decoder=_plain(decoder), model=_plain(model), task=_plain(task),
            metrics=_plain(metrics), n_prompts=int(n_prompts), n_skipped=sum(skips.values()),
            skip_reasons=skips, run_dir=str(run_dir) if run_dir is not None else None,
            **environment_info(devices))


def _required(cls: type, name: str) -> bool:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def check_version(version: Any, where: str) -> None:
    """Fail, naming ``where``, on a row of another schema version."""
    if version != SCHEMA_VERSION:
        raise ValueError(f"{where} has schema_version={version!r}, this mtad reads version {SCHEMA_VERSION}: "
                         "load it with the mtad version that wrote it, or rerun the experiment")


# ---------------------------------------------------------------------------------------------- hashing
def _plain(obj: Any) -> Any:
    """Dataclass / DictConfig / Mapping -> plain JSON-able containers."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _drop(d: dict, dotted: str) -> None:
    head, _, rest = dotted.partition(".")
    if rest and isinstance(d.get(head), dict):
        _drop(d[head], rest)
    elif not rest:
        d.pop(head, None)


def canonical_config(cfg: Any, exclude: Iterable[str] = VOLATILE_KEYS) -> dict:
    """The resolved config as plain data minus ``exclude`` (top-level keys or dotted paths) and minus the
    decoder keys that were added later and hold their defaults (:func:`_drop_late_defaults`), with renamed
    pairs under their old names (:data:`RENAMED_PAIRS`)."""
    plain = _plain(cfg)
    if not isinstance(plain, dict):
        raise ValueError(f"config_hash needs a mapping config, got {type(cfg).__name__}")
    plain = json.loads(json.dumps(plain, default=_json_default))  # deep copy + normalise tuples, Paths
    for key in exclude:
        _drop(plain, key)
    _drop_late_defaults(plain)
    model = plain.get("model")
    if isinstance(model, dict) and model.get("name") in RENAMED_PAIRS:
        model["name"] = RENAMED_PAIRS[model["name"]]
    return plain


# Pairs renamed after rows were written: their configs hash under the old name, so the old rows still count
# as done. conf/model/smollm2_token.yaml was model=smollm2 until 2026-12-05 (now the best pair's alias).
RENAMED_PAIRS = {"smollm2_token": "smollm2"}


def _drop_late_defaults(plain: dict) -> None:
    """Leave out decoder and task keys added after rows were first written (``LATE_KEYS`` of
    :mod:`mtad._util.late`) while they hold their defaults: a config that does
    not use them hashes as before the keys existed, so its old row still counts as done; any other value is
    part of the hash."""
    for path, default in LATE_KEYS.items():
        group, key = path.split(".")
        node = plain.get(group)
        if isinstance(node, dict) and key in node and node[key] == default:
            del node[key]


def config_hash(cfg: Any, exclude: Iterable[str] = VOLATILE_KEYS) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no spaces) of ``canonical_config(cfg)``."""
    text = json.dumps(canonical_config(cfg, exclude), sort_keys=True, separators=(",", ":"),
                      default=_json_default)
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------------------------------ environment
# What runs write into the tree: changes there do not make the code that measured a row differ from its commit.
OUTPUT_PATHS = ("results", "outputs", "multirun")


def git_info(repo_root: str | Path) -> tuple[Optional[str], Optional[bool]]:
    """(HEAD sha, working tree dirty) of the repository whose top level is ``repo_root``; "dirty" means a
    change to a tracked file, or an untracked file, outside ``OUTPUT_PATHS`` (results, run outputs);
    (None, None) when it is not a git work tree (an installed package) or git is missing."""
    root = Path(repo_root).resolve()

    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root:
        return None, None
    sha = git("rev-parse", "HEAD")  # None in a repository with no commit yet
    status = git("status", "--porcelain", "--", ".", *(f":(exclude){p}" for p in OUTPUT_PATHS))
    return (sha.strip() if sha else None), (bool(status.strip()) if status is not None else None)


def machine_load() -> Optional[list[float]]:
    """The 1-, 5- and 15-minute load averages (``os.getloadavg``), rounded; None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def timing_info(load_start: Optional[list[float]], interleaved: bool) -> dict:
    """A row's ``timing``: whether the run was decoded interleaved with other configs (so its speed ratios
    against them are paired), the load average at its start and end, and the logical CPU count, so that a
    table can say how loaded the machine was while it was timed."""
    return {"interleaved": bool(interleaved), "load_start": load_start, "load_end": machine_load(),
            "cpus": os.cpu_count()}


def _version(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")  # a kernel interface; absent off Linux
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def environment_info(devices: Iterable[Any] = ()) -> dict:
    """``versions``, ``device_name`` and ``num_threads`` for a row. ``devices``: torch devices in use."""
    import torch  # heavy: rows are read and hashed (tracking, notebooks) without it

    mtad_version = _version("mtad")
    if mtad_version is None:
        mtad_version = __version__
    cuda = sorted({torch.device(d).index or 0 for d in devices if torch.device(d).type == "cuda"})
    names = [torch.cuda.get_device_name(i) for i in cuda] if cuda else []
    return {
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": _version("transformers"), "mtad": mtad_version,
                     "cuda": torch.version.cuda},
        "device_name": ", ".join(dict.fromkeys(names)) if names else _cpu_name(),
        "num_threads": torch.get_num_threads(),
    }


# ------------------------------------------------------------------------------------------- writing
def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} {obj!r} to a result row: convert it to a "
                    "number, string, list or dict first")


def finite(obj: Any, prefix: str = "") -> tuple[Any, dict[str, str]]:
    """``obj`` as plain JSON data with every NaN/inf float replaced by None, and ``{dotted key: "nan" |
    "inf" | "-inf"}`` of what was replaced: JSON has no NaN, and a row must parse with a strict reader."""
    if isinstance(obj, float):
        return (obj, {}) if math.isfinite(obj) else (None, {prefix or "value": str(obj)})
    if isinstance(obj, ResultRow) or (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        obj = dataclasses.asdict(obj)
    elif hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy / torch values
        obj = obj.tolist()
    if isinstance(obj, Mapping):
        out, bad = {}, {}
        for k, v in obj.items():
            out[k], sub = finite(v, f"{prefix}.{k}" if prefix else str(k))
            bad.update(sub)
        return out, bad
    if isinstance(obj, (list, tuple)):
        out_list, bad = [], {}
        for i, v in enumerate(obj):
            value, sub = finite(v, f"{prefix}.{i}" if prefix else str(i))
            out_list.append(value)
            bad.update(sub)
        return out_list, bad
    return obj, {}


def to_json_line(row: ResultRow | Mapping[str, Any]) -> str:
    """A row (or a sample) as one strict JSON line, newline included: NaN/inf become null, recorded under
    ``non_finite`` when ``row`` is a mapping."""
    plain, bad = finite(row)
    if bad and isinstance(plain, dict):
        log.warning("non-finite values written as null: %s", ", ".join(f"{k}={v}" for k, v in bad.items()))
        plain["non_finite"] = {**(plain.get("non_finite") or {}), **bad}
    return json.dumps(plain, default=_json_default, ensure_ascii=False, allow_nan=False) + "\n"


# ------------------------------------------------------------------------------------------- columns
def flatten_dict(d: Mapping[str, Any], sep: str = ".", prefix: str = "") -> dict:
    """{"metrics": {"ms_per_token": 3}} -> {"metrics.ms_per_token": 3}; lists stay values."""
    out: dict = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten_dict(v, sep, key))
        else:
            out[key] = v
    return out


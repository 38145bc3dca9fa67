"""The typed root of the Hydra configuration (STYLE.md, "Configuration").

Each group's schema is owned by its module (``ModelConfig`` in :mod:`mtad.models.load`, ``DecoderConfig``
in :mod:`mtad.decoding.config`, ``TaskConfig`` in :mod:`mtad.tasks.base`, ``TrackingConfig`` in
:mod:`mtad.harness.tracking`); :class:`RunConfig` nests them and is stored in Hydra's ConfigStore as
``base_config``, so every YAML under ``conf/`` merges into a typed node: a misspelt key or a wrong value
type fails at compose time with a message naming the key.
"""
from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from mtad._util.io import temp_name
from mtad.decoding.config import DecoderConfig
from mtad.decoding.core import check_keys
from mtad.harness.store import sibling_names
from mtad.harness.tracking import TrackingConfig
from mtad.models.load import ModelConfig
from mtad.tasks.base import TaskConfig


def _schema(cls: type) -> type:
    """A mutable twin of a frozen config dataclass: OmegaConf makes frozen dataclasses read-only, which
    would forbid merging the group YAMLs into them. The twin has the same fields, types and defaults;
    values are validated when the runner builds the frozen class from the composed node."""
    specs = [(f.name, f.type, field(default=f.default) if f.default is not dataclasses.MISSING
              else field(default_factory=f.default_factory)) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__ + "Schema", specs, namespace={"__module__": cls.__module__})


ModelSchema, DecoderSchema, TaskSchema, TrackingSchema = map(
    _schema, (ModelConfig, DecoderConfig, TaskConfig, TrackingConfig))


@dataclass
class RunConfig:
    model: ModelSchema = field(default_factory=ModelSchema)  # type: ignore[valid-type]
    decoder: DecoderSchema = field(default_factory=DecoderSchema)  # type: ignore[valid-type]
    task: TaskSchema = field(default_factory=TaskSchema)  # type: ignore[valid-type]
    tracking: TrackingSchema = field(default_factory=TrackingSchema)  # type: ignore[valid-type]
    # results go to ${results_dir}/${experiment}.jsonl. Presets (conf/experiment/) set `experiment`; on the
    # command line `experiment=X` selects a preset (Hydra reads it as the group), so name ad-hoc runs with
    # `name=X`, which wins over `experiment`.
    experiment: str = "default"
    name: Optional[str] = None
    results_dir: str = "results"  # relative paths are relative to the launch directory
    seed: int = 0
    warmup: int = 1  # prompts decoded untimed before measuring (not recorded)
    num_threads: int = 0  # torch CPU threads; 0 leaves torch's default (batch-1 CPU decoding: try 1)
    perplexity: bool = True  # score outputs under the raw target (after the timed window)
    force: bool = False  # rerun even if a row with the same config hash exists
    save_samples: bool = True  # write samples.jsonl into the run directory
    progress: bool = True  # progress bar on stderr (shown only when stderr is a terminal)


# top-level numbers: (lowest value, the valid range in words)
RUN_RANGES = {"seed": (0, "an integer >= 0"), "warmup": (0, "an integer >= 0 (prompts decoded untimed first)"),
              "num_threads": (0, "an integer >= 0 (0 leaves torch's default; try 1)")}


MAX_NAME_BYTES = 255  # a file name on every common file system


def run_name(name, experiment) -> str:
    """``${mtad.run_name:${name},${experiment}}``: the run folder's name, ``name`` else ``experiment`` else
    ``default`` (``name=null`` is unset, never the folder ``None``)."""
    return str(name or experiment or "default")


def experiment_name(cfg) -> str:
    """The results-file name of a resolved config: ``name`` if set, else ``experiment``; a ValueError unless it
    is a plain file name (``results/<name>.jsonl`` must stay inside ``results_dir``)."""
    key = "name" if cfg.get("name") else "experiment"
    value = cfg.get(key) or "default"
    text = str(value)
    # the longest file an append puts beside <name>.jsonl is its atomic rewrite's temp file (store.sibling_names)
    extra = max(len(n.encode()) for n in sibling_names(".jsonl"))
    if len(text.encode()) + extra > MAX_NAME_BYTES:
        raise ValueError(f"{key}={text[:40]!r}... is {len(text.encode())} bytes long: results go to "
                         f"<results_dir>/<{key}>.jsonl, appended through its lock and a temp file "
                         f"'{temp_name(f'<{key}>.jsonl')}', and a file name holds at most {MAX_NAME_BYTES} bytes, "
                         f"so use a name of at most {MAX_NAME_BYTES - extra} bytes")
    if "/" in text or "\\" in text or "\0" in text or text.strip(".") == "" or ".." in text:
        raise ValueError(f"{key}={text!r} is not a plain file name: results go to <results_dir>/<{key}>.jsonl, so "
                         f"use a name without '/', '\\' or '..' (choose the folder with results_dir=...)")
    return text


def check_run(cfg) -> None:
    """The top-level settings of a resolved config (``RunConfig``'s own keys): a ValueError naming the key and
    its valid range. The groups are checked by their own frozen classes."""
    experiment_name(cfg)
    for key, (low, allowed) in RUN_RANGES.items():
        value = cfg.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}={value!r} is out of range: allowed {allowed}")


def check_settings(cfg: Any) -> None:
    """Every setting of a composed config, before anything is created: each group through its frozen class
    (ranges, finiteness, choices) and the top-level keys (:func:`check_run`). A ValueError naming the key."""
    def group(key: str) -> Any:
        node = OmegaConf.select(cfg, key, throw_on_missing=False) if OmegaConf.is_config(cfg) else cfg.get(key)
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node

    check_keys(DecoderConfig.from_any(group("decoder")))  # ranges, then no key the decoder does not read
    ModelConfig.from_any(group("model"))
    TaskConfig.from_any(group("task") or {})
    TrackingConfig.from_any(group("tracking"))
    check_run({key: group(key) for key in ("name", "experiment", *RUN_RANGES) if group(key) is not None})


def run_uid() -> str:
    """Six random hex digits: the ``${mtad.uid:}`` resolver, so that two jobs started in the same second
    never share a run directory (cached per config by OmegaConf, like ``${now:}``, so a sweep's jobs agree)."""
    return secrets.token_hex(3)


def register_configs() -> None:
    """Store ``base_config`` and register the ``${mtad.uid:}`` resolver (a random per-config suffix that
    keeps run directories of jobs started in the same second apart; see ``conf/config.yaml``)."""
    ConfigStore.instance().store(name="base_config", node=RunConfig)
    OmegaConf.register_new_resolver("mtad.uid", run_uid, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("mtad.run_name", run_name, replace=True)

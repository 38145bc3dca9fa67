"""The typed root of the Hydra configuration (STYLE.md, "Configuration").

Each group's schema is owned by its module (``ModelConfig`` in :mod:`mtad.loading`, ``DecoderConfig``
in :mod:`mtad.decoding.config`, ``TaskConfig`` in :mod:`mtad.tasks.base`, ``TrackingConfig`` in
:mod:`mtad.tracker`); :class:`RunConfig` nests them and is stored in Hydra's ConfigStore as
``base_config``, so every YAML under ``conf/`` merges into a typed node: a misspelt key or a wrong value
type fails at compose time with a message naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from mtad.decoding.config import DecoderConfig
from mtad.loading import ModelConfig
from mtad.tasks.base import TaskConfig
from mtad.tracker import TrackingConfig


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    experiment: str = "default"  # results go to ${results_dir}/${experiment}.jsonl
    results_dir: str = "results"  # relative paths are relative to the launch directory
    seed: int = 0
    warmup: int = 1  # prompts decoded untimed before measuring (not recorded)
    num_threads: int = 0  # torch CPU threads; 0 leaves torch's default (batch-1 CPU decoding: try 1)
    perplexity: bool = True  # score outputs under the raw target (after the timed window)
    force: bool = False  # rerun even if a row with the same config hash exists
    save_samples: bool = True  # write samples.jsonl into the run directory


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=RunConfig)

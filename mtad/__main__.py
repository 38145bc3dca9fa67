"""``python -m mtad model=<pair> decoder=<name> task=<task>`` (Hydra; ``-m`` for a sweep)."""
from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from mtad.config import register_configs

register_configs()
log = logging.getLogger("mtad")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from mtad.runner import run

    try:
        run(cfg)
    except (ValueError, FileNotFoundError, OSError) as err:
        log.error("%s: %s", type(err).__name__, err)
        print(f"mtad: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

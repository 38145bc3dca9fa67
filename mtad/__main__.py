"""``python -m mtad model=<pair> decoder=<name> task=<task>`` (Hydra; ``-m`` for a sweep)."""
from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mtad.config import register_configs

register_configs()
log = logging.getLogger("mtad")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from tqdm.contrib.logging import logging_redirect_tqdm

    from mtad.progress import summary_table
    from mtad.runner import run

    try:
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            row = run(cfg)
        if row is not None:
            print(summary_table(row))
    except (ValueError, FileNotFoundError, OSError) as err:
        log.error("%s: %s", type(err).__name__, err)
        print(f"mtad: error: {err}", file=sys.stderr)
        _drop_failed_run_dir()
        sys.exit(2)


def _drop_failed_run_dir() -> None:
    """A run that failed before writing results leaves no directory behind (only Hydra's config + log)."""
    from hydra.core.hydra_config import HydraConfig

    out = Path(HydraConfig.get().runtime.output_dir)
    if out.is_dir() and not (out / "samples.jsonl").exists():
        shutil.rmtree(out, ignore_errors=True)
        for parent in list(out.parents)[:3]:  # empty experiment/sweep folders too
            try:
                parent.rmdir()
            except OSError:
                break


if __name__ == "__main__":
    main()

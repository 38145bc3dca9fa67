"""``python -m mtad.train [recipe=<name>] [key=value ...]``: compose ``conf/train/draft.yaml`` (Hydra) and train.

``make train-draft ARGS="..."`` runs the same. Recipes: ``conf/train/recipe/*.yaml`` (default ``feature_cache``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict

import hydra
from omegaconf import OmegaConf

from mtad.train.config import register
from mtad.train.trainer import train

log = logging.getLogger("mtad.train")


# config_path is relative to this file; Hydra resolves it from the file only when this module runs as __main__
@hydra.main(config_path="../../conf/train", config_name="draft", version_base="1.3")
def main(dcfg) -> None:
    cfg = OmegaConf.to_object(dcfg)
    log.info("train_draft config: %s", asdict(cfg))
    meta = train(cfg)
    log.info("done: %d steps, %d tokens, final loss %.4f, eval %s", meta["steps"], meta["tokens"],
             meta["final_loss"], json.dumps(meta["eval"].get("all", {})))


if __name__ == "__main__":
    register()
    main()

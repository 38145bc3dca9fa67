"""``python -m mtad.harness.profile profile model=<pair> [num_threads=1] [model.device=cuda] [--reps 10]``:
measure a pair's per-forward costs on this machine (:func:`mtad.measure.costmodel.measure`) and write the cost
profile ``results/profiles/<hardware>-<threads>-<pair>.json`` that the tables' predicted ms/token read.

The config is composed as for a run (Hydra overrides), so a profile is measured on exactly the pair a run loads.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mtad._util.paths import REPO_ROOT
from mtad.harness.config import register_configs
from mtad.harness.rows import environment_info
from mtad.measure.costmodel import PROFILE_DIR, measure, profile_path
from mtad.models.load import load_pair


def _compose(overrides: Sequence[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def profile_command(overrides: Sequence[str], out_dir: str | Path = PROFILE_DIR, reps: int = 10) -> Path:
    """Compose the config (Hydra overrides, e.g. ``model=smollm2 num_threads=1``), load the pair, measure,
    write the profile JSON; returns its path."""
    cfg = OmegaConf.to_container(_compose(overrides), resolve=True)
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg["num_threads"]))
    pair = load_pair(cfg["model"])
    devices = {p.device for m in (pair.target, pair.draft) if m is not None for p in m.parameters()}
    env = environment_info(devices)
    cuda = any(d.type == "cuda" for d in devices)
    threads = None if cuda else env["num_threads"]
    dec = cfg["decoder"]
    prof = measure(pair, env["device_name"], threads, gamma=max(int(dec.get("gamma", 4)), 4),
                   W=max(int(dec.get("beam_width", 4)), 4), reps=reps)
    path = profile_path(out_dir, env["device_name"], pair.name, threads, cuda)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.to_json() + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mtad.harness.profile", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    prof = sub.add_parser("profile", help="measure per-forward costs of a pair on this machine")
    prof.add_argument("--out", default=str(PROFILE_DIR), help="folder for the profile JSON (default results/profiles)")
    prof.add_argument("--reps", type=int, default=10, help="timed rounds per shape (10 %%-trimmed mean)")
    prof.add_argument("overrides", nargs="*", help="Hydra overrides: model=smollm2 num_threads=1 model.device=cuda")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        path = profile_command(args.overrides, args.out, args.reps)
    except (ValueError, FileNotFoundError) as err:
        print(f"mtad.harness.profile: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

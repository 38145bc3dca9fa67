"""``python -m mtad.study.regimes [--root DIR]``: ``regimes.md``, ``regimes.json`` and ``regimes.png`` from the
records under ``results/regimes/`` (or ``DIR``)."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from mtad.study.regimes.build import build
from mtad.study.regimes.figure import figure
from mtad.study.regimes.inputs import ROOT
from mtad.study.regimes.tables import markdown

log = logging.getLogger("mtad.study.regimes")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.study.regimes", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the regime runs' records (default: %(default)s)")
    root = ap.parse_args(argv).root
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    res = build(root)
    (root / "regimes.json").write_text(json.dumps(res, indent=1, default=float))
    (root / "regimes.md").write_text(markdown(res))
    figure(res, root / "regimes.png")
    log.info("wrote %s, %s, %s", root / "regimes.md", root / "regimes.json", root / "regimes.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m mtad.study.regimes [--root DIR]``: ``regimes.md``, ``regimes.json`` and ``regimes.png`` from the
records under ``results/regimes/`` (or ``DIR``)."""
from __future__ import annotations

import json
import logging

from mtad._util.paths import REPO_ROOT
from mtad.harness.clicheck import ArgumentParser, check_or_exit, folder_with, writable_dir
from mtad.study.regimes import why
from mtad.study.regimes.build import build
from mtad.study.regimes.figure import figure
from mtad.study.regimes.inputs import ROOT
from mtad.study.regimes.tables import markdown
from mtad.study.regimes.two_axis import figure as two_axis_figure

log = logging.getLogger("mtad.study.regimes")
DOCS = (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "PAPER.md")  # documents with a why block


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m mtad.study.regimes", description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(ROOT), help="the regime runs' records (default: %(default)s)",
                    type=folder_with("drafts.tsv", "alpha.jsonl", fix="give the folder the regime runs wrote "
                                     "(results/regimes)"))
    root = ap.parse_args(argv).root
    check_or_exit(ap, writable_dir, root, "--root")  # the map is written into it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    res = build(root)
    (root / "regimes.json").write_text(json.dumps(res, indent=1, default=float))
    (root / "regimes.md").write_text(markdown(res))
    figure(res, root / "regimes.png")
    (root / "why.json").write_text(json.dumps(res["why"], indent=1, default=float) + "\n")
    if root.resolve() == ROOT.resolve():  # the repository's map: its documents carry the same answer
        for doc in DOCS:
            if why.update(doc, res["why"]):
                log.info("updated the why block of %s", doc)
    if res.get("two_axis"):
        two_axis_figure(res, root / "two_axis.png", res["hardware"])
    log.info("wrote %s, %s, %s", root / "regimes.md", root / "regimes.json", root / "regimes.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

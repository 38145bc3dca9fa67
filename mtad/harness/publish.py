"""The publish step: result rows become a publication under ``results/published/`` that a reviewer can re-derive.

``python -m mtad.harness.publish RESULTS.jsonl --name NAME [--experiment E] [--allow-unclean "why"]``

1. **Provenance.** Every row must come from committed code: a recorded commit (``git_sha``) that is in this
   repository's history (an ancestor of HEAD) and a clean tree (``git_dirty`` false). A row that is not is
   refused, the whole publication with it, unless ``--allow-unclean "why"`` is given; the reason is then kept
   in each such row (``publication.override``) and printed in every table built from it.
2. **Records.** Every row's per-prompt records (``samples.jsonl`` in its run directory, what every interval is
   computed from) are copied to ``results/published/runs-NAME/<hash>/``; a row without them is refused.
3. **Rows** go to ``results/published/NAME.jsonl`` (``run_dir`` pointing at the copied records,
   ``publication`` saying what was checked), the **tables** to ``results/published/tables/NAME.{md,tex}``
   (the renderer of ``make reproduce-table``), and the publication's line — what it holds and the command
   that re-renders it — into the index of ``results/published/README.md``. ``--figures`` also draws the
   figures of the analysis notebook into ``results/published/figures/``.

``python -m mtad.harness.publish --render NAME [--tables-dir DIR]`` re-renders a publication's tables from its
committed rows and records: the command the published README gives, which reproduces the committed tables
byte for byte (a test checks every publication). Nothing is overwritten: a name already published is
refused (pick another, e.g. with a suffix).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from mtad._util.paths import REPO_ROOT
from mtad.harness.rows import to_json_line
from mtad.harness.store import load_frame, load_results
from mtad.report import stats
from mtad.report.render import write_tables

log = logging.getLogger(__name__)

PUBLISHED = REPO_ROOT / "results" / "published"
README = "README.md"
INDEX_START = "<!-- publications: written by python -m mtad.harness.publish; one line each -->"
INDEX_END = "<!-- /publications -->"
INDEX_HEADER = ("| publication | rows | per-prompt records | provenance | re-render |\n"
                "| --- | --- | --- | --- | --- |")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class PublishError(ValueError):
    """A publication refused: the message names the problem and the fix."""


def render_command(name: str) -> str:
    return f"python -m mtad.harness.publish --render {name}"


# ------------------------------------------------------------------------------------------- checks
def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)


RESULTS_DIR_LINE = re.compile(r"^results_dir: (.+)$", re.M)


def checkout_relative(path: str | Path) -> str:
    """An absolute ``path`` inside a git checkout (this repository or another worktree of it) relative to that
    checkout's top, else as given: a publication records where a run wrote without a machine's own paths."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    probe = p
    while not probe.is_dir() and probe != probe.parent:
        probe = probe.parent
    top = _git(probe, "rev-parse", "--show-toplevel").stdout.strip()
    try:
        return str(p.relative_to(top)) if top else str(path)
    except ValueError:
        return str(path)


def provenance_problem(row: dict, root: Path = REPO_ROOT) -> str | None:
    """Why a row's code cannot be re-derived from this repository (None when it can): no recorded commit, a
    dirty tree, or a commit that is not an ancestor of HEAD."""
    sha = row.get("git_sha")
    if not sha:
        return "no commit recorded (git_sha is null)"
    if row.get("git_dirty") is not False:
        return f"measured from a dirty tree at {sha[:10]} (git_dirty is {json.dumps(row.get('git_dirty'))})"
    if _git(root, "merge-base", "--is-ancestor", sha, "HEAD").returncode != 0:
        return f"commit {sha[:10]} is not in this repository's history"
    return None


def _records_dir(row: dict, search: Sequence[Path]) -> Path | None:
    return stats.resolve_run_dir(row.get("run_dir"), search)


def _checked_rows(rows: list[dict], search: Sequence[Path], allow_unclean: str | None) -> list[tuple[dict, Path, str]]:
    """(row, records dir, provenance problem or "") per row; raises PublishError on the first kind of refusal."""
    if not rows:
        raise PublishError("no rows to publish: the results file (or --experiment) selects none")
    out, unclean, lost = [], [], []
    for r in rows:
        problem = provenance_problem(r)
        where = _records_dir(r, search)
        if problem:
            unclean.append(f"{r.get('run_id')}: {problem}")
        if where is None:
            lost.append(f"{r.get('run_id')} (run_dir {r.get('run_dir')})")
        out.append((r, where, problem or ""))
    if lost:
        raise PublishError(f"{len(lost)} of {len(rows)} rows have no per-prompt records (samples.jsonl), e.g. "
                           f"{lost[0]}: a publication must carry them; rerun those configurations or publish without "
                           "those rows (--experiment)")
    if unclean and not allow_unclean:
        raise PublishError(f"{len(unclean)} of {len(rows)} rows do not come from committed code, e.g. {unclean[0]}: "
                           "commit, rerun from the clean tree and publish those rows, or pass --allow-unclean "
                           "\"<why>\" (printed in every table built from them)")
    return out


# ------------------------------------------------------------------------------------------- publish
def publish(results: Path, name: str, experiment: str | None = None, allow_unclean: str | None = None,
            published: Path = PUBLISHED, command: str | None = None, figures: bool = False) -> list[Path]:
    """Publish ``results``' rows (those of ``experiment`` if given) as ``name``; returns the files written."""
    if not NAME_RE.fullmatch(name):
        raise PublishError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (e.g. cpu_qa-2026-12-06)")
    if not results.is_file():
        raise PublishError(f"{results}: no such results file")
    taken = [p for p in (published / f"{name}.jsonl", published / f"runs-{name}", published / "tables" / f"{name}.md")
             if p.exists()]
    if taken:
        raise PublishError(f"{taken[0]} exists: {name!r} is published already; pick another --name (nothing is "
                           "overwritten)")
    rows = [r for r in load_results(results) if experiment is None or r.get("experiment") == experiment]
    checked = _checked_rows(rows, [results.parent], allow_unclean)
    published.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".publish-{name}-", dir=published))
    try:
        lines = []
        for row, where, problem in checked:
            short = row["config_hash"][:12]
            dest = staging / "runs" / short
            if dest.exists():
                raise PublishError(f"two rows share config hash {short}: publish one results file of one grid")
            dest.mkdir(parents=True)
            shutil.copy2(where / "samples.jsonl", dest / "samples.jsonl")
            if (where / "resolved_config.yaml").is_file():
                config = (where / "resolved_config.yaml").read_text()
                (dest / "resolved_config.yaml").write_text(RESULTS_DIR_LINE.sub(
                    lambda m: f"results_dir: {checkout_relative(m.group(1))}", config))
            row = {**row, "run_dir": f"results/published/runs-{name}/{short}",
                   "publication": {"name": name, "checked": "override" if problem else "clean commit in history",
                                   "override": f"{problem}; published anyway: {allow_unclean}" if problem else None}}
            lines.append(to_json_line(row))
        (staging / f"{name}.jsonl").write_text("".join(lines))
        os.replace(staging / "runs", published / f"runs-{name}")
        os.replace(staging / f"{name}.jsonl", published / f"{name}.jsonl")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    written = [published / f"{name}.jsonl", published / f"runs-{name}"]
    written += list(render(name, published))
    add_to_index(published / README, name, len(checked), sum(bool(p) for _, _, p in checked),
                 command or f"python -m mtad.harness.publish {checkout_relative(results)} --name {name}")
    if figures:
        written += draw_figures(name, published)
    return written


def render(name: str, published: Path = PUBLISHED, tables_dir: Path | None = None) -> tuple[Path, Path]:
    """Render publication ``name``'s tables from its committed rows and records (``tables_dir``: default
    ``<published>/tables``)."""
    rows = published / f"{name}.jsonl"
    if not rows.is_file():
        raise PublishError(f"{rows}: no publication named {name!r} (see the index in {published / README})")
    return write_tables(load_frame(rows), tables_dir or published / "tables", name, search=[published])


def add_to_index(readme: Path, name: str, n_rows: int, n_overridden: int, command: str) -> None:
    """Add the publication's line to the index block of the published README (the block is made if absent)."""
    text = readme.read_text() if readme.exists() else "# Published result rows\n"
    if INDEX_START not in text:
        text = text.rstrip("\n") + f"\n\n## Index\n\n{INDEX_START}\n{INDEX_HEADER}\n{INDEX_END}\n"
    prov = "clean commits in history" if not n_overridden else f"{n_overridden} row(s) published with an override"
    line = (f"| `{name}` ({date.today().isoformat()}; published with `{command}`) | {n_rows} | `runs-{name}/` | "
            f"{prov} | `{render_command(name)}` |")
    text = text.replace(INDEX_END, f"{line}\n{INDEX_END}")
    readme.write_text(text)


def indexed(readme: Path = PUBLISHED / README) -> list[str]:
    """The publication names the published README's index gives a re-render command for."""
    text = readme.read_text() if readme.exists() else ""
    block = text.split(INDEX_START, 1)[1].split(INDEX_END, 1)[0] if INDEX_START in text else ""
    return re.findall(r"`python -m mtad\.harness\.publish --render ([A-Za-z0-9._-]+)`", block)


def draw_figures(name: str, published: Path = PUBLISHED) -> list[Path]:
    """The analysis notebook's figures of the publication, run headless, copied into ``<published>/figures``."""
    import nbformat
    from nbclient import NotebookClient

    out = Path(tempfile.mkdtemp(prefix="mtad-figures-"))
    nb = nbformat.read(REPO_ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    env = {"MTAD_RESULTS": str(published / f"{name}.jsonl"), "MTAD_TABLES": str(out)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = NotebookClient(nb, timeout=1800, kernel_name="python3",
                                resources={"metadata": {"path": str(REPO_ROOT)}})
        client.execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    (published / "figures").mkdir(exist_ok=True)
    copied = []
    for png in sorted(out.glob(f"{name}_*.png")):
        shutil.copy2(png, published / "figures" / png.name)
        copied.append(published / "figures" / png.name)
    return copied


# ------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mtad.harness.publish", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="?", type=Path, help="the results file whose rows to publish")
    p.add_argument("--name", help="the publication's name (e.g. cpu_qa-2026-12-06)")
    p.add_argument("--experiment", default=None, help="publish only the rows of this experiment")
    p.add_argument("--allow-unclean", metavar="WHY", default=None,
                   help="publish rows from a dirty tree or an unknown commit anyway; WHY is printed in their tables")
    p.add_argument("--figures", action="store_true", help="also draw the notebook's figures (minutes)")
    p.add_argument("--render", metavar="NAME", default=None, help="re-render a publication's tables and exit")
    p.add_argument("--tables-dir", type=Path, default=None, help="with --render: where the tables go")
    p.add_argument("--published-dir", type=Path, default=PUBLISHED,
                   help="where publications live (default: results/published)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    try:
        if args.render:
            for path in render(args.render, args.published_dir, args.tables_dir):
                print(f"wrote {path}")
            return 0
        if args.results is None or not args.name:
            raise PublishError("give a results file and --name (or --render NAME)")
        argv_text = " ".join(sys.argv[1:] if argv is None else argv)
        for path in publish(args.results, args.name, args.experiment, args.allow_unclean, args.published_dir,
                            command=f"python -m mtad.harness.publish {argv_text}", figures=args.figures):
            print(f"wrote {path}")
    except (PublishError, FileNotFoundError) as err:
        print(f"mtad.harness.publish: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

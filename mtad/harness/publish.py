"""The publish step: result rows become a publication under ``results/published/`` that a reviewer can re-derive.

``python -m mtad.harness.publish RESULTS.jsonl --name NAME [--experiment E] [--allow-unclean "why"]``

1. **Provenance.** Every row must come from committed code: a recorded commit (``git_sha``, the full hash) that is
   in this repository's history (an ancestor of HEAD) and a clean tree (``git_dirty`` false). A row that is not is
   refused, the whole publication with it, unless ``--allow-unclean "why"`` is given; the reason is then kept
   in each such row (``publication.override``) and printed in every table built from it.
2. **Records.** Every row's per-prompt records (``samples.jsonl`` in its run directory, what every interval is
   computed from) are copied to ``results/published/runs-NAME/<hash>/``; a row without them is refused.
3. **Rows** go to ``results/published/NAME.jsonl`` (``run_dir`` pointing at the copied records,
   ``publication`` saying what was checked), the **tables** to ``results/published/tables/NAME.{md,tex}``
   (the renderer of ``make reproduce-table``), and the publication's line — what it holds and the command
   that made it, normalised (paths relative to their checkout, one line) — into the index of
   ``results/published/README.md``. ``--figures`` also draws the figures of the analysis notebook into
   ``results/published/figures/``.

**One transaction.** Everything is checked before anything is written: the name (letters, digits, ``._-``, so
every file stays in the published folder), the folders, the index, every row, and that nothing of that name exists
(nothing is ever overwritten). The publication is then built in ``<published>/.publish-NAME/`` (its tables
rendered from the staged rows) and a plan written there last; each file is renamed into place, and the index line
added last (temp file + rename). A rerun after a kill finishes a planned publication or removes a half-built stage
and starts again; ``--render`` of an unfinished one says so. One publish step at a time holds the folder's lock.

``python -m mtad.harness.publish --render NAME [--tables-dir DIR]`` re-renders a publication's tables from its
committed rows and records: the command the published README gives, which reproduces the committed tables
byte for byte (a test checks every publication).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path

from mtad._util.io import atomic_write, fsync_dir
from mtad._util.paths import REPO_ROOT, repo_relative
from mtad.harness.rows import to_json_line
from mtad.harness.store import load_frame, load_results
from mtad.report import stats
from mtad.report.markdown import table
from mtad.report.render import write_tables

log = logging.getLogger(__name__)

PUBLISHED = REPO_ROOT / "results" / "published"
README = "README.md"
INDEX_START = "<!-- publications: written by python -m mtad.harness.publish; one line each -->"
INDEX_END = "<!-- /publications -->"
INDEX_COLUMNS = ("publication", "rows", "per-prompt records", "provenance", "re-render")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 object names, never a ref or a prefix
HASH_RE = re.compile(r"[0-9a-f]{12,64}")
PLAN = "plan.json"
PLAN_KEYS = {"name", "moves", "rows", "overridden", "command", "date"}
PROG = "python -m mtad.harness.publish"


class PublishError(ValueError):
    """A publication refused: the message names the problem and the fix."""


def render_command(name: str) -> str:
    return f"{PROG} --render {name}"


def stage_dir(published: Path, name: str) -> Path:
    """Where publication ``name`` is built before its files are renamed into ``published``."""
    return published / f".publish-{name}"


# ------------------------------------------------------------------------------------------- checks
def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:  # no git, or a hung one: the check fails, it does not crash
        return subprocess.CompletedProcess(args, 1, "", str(err))


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


def shown_path(path: str | Path) -> str:
    """``path`` as the index records it: relative to this repository or to its own checkout, else ``.../<name>``
    (no machine's absolute path)."""
    full = Path(os.path.abspath(path))
    for rel in (repo_relative(full), checkout_relative(full)):
        if not Path(rel).is_absolute():
            return rel
    return f".../{full.name}"


def normalised_command(results: Path, name: str, experiment: str | None = None, allow_unclean: str | None = None,
                       figures: bool = False) -> str:
    """The publish command as the index records it: the results file by ``shown_path``, every value quoted for a
    shell (checked to be one line), options in one order."""
    args = [shown_path(results), "--name", name]
    args += ["--experiment", experiment] if experiment is not None else []
    args += ["--allow-unclean", allow_unclean] if allow_unclean is not None else []
    args += ["--figures"] if figures else []
    return f"{PROG} " + " ".join(shlex.quote(a) for a in args)


def provenance_problem(row: dict, root: Path = REPO_ROOT) -> str | None:
    """Why a row's code cannot be re-derived from this repository (None when it can): no recorded commit, one
    that is not a full commit hash, a dirty tree, or a commit that is not an ancestor of HEAD."""
    sha = row.get("git_sha")
    if not sha:
        return "no commit recorded (git_sha is null)"
    if not isinstance(sha, str) or not FULL_SHA.fullmatch(sha):
        return f"git_sha {json.dumps(sha)} is not a full commit hash (40 hex digits)"
    if row.get("git_dirty") is not False:
        return f"measured from a dirty tree at {sha[:10]} (git_dirty is {json.dumps(row.get('git_dirty'))})"
    if _git(root, "merge-base", "--is-ancestor", sha, "HEAD").returncode != 0:
        return f"commit {sha[:10]} is not in this repository's history"
    return None


def _check_name(name: str | None, option: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise PublishError(f"{option} {name!r}: a publication's name is letters, digits, '.', '_' and '-', starting "
                           "with a letter or digit, at most 100 (e.g. cpu_qa-2026-12-06), so that its files stay in "
                           "the published folder")
    return name


def _check_text(value: str | None, option: str) -> None:
    if value is not None and (not value.strip() or not value.isprintable()):
        raise PublishError(f"{option} {value!r}: give it as one line of printable text (it is printed in tables and "
                           "recorded in the index)")


def _check_folder(path: Path, what: str) -> None:
    """``path`` is a folder this process can write into, or can be made one; nothing is created."""
    probe = Path(os.path.abspath(path))
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise PublishError(f"{what} {path}: {probe} is a file, not a folder; give a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PublishError(f"{what} {path}: {probe} cannot be written; give a folder you can write")


def _index_text(readme: Path) -> str:
    """The published README's text ("" when absent), checked: a file this process may replace, one intact
    index block or none (it is then added)."""
    if not readme.exists() and not readme.is_symlink():
        return ""
    if not readme.is_file():
        raise PublishError(f"the index {readme} is not a file: restore the published README and rerun")
    if not os.access(readme, os.R_OK | os.W_OK):
        raise PublishError(f"the index {readme} cannot be written (read-only): make it writable (chmod u+w) and "
                           "rerun; nothing was published")
    try:
        text = readme.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise PublishError(f"the index {readme} cannot be read ({err}): restore it from git and rerun") from None
    starts, ends = text.count(INDEX_START), text.count(INDEX_END)
    if (starts, ends) not in ((0, 0), (1, 1)) or (starts and text.index(INDEX_START) > text.index(INDEX_END)):
        raise PublishError(f"the index block of {readme} is damaged ({starts} start and {ends} end marker(s)): "
                           "restore it from git and rerun; nothing was published")
    return text


def _indexed_in(text: str) -> list[str]:
    block = text.split(INDEX_START, 1)[1].split(INDEX_END, 1)[0] if INDEX_START in text else ""
    return re.findall(r"`python -m mtad\.harness\.publish --render ([A-Za-z0-9._-]+)`", block)


def indexed(readme: Path = PUBLISHED / README) -> list[str]:
    """The publication names the published README's index gives a re-render command for."""
    return _indexed_in(readme.read_text() if readme.exists() else "")


def _targets(published: Path, name: str) -> list[Path]:
    return [published / f"runs-{name}", published / "tables" / f"{name}.md", published / "tables" / f"{name}.tex",
            published / f"{name}.jsonl"]


def _check_free(published: Path, name: str, index: str) -> None:
    """Nothing of publication ``name`` exists yet: it is not indexed, and no file of its would be overwritten."""
    if name in _indexed_in(index):
        raise PublishError(f"{name!r} is published already (the index of {published / README} has it); pick another "
                           "--name (nothing is overwritten)")
    stray = [p for p in _targets(published, name) if p.exists() or p.is_symlink()]
    if stray:
        raise PublishError(f"{stray[0]} exists but the index has no publication {name!r} (a stray file, or one left "
                           f"by an interrupted publish of an older mtad): move {', '.join(map(str, stray))} away or "
                           "pick another --name (nothing is overwritten)")


def _load_rows(results: Path, experiment: str | None) -> list[dict]:
    if not results.is_file():
        raise PublishError(f"{results}: no such results file")
    try:
        rows = load_results(results)
    except ValueError as err:  # a damaged line or another schema version: the message names the line and the fix
        raise PublishError(str(err)) from None
    except OSError as err:
        raise PublishError(f"{results} cannot be read ({err.strerror or err}): give a results file you can "
                           "read") from None
    return [r for r in rows if experiment is None or r.get("experiment") == experiment]


def _checked_rows(rows: list[dict], search: Sequence[Path], allow_unclean: str | None) -> list[tuple[dict, Path, str]]:
    """(row, records dir, provenance problem or "") per row; raises PublishError on the first kind of refusal."""
    if not rows:
        raise PublishError("no rows to publish: the results file (or --experiment) selects none")
    out, unclean, lost, shorts = [], [], [], {}
    for r in rows:
        h = r.get("config_hash")
        if not isinstance(h, str) or not HASH_RE.fullmatch(h):
            raise PublishError(f"row {r.get('run_id')!r} has config_hash {json.dumps(h)}, not a hex hash: publish "
                               "rows written by mtad's runner")
        if shorts.setdefault(h[:12], r.get("run_id")) != r.get("run_id"):
            raise PublishError(f"two rows share config hash {h[:12]} ({shorts[h[:12]]}, {r.get('run_id')}): publish "
                               "one results file of one grid (or pick its rows with --experiment)")
        problem = provenance_problem(r)
        where = stats.resolve_run_dir(r.get("run_dir"), search)
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
@contextlib.contextmanager
def _locked(published: Path) -> Iterator[None]:
    """Hold the published folder's lock (flock on the folder itself: no lock file to leave behind)."""
    published.mkdir(parents=True, exist_ok=True)
    fd = os.open(published, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another publish step in %s", published)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def publish(results: Path, name: str, experiment: str | None = None, allow_unclean: str | None = None,
            published: Path = PUBLISHED, command: str | None = None, figures: bool = False) -> list[Path]:
    """Publish ``results``' rows (those of ``experiment`` if given) as ``name``; returns the files written.
    ``command``: what the index says made it (default: ``normalised_command``; made one line)."""
    _check_name(name, "--name")
    _check_text(allow_unclean, "--allow-unclean")
    _check_text(experiment, "--experiment")
    _check_folder(published, "--published-dir")
    for sub in ("tables", "figures"):
        if (published / sub).exists() and not (published / sub).is_dir():
            raise PublishError(f"{published / sub} is a file, not a folder: move it away and rerun")
    command = " ".join(command.split()) if command else normalised_command(results, name, experiment, allow_unclean,
                                                                           figures)
    stage = stage_dir(published, name)
    if stage.exists():
        with _locked(published):
            done = _recover(published, stage, name, command)
        if done is not None:
            return done
    index = _index_text(published / README)
    _check_free(published, name, index)
    checked = _checked_rows(_load_rows(results, experiment), [results.parent], allow_unclean)
    with _locked(published):
        _check_free(published, name, _index_text(published / README))  # again: another publish may have run
        stage.mkdir()
        try:
            moves = _stage(stage / "files", name, checked, allow_unclean, published, figures)
            plan = {"name": name, "moves": moves, "rows": len(checked), "overridden": sum(bool(p) for *_, p in checked),
                    "command": command, "date": date.today().isoformat()}
            atomic_write(stage / PLAN, json.dumps(plan, indent=1) + "\n")
        except (Exception, KeyboardInterrupt) as err:
            shutil.rmtree(stage, ignore_errors=True)
            if isinstance(err, (OSError, ValueError)) and not isinstance(err, PublishError):
                raise PublishError(f"could not build {name!r} ({err}): nothing was published") from err
            raise
        return _commit(published, stage, plan)


def _stage(files: Path, name: str, checked: list[tuple[dict, Path, str]], allow_unclean: str | None,
           published: Path, figures: bool) -> list[str]:
    """Build publication ``name`` in ``files`` as it will lie in ``published``; returns what to move into place
    (relative paths, the rows file last: ``--render`` finds a publication by it)."""
    lines = []
    for row, where, problem in checked:
        short = row["config_hash"][:12]
        dest = files / f"runs-{name}" / short
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
    rows = files / f"{name}.jsonl"
    rows.write_text("".join(lines))
    write_tables(load_frame(rows), files / "tables", name, search=[files, published])
    drawn = [f"figures/{p.name}" for p in draw_figures(name, rows, files / "figures")] if figures else []
    taken = [f for f in drawn if (published / f).exists()]
    if taken:
        raise PublishError(f"{published / taken[0]} exists: the figures of {name!r} would overwrite it; move it away "
                           "or pick another --name")
    return [f"runs-{name}", f"tables/{name}.md", f"tables/{name}.tex", *drawn, f"{name}.jsonl"]


def _commit(published: Path, stage: Path, plan: dict) -> list[Path]:
    """Rename each staged file into place (one already moved is skipped), then add the index line, then remove
    the stage: a kill anywhere leaves a state that the next run of the plan finishes."""
    name = plan["name"]
    again = f"rerun `{plan['command']}` to finish publishing {name!r}"
    try:
        for rel in plan["moves"]:
            src, dst = stage / "files" / rel, published / rel
            there = dst.exists() or dst.is_symlink()
            if src.exists() and there:
                raise PublishError(f"{dst} appeared while {name!r} was being published: move it away and {again}")
            if not src.exists() and not there:
                raise PublishError(f"{src} is missing from the stage of {name!r}: remove {stage} and publish again")
            if not there:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dst)
        fsync_dir(published)
        for tmp in published.glob(f".{README}.*.tmp"):  # a killed index write's temp file (we hold the lock)
            tmp.unlink()
        index = _index_text(published / README)
        if name not in _indexed_in(index):
            atomic_write(published / README, with_index_line(index, name, plan["rows"], plan["overridden"],
                                                             plan["command"], plan["date"]))
    except OSError as err:
        raise PublishError(f"publishing {name!r} stopped before it was indexed ({err}): fix that and {again}") from err
    shutil.rmtree(stage, ignore_errors=True)
    return [published / rel for rel in plan["moves"]]


def _read_plan(stage: Path) -> dict | None:
    """The plan of a complete stage, else None (written atomically: an unreadable one is a changed stage)."""
    try:
        plan = json.loads((stage / PLAN).read_text())
        return plan if isinstance(plan, dict) and PLAN_KEYS <= set(plan) else None
    except (OSError, ValueError):
        return None


def _recover(published: Path, stage: Path, name: str, command: str) -> list[Path] | None:
    """After a kill: finish a planned publication (its files returned; a PublishError if this command asked for
    another one), or remove a half-built stage (None: publish afresh)."""
    if not stage.exists():  # another publish of this name finished it while this one waited for the lock
        return None
    plan = _read_plan(stage)
    if plan is None:
        log.warning("removing %s: the stage of a publish of %r that was interrupted before it was complete", stage,
                    name)
        shutil.rmtree(stage)
        return None
    written = _commit(published, stage, plan)
    log.warning("finished the interrupted publish of %r (%s)", name, plan["command"])
    if plan["command"] != command:
        raise PublishError(f"finished the interrupted `{plan['command']}` first; {name!r} is published now, so this "
                           "command's rows were not: pick another --name")
    return written


def render(name: str, published: Path = PUBLISHED, tables_dir: Path | None = None) -> tuple[Path, Path]:
    """Render publication ``name``'s tables from its committed rows and records (``tables_dir``: default
    ``<published>/tables``)."""
    _check_name(name, "--render")
    if published.exists() and not published.is_dir():
        raise PublishError(f"--published-dir {published} is a file, not a folder; give the published folder")
    plan = _read_plan(stage_dir(published, name))
    if plan:
        raise PublishError(f"the publish of {name!r} was interrupted before it was indexed: rerun `{plan['command']}` "
                           "to finish it")
    rows = published / f"{name}.jsonl"
    if not rows.is_file():
        raise PublishError(f"{rows}: no publication named {name!r} (see the index in {published / README})")
    out = tables_dir or published / "tables"
    _check_folder(out, "--tables-dir")
    try:
        frame = load_frame(rows)
    except ValueError as err:
        raise PublishError(f"{err}") from None
    return write_tables(frame, out, name, search=[published])


def _code_cell(text: str) -> str:
    """``text`` as a Markdown code span that stays in one table cell (pipes escaped, a fence longer than any run of
    backticks inside)."""
    text = text.replace("|", "\\|")
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{fence}{text}{fence}" if len(fence) == 1 else f"{fence} {text} {fence}"


def with_index_line(text: str, name: str, n_rows: int, n_overridden: int, command: str, day: str | None = None) -> str:
    """The published README ``text`` with the publication's line added to its index block (the block is made if
    absent)."""
    text = text or "# Published result rows\n"
    if INDEX_START not in text:
        block = "\n".join([INDEX_START, *table(INDEX_COLUMNS), INDEX_END])
        text = text.rstrip("\n") + f"\n\n## Index\n\n{block}\n"
    prov = "clean commits in history" if not n_overridden else f"{n_overridden} row(s) published with an override"
    cell = f"`{name}` ({day or date.today().isoformat()}; published with {_code_cell(' '.join(command.split()))})"
    line = table(INDEX_COLUMNS, [[cell, str(n_rows), f"`runs-{name}/`", prov, f"`{render_command(name)}`"]])[-1]
    return text.replace(INDEX_END, f"{line}\n{INDEX_END}")


def draw_figures(name: str, rows: Path, out_dir: Path) -> list[Path]:
    """The analysis notebook's figures of the publication whose rows are ``rows``, run headless, into
    ``out_dir``."""
    import nbformat
    from nbclient import NotebookClient

    out = Path(tempfile.mkdtemp(prefix="mtad-figures-"))
    nb = nbformat.read(REPO_ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    env = {"MTAD_RESULTS": str(rows), "MTAD_TABLES": str(out)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = NotebookClient(nb, timeout=1800, kernel_name="python3",
                                resources={"metadata": {"path": str(REPO_ROOT)}})
        client.execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = [Path(shutil.copy2(png, out_dir / png.name)) for png in sorted(out.glob(f"{name}_*.png"))]
    shutil.rmtree(out, ignore_errors=True)
    return drawn


# ------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
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
        if args.render is not None:
            for path in render(args.render, args.published_dir, args.tables_dir):
                print(f"wrote {path}")
            return 0
        if args.results is None or not args.name:
            raise PublishError("give a results file and --name (or --render NAME)")
        if args.tables_dir is not None:
            raise PublishError("--tables-dir goes with --render NAME; a publication's tables go to <published>/tables")
        for path in publish(args.results, args.name, args.experiment, args.allow_unclean, args.published_dir,
                            figures=args.figures):
            print(f"wrote {path}")
    except PublishError as err:
        print(f"{PROG.split()[-1]}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

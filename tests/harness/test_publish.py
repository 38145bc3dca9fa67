"""The publish step (mtad.harness.publish) and what it guarantees of results/published/: every row's per-prompt
records are tracked by git, nothing there is hidden by an ignore rule, every published table re-renders byte for
byte with the command the published README gives."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mtad._util.io import atomic_write
from mtad._util.paths import REPO_ROOT
from mtad.harness import publish as pub
from mtad.harness.store import load_results
from mtad.report import stats

PUBLISHED = REPO_ROOT / "results" / "published"
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "results_small.jsonl"
HAS_GIT = (REPO_ROOT / ".git").exists()
needs_git = pytest.mark.skipif(not HAS_GIT, reason="not a git checkout: provenance and tracking need git")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=True).stdout


# ------------------------------------------------------------------------------------------- the repository
@needs_git
def test_every_published_row_has_its_records_tracked_by_git():
    """git ls-files, not the file system: a record that exists here but is hidden by an ignore rule fails."""
    tracked = set(git("ls-files", "results/published").splitlines())
    missing = []
    for rows_file in sorted(PUBLISHED.glob("*.jsonl")):
        for row in load_results(rows_file):
            where = stats.resolve_run_dir(row.get("run_dir"), [PUBLISHED])
            rel = str((where / "samples.jsonl").resolve().relative_to(REPO_ROOT)) if where else None
            if rel not in tracked:
                missing.append(f"{rows_file.name}: {row['run_id']} (run_dir {row.get('run_dir')})")
    assert not missing, missing


@needs_git
def test_no_ignore_rule_hides_anything_under_results_published():
    paths = ["results/published/runs-x/abc/samples.jsonl", "results/published/runs/abc/samples.jsonl",
             "results/published/x.jsonl", "results/published/figures/x.png", "results/published/tables/x.md"]
    out = subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "--no-index", *paths], capture_output=True,
                         text=True)
    assert out.stdout == "", out.stdout
    # control: the same rules still hide a run directory outside results/published
    assert subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "--no-index", "results/runs/abc/x.jsonl"],
                          capture_output=True).returncode == 0


def test_every_published_table_is_indexed_with_its_rerender_command():
    names = pub.indexed()
    tables = sorted(p.stem for p in (PUBLISHED / "tables").glob("*.md"))
    assert tables and sorted(names) == tables
    assert all((PUBLISHED / f"{n}.jsonl").is_file() for n in names)


@pytest.mark.parametrize("name", pub.indexed())
def test_published_tables_rerender_byte_for_byte(name, tmp_path):
    """The README's command (python -m mtad.harness.publish --render NAME) run in-process into a temporary
    folder gives the committed tables exactly. A renderer change must re-render and commit them."""
    assert pub.main(["--render", name, "--tables-dir", str(tmp_path)]) == 0
    for ext in ("md", "tex"):
        assert (tmp_path / f"{name}.{ext}").read_text() == (PUBLISHED / "tables" / f"{name}.{ext}").read_text(), \
            f"{name}.{ext} does not re-render from its rows: rerun `{pub.render_command(name)}` and commit"


# ------------------------------------------------------------------------------------------- the step
def _rows(tmp_path: Path, sha: str | None, dirty: bool | None, drop_records: bool = False) -> Path:
    """A results file of three fixture rows (gsm8k: sampling, speculative, mtad) with run directories."""
    picked = {}
    for r in load_results(FIXTURE):
        d = r["decoder"]
        if r["task"]["name"] == "gsm8k" and d["name"] in ("mtad", "sampling", "speculative") and \
                (d["gamma"], d["beam_width"], d["tau"]) == (4, 4, 0.5):
            picked[d["name"]] = json.loads(json.dumps(r))
    out = tmp_path / "res"
    for i, (name, r) in enumerate(sorted(picked.items())):
        run = out / "runs" / r["config_hash"][:12]
        run.mkdir(parents=True)
        if not (drop_records and name == "mtad"):
            (run / "samples.jsonl").write_text("".join(json.dumps(
                {"id": f"p{k}", "turn": 0, "n_tokens": 10, "time_s": (1 + 0.1 * k) * (0.5 if name == "mtad" else 1),
                 "mean_logprob": -1.0 - 0.01 * k, "scores": {}, "output_ids": [k, k + 1, k + 2, i]}) + "\n"
                for k in range(8)))
        r.update(run_dir=f"runs/{r['config_hash'][:12]}", git_sha=sha, git_dirty=dirty)
    (out / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in picked.values()))
    return out / "r.jsonl"


@pytest.fixture
def head() -> str:
    if not HAS_GIT:
        pytest.skip("not a git checkout")
    return git("rev-parse", "HEAD").strip()


def test_publish_copies_records_renders_and_indexes(tmp_path, head):
    published = tmp_path / "published"
    written = pub.publish(_rows(tmp_path, head, False), "t-1", published=published, command="make publish ...")
    rows = load_results(published / "t-1.jsonl")
    assert len(rows) == 3 and all(r["publication"]["checked"] == "clean commit in history" for r in rows)
    for r in rows:
        assert r["run_dir"].startswith("results/published/runs-t-1/")
        assert (published / "runs-t-1" / r["config_hash"][:12] / "samples.jsonl").is_file()
    md = (published / "tables" / "t-1.md").read_text()
    assert "Provenance: every row from a clean tree" in md and published / "tables" / "t-1.md" in written
    assert pub.indexed(published / "README.md") == ["t-1"]
    again = tmp_path / "again"
    pub.render("t-1", published, again)
    assert (again / "t-1.md").read_text() == md
    assert not [p for p in published.iterdir() if p.name.startswith(".publish-")]  # no staging left behind


@pytest.mark.parametrize("sha,dirty,why", [
    (None, False, "no commit recorded"),
    ("0" * 40, False, "is not in this repository's history"),
    ("HEAD", True, "measured from a dirty tree"),
])
def test_publish_refuses_rows_not_from_committed_code(tmp_path, head, capsys, sha, dirty, why):
    results = _rows(tmp_path, head if sha == "HEAD" else sha, dirty)
    published = tmp_path / "published"
    assert pub.main([str(results), "--name", "t-2", "--published-dir", str(published)]) == 2
    with pytest.raises(pub.PublishError, match=why):
        pub.publish(results, "t-2", published=published)
    assert not (published / "t-2.jsonl").exists() and not (published / "runs-t-2").exists()
    # the override publishes them, and every table built from them says so
    pub.publish(results, "t-2", allow_unclean="a rerun would take a day", published=published)
    md = (published / "tables" / "t-2.md").read_text()
    assert "override(s) of the publish step's check" in md and "a rerun would take a day" in md and why in md


def test_publish_cli_one_line_errors(tmp_path, head, capsys):
    lost = _rows(tmp_path, head, False, drop_records=True)
    where = ["--published-dir", str(tmp_path / "published")]
    assert pub.main([str(lost), "--name", "t-3", *where]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtad.harness.publish: error: 1 of 3 rows have no per-prompt records") and "\n" not in err
    assert pub.main([str(tmp_path / "nope.jsonl"), "--name", "t-3", *where]) == 2
    assert "no such results file" in capsys.readouterr().err
    assert pub.main(["--render", "no-such-publication", *where]) == 2
    assert pub.main([str(lost), "--name", "../escape", *where]) == 2
    assert not (tmp_path / "published").exists()  # nothing written by any refusal


def test_publish_never_overwrites(tmp_path, head):
    published = tmp_path / "published"
    results = _rows(tmp_path, head, False)
    pub.publish(results, "t-4", published=published)
    before = (published / "t-4.jsonl").read_text()
    with pytest.raises(pub.PublishError, match="published already"):
        pub.publish(results, "t-4", published=published)
    assert (published / "t-4.jsonl").read_text() == before


def test_publish_records_where_runs_wrote_relative_to_their_checkout(tmp_path, head):
    """A run's resolved config names its results_dir with the machine's absolute path (a run from another
    checkout); the published copy and the index's command name it relative to that checkout. Control: a path in
    no checkout is kept as it is."""
    from mtad._util.paths import repo_relative

    checkout = tmp_path / "wt"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    results = _rows(tmp_path, head, False)
    moved = checkout / "results" / "x"
    moved.parent.mkdir(parents=True)
    results.parent.rename(moved)
    for run in (moved / "runs").iterdir():
        (run / "resolved_config.yaml").write_text(f"name: x\nresults_dir: {moved}\nseed: 0\n")
    published = tmp_path / "published"
    pub.publish(moved / "r.jsonl", "t-rel", published=published)
    configs = [p.read_text() for p in (published / "runs-t-rel").glob("*/resolved_config.yaml")]
    assert len(configs) == 3 and all(c == "name: x\nresults_dir: results/x\nseed: 0\n" for c in configs)
    assert "python -m mtad.harness.publish results/x/r.jsonl --name t-rel" in (published / "README.md").read_text()
    outside = Path("/nonexistent-mtad-path/results")
    assert pub.checkout_relative(outside) == str(outside)  # control
    assert repo_relative(REPO_ROOT / "results" / "regimes") == "results/regimes"
    assert repo_relative(outside) == str(outside)


# ------------------------------------------------------------------------------------------- the step as a transaction
class Killed(BaseException):
    """A kill -9 in the middle: no ``except Exception`` handler of the step runs (a finally still would)."""


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (folders as None): what 'nothing written' compares."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


def _refused(capsys, argv: list[str], *words: str) -> str:
    """main(argv) ends in exit 2 with one line on stderr naming ``words``, no traceback."""
    assert pub.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mtad.harness.publish: error: ") and "Traceback" not in err, err
    assert all(w in err for w in words), err
    return err


def _published_ok(published: Path, name: str) -> None:
    """Indexed once, its rows, records and tables in place, they re-render to the same bytes, no stage left."""
    assert pub.indexed(published / "README.md").count(name) == 1
    rows = load_results(published / f"{name}.jsonl")
    assert all((published / f"runs-{name}" / r["config_hash"][:12] / "samples.jsonl").is_file() for r in rows)
    again = published.parent / f"again-{name}"
    pub.render(name, published, again)
    assert (again / f"{name}.md").read_text() == (published / "tables" / f"{name}.md").read_text()
    assert not [p for p in published.iterdir() if p.name.startswith(".")]


@pytest.fixture
def indexed_published(tmp_path) -> Path:
    """A published folder whose README has an index block with one publication already."""
    published = tmp_path / "published"
    published.mkdir()
    (published / "README.md").write_text(pub.with_index_line("# Published\n\nSome prose.\n", "old-1", 3, 0,
                                                             "python -m mtad.harness.publish r.jsonl --name old-1"))
    return published


def test_a_bad_line_in_the_results_file_is_one_line_and_writes_nothing(tmp_path, head, capsys, indexed_published):
    results = _rows(tmp_path, head, False)
    good = results.read_text()
    lines = good.splitlines(keepends=True)
    results.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    before = _tree(indexed_published)
    _refused(capsys, [str(results), "--name", "t-bad", "--published-dir", str(indexed_published)],
             "r.jsonl:2: bad result line", "repair or delete that line")
    assert _tree(indexed_published) == before
    results.write_text(good)  # control: the same file without that line publishes
    assert pub.main([str(results), "--name", "t-bad", "--published-dir", str(indexed_published)]) == 0
    _published_ok(indexed_published, "t-bad")


def test_a_published_dir_that_is_a_file_is_one_line(tmp_path, head, capsys):
    results = _rows(tmp_path, head, False)
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for where in (afile, afile / "below"):
        _refused(capsys, [str(results), "--name", "t-f", "--published-dir", str(where)], "is a file, not a folder")
        _refused(capsys, ["--render", "t-f", "--published-dir", str(afile)], "is a file, not a folder")
    assert afile.read_text() == "keep"
    folder = tmp_path / "folder"  # control: a folder (made when missing) takes the publication
    assert pub.main([str(results), "--name", "t-f", "--published-dir", str(folder)]) == 0
    _published_ok(folder, "t-f")


def test_an_unwritable_index_is_refused_before_anything_is_written(tmp_path, head, capsys, indexed_published,
                                                                   monkeypatch):
    results = _rows(tmp_path, head, False)
    argv = [str(results), "--name", "t-ro", "--published-dir", str(indexed_published)]
    readme = indexed_published / "README.md"
    real_access = os.access
    monkeypatch.setattr(pub.os, "access", lambda p, mode: False if Path(p) == readme else real_access(p, mode))
    before = _tree(indexed_published)
    _refused(capsys, argv, "cannot be written (read-only)", "chmod u+w")
    assert _tree(indexed_published) == before
    monkeypatch.undo()
    text = readme.read_text()
    readme.unlink()
    readme.mkdir()  # a folder where the index should be (root may write any file, so the test also uses this)
    _refused(capsys, argv, "is not a file")
    assert sorted(_tree(indexed_published)) == ["README.md"]
    readme.rmdir()
    readme.write_text(text.replace(pub.INDEX_END, ""))  # a damaged index block would never take the line
    _refused(capsys, argv, "index block", "damaged")
    readme.write_text(text)  # control: the intact, writable index takes the line and keeps every other byte
    assert pub.main(argv) == 0
    new = readme.read_text()
    assert new.startswith(text.split(pub.INDEX_END)[0]) and new.endswith(pub.INDEX_END + "\n")
    assert pub.indexed(readme) == ["old-1", "t-ro"]


def test_an_index_write_that_fails_last_is_finished_by_a_rerun(tmp_path, head, capsys, indexed_published,
                                                              monkeypatch):
    results = _rows(tmp_path, head, False)
    argv = [str(results), "--name", "t-full", "--published-dir", str(indexed_published)]

    def disk_full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pub, "atomic_write", lambda path, data: disk_full(path, data) if Path(path).name ==
                        "README.md" else atomic_write(path, data))
    _refused(capsys, argv, "No space left on device", "rerun", "to finish")
    # control: the check below sees an unfinished publication
    assert pub.indexed(indexed_published / "README.md") == ["old-1"]
    _refused(capsys, ["--render", "t-full", "--published-dir", str(indexed_published)], "was interrupted")
    monkeypatch.undo()
    assert pub.main(argv) == 0
    _published_ok(indexed_published, "t-full")


@pytest.mark.parametrize("where", ["staging", "moving", "before the index"])
def test_a_rerun_after_a_kill_finishes_or_cleans_up(tmp_path, head, capsys, indexed_published, monkeypatch, where):
    results = _rows(tmp_path, head, False)
    argv = [str(results), "--name", "t-kill", "--published-dir", str(indexed_published)]
    calls = []

    def dying(real):
        def call(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:
                raise Killed
            return real(*args, **kwargs)
        return call

    if where == "staging":
        monkeypatch.setattr(pub.shutil, "copy2", dying(shutil.copy2))
    elif where == "moving":
        monkeypatch.setattr(pub.os, "rename", dying(os.rename))
    else:
        monkeypatch.setattr(pub, "fsync_dir", dying(lambda d: None))
        calls.append("once")
    with pytest.raises(Killed):
        pub.main(argv)
    monkeypatch.undo()
    # control: the kill left an unfinished publication, which these checks see
    assert pub.indexed(indexed_published / "README.md") == ["old-1"]
    assert (indexed_published / ".publish-t-kill").is_dir()
    if where != "staging":
        _refused(capsys, ["--render", "t-kill", "--published-dir", str(indexed_published)], "was interrupted")
    assert pub.main(argv) == 0
    _published_ok(indexed_published, "t-kill")


def test_a_rerun_with_another_command_finishes_the_killed_one_then_refuses(tmp_path, head, capsys,
                                                                           indexed_published, monkeypatch):
    results = _rows(tmp_path, head, False)
    monkeypatch.setattr(pub, "fsync_dir", lambda d: (_ for _ in ()).throw(Killed))
    with pytest.raises(Killed):
        pub.publish(results, "t-two", published=indexed_published)
    monkeypatch.undo()
    _refused(capsys, [str(results), "--name", "t-two", "--experiment", "fixture", "--published-dir",
                      str(indexed_published)], "finished the interrupted", "pick another --name")
    _published_ok(indexed_published, "t-two")
    assert all(r["publication"]["name"] == "t-two" for r in load_results(indexed_published / "t-two.jsonl"))


def test_a_kill_while_the_index_is_written_leaves_it_whole(tmp_path, head, indexed_published, monkeypatch):
    """Killed half-way through writing the index: the README is the old one, byte for byte, and a rerun adds
    the line. Control: the same half-written kill on a file written in place cuts it, which the check sees."""
    readme = indexed_published / "README.md"
    before = readme.read_bytes()

    def half_then_killed(path, data):
        Path(path).write_text(data[: len(data) // 2])
        raise Killed

    monkeypatch.setattr(pub, "atomic_write", lambda path, data: atomic_write(path, lambda tmp: half_then_killed(
        tmp, data)) if Path(path).name == "README.md" else atomic_write(path, data))
    results = _rows(tmp_path, head, False)
    with pytest.raises(Killed):
        pub.publish(results, "t-idx", published=indexed_published)
    assert readme.read_bytes() == before
    monkeypatch.undo()
    (indexed_published / ".README.md.x1y2z3.tmp").write_bytes(before[:99])  # what a kill -9 there leaves
    pub.publish(results, "t-idx", published=indexed_published)
    assert readme.read_bytes().startswith(before.split(pub.INDEX_END.encode())[0])
    _published_ok(indexed_published, "t-idx")
    cut = tmp_path / "cut.md"  # control
    cut.write_bytes(before)
    with pytest.raises(Killed):
        half_then_killed(cut, before.decode() + "| new line |\n")
    assert cut.read_bytes() != before and len(cut.read_bytes()) < len(before)


def test_a_stray_file_of_the_name_is_never_overwritten(tmp_path, head, capsys, indexed_published):
    results = _rows(tmp_path, head, False)
    stray = indexed_published / "tables" / "t-stray.tex"
    stray.parent.mkdir()
    stray.write_text("someone's table")
    before = _tree(indexed_published)
    _refused(capsys, [str(results), "--name", "t-stray", "--published-dir", str(indexed_published)],
             "t-stray.tex exists but the index has no publication", "nothing is overwritten")
    assert _tree(indexed_published) == before
    runs = indexed_published / "runs-t-stray"  # what a kill of an older mtad left: refused the same way
    stray.unlink()
    runs.mkdir()
    _refused(capsys, [str(results), "--name", "t-stray", "--published-dir", str(indexed_published)],
             "runs-t-stray exists but the index has no publication")
    runs.rmdir()  # control: nothing of that name there, it publishes
    assert pub.main([str(results), "--name", "t-stray", "--published-dir", str(indexed_published)]) == 0
    _published_ok(indexed_published, "t-stray")


@pytest.mark.parametrize("name", ["../..", "..", "/etc/passwd", "a/b", ".hidden", "x" * 101])
def test_names_stay_in_the_published_folder(tmp_path, capsys, name):
    published = tmp_path / "deep" / "published"
    (published / "tables").mkdir(parents=True)
    out = tmp_path / "out"
    _refused(capsys, ["--render", name, "--published-dir", str(published), "--tables-dir", str(out)],
             "a publication's name is letters")
    _refused(capsys, [str(FIXTURE), "--name", name, "--published-dir", str(published)],
             "a publication's name is letters")
    assert not out.exists() and _tree(tmp_path / "deep") == {"published": None, "published/tables": None}
    # control: a name of those characters passes the name check (and then finds no publication)
    _refused(capsys, ["--render", "x" * 100, "--published-dir", str(published)], "no publication named")


def test_a_config_hash_cannot_name_a_folder_outside(tmp_path, head, capsys):
    results = _rows(tmp_path, head, False)
    rows = load_results(results)
    rows[0]["config_hash"] = "../../outside"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _refused(capsys, [str(results), "--name", "t-h", "--published-dir", str(tmp_path / "p")], "not a hex hash")
    assert not (tmp_path / "p").exists()


def test_the_index_records_a_normalised_command(tmp_path, head, capsys, indexed_published):
    """No raw newline (it could forge an index line), no absolute path: a results file in this repository is
    named relative to it, one elsewhere by its file name. Controls: the raw command would have forged a line
    and leaked the path, which the same checks see."""
    results = _rows(tmp_path, head, True)
    forged = "x\n| `forged` | 1 | `runs-forged/` | ok | `python -m mtad.harness.publish --render forged` |"
    argv = [str(results), "--name", "t-cmd", "--allow-unclean", forged, "--published-dir", str(indexed_published)]
    before = _tree(indexed_published)
    _refused(capsys, argv, "--allow-unclean", "one line")
    assert _tree(indexed_published) == before
    readme = indexed_published / "README.md"
    raw = readme.read_text().replace(pub.INDEX_END, f"| `t-cmd` (published with `python -m mtad.harness.publish "
                                     f"{' '.join(argv)}`) | 3 | `runs-t-cmd/` | x | `{pub.render_command('t-cmd')}` "
                                     f"|\n{pub.INDEX_END}")
    leaked = tmp_path / "leak.md"
    leaked.write_text(raw)
    assert "forged" in pub.indexed(leaked) and str(tmp_path) in raw  # control
    argv[4] = "a rerun takes a day | or two"
    assert pub.main(argv) == 0
    text = readme.read_text()
    assert pub.indexed(readme) == ["old-1", "t-cmd"] and str(tmp_path) not in text
    line = next(s for s in text.splitlines() if "`t-cmd`" in s)
    assert "published with `python -m mtad.harness.publish .../r.jsonl --name t-cmd --allow-unclean " \
           "'a rerun takes a day \\| or two'`" in line
    inside = REPO_ROOT / "results" / "x.jsonl"
    assert pub.shown_path(inside) == pub.shown_path(os.path.relpath(inside)) == "results/x.jsonl"


@pytest.mark.parametrize("sha", ["HEAD", "HEAD~1", "main", "short"])
def test_provenance_demands_a_full_commit_hash(tmp_path, head, capsys, sha):
    results = _rows(tmp_path, head[:10] if sha == "short" else sha, False)
    _refused(capsys, [str(results), "--name", "t-sha", "--published-dir", str(tmp_path / "p")],
             "is not a full commit hash")
    assert not (tmp_path / "p").exists()
    assert pub.provenance_problem({"git_sha": head, "git_dirty": False}) is None  # control: the full hash passes

"""The publish step (mtad.harness.publish) and what it guarantees of results/published/: every row's per-prompt
records are tracked by git, nothing there is hidden by an ignore rule, every published table re-renders byte for
byte with the command the published README gives."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

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

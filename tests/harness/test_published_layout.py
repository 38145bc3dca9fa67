"""What ``results/`` tracks is what is published, laid out as the publish step lays it out:

- every published row's ``run_dir`` resolves as recorded (relative to the repository, no search) and is
  ``results/published/runs-<publication>/<hash>``, the folder the publish step copies the records to;
- no lock file and no render outside ``results/published/`` (``results/tables/`` is a sweep's output) is tracked.

Controls: a row whose records moved (the recorded folder no longer exists), and one in another publication's
folder, are reported; a planted lock file and a planted stale render are reported."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mtad._util.paths import REPO_ROOT

PUBLISHED = REPO_ROOT / "results" / "published"
needs_git = pytest.mark.skipif(shutil.which("git") is None or not (REPO_ROOT / ".git").exists(),
                               reason="not a git checkout")


def misplaced_rows(name: str, rows: list[dict], root: Path = REPO_ROOT) -> list[str]:
    """The rows of publication ``name`` whose ``run_dir`` is not its records' folder as the publish step writes
    it, or does not hold ``samples.jsonl`` there."""
    bad = []
    for r in rows:
        want = f"results/published/runs-{name}/{r['config_hash'][:12]}"
        if r.get("run_dir") != want or not (root / want / "samples.jsonl").is_file():
            bad.append(f"{name}: {r['run_id']} run_dir {r.get('run_dir')!r} (want {want})")
    return bad


def test_every_published_run_dir_resolves_as_recorded():
    files = sorted(PUBLISHED.glob("*.jsonl"))
    assert len(files) >= 10
    bad = []
    for f in files:
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        bad += misplaced_rows(f.stem, rows)
    assert not bad, bad


def test_a_moved_or_misplaced_run_dir_is_reported(tmp_path):
    name, h = "t-2026-01-01", "0123456789abcdef"
    (tmp_path / "results" / "published" / f"runs-{name}" / h[:12]).mkdir(parents=True)
    (tmp_path / "results" / "published" / f"runs-{name}" / h[:12] / "samples.jsonl").write_text("{}\n")
    ok = {"run_id": "a", "config_hash": h, "run_dir": f"results/published/runs-{name}/{h[:12]}"}
    assert misplaced_rows(name, [ok], tmp_path) == []
    moved = {**ok, "run_dir": f"results/runs-2026-01-01/{h[:12]}"}  # the records were moved, the row not
    other = {**ok, "run_dir": f"results/published/runs-other/{h[:12]}"}
    gone = {**ok, "config_hash": "f" * 16, "run_dir": "results/published/runs-t-2026-01-01/ffffffffffff"}
    assert len(misplaced_rows(name, [moved, other, gone], tmp_path)) == 3


def stale(tracked: list[str]) -> list[str]:
    """Tracked files that a run or a sweep writes and nothing publishes: lock files and renders outside
    ``results/published/``."""
    return [f for f in tracked if f.endswith(".lock") or f.startswith("results/tables/")
            or (f.startswith("results/") and "/tables/" in f and not f.startswith("results/published/"))]


@needs_git
def test_no_lock_file_or_stale_render_is_tracked():
    tracked = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert stale(tracked) == []
    planted = ["results/run5/cpu_table.jsonl.lock", "results/tables/cpu_table.md", "results/x/tables/t.tex",
               "results/published/tables/t.md", "results/published/t.jsonl"]
    assert stale(planted) == planted[:3]  # control

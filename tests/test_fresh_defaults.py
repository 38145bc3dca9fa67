"""Defaults a new user meets: the analysis notebook reads the published table it documents (not every file of
``results/`` pooled), and ``make reproduce-table PROFILE=quick`` writes only untracked files."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from mtad._util.paths import REPO_ROOT


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)


needs_git = pytest.mark.skipif(shutil.which("git") is None or _git("rev-parse").returncode != 0,
                               reason="not a git checkout")


def _notebook_code() -> str:
    nb = json.loads((REPO_ROOT / "notebooks" / "analysis.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_the_notebook_defaults_to_a_published_table():
    default = re.search(r'os\.environ\.get\("MTAD_RESULTS", "([^"]+)"\)', _notebook_code()).group(1)
    path = REPO_ROOT / default
    assert default.startswith("results/published/") and path.suffix == ".jsonl" and path.is_file(), default


@needs_git
def test_the_notebooks_default_output_is_untracked():
    default = re.search(r'repo_path\("(results/tables/[^"]+)"\)', _notebook_code()).group(1)
    assert _git("check-ignore", "-q", f"{default}/x.md").returncode == 0, default


@needs_git
@pytest.mark.parametrize("name", ["quick", "quick_controls"])
def test_profile_quick_writes_no_tracked_file(name):
    """The tables ``--profile quick`` writes (results/tables/<experiment>.md/.tex) are not tracked."""
    for ext in ("md", "tex"):
        rel = f"results/tables/{name}.{ext}"
        assert _git("ls-files", "--error-unmatch", rel).returncode != 0, f"{rel} is tracked"
        assert _git("check-ignore", "-q", rel).returncode == 0, f"{rel} is not ignored"

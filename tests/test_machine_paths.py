"""No machine's own path in what the repository ships: the tracked text files under ``results/``, ``docs/`` and the
drafts' ``models/*/draft.json`` name places relative to the repository (``mtad._util.paths.repo_relative``), or
``.../<name>`` for a place outside it (as the publish step's index does), never ``/tmp/...``, ``/home/...``,
``/work/...`` or another checkout's absolute path.

Controls: planted absolute paths are found; relative paths, ``.../<name>`` and URLs are not."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from mtad._util.paths import REPO_ROOT

ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:tmp|home|work|root|Users|mnt|scratch|private|var/folders)/[^\s\"'`),;\]]*")
BINARY = (".png", ".pdf", ".pt", ".pkl", ".safetensors", ".bin", ".gguf")


def machine_paths(text: str) -> list[str]:
    """The absolute machine paths in ``text``."""
    return ABSOLUTE.findall(text)


def shipped_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "results", "docs", "models"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return [f for f in out if not f.endswith(BINARY)
            and (not f.startswith("models/") or f.endswith("/draft.json"))]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO_ROOT / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_names_a_machine_path():
    files = shipped_files()
    assert "models/smollm2-feature-draft/draft.json" in files and "results/published/README.md" in files
    found = {}
    for f in files:
        path = REPO_ROOT / f
        if not path.is_file():  # removed from the tree, not yet from the index
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if hits := machine_paths(text):
            found[f] = sorted(set(hits))[:3]
    assert not found, f"machine paths (write them relative to the repository, or .../<name>): {found}"


def test_machine_paths_are_found_and_relative_ones_are_not():
    planted = ('published with `python -m mtad.harness.publish /tmp/regime_check_all.jsonl`; "ckpt_dir": '
               '"/work/run5/ckpt", log: /work/wt-users/results/x.log, model.draft=/home/u/run1 (/Users/me/d)')
    assert machine_paths(planted) == ["/tmp/regime_check_all.jsonl", "/work/run5/ckpt",
                                      "/work/wt-users/results/x.log", "/home/u/run1", "/Users/me/d"]
    clean = ('results/regimes/tmp/x.json, .../regime_check_all.jsonl, model.draft=.../run1, '
             'https://example.org/home/page, ~/.cache/mtad, results/published/runs-x/abc/samples.jsonl')
    assert machine_paths(clean) == []


def test_recorded_paths_hold_no_machine_path():
    """What the study, agreement and training commands record: relative to the repository, or ``.../<name>``
    outside it; control: the absolute paths they were given are machine paths."""
    from mtad._util.paths import recorded_command, recorded_path

    inside, outside = str(REPO_ROOT / "results" / "a.json"), "/tmp/mtad-lineage/run1"
    assert machine_paths(inside + " " + outside) == [outside] or machine_paths(outside) == [outside]  # control
    assert recorded_path(inside) == "results/a.json" and recorded_path(outside) == ".../run1"
    assert recorded_path("models/smollm2-draft") == "models/smollm2-draft"
    argv = ["--save-raw", "/tmp/v/raw.pkl", f"model.draft={outside}", "decoder=mtad", "--out", inside]
    got = recorded_command(argv)
    assert got == ["--save-raw", ".../raw.pkl", "model.draft=.../run1", "decoder=mtad", "--out", "results/a.json"]
    assert machine_paths(" ".join(got)) == [] and machine_paths(" ".join(argv))

"""The result row (mtad.harness.rows): schema, config hashing, provenance, strict JSON lines; pinned to the
values the code wrote before the row schema moved out of the store, so a row already written is still
"already done"."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from mtad._util.paths import REPO_ROOT
from mtad.harness.rows import SCHEMA_VERSION, ResultRow, config_hash, git_info, to_json_line
from mtad.harness.store import append_row, load_results

CFG = {
    "experiment": "table1",
    "seed": 0,
    "decoder": {"name": "mtad", "gamma": 4, "tau": 0.5, "k_config": [4, 2, 2]},
    "model": {"name": "tiny", "dtype": "float32"},
    "task": {"name": "gsm8k", "n": 10},
    "results_dir": "results",
    "force": False,
    "tracking": {"backend": "none"},
    "hydra": {"run": {"dir": "outputs/x"}},
}
PUBLISHED = sorted((REPO_ROOT / "results" / "published").glob("*.jsonl"))
FIELDS = ("run_id", "config_hash", "experiment", "timestamp", "git_sha", "git_dirty", "versions", "device_name",
          "num_threads", "seed", "decoder", "model", "task", "metrics", "n_prompts", "n_skipped", "skip_reasons",
          "run_dir", "non_finite", "schema_version", "timing", "publication")


# ------------------------------------------------------------------------------------------------ hash
def test_config_hash_stable_under_key_order_and_volatile_keys():
    h = config_hash(CFG)
    reordered = {k: (dict(reversed(list(v.items()))) if isinstance(v, dict) else v)
                 for k, v in reversed(list(CFG.items()))}
    assert config_hash(reordered) == h
    moved = {**CFG, "results_dir": "elsewhere", "force": True, "tracking": {"backend": "wandb"},
             "hydra": {"job": 3}}
    assert config_hash(moved) == h
    # sha256 of the canonical JSON of the settings that are not volatile: 64 lower-case hex digits, recomputed here
    settings = {k: v for k, v in CFG.items() if k not in ("results_dir", "force", "tracking", "hydra")}
    assert h == hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert not re.fullmatch(r"[0-9a-f]{64}", h[:63]) and not re.fullmatch(r"[0-9a-f]{64}", h.upper())  # controls


def test_config_hash_sensitive_to_settings():
    h = config_hash(CFG)
    assert config_hash({**CFG, "decoder": {**CFG["decoder"], "tau": 0.3}}) != h
    assert config_hash({**CFG, "decoder": {**CFG["decoder"], "k_config": [4, 2]}}) != h
    assert config_hash({**CFG, "seed": 1}) != h
    assert config_hash(CFG, exclude=()) != h  # the volatile keys are what made the difference above


def test_config_hash_accepts_omegaconf_and_dotted_exclusions():
    from omegaconf import OmegaConf

    assert config_hash(OmegaConf.create(CFG)) == config_hash(CFG)
    nested = {**CFG, "run": {"out": "a", "n": 1}}
    assert config_hash(nested, exclude=("run.out",)) == config_hash({**nested, "run": {"out": "b", "n": 1}},
                                                                     exclude=("run.out",))
    with pytest.raises(ValueError, match="mapping"):
        config_hash([1, 2])


def test_config_hash_is_pinned():
    """Hashes as the code wrote them before the split (commit b87e07a): a changed canonical form would make
    every recorded run look new. test_config_hash_sensitive_to_settings is the control that it can fail."""
    assert config_hash(CFG) == "de954b70d6d1b3e98c4999fed127ebd9ad73f959ebef686128aa9633a59b4754"
    odd = {**CFG, "data": Path("d/x.jsonl"), "k": (1, 2), "s": {3, 1}}  # Paths, tuples, sets normalised
    assert config_hash(odd) == "d8d7f53c05d2c36254f49f9b8b9bda53acd991c567a595ddf858fb4c51d6dec3"


# -------------------------------------------------------------------------------------------- schema
def test_schema_fields_are_pinned():
    assert SCHEMA_VERSION == 1
    assert tuple(f.name for f in dataclasses.fields(ResultRow)) == FIELDS


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_published_rows_read_and_rewrite_byte_for_byte(path):
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines
    for line in lines:
        row = json.loads(line)
        back = ResultRow.from_dict(row).to_dict()  # older rows lack non_finite: it defaults to {}
        assert {k: back[k] for k in row} == row
        assert to_json_line(row) == line


def test_rewrite_check_can_fail():
    line = PUBLISHED[0].read_text(encoding="utf-8").splitlines(keepends=True)[0]
    row = json.loads(line)
    moved = {"config_hash": row.pop("config_hash"), **row}  # same content, another key order
    assert to_json_line(moved) != line
    with pytest.raises(ValueError, match="missing keys"):
        ResultRow.from_dict(row)


def test_lines_are_strict_json_with_text_as_written():
    assert to_json_line({"label": "τ=0.5", "p": Path("a")}) == '{"label": "τ=0.5", "p": "a"}\n'
    line = to_json_line({"metrics": {"ppl": float("nan"), "x": [1.0, float("inf")]}, "non_finite": {}})
    assert json.loads(line) == {"metrics": {"ppl": None, "x": [1.0, None]},
                                "non_finite": {"metrics.ppl": "nan", "metrics.x.1": "inf"}}


# ----------------------------------------------------------------------------------------- row + env
def test_build_row_roundtrip(tmp_path):
    row = ResultRow.build(CFG, experiment="table1", metrics={"ms_per_token": 2.0},
                          decoder=CFG["decoder"], model=CFG["model"], task=CFG["task"], seed=0,
                          n_prompts=9, skip_reasons={"prompt too long": 1}, run_dir=tmp_path / "run",
                          devices=["cpu"], repo_root=tmp_path)
    assert row.config_hash == config_hash(CFG) and row.n_skipped == 1
    assert row.timestamp.endswith("+00:00") and row.git_sha is None
    assert row.versions["torch"] and row.device_name and row.num_threads >= 1
    assert row.run_dir == str(tmp_path / "run")
    append_row(tmp_path / "table1.jsonl", row)
    back = load_results(tmp_path / "table1.jsonl")[0]
    assert ResultRow.from_dict(back) == row
    with pytest.raises(ValueError, match="unknown keys"):
        ResultRow.from_dict({**back, "extra": 1})


def test_git_info(tmp_path):
    assert git_info(tmp_path) == (None, None)  # not a repository
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, env=env)

    git("init", "-q")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("commit", "-q", "-m", "x")
    sha, dirty = git_info(tmp_path)
    assert len(sha) == 40 and dirty is False
    (tmp_path / "f").write_text("2")
    assert git_info(tmp_path) == (sha, True)
    (tmp_path / "sub").mkdir()
    assert git_info(tmp_path / "sub") == (None, None)  # only the repository's own top level counts
    git("checkout", "-q", "f")
    (tmp_path / "results" / "runs").mkdir(parents=True)
    (tmp_path / "results" / "runs" / "samples.jsonl").write_text("{}")  # what a run writes: not dirty
    assert git_info(tmp_path) == (sha, False)
    (tmp_path / "new.py").write_text("x = 1")  # untracked code outside the output folders: dirty (control)
    assert git_info(tmp_path) == (sha, True)


def test_rows_record_load_and_interleaving():
    from mtad.harness.rows import timing_info

    t = timing_info([0.5, 0.4, 0.3], True)
    assert t["interleaved"] is True and t["load_start"] == [0.5, 0.4, 0.3] and t["cpus"] >= 1
    assert len(t["load_end"]) == 3 and timing_info(None, False)["interleaved"] is False

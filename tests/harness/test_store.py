"""The results store (mtad.harness.store): crash-safe concurrent appends, tail repair, loading."""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from mtad.harness.rows import SCHEMA_VERSION, ResultRow
from mtad.harness.store import append_row, existing_hashes, load_frame, load_results, write_jsonl_atomic


def make_row(i: int = 0, writer: int = 0, **over) -> dict:
    row = ResultRow(run_id=f"w{writer}-{i}", config_hash=f"h{writer}-{i}", experiment="t",
                    timestamp="2025-01-01T00:00:00+00:00", git_sha=None, git_dirty=None,
                    versions={"torch": "x"}, device_name="cpu", num_threads=1, seed=i,
                    decoder={"name": "greedy", "gamma": 4}, model={"name": "tiny"}, task={"name": "t"},
                    metrics={"ms_per_token": 1.5 * i, "acceptance_rate": None}, n_prompts=3, n_skipped=0,
                    run_dir="runs/x").to_dict()
    row.update(over)
    return row


# ---------------------------------------------------------------------------------------------- append
def _writer(path: str, writer: int, n: int) -> None:
    for i in range(n):
        append_row(path, make_row(i, writer))


def test_concurrent_appends_from_processes(tmp_path):
    path = tmp_path / "results" / "t.jsonl"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 10)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    lines = path.read_text().splitlines()
    assert len(lines) == 40
    ids = sorted(json.loads(s)["run_id"] for s in lines)
    assert ids == sorted(f"w{w}-{i}" for w in range(4) for i in range(10))
    assert not list(path.parent.glob("*.tmp"))


def _old_file(tmp_path) -> tuple[Path, bytes]:
    path = tmp_path / "t.jsonl"
    append_row(path, make_row(0))
    append_row(path, make_row(1))
    return path, path.read_bytes()


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_crash_mid_write_keeps_old_file(tmp_path, monkeypatch, where):
    path, before = _old_file(tmp_path)

    def crash(*a, **k):
        raise KeyboardInterrupt  # Ctrl-C after the temp file holds (part of) the new content

    monkeypatch.setattr(os, where, crash)
    with pytest.raises(KeyboardInterrupt):
        append_row(path, make_row(2))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [r["run_id"] for r in load_results(path)] == ["w0-0", "w0-1"]
    assert not list(tmp_path.glob("*.tmp"))
    append_row(path, make_row(2))  # the lock was released
    assert len(load_results(path)) == 3


def test_unserialisable_row_fails_before_touching_file(tmp_path):
    path, before = _old_file(tmp_path)
    with pytest.raises(TypeError, match="cannot write object"):
        append_row(path, make_row(2, metrics={"x": object()}))
    assert path.read_bytes() == before


def test_append_refuses_other_schema_version(tmp_path):
    with pytest.raises(ValueError, match="schema_version"):
        append_row(tmp_path / "t.jsonl", make_row(0, schema_version=SCHEMA_VERSION + 1))


# ------------------------------------------------------------------------------------------------ load
def test_trailing_bad_line_is_reported_and_skipped(tmp_path, caplog):
    path, before = _old_file(tmp_path)
    path.write_bytes(before + b'{"run_id": "half')  # a writer killed outside append_row
    with caplog.at_level(logging.WARNING, logger="mtad.harness.store"):
        assert len(load_results(path)) == 2
    assert "bad trailing line" in caplog.text
    append_row(path, make_row(2))  # drops the half line instead of burying it mid-file
    assert [r["run_id"] for r in load_results(path)] == ["w0-0", "w0-1", "w0-2"]


def test_bad_line_in_the_middle_is_an_error(tmp_path):
    path, before = _old_file(tmp_path)
    path.write_bytes(b"not json\n" + before)
    with pytest.raises(ValueError, match=r"t\.jsonl:1: bad result line"):
        load_results(path)


def test_schema_version_checked_on_load(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(make_row(0, schema_version=0)) + "\n")
    with pytest.raises(ValueError, match="schema_version=0"):
        load_results(path)
    with pytest.raises(FileNotFoundError, match="no results"):
        load_results(tmp_path / "missing.jsonl")


def test_existing_hashes(tmp_path):
    path = tmp_path / "t.jsonl"
    assert existing_hashes(path) == set()
    append_row(path, make_row(0))
    append_row(path, make_row(1))
    assert existing_hashes(path) == {"h0-0", "h0-1"}


def test_load_frame_flattens_and_reads_directories(tmp_path):
    append_row(tmp_path / "a.jsonl", make_row(1))
    append_row(tmp_path / "b.jsonl", make_row(2, experiment="b"))
    (tmp_path / "notes.txt").write_text("ignored")
    df = load_frame(tmp_path)
    assert len(df) == 2
    assert {"metrics.ms_per_token", "metrics.acceptance_rate", "decoder.name", "decoder.gamma",
            "model.name", "run_id", "schema_version"} <= set(df.columns)
    assert "metrics" not in df.columns
    assert df["metrics.ms_per_token"].tolist() == [1.5, 3.0]
    assert df["decoder.name"].tolist() == ["greedy", "greedy"]


def test_write_jsonl_atomic(tmp_path, monkeypatch):
    path = tmp_path / "run" / "samples.jsonl"
    write_jsonl_atomic(path, [{"i": 0, "path": Path("a")}, {"i": 1, "ids": [1, 2]}])
    assert [json.loads(s) for s in path.read_text().splitlines()] == [{"i": 0, "path": "a"},
                                                                     {"i": 1, "ids": [1, 2]}]
    before = path.read_bytes()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError):
        write_jsonl_atomic(path, [{"i": 9}])
    assert path.read_bytes() == before

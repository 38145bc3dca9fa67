"""A row records only what ran, and a sweep that cannot go on ends in one line with what it finished kept.

- gamma is not a shared key: greedy, sampling and specinfer do not read it, so ``-m decoder=greedy,sampling
  decoder.gamma=4,7`` writes one row per decoder and refuses the gamma=7 jobs (their identical decodes would be
  recorded and hashed as other configs); the decoders that read gamma take it (the control).
- A model-based proposer that a decoder does not draft with is refused when the config is built, not swapped for
  the decoder's own draft step (mtad's beam sampling); speculative, which drafts its chain, takes it (control).
  With the refusal switched off, mtad decodes exactly as with ``proposer=draft``: the setting never ran.
- A full disk in a multirun ends the sweep in one ``mtad: error:`` line, exit 2, the rows already appended kept:
  when a job's append fails (ENOSPC), and between jobs, before Hydra writes the next job's files (which used to end
  in Hydra's traceback, the control with the check switched off). Another write error (EACCES) fails only its job.
- ``name=`` is checked against the longest file an append puts beside ``<name>.jsonl`` (its temp file): the longest
  accepted name appends; a name the old check passed (246 bytes) fails to append (the control) and is refused.
- All prompts too long for the target's context: the advice names settings that make them fit, and they do; the
  old advice (``task.on_long_prompt=truncate`` alone) decodes nothing (the control).
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import tinymodels as tm
import torch
from hydra import compose, initialize_config_dir
from inprocess import run_module

import mtad
from mtad._util.paths import REPO_ROOT
from mtad.decoding import DecoderConfig
from mtad.decoding import config as dconfig
from mtad.decoding.core import check_keys
from mtad.decoding.propose import PROPOSERS, Proposer, draft_rows
from mtad.harness import rundir, runner, store
from mtad.harness.config import experiment_name, register_configs
from mtad.harness.rows import ResultRow
from mtad.harness.store import append_row, load_results
from mtad.models.pair import ModelPair

register_configs()
torch.set_num_threads(1)
TINY = ["model=tiny", "task=jsonl", "name=t", "decoder.max_new_tokens=4", "warmup=0"]


def _data(tmp_path: Path, prompts: list[str] | None = None) -> Path:
    path = tmp_path / "p.jsonl"
    prompts = prompts or [f"say hi {i}" for i in range(2)]
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "answer": "hi"}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def _cli(tmp_path: Path, *args: str):
    """``python -m mtad`` in this process on one short prompt (no perplexity pass: only the rows matter here)."""
    return run_module("mtad", *args, *TINY, f"task.data_file={_data(tmp_path, ['say hi'])}", "perplexity=false",
                      f"results_dir={tmp_path / 'res'}", cwd=tmp_path, env={"WANDB_MODE": "disabled"})


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mtad: error")]


# ---- gamma ---------------------------------------------------------------------------------------------------
def test_gamma_is_refused_where_it_is_not_read_and_taken_where_it_is():
    for name in ("greedy", "sampling", "specinfer"):
        with pytest.raises(ValueError, match=rf"decoder.gamma=7 has no effect with decoder={name}\b.*drop it"):
            check_keys(DecoderConfig(name=name, gamma=7))
    for name in ("speculative", "mtad", "mmtad", "mtjd"):  # control: they read it
        check_keys(DecoderConfig(name=name, gamma=7))


def test_a_gamma_sweep_over_decoders_that_ignore_it_writes_one_row_each(tmp_path):
    out = _cli(tmp_path, "-m", "decoder=greedy,sampling", "decoder.gamma=4,7")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    rows = load_results(tmp_path / "res" / "t.jsonl")
    assert sorted((r["decoder"]["name"], r["decoder"]["gamma"]) for r in rows) == [("greedy", 4), ("sampling", 4)]
    records = [json.loads(p.read_text()) for p in (tmp_path / "res" / "multirun").rglob("error.json")]
    assert sorted("decoder=greedy" in r["overrides"] for r in records) == [False, True]
    assert all("decoder.gamma=7" in r["overrides"] and "decoder.gamma=7 has no effect" in r["message"]
               for r in records)
    assert "2 job(s) of the multirun failed" in out.stderr


# ---- proposers -----------------------------------------------------------------------------------------------
@pytest.fixture
def one_token_proposer(monkeypatch):
    """A model-based proposer other than the draft model's own step: one draft token per block."""
    monkeypatch.setitem(PROPOSERS, "draft1", Proposer(
        "draft1", model=True, rows=lambda states, draft, batch, runs, K, rng, V: draft_rows(
            draft, batch, [min(k, 1) for k in K], rng)))


def _decode(cfg: dict) -> tuple[list[int], int]:
    t = tm.model("llama", 1, 32, hidden=16)
    models = ModelPair(t, tm.near(t, 5, 0.6))
    c = DecoderConfig(max_new_tokens=12, top_k=4, **cfg)
    out = mtad.generate(models, [3, 1, 4, 1, 5, 9, 2, 6], c, torch.Generator().manual_seed(0))
    return out.tokens, out.draft_forwards


@pytest.mark.parametrize("name", ["mtad", "mmtad", "specinfer", "greedy"])
def test_a_proposer_the_decoder_does_not_use_is_refused(one_token_proposer, name):
    with pytest.raises(ValueError) as err:
        DecoderConfig(name=name, proposer="draft1")
    msg = str(err.value)
    assert f"decoder.proposer='draft1' is not used by decoder={name}" in msg and "\n" not in msg
    assert "proposer=draft" in msg and "decoder=speculative" in msg


def test_speculative_drafts_with_it_and_mtad_would_swap_it(one_token_proposer, monkeypatch):
    DecoderConfig(name="speculative", proposer="draft1")  # control: the decoder that drafts the proposer's chain
    assert _decode({"name": "speculative", "proposer": "draft1"}) != _decode({"name": "speculative"})
    # why mtad refuses it: with the refusal switched off, mtad decodes as with proposer=draft (its beam step)
    monkeypatch.setattr(dconfig, "MODEL_PROPOSER_DECODERS", ("speculative", "mtad"))
    assert _decode({"name": "mtad", "proposer": "draft1"}) == _decode({"name": "mtad"})


# ---- a full disk in a multirun -------------------------------------------------------------------------------
def _append_fails_from(monkeypatch, n: int, code: int) -> None:
    """Every append to the results file from the ``n``-th on fails with ``code``."""
    real, calls = store.atomic_write, []

    def write(path, data):
        if Path(path).suffix == ".jsonl" and Path(path).parent.name == "res":
            calls.append(path)
            if len(calls) >= n:
                raise OSError(code, os.strerror(code))
        return real(path, data)

    monkeypatch.setattr(store, "atomic_write", write)


def test_a_disk_full_append_ends_the_multirun_in_one_line(tmp_path, monkeypatch):
    results = tmp_path / "res" / "t.jsonl"
    append_row(results, _row())  # a row a finished job appended before the disk filled
    before = results.read_bytes()
    _append_fails_from(monkeypatch, 1, errno.ENOSPC)
    out = _cli(tmp_path, "-m", "decoder=greedy,sampling")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = _errors(out.stderr)
    assert len(lines) == 1, lines
    assert "the multirun stops after job 0" in lines[0] and "No space left" in lines[0]
    assert str(results) in lines[0] and "rerun the same command" in lines[0]
    assert results.read_bytes() == before  # the finished row kept
    jobs = [p.name for p in (tmp_path / "res" / "multirun").glob("t/*/*") if p.is_dir()]
    assert [j.split("_")[1] for j in jobs] == ["greedy"]  # sampling never started
    saved = next((tmp_path / "res" / "multirun").rglob("row.json"))  # job 0's row, kept beside its samples
    assert ResultRow.from_dict(json.loads(saved.read_text())).decoder["name"] == "greedy"


def test_another_write_error_fails_only_its_job(tmp_path, monkeypatch):
    """Control: a failed append that is not a full disk (EACCES) is one job's failure; the sweep goes on."""
    _append_fails_from(monkeypatch, 1, errno.EACCES)
    out = _cli(tmp_path, "-m", "decoder=greedy,sampling")
    assert out.returncode == 2 and "2 job(s) of the multirun failed" in out.stderr, out.stderr[-2000:]
    assert not any("the multirun stops" in line for line in _errors(out.stderr))


def _disk_fills_after(monkeypatch, tmp_path: Path, rows: int = 1) -> None:
    """After ``rows`` rows are appended, every write under ``tmp_path`` fails with ENOSPC: the write check's
    probe (``os.write``) and Hydra's files of the next job (``_save_config``)."""
    import hydra.core.utils as hydra_utils

    full, real_append, real_write, real_save = [], runner.append_row, os.write, hydra_utils._save_config

    def append(*a, **k):
        done = real_append(*a, **k)
        full.append(True)
        return done

    def write(fd, data):
        if len(full) >= rows and os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def save(cfg, filename, output_dir):
        if len(full) >= rows:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(output_dir) / filename))
        return real_save(cfg, filename, output_dir)

    monkeypatch.setattr(runner, "append_row", append)
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(hydra_utils, "_save_config", save)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_disk_that_fills_between_jobs_ends_the_multirun_in_one_line(tmp_path, monkeypatch):
    _disk_fills_after(monkeypatch, tmp_path)
    out = _cli(tmp_path, "-m", "decoder=greedy,sampling")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = _errors(out.stderr)
    assert len(lines) == 1 and "the multirun stops after job 0" in lines[0] and "No space left" in lines[0], lines
    assert [r["decoder"]["name"] for r in load_results(tmp_path / "res" / "t.jsonl")] == ["greedy"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_disk_full_after_the_last_job_fails_nothing(tmp_path, monkeypatch):
    """Control: the check runs only where another job follows, so a finished sweep is not reported as stopped."""
    _disk_fills_after(monkeypatch, tmp_path, rows=2)
    out = _cli(tmp_path, "-m", "decoder=greedy,sampling")
    assert out.returncode == 0 and not _errors(out.stderr), out.stderr[-2000:]
    assert len(load_results(tmp_path / "res" / "t.jsonl")) == 2


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_without_the_check_between_jobs_hydra_ends_in_a_traceback(tmp_path, monkeypatch):
    """Control: the same full disk with the between-jobs check switched off fails in Hydra's own writes."""
    _disk_fills_after(monkeypatch, tmp_path)
    monkeypatch.setattr(rundir.RunDirGuard, "on_job_end", lambda self, *a, **k: None)
    out = _cli(tmp_path, "-m", "decoder=greedy,sampling")
    assert out.returncode == 1 and "OSError" in out.stderr and not _errors(out.stderr), out.stderr[-2000:]


# ---- name length ---------------------------------------------------------------------------------------------
def _row() -> ResultRow:
    return ResultRow(run_id="r", config_hash="a" * 64, experiment="t", timestamp="2025-01-01T00:00:00+00:00",
                     git_sha=None, git_dirty=None, versions={}, device_name="cpu", num_threads=1, seed=0,
                     decoder={}, model={}, task={}, metrics={}, n_prompts=1, n_skipped=0)


def test_the_name_check_counts_the_files_beside_the_results_file(tmp_path):
    if os.pathconf(tmp_path, "PC_NAME_MAX") != 255:
        pytest.skip("a file system with another name limit")
    longest = "n" * 235
    assert experiment_name({"name": longest}) == longest
    assert append_row(tmp_path / f"{longest}.jsonl", _row())  # its lock and its temp file fit too
    with pytest.raises(ValueError, match="is 236 bytes long.*at most 255 bytes, so use a name of at most 235"):
        experiment_name({"name": "n" * 236})
    # control: 246 bytes passed the old check (<name>.jsonl alone is 252 bytes), then failed to append
    old = "o" * 246
    with pytest.raises(OSError) as err:
        append_row(tmp_path / f"{old}.jsonl", _row())
    assert err.value.errno == errno.ENAMETOOLONG
    with pytest.raises(ValueError, match="is 246 bytes long"):
        experiment_name({"name": old})


# ---- prompts longer than the model's context -----------------------------------------------------------------
def _run(tmp_path: Path, data: Path, *extra: str):
    overrides = [*TINY, f"task.data_file={data}", f"results_dir={tmp_path / 'res'}", *extra]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return runner.run(cfg, run_dir=tmp_path / f"run{len(list(tmp_path.glob('run*')))}")


def test_the_long_prompt_advice_names_what_makes_them_fit(tmp_path):
    data = _data(tmp_path, ["x" * 1100, "y" * 1200])  # longer than the tiny target's 1024 positions
    with pytest.raises(ValueError) as err:
        _run(tmp_path, data, "decoder=greedy", "task.max_prompt_tokens=0")
    msg = str(err.value)
    assert "all 2 selected prompts were skipped: 2 prompts do not fit the model context" in msg and "\n" not in msg
    assert "set task.max_prompt_tokens=1020 task.on_long_prompt=truncate" in msg
    assert "longer context" in msg and "decoder.max_new_tokens=" in msg
    fix = ["task.max_prompt_tokens=1020", "task.on_long_prompt=truncate"]
    row = _run(tmp_path, data, "decoder=greedy", *fix)  # the advice works
    assert row["n_prompts"] == 2 and row["n_skipped"] == 0
    # control: the old advice alone truncates to task.max_prompt_tokens (0: no limit), never to the context
    with pytest.raises(ValueError, match="all 2 selected prompts were skipped"):
        _run(tmp_path, data, "decoder=sampling", "task.max_prompt_tokens=0", "task.on_long_prompt=truncate")

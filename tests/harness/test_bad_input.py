"""Nothing lost, nothing deleted that the run did not create.

Each test names the issue item it covers. CLI runs (``python -m mtad``) start from a tmp dir, in this process
(:mod:`inprocess`) unless they need a process of their own (a mount namespace, two runs at once); the rest runs
in-process on ``model=tiny``.
"""
from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from inprocess import run_module

from mtad._util.paths import REPO_ROOT
from mtad.harness.config import register_configs
from mtad.harness.rows import ResultRow
from mtad.harness.store import append_row, load_results

register_configs()
PROMPTS = [{"id": f"p{i}", "prompt": f"Question {i}: say hi", "answer": "hi"} for i in range(2)]
TINY = ["model=tiny", "task=jsonl", "name=t", "decoder.max_new_tokens=4", "warmup=0"]


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "prompts.jsonl", PROMPTS)


def _cfg(tmp_path: Path, data_file: Path, *extra: str):
    overrides = [*TINY, f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}", *extra]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _env(**extra: str) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO_ROOT), **extra}


def _cli(cwd: Path, *args: str, prefix: tuple = ()) -> subprocess.CompletedProcess:
    """``python -m mtad args`` from ``cwd``: in this process (:mod:`inprocess`), or, under a ``prefix`` (a mount
    namespace), in a child process."""
    if not prefix:
        return run_module("mtad", *args, cwd=cwd, env={"WANDB_MODE": "disabled"})
    return subprocess.run([*prefix, sys.executable, "-m", "mtad", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mtad: error")]


def _strict_rows(path: Path) -> list[dict]:
    def no_constant(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return [json.loads(line, parse_constant=no_constant) for line in path.read_text().splitlines()]


# ---- 14.1: a failed run deletes only what it created ------------------------------------------------------
@pytest.mark.parametrize("where", ["existing_folder", "cwd", "results_dir"])
def test_failed_run_keeps_a_folder_it_did_not_create(tmp_path, data_file, where):
    from mtad.harness.runner import run

    (tmp_path / "res").mkdir()
    if where == "results_dir":  # a results dir with a row, a lock and a run directory
        run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "res" / "runs" / "ok")
    target = {"existing_folder": tmp_path / "mine", "cwd": tmp_path, "results_dir": tmp_path / "res"}[where]
    target.mkdir(exist_ok=True)
    (target / "notes.txt").write_text("precious")
    (target / "sub").mkdir()
    (target / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = _files(target)
    run_dir = "." if where == "cwd" else str(target)
    out = _cli(tmp_path, *TINY, f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
               "decoder=mtad", "decoder.tau=1.5", f"hydra.run.dir={run_dir}")
    assert out.returncode == 2 and "tau" in out.stderr, out.stderr[-2000:]
    assert target.is_dir() and _files(target) == before  # Hydra's own .hydra/ and log went, nothing else
    assert not (target / ".hydra").exists() and not (target / "__main__.log").exists()


def test_failed_run_removes_the_fresh_run_dir_it_created(tmp_path, data_file):
    out = _cli(tmp_path, *TINY, f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
               "decoder=mtad", "decoder.tau=1.5")
    assert out.returncode == 2 and "tau" in out.stderr
    assert not (tmp_path / "res").exists()  # the run dir and the parents this run created are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl"]


# ---- 13.1: output paths checked before any work ------------------------------------------------------------
def _read_only_mount() -> tuple:
    """``unshare -rm`` + a read-only tmpfs: a read-only file system without touching the host's mounts."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user+mount namespaces unavailable: {probe.stderr.decode()[:200]}")
    return ("unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$0" && exec "$@"')


def _guard_exit(tmp_path: Path, data_file: Path, capsys, *overrides: str) -> list[str]:
    """Run the Hydra callback's checks (what ``python -m mtad`` runs before Hydra creates anything)."""
    from mtad.harness.rundir import RunDirGuard

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True,
                      overrides=[*TINY, f"task.data_file={data_file}", *overrides])
    with pytest.raises(SystemExit) as stop:
        RunDirGuard().on_run_start(config=cfg)
    assert stop.value.code == 2
    return [line for line in capsys.readouterr().err.splitlines() if line]


@pytest.mark.parametrize("case", ["proc", "file_as_folder", "results_file_is_a_folder", "default_run_dir"])
def test_unwritable_output_is_refused_before_hydra_creates_anything(tmp_path, data_file, capsys, case):
    """proc: results_dir under /proc (no file can be created there); file_as_folder: results_dir below a
    regular file; results_file_is_a_folder: res/t.jsonl is a directory while the run dir is writable;
    default_run_dir: the default run dir (under results_dir) below a file. Each: exit 2, one line naming
    the path and the setting to change, nothing created (the CLI path is the read-only test below)."""
    run_dir = [f"hydra.run.dir={tmp_path / 'run'}"]
    if case == "proc":
        results, named = "/proc/mtad-nowhere/res", "/proc"
    elif case in ("file_as_folder", "default_run_dir"):
        (tmp_path / "plain").write_text("I am a file")
        results, named = str(tmp_path / "plain" / "res"), f"{tmp_path / 'plain'} is a file"
        run_dir = [] if case == "default_run_dir" else run_dir
    else:
        (tmp_path / "res" / "t.jsonl").mkdir(parents=True)
        results, named = str(tmp_path / "res"), f"{tmp_path / 'res' / 't.jsonl'} is not a regular file"
    before = sorted(tmp_path.rglob("*"))
    lines = _guard_exit(tmp_path, data_file, capsys, f"results_dir={results}", *run_dir)
    assert len(lines) == 1 and lines[0].startswith("mtad: error: ") and named in lines[0], lines
    assert "results_dir" in lines[0] or "hydra.run.dir" in lines[0]
    assert sorted(tmp_path.rglob("*")) == before


def test_read_only_results_dir_fails_before_any_work_through_the_cli(tmp_path, data_file):
    """results_dir on a read-only tmpfs (own mount namespace) while hydra.run.dir is writable: exit 2, one
    error line naming the path, no run directory, nothing written, no model loaded."""
    (tmp_path / "ro").mkdir()
    run_dir = tmp_path / "run"
    before = _files(tmp_path)
    out = _cli(tmp_path, *TINY, f"task.data_file={data_file}", f"results_dir={tmp_path / 'ro' / 'res'}",
               "decoder=greedy", f"hydra.run.dir={run_dir}", prefix=(*_read_only_mount(), str(tmp_path / "ro")))
    assert out.returncode == 2, out.stderr[-2000:]
    lines = _error_lines(out.stderr)
    assert len(lines) == 1 and str(tmp_path / "ro") in lines[0] and "Read-only file system" in lines[0]
    assert "Traceback" not in out.stderr and "energy source" not in out.stderr + out.stdout  # no model run
    assert not run_dir.exists() and _files(tmp_path) == before


def test_run_dir_under_a_file_fails_before_any_work(tmp_path, data_file):
    from mtad.harness.rundir import NotWritable
    from mtad.harness.runner import run

    (tmp_path / "plain").write_text("x")
    with pytest.raises(NotWritable, match="plain is a file"):
        run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "plain" / "run")
    assert not (tmp_path / "res").exists()


def _fail_append(monkeypatch, names: set[str]) -> None:
    import mtad.harness.store as results

    real = results.atomic_write

    def disk_full(path, data):
        if Path(path).name in names:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    monkeypatch.setattr(results, "atomic_write", disk_full)


def test_failed_append_saves_the_row_beside_the_samples(tmp_path, data_file, monkeypatch):
    from mtad.harness.runner import ResultsNotAppended, run

    run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "first")
    results_file = tmp_path / "res" / "t.jsonl"
    before = results_file.read_bytes()
    _fail_append(monkeypatch, {"t.jsonl"})
    with pytest.raises(ResultsNotAppended) as err:
        run(_cfg(tmp_path, data_file, "decoder=mtad"), run_dir=tmp_path / "second")
    saved = tmp_path / "second" / "row.json"
    assert str(saved) in str(err.value) and "No space left" in str(err.value)
    row = ResultRow.from_dict(json.loads(saved.read_text()))
    assert row.decoder["name"] == "mtad" and row.n_prompts == 2
    assert (tmp_path / "second" / "samples.jsonl").is_file()
    assert results_file.read_bytes() == before and len(_strict_rows(results_file)) == 1
    monkeypatch.undo()  # the disk is fixed: the saved row goes in with the documented command
    from mtad.harness.store import main as results_main

    results_main(["append", str(saved), str(results_file)])
    assert [r["decoder"]["name"] for r in load_results(results_file)] == ["greedy", "mtad"]


def test_failed_append_and_failed_rescue_print_the_row_to_stderr(tmp_path, data_file, monkeypatch, capsys):
    from mtad.harness.runner import ResultsNotAppended, run

    _fail_append(monkeypatch, {"t.jsonl", "row.json"})
    with pytest.raises(ResultsNotAppended, match="stderr"):
        run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "run")
    line = [s for s in capsys.readouterr().err.splitlines() if s.startswith("{")][-1]
    assert ResultRow.from_dict(json.loads(line)).n_prompts == 2
    assert not (tmp_path / "res" / "t.jsonl").exists()


# ---- 14.6: concurrent identical sweeps, unique run directories -------------------------------------------
def test_done_check_is_repeated_under_the_lock(tmp_path, data_file, monkeypatch):
    """Both runs pass the early check (as two identical sweeps started together do); one row results."""
    from mtad.harness import runner

    monkeypatch.setattr(runner, "existing_hashes", lambda path: set())
    first = runner.run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "a")
    second = runner.run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "b")
    assert first is not None and second is None
    assert len(load_results(tmp_path / "res" / "t.jsonl")) == 1
    assert (tmp_path / "b" / "samples.jsonl").is_file()  # the discarded run's samples stay
    assert runner.run(_cfg(tmp_path, data_file, "decoder=greedy", "force=true"), run_dir=tmp_path / "c")
    assert len(load_results(tmp_path / "res" / "t.jsonl")) == 2  # force=true still appends


def _append_once(path: str, run_id: str) -> None:
    row = {**json.loads(json.dumps(_row_template())), "run_id": run_id}
    append_row(path, row, unless_hash=row["config_hash"])


def _row_template() -> dict:
    return ResultRow(run_id="r", config_hash="h" * 64, experiment="t", timestamp="2025-01-01T00:00:00+00:00",
                     git_sha=None, git_dirty=None, versions={}, device_name="cpu", num_threads=1, seed=0,
                     decoder={}, model={}, task={}, metrics={}, n_prompts=1, n_skipped=0).to_dict()


def test_concurrent_appends_of_one_config_write_one_row(tmp_path):
    path = tmp_path / "t.jsonl"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_once, args=(str(path), f"w{i}")) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert len(_strict_rows(path)) == 1


def test_run_dirs_are_unique_per_job(tmp_path):
    """Two configs composed in the same second resolve to different run and sweep directories."""
    from omegaconf import OmegaConf

    def dirs():
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["model=tiny"], return_hydra_config=True)
        return OmegaConf.select(cfg, "hydra.run.dir"), OmegaConf.select(cfg, "hydra.sweep.dir")

    for _ in range(5):
        (run1, sweep1), (run2, sweep2) = dirs(), dirs()
        stamp = len("2026-01-01_00-00-00")
        if Path(run1).name[:stamp] == Path(run2).name[:stamp]:  # same second: only the suffix differs
            break
    assert run1 != run2 and sweep1 != sweep2


@pytest.mark.slow  # ~40 s on 2 shared cores; the append path's race is covered by the two tests above
def test_two_identical_concurrent_cli_runs_write_one_row_in_two_dirs(tmp_path, data_file):
    args = [*TINY, f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}", "decoder=greedy"]
    procs = [subprocess.Popen([sys.executable, "-m", "mtad", *args], cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    assert len(_strict_rows(tmp_path / "res" / "t.jsonl")) == 1
    run_dirs = [p for p in (tmp_path / "res" / "runs" / "t").iterdir() if p.is_dir()]
    assert len(run_dirs) == 2  # one per process, however close their starts


# ---- 14.7: data file content in the config hash ------------------------------------------------------------
def test_editing_the_data_file_makes_a_new_config(tmp_path, data_file):
    from mtad.harness.runner import run

    first = run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "a")
    _write(data_file, [{**PROMPTS[0], "answer": "hello"}, PROMPTS[1]])  # one answer edited
    second = run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "b")
    assert second is not None and second["config_hash"] != first["config_hash"]
    _write(data_file, [{**PROMPTS[0], "answer": "hello"}, PROMPTS[1]])  # same bytes, new mtime
    assert run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "c") is None
    assert len(load_results(tmp_path / "res" / "t.jsonl")) == 2


def test_data_fingerprint_covers_the_few_shot_file(tmp_path):
    from mtad.tasks import TaskConfig, get_task

    src = Path(os.environ.get("MTAD_DATA_DIR", REPO_ROOT.parent / "shared" / "data")) / "gsm8k"
    if not (src / "train.jsonl").is_file():
        pytest.skip("gsm8k data not available")
    (tmp_path / "gsm8k").mkdir()
    for split in ("test", "train"):
        lines = (src / f"{split}.jsonl").read_text().splitlines()[:6]
        (tmp_path / "gsm8k" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")

    def fingerprint():
        cfg = TaskConfig(name="gsm8k", data_dir=str(tmp_path), n_prompts=2, few_shot=2)
        return get_task(cfg).data_fingerprint()

    before = fingerprint()
    assert set(before) == {"test.jsonl", "train.jsonl"} and before == fingerprint()
    train = tmp_path / "gsm8k" / "train.jsonl"
    train.write_text(train.read_text().replace("#### ", "####  ", 1))
    after = fingerprint()
    assert after["train.jsonl"] != before["train.jsonl"] and after["test.jsonl"] == before["test.jsonl"]


# ---- 14.8 / 13.3: skipped rows counted, the right advice, duplicate ids ------------------------------------
def test_bad_rows_are_counted_in_the_row(tmp_path, data_file, caplog):
    from mtad.harness.runner import run

    _write(data_file, [PROMPTS[0], "{not json", {"id": "e", "prompt": "  "}, {**PROMPTS[0], "prompt": "again"},
                       PROMPTS[1]])
    row = run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "run")
    assert row["n_prompts"] == 2 and row["n_skipped"] == 3
    assert row["skip_reasons"] == {"data row: not valid JSON": 1, "data row: empty or non-string field 'prompt'": 1,
                                   "data row: duplicate id": 1}
    assert f"{data_file}:4" in caplog.text and f"'p0' repeats the row at {data_file}:1" in caplog.text
    assert row["task"]["selected_ids"] == ["p0", "p1"]


def test_duplicate_ids_are_dropped_for_every_task(tmp_path):
    from mtad.tasks import TaskConfig, get_task

    path = _write(tmp_path / "question.jsonl", [
        {"question_id": 1, "category": "writing", "turns": ["a"]},
        {"question_id": 1, "category": "math", "turns": ["b"]},
        {"question_id": 2, "category": "math", "turns": ["c"]}])
    t = get_task(TaskConfig(name="mt_bench", data_file=str(path), n_prompts=0))
    assert [s.turns for s in t.samples()] == [["a"], ["c"]]
    assert t.skip_counts() == {"data row: duplicate id": 1}


def test_all_rows_bad_says_fix_the_data_file(tmp_path, data_file):
    from mtad.harness.runner import run

    _write(data_file, ["{not json", {"id": "a"}, {"id": "b", "prompt": ""}])
    with pytest.raises(ValueError) as err:
        run(_cfg(tmp_path, data_file, "decoder=greedy"), run_dir=tmp_path / "run")
    msg = str(err.value)
    assert str(data_file) in msg and "lines/rows 1, 2, 3" in msg and "fix the data file" in msg
    assert "max_prompt_tokens" not in msg and "\n" not in msg
    assert not (tmp_path / "res").exists() and not (tmp_path / "run").exists()


def test_all_prompts_too_long_is_one_line_with_count_and_range(tmp_path, data_file):
    from mtad.harness.runner import run

    _write(data_file, [{"id": f"l{n}", "prompt": "x" * n} for n in (80, 95, 120, 150)])
    with pytest.raises(ValueError) as err:
        run(_cfg(tmp_path, data_file, "decoder=greedy", "task.max_prompt_tokens=40"), run_dir=tmp_path / "run")
    msg = str(err.value)
    assert "\n" not in msg and "{" not in msg
    assert "all 4 selected prompts were skipped" in msg and "4 longer than task.max_prompt_tokens=40" in msg
    low, high = map(int, re.search(r"\((\d+)-(\d+) tokens\)", msg).groups())
    assert low > 80 and high > 150 and high - low == 70  # the range of lengths
    assert "raise task.max_prompt_tokens" in msg


def test_long_prompt_skips_are_one_reason_whatever_their_length(tmp_path, data_file):
    from mtad.harness.runner import run

    _write(data_file, [{"id": "a", "prompt": "x" * 80}, {"id": "b", "prompt": "x" * 95}, PROMPTS[0]])
    row = run(_cfg(tmp_path, data_file, "decoder=greedy", "task.max_prompt_tokens=40"), run_dir=tmp_path / "r")
    assert row["skip_reasons"] == {"longer than task.max_prompt_tokens=40": 2} and row["n_prompts"] == 1
    samples = [json.loads(s) for s in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert "tokens > max_prompt_tokens=40" in samples[0]["skip_reason"]  # the detail stays per prompt


# ---- 14.9: a bad job in a multirun -------------------------------------------------------------------------
def test_multirun_records_a_bad_job_and_runs_the_rest(tmp_path, data_file):
    out = _cli(tmp_path, "-m", *TINY, f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}",
               "decoder=mtad", "decoder.tau=0.5,1.5,0.7")
    assert out.returncode == 2, out.stderr[-2000:]
    rows = load_results(tmp_path / "res" / "t.jsonl")
    assert sorted(r["decoder"]["tau"] for r in rows) == [0.5, 0.7]
    errors = list((tmp_path / "res" / "multirun").rglob("error.json"))
    assert len(errors) == 1 and errors[0].parent.name.startswith("1_")
    record = json.loads(errors[0].read_text())
    assert record["error"] == "ValueError" and "tau" in record["message"] and "decoder.tau=1.5" in record["overrides"]
    assert "1 job(s) of the multirun failed" in out.stderr and "decoder.tau=1.5" in out.stderr


# ---- 14.10: NaN / inf logits -------------------------------------------------------------------------------
def _poisoned(role: str, value: float = float("nan")):
    from mtad.models.tiny import tiny_pair

    pair = tiny_pair("llama", seed=0)
    with torch.no_grad():
        getattr(pair, role).lm_head.weight[3] = value  # one vocabulary row: logit 3 is NaN/inf
    return pair


SAMPLERS = {"greedy": {}, "sampling": {}, "speculative": {}, "mtad": {}, "mmtad": {}}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_nan_target_logits_are_a_clear_error(name):
    from mtad.decoding import generate
    from mtad.decoding.kv import NonFiniteLogits

    with pytest.raises(NonFiniteLogits, match=r"the target model returned NaN/inf logits at decoding step 1"):
        generate(_poisoned("target"), [1, 2, 3], {"name": name, "max_new_tokens": 6})


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_nan_draft_logits_are_a_clear_error(name):
    from mtad.decoding import generate
    from mtad.decoding.kv import NonFiniteLogits

    pair = _poisoned("draft", float("inf"))
    if name in ("greedy", "sampling"):  # control: these never run the draft
        assert len(generate(pair, [1, 2, 3], {"name": name, "max_new_tokens": 6}).tokens) == 6
        return
    with pytest.raises(NonFiniteLogits, match=r"the draft model returned NaN/inf logits at decoding step \d+"):
        generate(pair, [1, 2, 3], {"name": name, "max_new_tokens": 6})


def test_nan_model_through_the_cli_exits_2_with_no_row(tmp_path, data_file):
    from mtad.models.tiny import tiny_tokenizer

    pair = _poisoned("target")
    target = tmp_path / "nan-target"
    pair.target.save_pretrained(target)
    tiny_tokenizer().save_pretrained(target)
    out = _cli(tmp_path, "model=tiny", "model.kind=hf", f"model.target={target}", "model.device=cpu",
               "task=jsonl", f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}", "name=t",
               "decoder=greedy", "decoder.max_new_tokens=4", "warmup=0")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "the target model returned NaN/inf logits at decoding step" in _error_lines(out.stderr)[0]
    assert not (tmp_path / "res" / "t.jsonl").exists()


def test_non_finite_floats_never_reach_a_row(tmp_path):
    row = {**_row_template(), "metrics": {"ppl": float("nan"), "x": [1.0, float("inf")], "t": torch.tensor(2.5)}}
    append_row(tmp_path / "t.jsonl", row)
    (back,) = _strict_rows(tmp_path / "t.jsonl")  # strict: no NaN/Infinity constants
    assert back["metrics"] == {"ppl": None, "x": [1.0, None], "t": 2.5}
    assert back["non_finite"] == {"metrics.ppl": "nan", "metrics.x.1": "inf"}
    ResultRow.from_dict(back)


# ---- 14.11: W&B online with no reachable server -------------------------------------------------------------
def test_unreachable_wandb_server_is_bounded_and_the_row_written(tmp_path, data_file, monkeypatch, caplog):
    import logging

    from mtad.harness.runner import run

    home = tmp_path / "home"
    home.mkdir()
    for var, value in {"WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9", "HOME": str(home),
                       "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(home / "cfg"),
                       "WANDB_CACHE_DIR": str(home / "cache"), "WANDB_DATA_DIR": str(home / "data")}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    timeout = 3
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mtad.harness.tracking"):
        row = run(_cfg(tmp_path, data_file, "decoder=greedy", "tracking=wandb", "tracking.mode=online",
                       f"tracking.init_timeout_s={timeout}"), run_dir=tmp_path / "run")
    elapsed = time.monotonic() - t0
    assert "W&B start failed" in caplog.text  # it did try the (unreachable) server, and gave up
    assert row is not None and len(load_results(tmp_path / "res" / "t.jsonl")) == 1
    assert elapsed < timeout + 12, f"run took {elapsed:.1f} s with a {timeout} s W&B init timeout"

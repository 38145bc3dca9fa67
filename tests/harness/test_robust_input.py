"""Robust input: results go where the user points, values are checked before work, one row never ends a
run, and every error names its file or key (one ``mtad: error:`` line, exit 2; Ctrl-C: one line, exit 130).

In-process on ``model=tiny`` where possible; the CLI cases run ``python -m mtad`` in this process too
(:mod:`inprocess`), but for the full disk, which needs a mount namespace of its own (a child process).
"""
from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from inprocess import run_module

from mtad._util.paths import REPO_ROOT
from mtad.harness import store
from mtad.harness.config import register_configs
from mtad.harness.rows import ResultRow
from mtad.harness.store import append_row, load_results

register_configs()
PROMPTS = [{"id": f"p{i}", "prompt": f"Question {i}: say hi", "answer": "hi"} for i in range(2)]
TINY = ["model=tiny", "task=jsonl", "name=t", "decoder=greedy", "decoder.max_new_tokens=4", "warmup=0"]


def make_row(i: int = 0, writer: int = 0) -> dict:
    return ResultRow(run_id=f"w{writer}-{i}", config_hash=f"h{writer}-{i}", experiment="t",
                     timestamp="2025-01-01T00:00:00+00:00", git_sha=None, git_dirty=None, versions={"torch": "x"},
                     device_name="cpu", num_threads=1, seed=i, decoder={"name": "greedy"}, model={"name": "tiny"},
                     task={"name": "t"}, metrics={"ms_per_token": 1.0}, n_prompts=1, n_skipped=0,
                     run_dir="runs/x").to_dict()


def _cfg(tmp_path: Path, data_file: Path, *extra: str, hydra: bool = False):
    overrides = [*TINY, f"task.data_file={data_file}", f"results_dir={tmp_path / 'res'}", *extra]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


def _guard_exit(tmp_path: Path, data_file: Path, capsys, *overrides: str) -> list[str]:
    """The Hydra callback's checks (what ``python -m mtad`` runs before Hydra creates anything): exit 2."""
    from mtad.harness.rundir import RunDirGuard

    cfg = _cfg(tmp_path, data_file, *overrides, hydra=True)
    with pytest.raises(SystemExit) as stop:
        RunDirGuard().on_run_start(config=cfg)
    assert stop.value.code == 2
    return [line for line in capsys.readouterr().err.splitlines() if line]


def _cli(cwd: Path, *args: str, prefix: tuple = ()) -> subprocess.CompletedProcess:
    """``python -m mtad args`` from ``cwd``: in this process (:mod:`inprocess`), or, under a ``prefix`` (a mount
    namespace), in a child process."""
    if not prefix:
        return run_module("mtad", *args, cwd=cwd, env={"WANDB_MODE": "disabled"})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([*prefix, sys.executable, "-m", "mtad", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---- 21.2: a symlinked results file is written through --------------------------------------------------------
def test_a_symlinked_results_file_is_written_through(tmp_path):
    shared, results = tmp_path / "shared", tmp_path / "results"
    shared.mkdir()
    results.mkdir()
    real = shared / "exp.jsonl"
    append_row(real, make_row(0))
    link = results / "exp.jsonl"
    link.symlink_to(real)
    assert append_row(link, make_row(1))
    assert link.is_symlink() and os.readlink(link) == str(real)  # still a link ...
    assert [r["run_id"] for r in load_results(real)] == ["w0-0", "w0-1"]  # ... and the target got the row
    assert store.lock_path(link) == store.lock_path(real) == shared / "exp.jsonl.lock"
    assert sorted(p.name for p in results.iterdir()) == ["exp.jsonl"]  # no second lock beside the link


def _writer(path: str, writer: int, n: int) -> None:
    for i in range(n):
        append_row(path, make_row(i, writer))


def test_writers_through_the_link_and_the_real_path_share_one_lock(tmp_path):
    real = tmp_path / "shared" / "exp.jsonl"
    real.parent.mkdir()
    link = tmp_path / "exp.jsonl"
    link.symlink_to(real)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 12)) for w, path in enumerate((link, real, link))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert link.is_symlink() and len(load_results(real)) == 36


def test_a_run_appends_through_a_symlinked_results_file(tmp_path, data_file):
    from mtad.harness.runner import run

    real = tmp_path / "shared" / "t.jsonl"
    real.parent.mkdir()
    real.write_text("")
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "t.jsonl").symlink_to(real)
    run(_cfg(tmp_path, data_file), run_dir=tmp_path / "run")
    assert (tmp_path / "res" / "t.jsonl").is_symlink() and len(load_results(real)) == 1


# ---- 21.3: numbers checked for finiteness and range before any work --------------------------------------------
BAD_NUMBERS = [
    ("decoder.temperature=nan", "decoder.temperature"), ("decoder.temperature=inf", "decoder.temperature"),
    ("decoder.top_p=nan", "decoder.top_p"), ("decoder.tau=nan", "decoder.tau"),
    ("decoder.typical_alpha=inf", "decoder.typical_alpha"), ("decoder.fuzzy_threshold=nan", "decoder.fuzzy_threshold"),
    ("decoder.eos_token_id=-1", "decoder.eos_token_id"),
    ("task.timeout_s=nan", "task.timeout_s"), ("task.timeout_s=inf", "task.timeout_s"),
    ("tracking.init_timeout_s=inf", "tracking.init_timeout_s"),
    ("num_threads=-3", "num_threads"), ("warmup=-1", "warmup"), ("seed=-1", "seed"),
]


@pytest.mark.parametrize("override, key", BAD_NUMBERS)
def test_bad_numbers_are_one_line_before_hydra_creates_anything(tmp_path, data_file, capsys, override, key):
    before = _tree(tmp_path)
    lines = _guard_exit(tmp_path, data_file, capsys, override)
    assert len(lines) == 1 and lines[0].startswith(f"mtad: error: {key}="), lines
    assert "allowed" in lines[0] or "range" in lines[0]
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("override, key", BAD_NUMBERS)
def test_bad_numbers_fail_in_run_before_the_model_loads(tmp_path, data_file, monkeypatch, override, key):
    from mtad.harness import runner

    monkeypatch.setattr(runner, "load_pair", lambda mcfg: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match=f"^{key}="):
        runner.run(_cfg(tmp_path, data_file, override), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_good_numbers_pass_the_same_checks(tmp_path, data_file):
    """Control: finite values in range compose and pass the checks (inf stays allowed where documented)."""
    from mtad.harness.config import check_settings

    check_settings(_cfg(tmp_path, data_file, "decoder=fuzzy", "decoder.temperature=0.5", "task.timeout_s=2.5",
                        "num_threads=1", "decoder.fuzzy_threshold=inf", "decoder.eos_token_id=0", "seed=3"))


# ---- 21.4: a row the tokenizer cannot take is skipped and counted ----------------------------------------------
def test_a_lone_surrogate_row_is_skipped_and_counted(tmp_path, data_file, caplog):
    from mtad.harness.runner import run

    data_file.write_text(json.dumps(PROMPTS[0]) + "\n" + '{"id": "s", "prompt": "bad \\ud800 text", "answer": "x"}\n'
                         + json.dumps(PROMPTS[1]) + "\n")
    row = run(_cfg(tmp_path, data_file), run_dir=tmp_path / "run")
    assert row["n_prompts"] == 2 and row["skip_reasons"] == {"data row: text that is not valid Unicode": 1}
    assert f"{data_file}:2" in caplog.text and "surrogate" in caplog.text


def test_a_row_the_tokenizer_refuses_is_skipped_whatever_got_it_past_loading(tmp_path, data_file, monkeypatch):
    """The runner's own net: a prompt whose rendering or tokenizing raises TypeError/UnicodeError (here the
    loader's surrogate check is switched off) is a skipped prompt with its reason, not the end of the run."""
    from mtad.harness.runner import run
    from mtad.tasks import records

    monkeypatch.setattr(records, "_bad_text", lambda row: None)
    data_file.write_text(json.dumps(PROMPTS[0]) + "\n" + '{"id": "s", "prompt": "bad \\ud800 text", "answer": "x"}\n')
    row = run(_cfg(tmp_path, data_file), run_dir=tmp_path / "run")
    assert row["n_prompts"] == 1 and len(row["skip_reasons"]) == 1
    assert next(iter(row["skip_reasons"])).startswith("prompts that cannot be rendered or tokenized")


def test_invalid_utf8_in_a_data_file_names_the_file_and_line(tmp_path, data_file, caplog):
    from mtad.tasks import TaskConfig, get_task

    data_file.write_bytes(json.dumps(PROMPTS[0]).encode() + b"\n" + b'{"id": "u", "prompt": "caf\xe9"}\n'
                          + json.dumps(PROMPTS[1]).encode() + b"\n")
    task = get_task(TaskConfig(name="jsonl", data_file=str(data_file), n_prompts=0))
    assert [s.id for s in task.samples()] == ["p0", "p1"]
    assert task.skip_counts() == {"data row: unreadable row": 1} and f"{data_file}:2" in caplog.text
    array = data_file.with_suffix(".json")
    array.write_bytes(b'[{"id": "a", "prompt": "caf\xe9"}]')
    with pytest.raises(ValueError, match=f"{array} is not valid UTF-8"):
        get_task(TaskConfig(name="jsonl", data_file=str(array), n_prompts=0)).samples()


# ---- 21.5: name is a plain file name --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../x", "../../x", "a/b", "/abs/x", "..", "."])
def test_name_must_be_a_plain_file_name(tmp_path, data_file, capsys, name):
    from mtad.harness.runner import run

    before = _tree(tmp_path)
    lines = _guard_exit(tmp_path, data_file, capsys, f"name={name}")
    assert len(lines) == 1 and lines[0].startswith(f"mtad: error: name={name!r} is not a plain file name"), lines
    with pytest.raises(ValueError, match="not a plain file name"):
        run(_cfg(tmp_path, data_file, f"name={name}"), run_dir=tmp_path / "run")
    assert _tree(tmp_path) == before


def test_name_outside_results_dir_through_the_cli_creates_nothing(tmp_path, data_file):
    out = _cli(tmp_path, *TINY, f"task.data_file={data_file}", "results_dir=res", "name=../../escaped")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("mtad: error")] == [
        "mtad: error: name='../../escaped' is not a plain file name: results go to <results_dir>/<name>.jsonl, so "
        "use a name without '/', '\\' or '..' (choose the folder with results_dir=...)"]
    assert _tree(tmp_path) == ["prompts.jsonl"] and not (tmp_path.parent / "escaped.jsonl").exists()


# ---- 21.6: the smaller items ----------------------------------------------------------------------------------
def test_a_trailing_json_line_that_is_not_an_object_is_repaired(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    append_row(path, make_row(0))
    with open(path, "a") as f:
        f.write("42\n")
    append_row(path, make_row(1))
    assert [r["run_id"] for r in load_results(path)] == ["w0-0", "w0-1"]  # readable on the next run
    assert "dropping a bad trailing line" in caplog.text and "42" in caplog.text


def test_tiny_refuses_a_draft_it_would_ignore(tmp_path, data_file, capsys):
    from mtad.models.load import ModelConfig

    lines = _guard_exit(tmp_path, data_file, capsys, "model.draft=some/draft")
    assert len(lines) == 1 and "model.draft='some/draft'" in lines[0] and "kind=tiny" in lines[0]
    with pytest.raises(ValueError, match="model.target"):
        ModelConfig(kind="tiny", target="x")
    ModelConfig(kind="tiny")  # control


def test_wandb_init_is_bounded_by_our_own_clock(tmp_path, monkeypatch, caplog):
    """However long wandb.init takes (here it hangs 20 s), start() gives up after init_timeout_s plus the
    stated slack, and the tracker turns into a no-op."""
    import wandb

    from mtad.harness.tracking import INIT_SLACK_S, make_tracker

    monkeypatch.setattr(wandb, "init", lambda **kw: time.sleep(20))
    t = make_tracker({"backend": "wandb", "mode": "online", "init_timeout_s": 1}, tmp_path)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mtad.harness.tracking"):
        t.start({}, "x")
    assert time.monotonic() - start < 1 + INIT_SLACK_S + 1.0
    assert t.broken and "did not start within 1 s" in caplog.text


def test_invalid_utf8_in_a_results_file_names_the_file_and_line(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    append_row(path, make_row(0))
    good = path.read_bytes()
    path.write_bytes(good + b'{"run_id": "caf\xe9"}\n' + good)
    with pytest.raises(ValueError, match=f"{path}:2: bad result line"):
        load_results(path)
    path.write_bytes(good + b'{"run_id": "caf\xe9"}\n')
    assert len(load_results(path)) == 1 and f"{path}:2: skipping a bad trailing line" in caplog.text


def test_a_cache_dir_that_is_a_file_names_the_variable(tmp_path, monkeypatch):
    from mtad._util.paths import cache_dir

    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("MTAD_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(NotADirectoryError, match="set MTAD_CACHE_DIR"):
        cache_dir()
    monkeypatch.setenv("MTAD_CACHE_DIR", str(tmp_path / "file" / "below"))
    with pytest.raises(NotADirectoryError, match=f"{tmp_path / 'file'} is a file"):
        cache_dir()
    monkeypatch.setenv("MTAD_CACHE_DIR", str(tmp_path / "new"))
    assert cache_dir() == tmp_path / "new"  # control: a folder yet to be made is fine


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, data_file, monkeypatch):
    import mtad.harness.runner as runner

    def stop(cfg):  # python -m mtad, with a run that Ctrl-C stops
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", stop)
    out = _cli(tmp_path, *TINY, f"task.data_file={data_file}", "results_dir=res")
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert [line for line in out.stderr.splitlines() if line.startswith("mtad:")] == [
        "mtad: interrupted: no row was written for the run in progress (rows already appended stay)"]
    assert _tree(tmp_path) == ["prompts.jsonl"]  # the run directory it had just created is gone


def test_a_writer_waiting_on_the_lock_says_so(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    append_row(path, make_row(0))
    with open(store.lock_path(path), "a") as held, caplog.at_level(logging.INFO, logger="mtad.harness.store"):
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another process, as far as flock can tell (own open file)
        writer = threading.Thread(target=append_row, args=(path, make_row(1)))
        writer.start()
        deadline = time.monotonic() + 10
        while "waiting for" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "waiting for" in caplog.text and str(store.lock_path(path)) in caplog.text
        assert len(load_results(path)) == 1  # still waiting
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        writer.join(10)
    assert len(load_results(path)) == 2


def test_a_full_disk_before_the_job_is_one_line(tmp_path, data_file):
    """The results folder on a full tmpfs (own mount namespace): exit 2 with one line naming the folder and
    "No space left", before Hydra writes its files (which used to end in Hydra's traceback)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("user+mount namespaces unavailable")
    full = tmp_path / "full"
    full.mkdir()
    prefix = ("unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=256k tmpfs "$0" && '
              'dd if=/dev/zero of="$0/fill" bs=4k 2>/dev/null; exec "$@"', str(full))
    out = _cli(tmp_path, *TINY, f"task.data_file={data_file}", f"results_dir={full / 'res'}", prefix=prefix)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("mtad: error")]
    assert len(lines) == 1 and str(full) in lines[0] and "No space left" in lines[0], lines

"""Every failure of the entry points is one line, exit 2, before any work: unknown config groups, options and
keys (main CLI, the comparison of ``make run``, the study, the frontier), duplicate decoders, output paths of
long jobs, an over-long ``name``, a full disk between sweep jobs; SIGTERM is taken like Ctrl-C; ``name=null``
runs under ``default``; the capitals task runs with no data folder (the repository ships it)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from inprocess import run_module

from mtad._util.paths import REPO_ROOT


def _env(**extra: str) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO_ROOT), **extra}


def _run(module: str, *args: str, cwd: Path = REPO_ROOT, **env: str) -> subprocess.CompletedProcess:
    """``python -m module args`` from ``cwd``, in this process (:mod:`inprocess`)."""
    return run_module(module, *args, cwd=cwd, env={"WANDB_MODE": "disabled", **env})


def _one_line(out: subprocess.CompletedProcess, prefix: str) -> str:
    """The run failed with exit 2 and stderr is one ``<prefix>: error:`` line (no traceback)."""
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and len(lines) == 1 and lines[0].startswith(f"{prefix}: error: "), \
        out.stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------------------- unknown groups and keys
def _err_lines(capsys, prefix: str) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [x for x in err.splitlines() if x.strip() and x.startswith(f"{prefix}:")]


def test_main_cli_refuses_an_unknown_option_in_one_line(tmp_path):
    """Through the real command line (Hydra would print ~80 lines and exit 1)."""
    out = _run("mtad", "-m", "decoder=mtad,mtadd", "task=capitals", f"results_dir={tmp_path / 'res'}", cwd=tmp_path)
    assert "unknown decoder 'mtadd' (decoder=mtadd): conf/decoder/ has" in _one_line(out, "mtad")
    assert not (tmp_path / "res").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args, needle", [
    (["model=smolm2"], "unknown model 'smolm2' (model=smolm2): conf/model/ has"),
    (["decoder=mtadd"], "unknown decoder 'mtadd'"),
    (["experiment=nosuch"], "unknown experiment 'nosuch'"),
    (["decoder.gamam=3"], "Could not override 'decoder.gamam'"),
    (["name=" + "x" * 260], "a file name holds at most 255 bytes"),
])
def test_main_cli_checks_overrides_before_hydra(capsys, args, needle):
    from mtad.__main__ import _check_command_line

    with pytest.raises(SystemExit) as stop:
        _check_command_line(args)
    lines = _err_lines(capsys, "mtad")
    assert stop.value.code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_the_check_leaves_valid_sweeps_alone():
    from mtad.harness.clicheck import check_overrides

    check_overrides(["model=tiny", "decoder=mtad,greedy", "task=capitals", "decoder.tau=0.2,0.8",
                     "hydra/launcher=slurm", "name=null"])
    check_overrides(["experiment=cpu_table", "experiment/pair@pair=smollm2_feature"])
    with pytest.raises(ValueError, match="unknown task 'capital'"):  # control: one bad value of a sweep
        check_overrides(["task=capitals,capital"], compose=False)


@pytest.mark.parametrize("args, needle", [
    (["--decoders", "sampling,sampling", "model=tiny"], "names sampling more than once"),
    (["--decoders", "sampling,mtadd", "model=tiny"], "unknown decoder 'mtadd'"),
    (["model=smolm2"], "unknown model 'smolm2'"),
])
def test_compare_refuses_bad_input_before_decoding(tmp_path, capsys, monkeypatch, args, needle):
    from mtad.harness import compare

    monkeypatch.setattr(compare, "run_interleaved", lambda *a, **k: pytest.fail("decoded"))
    assert compare.main([*args, f"results_dir={tmp_path / 'res'}"]) == 2
    lines = _err_lines(capsys, "mtad.harness.compare")
    assert len(lines) == 1 and needle in lines[0], lines


# ------------------------------------------------------------------------------- the study's inputs
@pytest.mark.parametrize("args, needle", [
    (["--tasks", "capitals", "capitalz"], "unknown task 'capitalz'"),
    (["--model", "smolm2"], "unknown model 'smolm2'"),
    (["--out", "FILE"], "is a file, not a folder"),
    (["--name", "n" * 300], "a file name holds at most 255 bytes"),
    (["--render-raw", "nothing.pkl"], "is not a file"),
])
def test_study_checks_names_and_outputs_before_it_runs(tmp_path, capsys, monkeypatch, args, needle):
    from mtad.study import __main__ as study

    monkeypatch.setattr(study, "load_pair", lambda *a, **k: pytest.fail("the study started"))
    (tmp_path / "FILE").write_text("mine\n")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    out_dir = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    assert study.main(["verifiers", *out_dir, *args]) == 2
    lines = _err_lines(capsys, "mtad.study")
    assert len(lines) == 1 and needle in lines[0], lines
    assert (tmp_path / "FILE").read_text() == "mine\n"


def test_study_save_raw_parent_is_created_before_the_study(tmp_path):
    from mtad.study.__main__ import check_outputs, parse_args

    args = parse_args(["verifiers", "--out", str(tmp_path / "a" / "b"), "--save-raw", str(tmp_path / "new" / "r.pkl")])
    check_outputs(args)
    assert (tmp_path / "a" / "b").is_dir() and (tmp_path / "new").is_dir() and not (tmp_path / "new/r.pkl").exists()


# ------------------------------------------------------------------------------- the frontier
def test_frontier_checks_its_output_folder_first(tmp_path, capsys):
    from mtad.report import frontier

    (tmp_path / "out").write_text("mine\n")
    assert frontier.main([str(REPO_ROOT / "tests/fixtures/results_small.jsonl"), "--task", "gsm8k",
                          "--out", str(tmp_path / "out")]) == 2
    lines = _err_lines(capsys, "mtad.report.frontier")
    assert len(lines) == 1 and "is a file, not a folder" in lines[0]
    assert (tmp_path / "out").read_text() == "mine\n"


# ------------------------------------------------------------------------------- a full disk
def test_sweep_stops_in_one_line_when_the_disk_fills_between_jobs(tmp_path, monkeypatch, capsys):
    from mtad.harness import sweep

    calls = []
    monkeypatch.setattr(sweep, "_run_group", lambda group, summary, *rest: calls.append(group))
    free = iter([10_000.0, 5.0])
    monkeypatch.setattr(sweep, "free_mb", lambda path: next(free))
    code = sweep.main(["--experiment", "quick", "--no-progress", "--no-cost-profile", "--no-interleave",
                       f"results_dir={tmp_path}"])
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mtad.harness.sweep: error:")]
    assert code == 2 and len(calls) == 1, calls
    assert len(err) == 1 and "only 5 MiB free on the disk of" in err[0] and "rerun" in err[0]


# ------------------------------------------------------------------------------- small things
def test_capitals_run_without_a_data_folder_and_name_null_runs_under_default(tmp_path):
    """``python -m mtad model=tiny task=capitals task.n_prompts=2`` on a machine without a data folder: the
    repository's copy; ``name=null`` files the run under ``default``, not ``None``."""
    out = _run("mtad", "model=tiny", "task=capitals", "task.n_prompts=2", "decoder.max_new_tokens=4", "warmup=0",
               "name=null", f"results_dir={tmp_path}", cwd=tmp_path, MTAD_DATA_DIR=str(tmp_path / "none"))
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads((tmp_path / "default.jsonl").read_text().splitlines()[0])
    assert row["task"]["name"] == "capitals" and row["n_prompts"] == 2 and row["task"]["source"] == "local"
    assert (tmp_path / "runs" / "default").is_dir() and not (tmp_path / "runs" / "None").exists()


def test_sigterm_is_taken_like_ctrl_c(tmp_path):
    """``scancel`` sends SIGTERM: one line, exit 143, no traceback, no row; a rerun writes the row."""
    args = [sys.executable, "-m", "mtad", "model=tiny", "task=capitals", "task.n_prompts=0", "decoder=greedy",
            "decoder.max_new_tokens=64", "warmup=0", "name=t", f"results_dir={tmp_path}"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(  # decoding has begun: the energy meter is up
            "energy source" in p.read_text() for p in (tmp_path / "runs").rglob("*.log")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = [x for x in err.splitlines() if x.startswith("mtad:")]
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("mtad: terminated (SIGTERM)"), err[-3000:]
    assert not (tmp_path / "t.jsonl").exists()


# ------------------------------------------------------------------------------- float32 underflow
@pytest.mark.parametrize("override", ["decoder.temperature=1e-40", "decoder.top_p=1e-300",
                                      "decoder.block_top_p=1e-300"])
def test_settings_that_underflow_in_float32_are_refused_before_the_model_loads(tmp_path, monkeypatch, override):
    from mtad.harness import runner
    from mtad.harness.sweep import compose_job

    monkeypatch.setattr(runner, "load_pair", lambda *a, **k: pytest.fail("the model loaded"))
    cfg = compose_job(["model=tiny", "task=capitals", "decoder=mtad", override, f"results_dir={tmp_path}"])
    key = override.split("=")[0].split(".")[1]
    with pytest.raises(ValueError, match=rf"decoder\.{key}=.* is out of range: allowed .*float32"):
        runner.run(cfg, run_dir=tmp_path / "run")


def test_the_smallest_allowed_settings_still_build():
    from mtad.decoding import DecoderConfig
    from mtad.decoding.config import MIN_PROBABILITY, MIN_TEMPERATURE

    DecoderConfig(name="mtad", temperature=MIN_TEMPERATURE, top_p=MIN_PROBABILITY, tau=1e-300)  # tau: a threshold
    DecoderConfig(name="sampling", temperature=0.0)  # greedy stays allowed



# ------------------------------------------------------------------------------- files that are not what they claim
def test_a_json_line_that_is_no_row_is_named_as_such(tmp_path):
    from mtad.harness.store import load_results

    good = (REPO_ROOT / "tests/fixtures/results_small.jsonl").read_text().splitlines()[0]
    (tmp_path / "r.jsonl").write_text(good + '\n{"x": 1}\n' + good + "\n")
    with pytest.raises(ValueError, match=r"row 2 is not a result row \(keys \['x'\]") as err:
        load_results(tmp_path / "r.jsonl")
    assert "schema_version" not in str(err.value).split(";")[0]
    (tmp_path / "old.jsonl").write_text(good.replace('"schema_version": 1', '"schema_version": 99') + "\n")
    with pytest.raises(ValueError, match="schema_version=99"):  # control: a real row of another version
        load_results(tmp_path / "old.jsonl")


def test_corrupt_weights_are_named_as_such(tmp_path):
    from mtad.models.draft_head import HEAD_FILE, read_head_file

    src = REPO_ROOT / "models" / "smollm2-feature-draft" / HEAD_FILE
    assert "kept_ids" in read_head_file(src.parent)  # control: the committed file reads
    data = src.read_bytes()
    for name, broken in (("truncated", data[: len(data) // 2]), ("garbage", b"\xff" * 64)):
        (tmp_path / name).mkdir()
        (tmp_path / name / HEAD_FILE).write_bytes(broken)
        with pytest.raises(ValueError, match=rf"{name}/{HEAD_FILE} is not a readable safetensors file .*corrupt"):
            read_head_file(tmp_path / name)


def test_model_tiny_runs_the_default_task(tmp_path):
    """The README's seconds-long smoke run: ``model=tiny`` with the default task (4-shot GSM8K prompts exceed
    max_prompt_tokens with its byte tokenizer; the tiny preset makes it zero-shot). An explicit few_shot wins."""
    from mtad.harness.runner import run
    from mtad.harness.sweep import compose_job

    row = run(compose_job(["model=tiny", "task.n_prompts=2", "decoder.max_new_tokens=4", "warmup=0",
                           f"results_dir={tmp_path}", "name=smoke"]), run_dir=tmp_path / "run")
    assert row is not None and row["n_prompts"] == 2 and row["task"]["name"] == "gsm8k" and row["n_skipped"] == 0
    assert compose_job(["model=tiny", "task.few_shot=2"]).task.few_shot == 2
    assert compose_job(["model=smollm2"]).task.few_shot == 4  # control: other pairs keep the task's default


def test_the_comparisons_eta_starts_after_loading():
    """60 s of loading, then 2 s per prompt: after prompt 3 of 10, 14 s are left (not 7 x 64/3 s)."""
    from mtad.harness.compare import Eta

    times = iter([0.0, 62.0, 64.0, 66.0])
    eta = Eta(clock=lambda: next(times))
    assert "loading included" in eta.line(1, 10)
    assert eta.line(2, 10).endswith("~16 s left)") and eta.line(3, 10).endswith("~14 s left)")

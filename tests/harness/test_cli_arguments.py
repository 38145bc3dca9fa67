"""Every command line of ``experiments/`` and ``python -m mtad.study*`` / ``mtad.measure.overhead`` refuses a bad
argument while it parses it (:mod:`mtad._util.cli`): one ``<program>: error:`` line on stderr, exit status 2, no
traceback, before any model loads. Counts that must be positive are (``--prompts 0`` once decoded every
prompt); ``nan`` is no temperature; an input file is read only when it has the format its option names.

Each bad case runs the entry point in this process with every way to a model blocked (``from_pretrained``,
:func:`mtad.models.load.load_pair`, the embedded pair's loader: :class:`Loaded`), and its negative control gives
a good value to the same parser, which then reaches the script's first step of work (stubbed: :class:`Started`).
One case runs as a child process: the real interpreter's stderr and exit status.
"""
from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys

import pytest
import torch

from mtad._util.cli import ArgumentParser, count, real
from mtad._util.paths import REPO_ROOT

FIXTURE_ROWS = REPO_ROOT / "tests" / "fixtures" / "results_small.jsonl"
_SCRIPTS: dict = {}


class Loaded(Exception):
    """A model was about to load."""


class Started(Exception):
    """The script got past its arguments to its first step of work (the negative controls)."""


@pytest.fixture
def script(monkeypatch):
    """``experiments/<name>.py`` as a module (loaded once), with ``sys.argv[0]`` its path, as when it runs (its
    program name in messages)."""
    def load(name: str):
        path = REPO_ROOT / "experiments" / f"{name}.py"
        if name not in _SCRIPTS:
            spec = importlib.util.spec_from_file_location(f"cli_{name}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _SCRIPTS[name] = mod
        monkeypatch.setattr(sys, "argv", [str(path)])
        return _SCRIPTS[name]

    return load


def start(*args, **kwargs):
    raise Started()


@pytest.fixture(autouse=True)
def no_model(monkeypatch, tmp_path):
    """No model loads in these tests, whatever the script imported; the working directory, torch's thread
    count and the logging set-up the scripts change are put back."""
    from transformers import PreTrainedModel

    import mtad.models.load
    import mtad.models.smollm2

    def loaded(*args, **kwargs):
        raise Loaded()

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(loaded))
    monkeypatch.setattr(mtad.models.load, "load_pair", loaded)
    monkeypatch.setattr(mtad.models.smollm2, "load", loaded)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def refused(capsys, call, program: str, needle: str) -> str:
    """``call()`` ends with exit status 2 (SystemExit or returned) and one ``<program>: error:`` line naming
    ``needle``; no traceback, nothing on stdout."""
    try:
        code = call()
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    lines = [x for x in out.err.splitlines() if x.strip()]
    assert code == 2, out.err
    assert "Traceback" not in out.err and len(lines) == 1, out.err
    assert lines[0].startswith(f"{program}: error: ") and needle in lines[0], lines
    assert not out.out.strip(), out.out
    return lines[0]


def started(call) -> None:
    """The negative control: the same command line with a good value gets past its arguments."""
    with pytest.raises(Started):
        call()


def regime_root(tmp_path):
    """A folder with the two files the regime map and the decoders' study read first."""
    root = tmp_path / "regimes"
    root.mkdir()
    (root / "drafts.tsv").write_text((REPO_ROOT / "results" / "regimes" / "drafts.tsv").read_text())
    (root / "alpha.jsonl").write_text("")
    return root


# ------------------------------------------------------------------------------- the shared types
@pytest.mark.parametrize("kind, bad, good, needle", [
    (count(1), "0", "1", "0 is out of range: give an integer >= 1"),
    (count(1), "-1", "7", "-1 is out of range"),
    (count(1), "2.5", "2", "'2.5' is not a whole number"),
    (count(0), "-1", "0", "give an integer >= 0"),
    (real(0, 1, low_open=True), "nan", "1", "nan is not finite: give a finite number > 0 and <= 1"),
    (real(0), "inf", "1e300", "inf is not finite"),
    (real(0, 1, low_open=True), "0", "1e-9", "0 is out of range"),
    (real(0, 1), "1.5", "0", "1.5 is out of range: give a finite number >= 0 and <= 1"),
    (real(), "x", "-3", "'x' is not a number: give a finite number"),
])
def test_the_shared_types_refuse_in_one_line(capsys, kind, bad, good, needle):
    ap = ArgumentParser(prog="python -m prog")
    ap.add_argument("--x", type=kind)
    assert refused(capsys, lambda: ap.parse_args(["--x", bad]), "prog", needle).startswith("prog: error: argument --x:")
    assert ap.parse_args(["--x", good]).x == float(good)  # control: a good value


def test_argparse_own_errors_are_one_line_too(capsys):
    ap = ArgumentParser(prog="prog")
    ap.add_argument("--x", type=int, required=True)
    refused(capsys, lambda: ap.parse_args(["--y"]), "prog", "(--help lists the options)")
    assert ap.parse_args(["--x", "3"]).x == 3


# ------------------------------------------------------------------------------- experiments/
@pytest.mark.parametrize("name", ["regime_decoders", "regime_temperature", "regime_check"])
@pytest.mark.parametrize("args, needle", [
    (["--prompts", "0"], "argument --prompts: 0 is out of range: give an integer >= 1"),
    (["--prompts", "-1"], "argument --prompts: -1 is out of range"),
    (["--tokens", "0"], "argument --tokens: 0 is out of range"),
    (["--out", "FILE"], "is a file, not a folder"),
])
def test_regime_scripts_refuse_counts_and_outputs(script, tmp_path, capsys, monkeypatch, name, args, needle):
    mod = script(name)
    (tmp_path / "FILE").write_text("mine\n")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    pair = ["--pair", "run5"] if name == "regime_check" else []
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    refused(capsys, lambda: mod.main([*pair, *out, *args]), f"{name}.py", needle)
    assert not (tmp_path / "out").exists() and (tmp_path / "FILE").read_text() == "mine\n"
    # control: good counts reach the decoding
    if name == "regime_check":
        monkeypatch.setattr(mod, "check", start)
    else:
        import mtad.harness.runner
        import mtad.harness.sweep

        monkeypatch.setattr(mtad.harness.sweep, "compose_job", lambda job: job)
        monkeypatch.setattr(mtad.harness.runner, "run_interleaved", start)
    extra = ["--root", str(regime_root(tmp_path)), "--draft", "run5"] if name == "regime_decoders" else []
    started(lambda: mod.main([*pair, "--out", str(tmp_path / "out"), "--prompts", "1", "--tokens", "1", *extra]))


@pytest.mark.parametrize("name", ["regime_decoders", "regime_temperature"])
@pytest.mark.parametrize("content, needle", [
    (None, "is not a file (no such path): give a results .jsonl"),
    ("", "holds no rows"),
    ("not json\n", ":1 is not a result row"),
    ('{"a": 1}\n', ":1 is not a result row"),
    (b"\xff\xfe\n", "is not text"),
])
def test_regime_rerenders_refuse_a_file_without_rows(script, tmp_path, capsys, monkeypatch, name, content, needle):
    mod = script(name)
    rows = tmp_path / "rows.jsonl"
    if content is not None:
        rows.write_bytes(content if isinstance(content, bytes) else content.encode())
    refused(capsys, lambda: mod.main(["--from", str(rows), "--out", str(tmp_path / "out")]), f"{name}.py", needle)
    monkeypatch.setattr(mod, "analyze", start)  # control: a results file reaches the analysis
    extra = ["--root", str(regime_root(tmp_path))] if name == "regime_decoders" else []
    started(lambda: mod.main(["--from", str(FIXTURE_ROWS), "--out", str(tmp_path / "out"), *extra]))


@pytest.mark.parametrize("root, needle", [
    ("missing", "is not a folder (no such path)"),
    ("empty", "holds no drafts.tsv or alpha.jsonl"),
    ("file", "is not a folder: give the regime map's folder"),
])
def test_regime_decoders_refuse_a_root_without_the_map(script, tmp_path, capsys, monkeypatch, root, needle):
    mod = script("regime_decoders")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x\n")
    refused(capsys, lambda: mod.main(["--root", str(tmp_path / root), "--out", str(tmp_path / "out")]),
            "regime_decoders.py", needle)
    monkeypatch.setattr(mod, "drafts", start)  # control: the map's folder is read
    started(lambda: mod.main(["--root", str(regime_root(tmp_path)), "--out", str(tmp_path / "out")]))


@pytest.mark.parametrize("temps, needle", [
    (["nan"], "argument --temps: nan is not finite"),
    (["0.7", "inf"], "inf is not finite"),
    (["0"], "0 is out of range: give a finite number >= 1e-06"),
    (["-0.5"], "-0.5 is out of range"),
])
def test_regime_temperature_refuses_a_temperature_that_is_none(script, tmp_path, capsys, monkeypatch, temps, needle):
    mod = script("regime_temperature")
    refused(capsys, lambda: mod.main(["--out", str(tmp_path / "out"), "--temps", *temps]), "regime_temperature.py",
            needle)
    import mtad.harness.runner
    import mtad.harness.sweep

    monkeypatch.setattr(mtad.harness.sweep, "compose_job", lambda job: job)
    monkeypatch.setattr(mtad.harness.runner, "run_interleaved", start)
    started(lambda: mod.main(["--out", str(tmp_path / "out"), "--temps", "0.7", "0.8"]))


@pytest.mark.parametrize("args, needle", [
    (["--new", "0"], "argument --new: 0 is out of range"),
    (["--threads", "0"], "argument --threads: 0 is out of range"),
    (["--threads", "-2"], "argument --threads: -2 is out of range"),
    (["--pair", "nope"], "no conf/model/nope.yaml"),
])
def test_bench_core_pair_refuses_counts(script, capsys, args, needle):
    mod = script("bench_core_pair")
    refused(capsys, lambda: mod.main(args), "bench_core_pair.py", needle)
    with pytest.raises(Loaded):  # control: good counts reach the model's load (blocked here)
        mod.main(["--pair", "tiny", "--new", "1", "--threads", "1"])


@pytest.mark.parametrize("args, needle", [
    (["--prompts", "0"], "argument --prompts: 0 is out of range"),
    (["--reps", "0"], "argument --reps"),
    (["--batches", "1,0"], "argument --batches: 0 is out of range"),
    (["--batches", "1,,4"], "has an empty name"),
    (["--out", "DIR"], "is a folder: give a file name"),
    (["--replot", "--out", "FILE"], "is not a JSON object"),
    (["model=smolm2"], "unknown model 'smolm2'"),
])
def test_bench_batch_refuses_before_the_pair_loads(script, tmp_path, capsys, monkeypatch, args, needle):
    mod = script("bench_batch")
    (tmp_path / "FILE").write_text("mine\n")
    args = [a.replace("FILE", str(tmp_path / "FILE")).replace("DIR", str(tmp_path)) for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "b.json")]
    refused(capsys, lambda: mod.main([*out, *args]), "bench_batch.py", needle)
    monkeypatch.setattr(mod, "load_pair", start)  # control
    started(lambda: mod.main(["--out", str(tmp_path / "b.json"), "--prompts", "1", "--batches", "1,2", "model=tiny"]))


@pytest.mark.parametrize("args, needle", [
    (["--prompts", "0"], "argument --prompts: 0 is out of range"),
    (["--max-new-tokens", "-1"], "argument --max-new-tokens"),
    (["--repeats", "0"], "argument --repeats"),
    (["--gamma", "0"], "argument --gamma"),
    (["--tau", "nan"], "argument --tau: nan is not finite"),
    (["--temperature", "0"], "argument --temperature"),
    (["--top-p", "1.5"], "argument --top-p"),
    (["--dtype", "float64"], "argument --dtype: invalid choice"),
    (["--out", "."], "is a folder: give a file name"),
])
def test_bench_hf_refuses_before_the_pair_loads(script, capsys, args, needle):
    mod = script("bench_hf")
    refused(capsys, lambda: mod.parse_args(args), "bench_hf.py", needle)
    a = mod.parse_args(["--quick", "--prompts", "1", "--tau", "1", "--top-k", "0"])  # control
    assert (a.prompts, a.max_new_tokens, a.tau, a.top_k) == (1, 16, 1.0, 0)


def test_decode_equality_and_overhead_floor_parse_their_command_lines(script, tmp_path, capsys, monkeypatch):
    eq = script("decode_equality")
    refused(capsys, lambda: eq.parse_args([]), "decode_equality.py", "the following arguments are required: out")
    refused(capsys, lambda: eq.parse_args([str(tmp_path / "new.json"), "--compare", str(tmp_path / "old.json")]),
            "decode_equality.py", "old.json is not a file (no such path)")
    (tmp_path / "old.json").write_text("{}\n")
    assert eq.parse_args([str(tmp_path / "new.json"), "--compare", str(tmp_path / "old.json")]).compare.is_file()
    floor = script("overhead_floor")
    refused(capsys, lambda: floor.main(["--prompts", "3"]), "overhead_floor.py", "unrecognized arguments")
    monkeypatch.setattr(floor.overhead, "build_pair", start)
    started(lambda: floor.main([]))


def test_the_check_scripts_parse_their_command_lines(script, tmp_path, capsys, monkeypatch):
    gpu = script("gpu_check_rows")
    refused(capsys, lambda: gpu.main(["rows.jsonl", "cpu", "greedy"]), "gpu_check_rows.py",
            "the following arguments are required: tasks, model")
    refused(capsys, lambda: gpu.main(["rows.jsonl", "tpu", "greedy", "gsm8k", "tiny"]), "gpu_check_rows.py",
            "argument device: invalid choice: 'tpu'")
    refused(capsys, lambda: gpu.main(["rows.jsonl", "cpu", "greedy,mtadd", "gsm8k", "tiny"]), "gpu_check_rows.py",
            "unknown mtadd: choose from")
    refused(capsys, lambda: gpu.main(["rows.jsonl", "cpu", "greedy", "gsm8k", "smolm2"]), "gpu_check_rows.py",
            "argument model: invalid choice: 'smolm2'")
    monkeypatch.setattr(gpu, "resolved_name", start)  # control
    started(lambda: gpu.main(["rows.jsonl", "cpu", "greedy,mtad", "gsm8k", "smollm2"]))
    slurm = script("slurm_check_rows")
    refused(capsys, lambda: slurm.main(["before.jsonl", str(FIXTURE_ROWS), "greedy"]), "slurm_check_rows.py",
            "before.jsonl is not a file (no such path): give the results file of pass 1")
    monkeypatch.setattr(slurm, "rows", start)  # control
    started(lambda: slurm.main([str(FIXTURE_ROWS), str(FIXTURE_ROWS), "greedy,mtad"]))


# ------------------------------------------------------------------------------- python -m mtad.study*
@pytest.mark.parametrize("args, needle", [
    (["--prompts", "0"], "argument --prompts: 0 is out of range"),
    (["--tv-draws", "-1"], "argument --tv-draws"),
    (["--temperature", "nan"], "argument --temperature: nan is not finite"),
    (["--top-p", "0"], "argument --top-p"),
    (["--mtad-taus", "0.5", "2"], "argument --mtad-taus: 2 is out of range"),
    (["--oracle-mix", "-0.1"], "argument --oracle-mix"),
    (["--prompts", "2", "--tv-contexts", "3"], "--tv-contexts=3 is out of range: 0 to --prompts (2)"),
    (["--render-raw", "TEXT"], "is not a complete pickle: give a file written with --save-raw"),
    (["--render-raw", "PICKLE"], "is not a study's --save-raw file (KeyError"),
])
def test_the_study_refuses_before_it_runs(tmp_path, capsys, monkeypatch, args, needle):
    from mtad.study import __main__ as study

    (tmp_path / "t.txt").write_text("a text file\n")
    (tmp_path / "p.pkl").write_bytes(pickle.dumps({"tasks": []}))
    args = [a.replace("TEXT", str(tmp_path / "t.txt")).replace("PICKLE", str(tmp_path / "p.pkl")) for a in args]
    refused(capsys, lambda: study.main(["verifiers", "--out", str(tmp_path / "out"), *args]), "mtad.study", needle)
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True
    monkeypatch.setattr(study, "verifiers", start)  # control
    started(lambda: study.main(["verifiers", "--out", str(tmp_path / "out"), "--prompts", "2", "--tv-contexts", "2",
                                "--temperature", "0.5", "--mtad-taus", "1"]))


@pytest.mark.parametrize("root, needle", [
    ("missing", "is not a folder (no such path): give the folder the regime runs wrote"),
    ("empty", "holds no drafts.tsv or alpha.jsonl"),
    ("file", "is not a folder"),
])
def test_the_regime_map_refuses_a_root_without_its_records(tmp_path, capsys, monkeypatch, root, needle):
    from mtad.study.regimes import __main__ as regimes

    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x\n")
    refused(capsys, lambda: regimes.main(["--root", str(tmp_path / root)]), "mtad.study.regimes", needle)
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == []
    monkeypatch.setattr(regimes, "build", start)  # control
    started(lambda: regimes.main(["--root", str(regime_root(tmp_path))]))


@pytest.mark.parametrize("args, needle", [
    (["token"], "'token' is not name=draft"),
    (["int8=target:int9"], "int8=target:int9:"),
    (["x=no/such/draft"], "no directory no/such/draft"),
    (["x=target:int8", "--threads", "0"], "argument --threads"),
])
def test_alpha_refuses_a_draft_it_cannot_load_before_the_target_loads(tmp_path, capsys, args, needle):
    from mtad.study import alpha

    out = ["--out", str(tmp_path / "alpha.jsonl"), "--cache", str(tmp_path / "eval.pt")]
    refused(capsys, lambda: alpha.main([*out, *args]), "mtad.study.alpha", needle)
    with pytest.raises(Loaded):  # control: a good draft gets to the target's load (blocked here)
        alpha.main([*out, "int8=target:int8", f"token={REPO_ROOT / 'tests'}"])


def test_the_overhead_benchmark_refuses_counts(capsys):
    from mtad.measure import overhead

    refused(capsys, lambda: overhead.parse(["--prompts", "0"]), "mtad.measure.overhead", "argument --prompts")
    refused(capsys, lambda: overhead.parse(["--vocab", "-1"]), "mtad.measure.overhead", "argument --vocab")
    assert overhead.parse(["--prompts", "1", "--vocab", "8"]).vocab == 8  # control


def test_a_child_process_prints_one_line_and_exits_2(tmp_path):
    """The real interpreter (not :mod:`inprocess`): stderr is the one line, and nothing is written."""
    (tmp_path / "file").write_text("x\n")
    out = subprocess.run([sys.executable, "-m", "mtad.study.regimes", "--root", str(tmp_path / "file")],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and not out.stdout, out.stderr
    assert out.stderr.startswith("mtad.study.regimes: error: argument --root: ") and "Traceback" not in out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["file"]

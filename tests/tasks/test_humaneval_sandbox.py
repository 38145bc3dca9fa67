"""HumanEval: postprocessing, the execution sandbox and pass@1 (right -> 1, wrong and malicious -> 0)."""
from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mtad.tasks import Sample, TaskConfig, get_task
from mtad.tasks.sandbox.client import Limits, run_python

TIMEOUT = 2.0
PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b.\n    >>> add(1, 2)\n    3\n    """\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-4, 4) == 0\n"
SAMPLE = Sample("toy/0", [PROMPT], TEST, {"entry_point": "add", "canonical_solution": "    return a + b\n"})


@pytest.fixture(scope="module")
def he():
    return get_task(TaskConfig(name="humaneval", timeout_s=TIMEOUT, memory_mb=512, n_prompts=2))


def timed_score(task, sample, completion):
    start = time.monotonic()
    score = task.score(sample, completion)
    return score, time.monotonic() - start


# ---- right and wrong ------------------------------------------------------------------------------------
def test_canonical_scores_one_and_wrong_scores_zero(he):
    assert he.score(SAMPLE, "    return a + b\n") == {"pass@1": 1.0}
    assert he.score(SAMPLE, "    return a - b\n") == {"pass@1": 0.0}
    assert he.score(SAMPLE, "    return a +\n") == {"pass@1": 0.0}  # syntax error
    assert he.score(SAMPLE, "") == {"pass@1": 0.0}


def test_real_problems_canonical_passes(he):
    samples = he.samples()
    assert [s.id for s in samples] == ["HumanEval/0", "HumanEval/1"]
    for s in samples:
        assert he.score(s, s.meta["canonical_solution"]) == {"pass@1": 1.0}
        assert he.score(s, "    return None\n") == {"pass@1": 0.0}


def test_falls_back_to_package_copy_without_data_dir(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MTAD_DATA_DIR", str(tmp_path))  # an empty data dir
    t = get_task(TaskConfig(name="humaneval", n_prompts=0))
    assert len(t.samples()) == 164
    with pytest.raises(FileNotFoundError, match="HumanEval.jsonl.gz"):  # an explicit data dir must exist
        get_task(TaskConfig(name="humaneval", data_dir=str(tmp_path))).samples()


# ---- postprocessing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, expected", [
    ("    return a + b\n\ndef helper():\n    pass\n", "    return a + b\n"),
    ("    return a + b\n\n\nif __name__ == '__main__':\n    print(add(1, 2))\n", "    return a + b\n"),
    ("    return a + b\nprint(add(1, 2))\n", "    return a + b\n"),
    ("    return a + b\n\nclass X:\n    pass", "    return a + b\n"),
    ("    return a + b\n```\nSome prose", "    return a + b\n"),
])
def test_base_model_continuation_is_cut(he, completion, expected):
    assert he.postprocess(SAMPLE, completion) == expected


def test_chat_code_block_with_whole_function(he):
    reply = ("Sure! Here is the function:\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n\n"
             "if __name__ == '__main__':\n    print(add(2, 2))\n```\nIt adds the numbers.")
    code = he.postprocess(SAMPLE, reply)
    assert code == "def add(a: int, b: int) -> int:\n    return a + b\n"
    assert he.postprocess(SAMPLE, code) == code  # idempotent
    assert he.score(SAMPLE, reply) == {"pass@1": 1.0}
    wrong = reply.replace("return a + b", "return a * b")
    assert he.score(SAMPLE, wrong) == {"pass@1": 0.0}
    # the block that defines the entry point is chosen over an earlier usage example
    two = "```python\nprint(add(1, 2))\n```\n\n```python\ndef add(a, b):\n    return a + b\n```"
    assert he.score(SAMPLE, two) == {"pass@1": 1.0}
    # an unterminated block (generation hit max_new_tokens) and prose without fences
    assert he.score(SAMPLE, "```python\ndef add(a, b):\n    return a + b\n") == {"pass@1": 1.0}
    assert he.score(SAMPLE, "Here you go:\ndef add(a, b):\n    return b + a\n") == {"pass@1": 1.0}


def test_chat_render_shows_the_prompt(he):
    from mtad.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    assert he.render(SAMPLE, tok, chat=False) == PROMPT
    chat = he.render(SAMPLE, tok, chat=True)
    assert f"```python\n{PROMPT}```" in chat and chat.endswith("<|im_start|>assistant\n")


# ---- malicious completions: each scores 0 and the run continues quickly ---------------------------------------
MALICIOUS = {
    "infinite_loop": "    while True:\n        pass\n",
    "sleep": "    import time\n    time.sleep(60)\n",
    "fork_bomb": "    import os\n    while True:\n        try:\n            os.fork()\n"
                 "        except OSError:\n            pass\n",
    "huge_print": "    while True:\n        print('x' * 10000)\n",
    "memory_hog": "    hog = []\n    while True:\n        hog.append(bytearray(50 * 2**20))\n",
    "one_huge_allocation": "    x = bytearray(64 * 2**30)\n    return a + b\n",
    "sys_exit_0": "    import sys\n    sys.exit(0)\n",
    "os_exit_0": "    import os\n    os._exit(0)\n",
    "exit_before_tests": "    return a + b\nimport sys\nsys.exit(0)\n",
    "network": "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n    return a + b\n",
    "kill_parent": "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
}


@pytest.mark.parametrize("name", sorted(MALICIOUS))
def test_malicious_completion_scores_zero_quickly(he, name):
    # exit_before_tests exits at module level, before the tests are even defined
    score, took = timed_score(he, SAMPLE, MALICIOUS[name])
    assert score == {"pass@1": 0.0}, name
    assert took < TIMEOUT + 3.0, f"{name} took {took:.1f}s"
    assert he.score(SAMPLE, "    return a + b\n") == {"pass@1": 1.0}  # the sandbox still works afterwards


def test_exit_inside_check_is_not_a_pass(he):
    sneaky = "    import sys\n    if (a, b) == (-4, 4):\n        sys.exit(0)\n    return a + b\n"
    assert he.score(SAMPLE, sneaky) == {"pass@1": 0.0}


# problems whose tests use prompt helpers (poly, encode_cyclic, encode_shift), name the entry point (33),
# test identity with ``is True`` (72), or loop over random inputs
SPECIAL = {"HumanEval/0", "HumanEval/10", "HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/50",
           "HumanEval/53", "HumanEval/72", "HumanEval/151", "HumanEval/163"}


@pytest.mark.parametrize("which", ["special", pytest.param("all", marks=pytest.mark.slow)])
def test_canonical_solutions_pass_and_return_none_fails(which):
    """The tests run in the supervisor against the jailed function, and the official solutions still pass
    (all 164 with ``-m slow``: measured 164/164, ~45 s)."""
    t = get_task(TaskConfig(name="humaneval", n_prompts=0, timeout_s=10.0))
    samples = [s for s in t.samples() if which == "all" or s.id in SPECIAL]
    assert which == "all" or len(samples) == len(SPECIAL)
    failed = [s.id for s in samples if not t.execute(s, s.meta["canonical_solution"]).passed]
    assert failed == []
    assert not any(t.execute(s, "    return None\n").passed for s in samples[:20])
    assert t.row_info()["sandbox"] in ("namespaces", "uid", "unsandboxed")


# ---- forging a pass: every attack scores 0, the right answer still scores 1 ------------------------
FORGERIES = {
    # walk the stack for anything that looks like a pass token, print it, exit 0
    "frame_walk": "    import sys, os\n    f = sys._getframe()\n    while f:\n"
                  "        for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
                  "            if isinstance(v, str) and len(v) == 32:\n                print(v)\n"
                  "        f = f.f_back\n    sys.stdout.flush()\n    os._exit(0)\n",
    # swap check() for a no-op before it is called, and make AssertionError harmless
    "settrace_swap": "    import sys, builtins\n    def hook(frame, event, arg):\n"
                     "        if frame.f_code.co_name == 'check':\n"
                     "            frame.f_globals['check'] = lambda c: None\n        return hook\n"
                     "    sys.settrace(hook)\n    builtins.AssertionError = type('A', (Exception,), {})\n"
                     "    return None\n",
    "always_equal": "    class E:\n        def __eq__(self, other):\n            return True\n"
                    "        __hash__ = object.__hash__\n    return E()\n",
    "int_subclass": "    class I(int):\n        def __eq__(self, other):\n            return True\n"
                    "        __hash__ = int.__hash__\n    return I(0)\n",
    "exit_zero_in_call": "    import os\n    os._exit(0)\n",
    "forged_reply": "    import os, json, struct\n    m = json.dumps({'value': {'i': hex(a + b)}}).encode()\n"
                    "    os.write(4, struct.pack('>I', len(m)) + m)\n    return None\n",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgery_scores_zero(he, name):
    assert he.score(SAMPLE, FORGERIES[name]) == {"pass@1": 0.0}, name
    assert he.score(SAMPLE, "    return a + b\n") == {"pass@1": 1.0}


def test_forgery_control_without_the_split_would_pass():
    """Negative control: the same frame-walk forgery *does* pass when tests and candidate share a process
    (the old design), so the test above can fail."""
    src = PROMPT + FORGERIES["frame_walk"] + "\n" + TEST + "\ntoken = '0123456789abcdef0123456789abcdef'\n" \
        "check(add)\nprint(token)\n"
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-I", "-c", src], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "0123456789abcdef0123456789abcdef" in out.stdout


def test_wire_format_is_type_strict():
    from mtad.tasks.sandbox import serve as wire

    value = {"a": [1, 2.5, float("nan"), None, True], (1, "x"): {frozenset({3}), b"\x00"}, "c": 2 ** 100 + 1j * 0}
    back = wire.decode(wire.encode(value))
    assert repr(back) == repr(value) and type(back[(1, "x")]) is set
    for bad in (type("I", (int,), {})(3), type("S", (str,), {})("x"), object(), [lambda: 0]):
        with pytest.raises(wire.WireError):
            wire.encode(bad)
    for bad in ({"i": 3}, {"i": "0x1", "f": "0x1p0"}, {"q": []}, [1], {"d": [[1]]}):
        with pytest.raises(wire.WireError):
            wire.decode(bad)


# ---- escaping the jail ----------------------------------------------------------------------------------------
needs_ns = pytest.mark.skipif(run_python("pass").isolation != "namespaces",
                              reason="user namespaces are not available on this machine")


@needs_ns
def test_network_is_unreachable_even_through_private_modules(he):
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(3.0)
    port = server.getsockname()[1]
    hits = []

    def accept():
        try:
            hits.append(server.accept())
        except OSError:  # timed out, or closed at the end: nobody connected
            pass

    threading.Thread(target=accept, daemon=True).start()
    for how in ("import _socket\n    s = _socket.socket()", "import socket\n    s = socket.socket.__mro__[1]()"):
        completion = f"    {how}\n    s.connect(('127.0.0.1', {port}))\n    return a + b\n"
        assert he.score(SAMPLE, completion) == {"pass@1": 0.0}
    time.sleep(0.3)
    assert hits == []
    socket.create_connection(("127.0.0.1", port), timeout=2).close()  # control: the listener does hear a connect
    time.sleep(0.3)
    server.close()
    assert len(hits) == 1


@needs_ns
def test_writes_outside_the_private_tmp_fail_and_tmp_does_not_outlive_the_call(tmp_path):
    victim = tmp_path / "results.jsonl"
    victim.write_text("{}\n")
    marker = f"mtad-escape-{os.getpid()}-{time.monotonic_ns()}"
    src = (f"import os\nopen('/tmp/{marker}', 'w').write('x')\nos.makedirs('/tmp/{marker}.d')\n"
           f"for path in ({str(victim)!r}, {str(tmp_path / 'new.txt')!r}, '/usr/{marker}', '/{marker}'):\n"
           "    try:\n        open(path, 'w').write('x')\n        print('WROTE', path)\n"
           "    except OSError as err:\n        print('refused', path, err.errno)\n"
           f"try:\n    os.remove({str(victim)!r})\n    print('REMOVED')\nexcept OSError:\n    pass\n")
    result = run_python(src, Limits(timeout_s=TIMEOUT))
    assert result.passed, result.output
    assert "WROTE" not in result.output and "REMOVED" not in result.output, result.output
    assert victim.read_text() == "{}\n" and not (tmp_path / "new.txt").exists()
    assert not os.path.exists(f"/tmp/{marker}") and not os.path.exists(f"/tmp/{marker}.d")
    if os.geteuid() == 0:  # control: unsandboxed, the same program (as root) does write here
        probe = f"open({str(victim)!r}, 'a').write('x')\nprint('WROTE')\n"
        loose = run_python(probe, Limits(timeout_s=TIMEOUT, isolation="none"))
        assert "WROTE" in loose.output and loose.isolation == "none" and victim.read_text() == "{}\nx"


@needs_ns
def test_file_count_and_bytes_are_capped():
    src = ("import os\nn = 0\ntry:\n    while n < 100000:\n        open(f'/tmp/f{n}', 'w').close()\n        n += 1\n"
           "except OSError as err:\n    print('files', n, err.errno)\n"
           "for i in range(n):\n    os.remove(f'/tmp/f{i}')\n"
           "try:\n    with open('/tmp/big', 'wb') as f:\n        for _ in range(64):\n"
           "            f.write(b'x' * (1 << 20))\nexcept OSError as err:\n"
           "    print('bytes', os.path.getsize('/tmp/big'))\n")
    result = run_python(src, Limits(timeout_s=5.0, max_files=200, disk_mb=4, output_bytes=8 << 20))
    files = int(result.output.split("files")[1].split()[0])
    size = int(result.output.split("bytes")[1].split()[0])
    assert files < 200 and size <= 4 << 20, result.output


@needs_ns
@pytest.mark.parametrize("how", ["fork", "setsid", "double_fork"])
def test_background_processes_do_not_outlive_the_call(how):
    marker = f"mtad-bg-{how}-{os.getpid()}-{time.monotonic_ns()}"
    spawn = {"fork": "if os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '30', M])\n",
             "setsid": "if os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '30', M])\n",
             "double_fork": "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                            "        os.execv('/bin/sleep', ['sleep', '30', M])\n    os._exit(0)\n"}[how]
    src = f"import os, time\nM = {marker!r}\n{spawn}time.sleep(0.3)\n"
    assert run_python(src, Limits(timeout_s=TIMEOUT)).passed
    assert _processes_with(marker) == []


def _processes_with(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_orphans_are_killed_and_reaped_in_every_isolation():
    """The fallbacks too: a child that escapes the process group with setsid must not outlive the call."""
    for isolation in ("uid", "none"):
        marker = f"mtad-orphan-{isolation}-{os.getpid()}-{time.monotonic_ns()}"
        src = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '30', "
               f"{marker!r}])\ntime.sleep(0.3)\n")
        result = run_python(src, Limits(timeout_s=TIMEOUT, isolation=isolation))
        assert result.passed and result.isolation == (isolation if os.geteuid() == 0 else "none")
        assert _processes_with(marker) == []


@needs_ns
def test_sandboxes_cannot_kill_each_other_or_the_runner(he):
    """kill(-1) inside one sandbox reaches nothing outside it: concurrent correct solutions still pass."""
    from concurrent.futures import ThreadPoolExecutor

    killer = "    import os, signal\n    for _ in range(50):\n        os.kill(-1, signal.SIGKILL)\n    return a + b\n"
    slow_right = "    import time\n    time.sleep(0.8)\n    return a + b\n"
    with ThreadPoolExecutor(4) as pool:
        right = [pool.submit(he.score, SAMPLE, slow_right) for _ in range(3)]
        time.sleep(0.3)
        pool.submit(he.score, SAMPLE, killer).result()
        assert [f.result() for f in right] == [{"pass@1": 1.0}] * 3


@needs_ns
def test_total_memory_is_capped_over_all_processes():
    """3 children x 300 MB each stay under a per-process cap of 512 MB but not under the total of 512 MB."""
    src = ("import os, time\npids = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
           "        x = bytearray(300 << 20)\n        for i in range(0, len(x), 4096):\n            x[i] = 1\n"
           "        time.sleep(3)\n        os._exit(0)\n    pids.append(pid)\n"
           "for pid in pids:\n    os.waitpid(pid, 0)\n")
    result = run_python(src, Limits(timeout_s=8.0, memory_mb=512))
    assert not result.passed and result.status in ("memory", "failed"), result
    alone = run_python(src.replace("range(3)", "range(1)"), Limits(timeout_s=8.0, memory_mb=512))
    assert alone.passed, alone  # control: one such child fits


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to become an ordinary user, and a system Python that user can run")
def test_an_ordinary_user_gets_the_same_jail(tmp_path):
    """The supervisor run as ``nobody`` (no root): the jail still builds, cannot delete the user's own
    results, and ``kill(-1)`` does not reach the supervisor."""
    import json
    import subprocess

    from mtad.tasks.sandbox.client import WORKER

    results = tmp_path / "results"
    results.mkdir()
    (results / "exp.jsonl").write_text("{}\n")
    os.chown(results, 65534, 65534)
    os.chown(results / "exp.jsonl", 65534, 65534)
    completion = (f"    import os, signal\n    try:\n        os.remove({str(results / 'exp.jsonl')!r})\n"
                  "    except OSError:\n        pass\n    try:\n        os.kill(-1, signal.SIGKILL)\n"
                  "    except OSError:\n        pass\n    return a + b\n")
    job = {"program": PROMPT + completion, "prompt": PROMPT, "test": TEST, "entry_point": "add", "timeout_s": 5.0,
           "memory_mb": 512, "output_bytes": 1 << 16, "processes": 16, "open_files": 32, "disk_mb": 4,
           "max_files": 64, "isolation": "auto"}
    out = subprocess.run(["/usr/bin/python3", "-I", str(WORKER)], input=json.dumps(job), capture_output=True,
                         text=True, timeout=30, user=65534, group=65534, extra_groups=[], cwd="/")
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert verdict["status"] == "passed" and verdict["isolation"] == "namespaces", (verdict, out.stderr)
    assert (results / "exp.jsonl").read_text() == "{}\n"


def test_the_row_records_which_sandbox_ran(tmp_path):
    """A HumanEval run through the runner (tiny model) writes ``metrics.sandbox``; ``task.sandbox=none``
    says "unsandboxed"; a bad value is refused when the config is built."""
    from hydra import compose, initialize_config_dir

    from mtad._util.paths import REPO_ROOT
    from mtad.harness.config import register_configs
    from mtad.harness.runner import run

    register_configs()

    def cfg(*extra):
        overrides = ["model=tiny", "task=humaneval", "task.n_prompts=1", "task.max_prompt_tokens=0",
                     f"results_dir={tmp_path / 'res'}", "name=he", "decoder=greedy", "decoder.max_new_tokens=4",
                     "warmup=0", *extra]
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)

    row = run(cfg(), run_dir=tmp_path / "a")
    assert row["metrics"]["sandbox"] == run_python("pass").isolation and row["metrics"]["score"]["pass@1"] == 0.0
    assert run(cfg("task.sandbox=none"), run_dir=tmp_path / "b")["metrics"]["sandbox"] == "unsandboxed"
    with pytest.raises(ValueError, match="task.sandbox"):
        TaskConfig(name="humaneval", sandbox="docker")


@pytest.mark.parametrize("name,text,kills", [
    ("memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n", 1),
    ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", 2),
    ("memory.events", "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n", 0),  # control: the limit was hit, nobody killed
    ("memory.stat", "oom_kill 5\n", 0),  # control: another file saying it is not read
])
def test_oom_kills_are_read_from_the_cgroup(tmp_path, name, text, kills):
    """A child the OOM killer ended makes the verdict ``memory`` even when the candidate ignores its death."""
    from mtad.tasks.sandbox.worker import oom_kills

    (tmp_path / name).write_text(text)
    assert oom_kills(str(tmp_path)) == kills

"""Nothing a candidate sends can stall or crash HumanEval scoring, and nothing of a sandbox is left.

The two stall triggers of the issue, in every isolation mode, as root and as an ordinary user: a reply of
``'[' * 200000`` to the program-load message (the supervisor's JSON parser raised ``RecursionError``, which
crashed it; a setup helper holding the runner's pipes then kept the call waiting until the candidate ended),
and a set of ints with equal hashes (quadratic decoding, no deadline). Each must give a failed verdict within
``timeout_s`` plus a small slack, after which no process, folder or cgroup of the sandbox may remain.
Measured on the main branch before the fix (timeout_s=3, candidate sleeping 60 s): nested JSON 60 s in
namespaces and a ``RuntimeError`` in uid/none; colliding set 60 s in namespaces and 23 s in uid/none.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tasks.test_humaneval_sandbox import _processes_with

from mtad.tasks.sandbox import client
from mtad.tasks.sandbox import serve as wire
from mtad.tasks.sandbox.client import Limits, run_check

TIMEOUT = 3.0
SLACK = 3.0  # the bound the tests hold a verdict to: timeout_s + this (measured after the fix: < 1.5 s in all)
PROMPT = 'def add(a, b):\n    """a + b"""\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
MODES = ("namespaces", "uid", "none")


def spawn(marker: str) -> str:
    """Module-level code: a detached ``sleep`` carrying ``marker`` (it must not outlive the call)."""
    return ("import os\nif os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv('/bin/sleep', ['sleep', '30', {marker!r}])\n")


def nested(marker: str) -> str:
    """Answer the program-load message with 200,000 open brackets, then sleep."""
    return ("    return a + b\n" + spawn(marker) +
            "import struct, time\nm = b'[' * 200000\nos.write(4, struct.pack('>I', len(m)) + m)\ntime.sleep(30)\n")


def colliding(marker: str, n: int = 100000) -> str:
    """Answer the first call with a set of ``n`` ints that all hash to 0 (multiples of 2**61 - 1), then sleep."""
    return ("    import json, struct, time\n    M = (1 << 61) - 1\n"
            f"    v = {{'S': [{{'i': hex(k * M)}} for k in range(1, {n} + 1)]}}\n"
            "    m = json.dumps({'value': v}).encode()\n    os.write(4, struct.pack('>I', len(m)) + m)\n"
            "    time.sleep(30)\n" + spawn(marker))


ATTACKS = {"nested": nested, "colliding": colliding}


def cgroups_of(pid: int) -> list[str]:
    """Sandbox cgroups a supervisor with this pid made (named after it, beside where this process lives)."""
    found = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        bases = ([f"/sys/fs/cgroup/memory{path}"] if "memory" in controllers.split(",") else
                 [f"/sys/fs/cgroup{path}", f"/sys/fs/cgroup/unified{path}"] if hid == "0" else [])
        for base in bases:
            found += glob.glob(f"{base.rstrip('/')}/mtad-sandbox-{pid}-*")
    return found


@pytest.fixture
def traced(monkeypatch):
    """Record the sandbox folders the client makes and the supervisors it starts."""
    seen = {"work": [], "pids": []}
    mkdtemp, popen = tempfile.mkdtemp, subprocess.Popen

    def record_dir(*a, **k):
        seen["work"].append(mkdtemp(*a, **k))
        return seen["work"][-1]

    def record_proc(*a, **k):
        proc = popen(*a, **k)
        seen["pids"].append(proc.pid)
        return proc

    monkeypatch.setattr(tempfile, "mkdtemp", record_dir)
    monkeypatch.setattr(subprocess, "Popen", record_proc)
    return seen


def assert_nothing_left(marker: str, seen: dict) -> None:
    deadline = time.monotonic() + 2.0  # SIGKILL is delivered at once, but the kernel may take a moment
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(marker) == []
    assert seen["work"] and not any(os.path.exists(w) for w in seen["work"]), seen
    assert not any(cgroups_of(pid) for pid in seen["pids"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_stall_triggers_fail_fast_and_leave_nothing(attack, mode, traced):
    marker = f"mtad-attack-{attack}-{mode}-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    result = run_check(PROMPT + ATTACKS[attack](marker), PROMPT, TEST, "add", Limits(timeout_s=TIMEOUT, isolation=mode))
    took = time.monotonic() - start
    assert result.status == "failed" and not result.passed, result
    assert took < TIMEOUT + SLACK, f"{attack}/{mode}: verdict after {took:.1f} s"
    assert_nothing_left(marker, traced)


def test_a_hostile_value_that_stalls_the_tests_is_cut_at_the_guard(traced, monkeypatch):
    """Whatever runs in the supervisor past the deadline (here: the tests build a set of 60,000 colliding ints,
    one quadratic C call no signal interrupts) ends at the runner's guard: the supervisor is killed, and with
    it every process of the sandbox, and its folder and cgroup are removed."""
    monkeypatch.setattr(client, "GUARD_S", 1.0)
    for mode in MODES:
        marker = f"mtad-guard-{mode}-{os.getpid()}-{time.monotonic_ns()}"
        body = ("    M = (1 << 61) - 1\n    return [k * M for k in range(1, 60001)]\n" + spawn(marker) +
                "import time\n")
        test = "def check(candidate):\n    assert len(set(candidate(1, 2))) == 3\n"
        start = time.monotonic()
        result = run_check(PROMPT + body, PROMPT, test, "add", Limits(timeout_s=1.0, isolation=mode))
        took = time.monotonic() - start
        assert result.status == "timeout" and took < 1.0 + 1.0 + 6.0, (mode, result, took)
        assert_nothing_left(marker, traced)


def test_a_swallowed_failure_is_still_a_failure():
    """The sticky verdict: a test that catches everything (``except BaseException``) around a call that timed
    out does not turn the timeout into a pass; ``except Exception`` does not even see it. (An exception the
    function raised is still the test's to catch, as in the official harness: the control.)"""
    hang = "    import time\n    time.sleep(30)\n"
    for catch in ("BaseException", "Exception"):
        test = f"def check(candidate):\n    try:\n        candidate(1, 2)\n    except {catch}:\n        pass\n"
        result = run_check(PROMPT + hang, PROMPT, test, "add", Limits(timeout_s=1.0))
        assert result.status == "timeout", (catch, result)
    control = "def check(candidate):\n    try:\n        candidate(1, 2)\n    except BaseException:\n        pass\n"
    assert run_check(PROMPT + "    raise ValueError\n", PROMPT, control, "add", Limits(timeout_s=1.0)).passed


# ---- the wire format alone -------------------------------------------------------------------------------------
def test_deep_json_is_a_wire_error_not_a_recursion_error():
    with pytest.raises(wire.WireError, match="nested too deeply"):
        wire.parse(b"[" * 200000)
    assert wire.parse(b'{"ok": [[[1]]]}') == {"ok": [[[1]]]}  # control: ordinary nesting parses


def test_colliding_hashes_are_refused_in_linear_time_and_distinct_ones_are_not():
    m = (1 << 61) - 1
    flood = {"S": [{"i": hex(k * m)} for k in range(1, 100001)]}
    start = time.monotonic()
    with pytest.raises(wire.WireError, match="share a hash"):
        wire.decode(flood)
    with pytest.raises(wire.WireError, match="share a hash"):
        wire.decode({"d": [[{"i": hex(k * m)}, None] for k in range(1, 100001)]})
    assert time.monotonic() - start < 5.0  # building that set alone takes minutes
    plain = {"S": [{"i": hex(k)} for k in range(100000)]}
    assert wire.decode(plain) == set(range(100000))  # control: 100,000 distinct hashes decode
    few = {"S": [{"i": hex(k * m)} for k in range(1, wire.MAX_COLLISIONS + 1)]}
    assert len(wire.decode(few)) == wire.MAX_COLLISIONS  # control: a handful of equal hashes is fine


def test_decoding_stops_at_the_deadline():
    big = {"l": [{"i": hex(k)} for k in range(1000)]}
    with pytest.raises(wire.Overtime):
        wire.decode(big, deadline=time.monotonic() - 1)
    assert len(wire.decode(big, deadline=time.monotonic() + 60)) == 1000


# ---- as an ordinary user ---------------------------------------------------------------------------------------
RUN_AS_USER = r"""
import importlib.util, json, sys, tempfile, time
spec = importlib.util.spec_from_file_location("client", sys.argv[1])
client = importlib.util.module_from_spec(spec)
sys.modules["client"] = client
spec.loader.exec_module(client)
made, mkdtemp = [], tempfile.mkdtemp
client.tempfile.mkdtemp = lambda *a, **k: made.append(mkdtemp(*a, **k)) or made[-1]
job = json.loads(sys.stdin.read())
start = time.monotonic()
r = client.run_check(job["program"], job["prompt"], job["test"], "add", client.Limits(timeout_s=job["timeout"],
                     isolation=job["mode"]))
print(json.dumps({"status": r.status, "isolation": r.isolation, "took": time.monotonic() - start, "work": made}))
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to become an ordinary user, and a system Python that user can run")
@pytest.mark.parametrize("mode", ["namespaces", "none"])  # (uid needs root: for a user it is none)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_stall_triggers_as_an_ordinary_user(attack, mode, tmp_path):
    if not os.access(client.__file__, os.R_OK) or not os.stat(Path(client.__file__).parents[3]).st_mode & 0o005:
        pytest.skip("the checkout is not readable by an ordinary user")
    marker = f"mtad-user-{attack}-{mode}-{os.getpid()}-{time.monotonic_ns()}"
    job = {"program": PROMPT + ATTACKS[attack](marker), "prompt": PROMPT, "test": TEST, "timeout": TIMEOUT,
           "mode": mode}
    out = subprocess.run(["/usr/bin/python3", "-I", "-c", RUN_AS_USER, client.__file__], input=json.dumps(job),
                         capture_output=True, text=True, timeout=60, user=65534, group=65534, extra_groups=[],
                         cwd="/")
    verdict = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    assert verdict.get("status") == "failed" and verdict["took"] < TIMEOUT + SLACK, (verdict, out.stderr[-2000:])
    assert verdict["isolation"] == mode
    assert_nothing_left(marker, {"work": verdict["work"], "pids": []})


if __name__ == "__main__":  # the closing note's table: python tests/tasks/test_sandbox_attacks.py
    for attack in sorted(ATTACKS):
        for mode in MODES:
            t = time.monotonic()
            r = run_check(PROMPT + ATTACKS[attack]("mtad-table"), PROMPT, TEST, "add", Limits(TIMEOUT, isolation=mode))
            print(f"{attack:10s} {mode:10s} {r.status:8s} {time.monotonic() - t:5.1f} s", file=sys.stderr)

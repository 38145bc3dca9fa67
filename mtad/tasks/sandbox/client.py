"""Run generated Python (HumanEval tests) so that a completion can neither forge a pass nor touch the host.

The runner starts a supervisor process (``worker.py``), which starts the candidate in a jail and
runs the **tests itself**: the candidate process holds only the prompt and the completion and answers calls
of the entry point over a pipe, with plain values of exact builtin types (``serve.py``). So the
candidate cannot read a pass token, swap ``check`` or return an always-equal object; the verdict travels on
the supervisor's stdout, which the candidate never holds. Isolation, best first (``Limits.isolation``,
``task.sandbox``; recorded per run in the row as ``sandbox``):

- ``namespaces`` — user/PID/network/mount/IPC/UTS namespaces, needs no root: a read-only root holding only
  the system libraries and the Python prefix, a private ``/tmp`` capped at ``disk_mb`` and ``max_files``, no
  network interface, an unprivileged uid (a random one per sandbox when run as root), no capabilities,
  and PID 1 of its own PID namespace, so it cannot signal anything outside and every process it started
  dies with it;
- ``uid`` — root without user namespaces: a random uid per sandbox (so sandboxes cannot signal each
  other), its own session and a throw-away working directory, but the host's file system and network as
  that uid sees them;
- ``none`` — neither: rlimits and a process group only. Unsandboxed: the row says so.

``auto`` (the default) takes the best that works on this machine and falls back with a warning. All modes:
rlimits (address space, CPU, file size, processes, open files, no core), a wall-clock limit, a total memory
cap over all of the candidate's processes (a memory cgroup where one can be made, else polling of their
resident memory; ``memory_cap`` in the result), and every process killed and reaped on return.

Bounded, whatever the candidate does: its verdict comes ``timeout_s`` after it starts plus the supervisor's
``GRACE_S`` (0.5 s) and the time to kill it, in practice under a second; past ``timeout_s + GUARD_S`` the
runner kills the supervisor itself (every process of the sandbox dies with it: ``PR_SET_PDEATHSIG``), then
kills whatever is left in the sandbox's cgroup, its uid (root) or its session, and removes the sandbox's
folder and cgroup (:func:`_clean_up`). A supervisor that ends without a verdict after the candidate started
is a failed sample, logged; one that never started the candidate raises :class:`SandboxError`.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
WORKER = Path(__file__).with_name("worker.py")
ISOLATION = ("auto", "namespaces", "uid", "none")
_fallback: str | None = None  # set once ``auto`` found namespaces unusable on this machine
GUARD_S = 12.0  # the runner's hard limit is timeout_s + this (the jail's setup may take up to 10 s)


class SandboxError(OSError):
    """The sandbox could not run the candidate at all (the message says why): not a verdict."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0
    memory_mb: int = 1024  # per process (address space) and in total over the candidate's processes
    output_bytes: int = 1 << 20
    processes: int = 64
    open_files: int = 64
    disk_mb: int = 16  # the private /tmp (namespaces only)
    max_files: int = 256
    isolation: str = "auto"

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION:
            raise ValueError(f"task.sandbox={self.isolation!r} must be one of {', '.join(ISOLATION)}")


@dataclass(frozen=True)
class RunResult:
    status: str  # passed | failed | timeout | memory | sandbox_error
    message: str  # why it failed (the supervisor's words)
    output: str  # tail of the candidate's stdout+stderr
    wall_s: float
    isolation: str | None  # namespaces | uid | none
    memory_cap: str  # cgroup | poll

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_check(program: str, prompt: str, test: str, entry_point: str, limits: Limits = Limits()) -> RunResult:
    """Load ``program`` (prompt + completion) in the jail; run ``prompt`` + ``test`` + ``check(candidate)`` in
    the supervisor, where ``candidate`` calls the jailed ``entry_point``. Passed iff ``check`` returned."""
    return _run({"program": program, "prompt": prompt, "test": test, "entry_point": entry_point}, limits)


def run_python(source: str, limits: Limits = Limits()) -> RunResult:
    """Execute ``source`` in the jail; passed iff it ran to its end without raising or exiting."""
    return _run({"program": source}, limits)


def _run(job: dict, limits: Limits) -> RunResult:
    global _fallback
    isolation = _fallback if limits.isolation == "auto" and _fallback else limits.isolation
    job = {**job, "timeout_s": limits.timeout_s, "memory_mb": limits.memory_mb, "output_bytes": limits.output_bytes,
           "processes": limits.processes, "open_files": limits.open_files, "disk_mb": limits.disk_mb,
           "max_files": limits.max_files, "isolation": isolation}
    result = _supervise(job, limits.timeout_s + GUARD_S)
    if result.status == "sandbox_error" and isolation == "auto":
        _fallback = "uid"
        log.warning("the HumanEval sandbox cannot use namespaces here (%s); falling back to %s isolation",
                    result.message, "uid" if os.geteuid() == 0 else "no (unsandboxed)")
        result = _supervise({**job, "isolation": _fallback}, limits.timeout_s + GUARD_S)
    if result.status == "sandbox_error":
        raise SandboxError(f"the HumanEval sandbox could not start ({isolation} isolation): {result.message}; "
                           "try task.sandbox=uid (as root) or task.sandbox=none (unsandboxed)")
    return result


def _supervise(job: dict, guard_s: float) -> RunResult:
    """Run the supervisor on ``job`` for at most ``guard_s`` seconds, then clean up after it on every path."""
    work = tempfile.mkdtemp(prefix="mtad-sandbox-")
    job = {**job, "work": work, "uid": 0x60000000 + secrets.randbelow(1 << 24)}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-I", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, text=True)
    killed = False
    try:
        out, err = proc.communicate(json.dumps(job), timeout=guard_s)
    except subprocess.TimeoutExpired:
        killed = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = _drain(proc)
    except BaseException:  # interrupted (Ctrl-C): neither the supervisor nor its sandbox may outlive us
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = _drain(proc)
        _clean_up(job, [_json(line) for line in out.splitlines()], work, leftover=True)
        raise
    lines = [_json(line) for line in out.splitlines()]
    verdict = next((row for row in reversed(lines) if "status" in row), None)
    _clean_up(job, lines, work, leftover=verdict is None or not verdict.get("reaped"))
    took = time.monotonic() - start
    if verdict is not None:
        if not verdict["reaped"]:
            log.warning("sandbox: some processes of the program could not be reaped within 5 s")
        return RunResult(verdict["status"], verdict["message"], verdict["output"], verdict["wall_s"],
                         verdict["isolation"], verdict["memory_cap"])
    started = next((row for row in lines if "started" in row), None)
    cap = "cgroup" if any("cgroup" in row for row in lines) else "poll"
    if killed:
        log.error("sandbox supervisor did not finish within %.0f s; counted as a failure", guard_s)
        return RunResult("timeout", "supervisor timeout", "", took, started and started["started"], cap)
    if started is None:
        raise SandboxError(f"the HumanEval sandbox supervisor failed (exit {proc.returncode}): {err[-2000:]}")
    log.error("sandbox supervisor ended without a verdict (exit %s), counted as a failure: %s",
              proc.returncode, err[-500:])
    return RunResult("failed", f"supervisor exit {proc.returncode}", "", took, started["started"], cap)


def _drain(proc: subprocess.Popen) -> tuple[str, str]:
    """What a killed supervisor left in its pipes, waiting at most 5 s (a process that escaped the kill may hold
    them: then they are closed unread)."""
    try:
        return proc.communicate(timeout=5.0)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait(timeout=5.0)
        return "", ""


def _json(line: str) -> dict:
    try:
        row = json.loads(line)
    except ValueError:
        return {}
    return row if isinstance(row, dict) else {}


def _clean_up(job: dict, lines: list[dict], work: str, leftover: bool) -> None:
    """After the supervisor: kill what may be left of the sandbox (its cgroup's processes, its uid's as root,
    its session), remove its cgroup and its folder. ``leftover``: the supervisor did not say it reaped all."""
    cgroup = next((row["cgroup"] for row in lines if isinstance(row.get("cgroup"), str)), None)
    started = next((row for row in lines if "started" in row), {})
    if leftover:
        if os.geteuid() == 0:
            for pid in _pids_where(lambda status, stat: f"\t{job['uid']}\t" in status.split("Uid:")[1][:80]):
                _kill(pid)
        if isinstance(started.get("child"), int):  # the candidate's session (it called setsid)
            for pid in _pids_where(lambda status, stat: stat.rsplit(")", 1)[1].split()[3] == str(started["child"])):
                _kill(pid)
    if cgroup and cgroup.startswith("/sys/fs/cgroup/") and "/mtad-sandbox-" in cgroup:
        for _ in range(200):
            if not os.path.isdir(cgroup):
                break
            for pid in _read(f"{cgroup}/cgroup.procs").split():
                _kill(int(pid))
            try:
                os.rmdir(cgroup)
            except OSError:
                time.sleep(0.01)
    shutil.rmtree(work, ignore_errors=True)


def _pids_where(test) -> list[int]:
    """Processes whose /proc status and stat texts pass ``test`` (this process excluded)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            status, stat = _read(f"/proc/{name}/status"), _read(f"/proc/{name}/stat")
            try:
                if status and stat and test(status, stat):
                    found.append(int(name))
            except (IndexError, ValueError):
                pass
    return found


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

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
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
WORKER = Path(__file__).with_name("worker.py")
ISOLATION = ("auto", "namespaces", "uid", "none")
_fallback: str | None = None  # set once ``auto`` found namespaces unusable on this machine


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
    result = _supervise(job, limits.timeout_s + 20.0)
    if result.status == "sandbox_error" and isolation == "auto":
        _fallback = "uid"
        log.warning("the HumanEval sandbox cannot use namespaces here (%s); falling back to %s isolation",
                    result.message, "uid" if os.geteuid() == 0 else "no (unsandboxed)")
        result = _supervise({**job, "isolation": _fallback}, limits.timeout_s + 20.0)
    if result.status == "sandbox_error":
        raise RuntimeError(f"the HumanEval sandbox could not start ({isolation} isolation): {result.message}")
    return result


def _supervise(job: dict, guard_s: float) -> RunResult:
    proc = subprocess.Popen([sys.executable, "-I", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, text=True)
    try:
        out, err = proc.communicate(json.dumps(job), timeout=guard_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        log.error("sandbox supervisor did not finish within %.0f s; counted as a failure", guard_s)
        return RunResult("timeout", "supervisor timeout", "", guard_s, None, "poll")
    try:
        row = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"the HumanEval sandbox supervisor failed (exit {proc.returncode}): "
                           f"{err[-2000:]}") from None
    if not row["reaped"]:
        log.warning("sandbox: some processes of the program could not be reaped within 5 s")
    return RunResult(row["status"], row["message"], row["output"], row["wall_s"], row["isolation"], row["memory_cap"])

"""Run generated Python (HumanEval tests) in a separate, resource-limited process.

What it does, and does not, protect against (this is a guard against accidents and naive misbehaviour of
generated code, not a security boundary against an adversary):

- a fresh supervisor process (``sandbox_worker.py``) marks itself child subreaper, starts the program in
  a new session with rlimits: address space (``memory_mb``), CPU seconds (timeout + 1), file size (so
  stdout/stderr, sent to a file, stop at ``output_bytes``), processes (``processes``), open files, no core
  dumps; after the program ends or its wall-clock timeout passes it SIGKILLs the process group and then
  every remaining descendant (orphans are re-parented to it, so ``setsid`` does not escape) and reaps
  them all, so fork bombs and zombies do not outlive the call;
- the working directory is a throw-away temp directory (HOME and TMPDIR point there), the environment is
  minimal (no proxies, no PYTHON* variables; ``python -I``);
- when running as root the program drops to uid/gid ``nobody`` after pre-importing common
  standard-library modules (root's interpreter lives under a private home), so RLIMIT_NPROC applies, the
  repository is read-only to it and it cannot signal our processes; importing a standard-library module
  outside the preloaded list then fails and the sample fails;
- no network: the child replaces ``socket.socket`` and the resolver functions with ones that raise
  (``_socket`` remains reachable to code that looks for it; there is no network namespace);
- a pass needs exit status 0 **and** a per-run random nonce that the child writes only after the program
  (tests and ``check(entry_point)``) returned normally, so ``sys.exit(0)`` or ``os._exit(0)`` before or
  inside the tests counts as a failure.
"""
from __future__ import annotations

import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
WORKER = Path(__file__).with_name("sandbox_worker.py")


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0
    memory_mb: int = 1024
    output_bytes: int = 1 << 20
    processes: int = 64
    open_files: int = 64


@dataclass(frozen=True)
class RunResult:
    status: str  # passed | failed | exited_early | timeout | sandbox_error
    returncode: int | None
    output: str  # tail of stdout+stderr
    wall_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_python(source: str, limits: Limits = Limits()) -> RunResult:
    """Execute ``source`` in the sandbox; RuntimeError if the sandbox itself cannot be set up."""
    with tempfile.TemporaryDirectory(prefix="mtad-sandbox-", ignore_cleanup_errors=True) as work:
        program = Path(work, "program.py")
        program.write_text(source, encoding="utf-8")
        uid, gid = _nobody()
        if os.geteuid() == 0:
            os.chown(work, uid, gid)
        job = {"workdir": work, "uid": uid, "gid": gid, "program_path": str(program),
               "output_path": str(Path(work, "output.txt")),
               "timeout_s": limits.timeout_s, "memory_mb": limits.memory_mb, "output_bytes": limits.output_bytes,
               "processes": limits.processes, "open_files": limits.open_files}
        result = _supervise(job, limits.timeout_s + 15.0)
    if result.status == "sandbox_error":
        raise RuntimeError(f"the HumanEval sandbox could not start: {result.output}")
    return result


def _supervise(job: dict, guard_s: float) -> RunResult:
    proc = subprocess.Popen([sys.executable, "-I", str(WORKER), "supervise"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=job["workdir"],
                            start_new_session=True, text=True)
    try:
        out, err = proc.communicate(json.dumps(job), timeout=guard_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        log.error("sandbox supervisor did not finish within %.0f s; counted as a failure", guard_s)
        return RunResult("timeout", None, "supervisor timeout", guard_s)
    try:
        row = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        if proc.returncode is not None and proc.returncode < 0:  # killed by a signal: the program's doing
            log.warning("sandbox supervisor was killed by signal %d; counted as a failure", -proc.returncode)
            return RunResult("failed", None, "supervisor killed", 0.0)
        raise RuntimeError(f"the HumanEval sandbox supervisor failed (exit {proc.returncode}): "
                           f"{err[-2000:]}") from None
    if not row["reaped"]:
        log.warning("sandbox: some processes of the program could not be reaped within 5 s")
    return RunResult(row["status"], row["returncode"], row["output"], row["wall_s"])

"""Stand-alone script (standard library only) that runs one untrusted Python program; see sandbox.py.

``python -I sandbox_worker.py supervise`` reads a JSON job from stdin, starts itself in ``run`` mode as the
limited child, waits, kills and reaps every descendant, and prints one JSON result line.
``python -I sandbox_worker.py run PROGRAM UID GID`` is the child: it reads a nonce from stdin, pre-imports
common standard-library modules, disables sockets, drops root to UID/GID (``nobody``), executes PROGRAM in
fresh globals and, only if PROGRAM finished without raising or exiting, writes the nonce to its stdout.
"""
import ctypes
import json
import math
import os
import resource
import secrets
import signal
import subprocess
import sys
import time

SETUP_FAILED = 97  # child exit code: the sandbox itself could not be set up
PR_SET_CHILD_SUBREAPER = 36
PRELOAD = [  # imported before dropping root; HumanEval prompts, solutions and tests need only these
    "abc", "array", "bisect", "builtins", "cmath", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "_strptime", "decimal", "enum", "errno", "fractions", "functools", "hashlib", "heapq", "io",
    "itertools", "json", "math", "numbers", "operator", "random", "re", "statistics", "string", "struct",
    "textwrap", "time", "traceback", "typing", "unicodedata", "warnings",
]


# ---- child --------------------------------------------------------------------------------------------
def _deny(*args, **kwargs):
    raise OSError(13, "network access is disabled in the mtad sandbox")


def _disable_network():
    import socket

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            _deny()

    socket.socket = socket.SocketType = NoSocket
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex",
                 "gethostbyaddr", "socketpair", "fromfd"):
        setattr(socket, name, _deny)


def _drop_root(uid, gid):
    if os.geteuid() != 0:
        return
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as err:
        os.write(2, f"mtad-sandbox: cannot drop root privileges: {err}\n".encode())
        os._exit(SETUP_FAILED)


def _setup(program_path, uid, gid):
    """Everything before the untrusted code runs; any failure here is the sandbox's, not the program's."""
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - replaces stdin for the rest of the process
    with open(program_path, encoding="utf-8") as f:
        source = f.read()
    for name in PRELOAD if os.geteuid() == 0 else ():  # root's stdlib is unreadable once we are nobody
        try:
            __import__(name)
        except ImportError:
            pass
    _disable_network()
    _drop_root(uid, gid)
    return nonce, source


def child(program_path, uid, gid):
    try:
        nonce, source = _setup(program_path, uid, gid)
    except Exception as err:  # noqa: BLE001 - reported to the supervisor as a setup failure
        os.write(2, f"mtad-sandbox: setup failed: {type(err).__name__}: {err}\n".encode())
        os._exit(SETUP_FAILED)
    code = compile(source, os.path.basename(program_path), "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102 - running it is the point
    sys.stdout.flush()
    os.write(1, f"\n{nonce}\n".encode())


# ---- supervisor ---------------------------------------------------------------------------------------
def _limits(job):
    cpu = math.ceil(job["timeout_s"]) + 1
    for res, value in ((resource.RLIMIT_AS, job["memory_mb"] << 20), (resource.RLIMIT_CPU, cpu),
                       (resource.RLIMIT_FSIZE, job["output_bytes"]), (resource.RLIMIT_NPROC, job["processes"]),
                       (resource.RLIMIT_NOFILE, job["open_files"]), (resource.RLIMIT_CORE, 0)):
        hard = value + 1 if res == resource.RLIMIT_CPU else value
        resource.setrlimit(res, (value, hard))


def _children(me):
    """Pids whose parent is ``me`` (after PR_SET_CHILD_SUBREAPER this includes orphaned descendants)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(entry))
    return found


def _kill_all(pgid, deadline):
    """SIGKILL the child's process group, then every remaining descendant, reaping until none is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    me = os.getpid()
    while time.monotonic() < deadline:
        for pid in _children(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            time.sleep(0.005)
    return False


def _start(job, nonce, out):
    """The limited child in a new session, cwd the throw-away directory, with a minimal environment."""
    env = {"PATH": "/usr/bin:/bin", "HOME": job["workdir"], "TMPDIR": job["workdir"], "LANG": "C.UTF-8"}
    argv = [sys.executable, "-I", os.path.abspath(__file__), "run", job["program_path"], str(job["uid"]),
            str(job["gid"])]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, cwd=job["workdir"],
                            env=env, start_new_session=True,
                            preexec_fn=lambda: _limits(job))  # noqa: PLW1509 - the supervisor has no threads
    try:
        proc.stdin.write(f"{nonce}\n".encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return proc


def _wait(proc, timeout_s):
    """(timed_out, wall seconds); waits on the child only, orphans are reaped by _kill_all."""
    start = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - start > timeout_s:
            return True, time.monotonic() - start
        time.sleep(0.005)
    return False, time.monotonic() - start


def _status(timed_out, rc, finished, text):
    if timed_out:
        return "timeout"
    if rc == SETUP_FAILED and "mtad-sandbox:" in text:
        return "sandbox_error"
    if rc == 0:
        return "passed" if finished else "exited_early"
    return "failed"


def supervise():
    job = json.loads(sys.stdin.read())
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write("mtad-sandbox: PR_SET_CHILD_SUBREAPER failed; escaped orphans are not reaped\n")
    nonce = secrets.token_hex(16)
    with open(job["output_path"], "w+b") as out:
        proc = _start(job, nonce, out)
        timed_out, wall = _wait(proc, job["timeout_s"])
        reaped = _kill_all(proc.pid, time.monotonic() + 5.0)
        out.seek(0)
        text = out.read(job["output_bytes"] + 1024).decode("utf-8", "replace")
    rc = None if timed_out else proc.returncode
    status = _status(timed_out, rc, nonce in text, text)
    tail = text.replace(nonce, "").strip()[-2000:]
    sys.stdout.write(json.dumps({"status": status, "returncode": rc, "wall_s": wall, "output": tail,
                                 "reaped": reaped}) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        supervise()

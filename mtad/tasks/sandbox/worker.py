"""Supervisor of one untrusted program (standard library only; see ``client.py`` for what it guarantees).

``python -I worker.py`` reads a JSON job on stdin and prints one JSON verdict line on stdout. It
starts the candidate (``serve.py``) in a jail, sends it the program, then — for a HumanEval job —
runs the tests itself, in this process, calling the candidate through a pipe. The candidate never holds
the tests, the verdict or this process's stdout.

The jail (``isolation``, set up by ``jail.py``), best first:
- ``namespaces``: new user, PID, network, mount, IPC and UTS namespaces (no root needed). The root file
  system is a read-only tmpfs holding read-only binds of the system libraries and the Python prefix only
  (no home, no repository, no data); ``/tmp`` is a private tmpfs capped in bytes and inodes; the
  candidate runs as an unprivileged uid (for root: a random uid per sandbox), without capabilities, with
  ``no_new_privs``, as PID 1 of its own PID namespace: when it dies, every process it started dies; it
  cannot see or signal any process outside; no network interface is up.
- ``uid`` (root, without user namespaces): a random uid per sandbox, own session, no file isolation.
- ``none`` (neither): only rlimits and the process group; the row says "none" — unsandboxed.
Everywhere: rlimits (address space, CPU, file size, processes, open files, no core), a wall-clock limit,
and a total memory cap over all the candidate's processes — a memory cgroup when one can be created,
else polling of their resident memory (``memory_cap``).

Nothing the candidate sends can stall or crash this process: every error of reading or decoding a reply is a
failed verdict, replies are bounded in size and depth and decoded against the deadline (``reply.py``, on the
wire format of ``serve.py``), and a ``SIGALRM`` ``GRACE_S`` after the deadline ends tests that loop over a
hostile value. Every process of the sandbox dies with this one: the setup helper and the candidate carry
``PR_SET_PDEATHSIG`` (the helper holds none of our pipes), and every path ends in :meth:`Jail.close`. Progress
lines on stdout (``{"cgroup": ...}``, ``{"started": ...}``) let the runner clean up after this process if it
has to kill it; the last line is the verdict.
"""
import json
import os
import secrets
import select
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve as wire  # noqa: E402 - a sibling script, not a package import
from jail import INSIDE_ID, PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, SERVE, SETUP_FAILED, child, libc, tell  # noqa: E402 - a sibling script, not a package import
from reply import CandidateError, Replies, brief  # noqa: E402 - a sibling script, not a package import

SETUP_S = 10.0  # the jail must be ready within this (the candidate's time limit starts after it)
GRACE_S = 0.5  # after the deadline, tests still running in this process are interrupted


class Failed(BaseException):
    """The candidate failed (the message says how); ``status`` is the verdict. A ``BaseException``, so that a
    test's ``except Exception`` cannot swallow it (the jail also remembers it: :attr:`Jail.failure`)."""

    def __init__(self, status, message=""):
        super().__init__(message)
        self.status = status


# ---- the supervisor -------------------------------------------------------------------------------------
class Lines:
    """Lines from the setup pipe, with a deadline."""

    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def next(self, deadline):
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise RuntimeError("the sandbox did not start in time")
            chunk = os.read(self.fd, 4096)
            if not chunk:
                raise RuntimeError("the sandbox setup ended without a word")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        line = line.decode(errors="replace")
        if line.startswith("error "):
            raise RuntimeError(line[6:])
        return line


def _cgroup(limit_bytes):
    """A fresh memory cgroup under ours (v1 or v2) with the limit set, or None where we may not make one."""
    name = f"mtad-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
    for line in _read("/proc/self/cgroup").splitlines():
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, files = f"/sys/fs/cgroup/memory{path}", ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        elif hid == "0":
            base = next((b for b in (f"/sys/fs/cgroup{path}", f"/sys/fs/cgroup/unified{path}")
                         if "memory" in _read(f"{b}/cgroup.subtree_control")), None)
            files = ("memory.max", "memory.swap.max")
            if base is None:
                continue
        else:
            continue
        try:
            os.mkdir(f"{base}/{name}")
        except OSError:
            continue
        try:
            _write(f"{base}/{name}/{files[0]}", str(limit_bytes))
        except OSError:
            os.rmdir(f"{base}/{name}")
            continue
        try:
            _write(f"{base}/{name}/{files[1]}", str(limit_bytes if "memsw" in files[1] else 0))
        except OSError:
            pass  # no swap accounting: swap is not limited, memory is
        return f"{base}/{name}"
    return None


def oom_kills(path):
    """How many processes the kernel's OOM killer ended in the cgroup at ``path`` (v2 ``memory.events``, v1
    ``memory.oom_control``); 0 where neither file says. A killed child the candidate ignores still counts."""
    for name in ("memory.events", "memory.oom_control"):
        for line in _read(f"{path}/{name}").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return 0


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def say(**fields):
    """One progress line on stdout for the runner (it reads them if it has to kill us)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def empty_cgroup(path, seconds=2.0):
    """Kill every process in the cgroup at ``path`` and remove it; True when it is gone (or never was)."""
    end = time.monotonic() + seconds
    while os.path.isdir(path):
        if os.path.exists(f"{path}/cgroup.kill"):  # cgroup v2, Linux >= 5.14
            try:
                _write(f"{path}/cgroup.kill", "1")
            except OSError:
                pass
        for pid in _read(f"{path}/cgroup.procs").split():
            _kill(int(pid))
        try:
            os.rmdir(path)
            return True
        except OSError:
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
    return True


def _tree(pid):
    """``pid`` and its descendants (via /proc/PID/task/TID/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                todo.extend(int(c) for c in _read(f"/proc/{p}/task/{tid}/children").split())
        except OSError:
            pass
    return found


def _rss_bytes(pids):
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for p in pids:
        fields = _read(f"/proc/{p}/statm").split()
        total += int(fields[1]) * page if len(fields) > 1 else 0
    return total


class Jail:
    """The running candidate: its pipes, the pid whose death ends it, and the limits being watched."""

    def __init__(self, job):
        self.job, self.isolation, self.cgroup, self.child = job, None, None, None
        self.deadline = time.monotonic() + job["timeout_s"]
        self.limit = job["memory_mb"] << 20
        self.last_poll = 0.0
        self.failure = None  # the first Failed raised, kept even if a test swallows it
        self.req = self.rep = self.replies = None

    def start(self, out_fd):
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
        req_r, self.req = os.pipe()
        self.rep, rep_w = os.pipe()
        self.replies = Replies(self.rep, self._watch, self.fail)
        pipes = {"up_w": up_w, "down_r": down_r, "req_r": req_r, "rep_w": rep_w, "out": out_fd,
                 "parent": (up_r, down_w, self.req, self.rep), "supervisor": os.getpid()}
        self.cgroup = _cgroup(self.limit)
        if self.cgroup:
            say(cgroup=self.cgroup)
        self.child = os.fork()
        if self.child == 0:
            try:
                child(self.job, pipes)
            except BaseException as err:  # noqa: BLE001 - reported to the supervisor, which decides
                os.write(up_w, f"error {type(err).__name__}: {err}\n".encode())
            os._exit(SETUP_FAILED)
        for fd in (up_w, down_r, req_r, rep_w):
            os.close(fd)
        self.pid = self.child
        lines, setup_deadline = Lines(up_r), time.monotonic() + SETUP_S
        try:
            line = lines.next(setup_deadline)
            if line == "unshared":
                self._map_ids()
                tell(down_w, "mapped")
                line = lines.next(setup_deadline)
            _, pid, self.isolation = line.split()
            self.pid = int(pid)
            say(started=self.isolation, pid=self.pid, child=self.child)
            if self.cgroup:
                _write(f"{self.cgroup}/cgroup.procs", str(self.pid))
            if lines.next(setup_deadline) != "ready":
                raise RuntimeError("setup protocol: expected 'ready'")
            tell(down_w, "go")
        finally:
            os.close(up_r)
            os.close(down_w)
        self.deadline = time.monotonic() + self.job["timeout_s"]  # the limit counts from the exec

    def _map_ids(self):
        """The candidate's uid/gid (inside: 1000): a random one per sandbox as root, our own otherwise. As
        root, inside 0 is root too, so that the jail can be built from root-only folders before the switch
        to 1000 drops every capability (a non-root user keeps its namespace capabilities until the exec)."""
        if os.geteuid() == 0:
            uid_map = gid_map = f"0 0 1\n{INSIDE_ID} {self.job['uid']} 1"
        else:
            uid_map, gid_map = f"{INSIDE_ID} {os.getuid()} 1", f"{INSIDE_ID} {os.getgid()} 1"
            _write(f"/proc/{self.child}/setgroups", "deny")
        _write(f"/proc/{self.child}/uid_map", uid_map)
        _write(f"/proc/{self.child}/gid_map", gid_map)

    def fail(self, status, message):
        """Raise (and remember) a failed verdict."""
        self.failure = self.failure or Failed(status, message)
        raise self.failure

    def call(self, message):
        """Send ``message`` and wait for the reply (``reply.Replies``), watching the time and the total memory.
        Whatever the candidate sends, the outcome is a reply (a dict) or ``Failed``."""
        if self.failure is not None:
            raise self.failure
        try:
            wire.send(self.req, message)
        except OSError:
            self.fail("failed", "the candidate exited")
        return self.replies.next()

    def value(self, reply):
        """The decoded return value in a call's reply (under the deadline), or ``Failed``."""
        return self.replies.value(reply, self.deadline + GRACE_S, self.job["timeout_s"])

    def _watch(self):
        now = time.monotonic()
        if now > self.deadline:
            self.fail("timeout", f"over the {self.job['timeout_s']} s limit")
        if now - self.last_poll > 0.02:
            self.last_poll = now
            if _rss_bytes(_tree(self.pid)) > self.limit:
                self.fail("memory", f"the candidate's processes use more than {self.job['memory_mb']} MB")

    def close(self):
        """Kill every process of the candidate and reap them, remove the cgroup; True when none is left."""
        if self.child is None:
            return self.cgroup is None or empty_cgroup(self.cgroup)
        for fd in (self.req, self.rep):
            if fd is not None:
                os.close(fd)
        _kill(self.pid)  # in a namespace, its PID 1: its death kills the rest
        _kill(-self.child)  # the process group, then whatever escaped it (we are their subreaper)
        reaped = False
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            for pid in _tree(os.getpid())[1:]:
                _kill(pid)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                reaped = True
                break
            if pid == 0:
                time.sleep(0.005)
        gone = self.cgroup is None or empty_cgroup(self.cgroup)
        return reaped and gone


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _check(job, jail):
    """The verdict: load the program in the jail, then run the tests here against the jailed function."""
    reply = jail.call({"program": job["program"], "entry_point": job.get("entry_point")})
    if "ok" not in reply:
        jail.fail("failed", f"the program did not load: {brief(reply.get('error'))}")
    if job.get("test") is None:
        return
    scope = {"__name__": "__mtad_check__"}
    exec(compile(job["prompt"], "prompt.py", "exec"), scope)  # noqa: S102 - the dataset's trusted code
    exec(compile(job["test"], "test.py", "exec"), scope)  # noqa: S102 - the dataset's trusted code

    def candidate(*args):
        return jail.value(jail.call({"args": wire.encode(list(args))}))

    scope[job["entry_point"]] = candidate  # tests may name the function too (HumanEval/33), as in the official run
    try:
        scope["check"](candidate)
    except Failed:
        raise
    except CandidateError as err:
        jail.fail("failed", str(err))
    except BaseException as err:  # noqa: BLE001 - an assertion or any other failure of the tests
        jail.fail("failed", f"{type(err).__name__}: {brief(err)}")
    if jail.failure is not None:  # a test swallowed a failed call (``except:``): still failed
        raise jail.failure


def _alarm(jail):
    """From now on, the tests running here end ``GRACE_S`` after the candidate's deadline (SIGALRM)."""
    def ring(signum, frame):
        jail.fail("timeout", f"over the {jail.job['timeout_s']} s limit (the tests ran on)")

    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(jail.deadline + GRACE_S - time.monotonic(), 0.001))


def _judge(job, out):
    """Start the jail, run the check, close the jail: (status, message, jail, reaped), on every path."""
    jail = Jail(job)
    status, message = "passed", ""
    try:
        try:
            jail.start(out.fileno())
        except Exception as err:  # noqa: BLE001 - the jail could not be built: not the candidate's fault
            return "sandbox_error", f"{type(err).__name__}: {err}", jail, jail.close()
        try:
            _alarm(jail)
            _check(job, jail)
        except Failed as err:
            status, message = err.status, str(err)
        except Exception as err:  # noqa: BLE001 - anything else here (MemoryError, a bug) fails the sample
            status, message = "failed", f"supervisor error: {type(err).__name__}: {brief(err)}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Failed as err:  # the alarm rang between the check and disarming it
        status, message = err.status, str(err)
    if jail.cgroup and status in ("passed", "failed") and oom_kills(jail.cgroup):
        status, message = "memory", f"the candidate's processes used more than {job['memory_mb']} MB in total"
    return status, message, jail, jail.close()


def supervise(job):
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/PID/mem access by a same-uid candidate
    reaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    job.setdefault("uid", 0x60000000 + secrets.randbelow(1 << 24))
    with open(SERVE) as f:
        job["serve_source"] = f.read()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mtad-sandbox-", dir=job.get("work"), ignore_cleanup_errors=True) as work:
        os.chmod(work, 0o755)
        job.update(workdir=os.path.join(work, "cwd"), root=os.path.join(work, "root"))
        os.mkdir(job["root"])
        os.mkdir(job["workdir"], 0o777)
        os.chmod(job["workdir"], 0o777)
        out_path = os.path.join(work, "output.txt")
        with open(out_path, "w+b") as out:
            status, message, jail, reaped = _judge(job, out)
            out.seek(0)
            text = out.read(job["output_bytes"] + 1024).decode("utf-8", "replace")
    return {"status": status, "message": message[-2000:], "output": text[-2000:], "wall_s": time.monotonic() - start,
            "isolation": jail.isolation, "memory_cap": "cgroup" if jail.cgroup else "poll",
            "reaped": reaped and reaper}


if __name__ == "__main__":
    sys.stdout.write(json.dumps(supervise(json.loads(sys.stdin.read()))) + "\n")

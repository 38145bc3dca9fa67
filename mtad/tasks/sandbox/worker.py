"""Supervisor of one untrusted program (standard library only; see ``client.py`` for what it guarantees).

``python -I worker.py`` reads a JSON job on stdin and prints one JSON verdict line on stdout. It
starts the candidate (``serve.py``) in a jail, sends it the program, then — for a HumanEval job —
runs the tests itself, in this process, calling the candidate through a pipe. The candidate never holds
the tests, the verdict or this process's stdout.

The jail (``isolation``), best first:
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
import ctypes
import fcntl
import json
import os
import platform
import resource
import secrets
import select
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve as wire  # noqa: E402 - a sibling script, not a package import
from reply import CandidateError, Replies, brief  # noqa: E402 - a sibling script, not a package import

SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")
SETUP_FAILED = 97
SETUP_S = 10.0  # the jail must be ready within this (the candidate's time limit starts after it)
GRACE_S = 0.5  # after the deadline, tests still running in this process are interrupted
INSIDE_ID = 1000  # the candidate's uid/gid inside its user namespace
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203}.get(platform.machine())
SYS_MOUNT_SETATTR, AT_RECURSIVE, MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 442, 0x8000, 1, 2
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
libc = ctypes.CDLL(None, use_errno=True)


class Failed(BaseException):
    """The candidate failed (the message says how); ``status`` is the verdict. A ``BaseException``, so that a
    test's ``except Exception`` cannot swallow it (the jail also remembers it: :attr:`Jail.failure`)."""

    def __init__(self, status, message=""):
        super().__init__(message)
        self.status = status


def _ok(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(text):
    return text.encode() if text is not None else None


def _mount(src, dst, fstype, flags, data=None):
    _ok(libc.mount(_enc(src), _enc(dst), _enc(fstype), ctypes.c_ulong(flags), _enc(data)), f"mount {dst}")


# ---- the jail (runs in the forked child, before exec) -----------------------------------------------------
def _bind_ro(src, dst):
    """Bind ``src`` at ``dst`` read-only (recursively; falls back to a remount keeping the locked flags)."""
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()  # noqa: SIM115 - a mount point for a file
    _mount(src, dst, None, MS_BIND | MS_REC)
    attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, -100, dst.encode(), AT_RECURSIVE, ctypes.byref(attr), 32) == 0:
        return
    kept = os.statvfs(src).f_flag & (MS_NODEV | MS_NOEXEC | 1024 | 2048)  # nodev, noexec, noatime, nodiratime
    kept |= (1 << 21) if os.statvfs(src).f_flag & 4096 else 0  # relatime
    _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | kept)


def _visible_paths():
    """System paths and the Python prefix, as (host path, kind) with symlinks kept as symlinks."""
    prefix = os.path.realpath(sys.base_prefix)
    paths = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)
    return paths


def _build_root(job):
    """Mount namespace: a read-only tmpfs root with read-only system binds, a capped private /tmp."""
    root = job["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=0755")
    for path in _visible_paths():
        if os.path.islink(path):  # e.g. /lib -> usr/lib
            os.symlink(os.readlink(path), root + path)
        else:
            _bind_ro(path, root + path)
    os.makedirs(root + "/dev")
    for dev in DEVICES:
        open(root + dev, "a").close()  # noqa: SIM115 - mount point
        _mount(dev, root + dev, None, MS_BIND)
    os.makedirs(root + "/.mtad")
    with open(root + "/.mtad/serve.py", "w") as dst:
        dst.write(job["serve_source"])
    os.mkdir(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={job['disk_mb']}m,nr_inodes={job['max_files']},mode=1777")
    os.mkdir(root + "/.old")
    _ok(libc.syscall(SYS_PIVOT_ROOT, root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _ok(libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/tmp")


def _rlimits(job):
    cpu = int(job["timeout_s"]) + 2
    for res, value in ((resource.RLIMIT_AS, job["memory_mb"] << 20), (resource.RLIMIT_CPU, cpu),
                       (resource.RLIMIT_FSIZE, job["output_bytes"]), (resource.RLIMIT_NPROC, job["processes"]),
                       (resource.RLIMIT_NOFILE, job["open_files"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))


def _tell(fd, line):
    os.write(fd, (line + "\n").encode())


def _await(fd, word):
    got = os.read(fd, 64).decode().strip()
    if got != word:
        raise RuntimeError(f"setup protocol: expected {word!r}, got {got!r}")


def _exec(job, pipes, argv, env):
    """Wire the fds (0 /dev/null, 1+2 output file, 3 requests, 4 replies) and exec the candidate."""
    keep = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (pipes["out"], pipes["req_r"], pipes["rep_w"])]
    null = os.open(os.devnull, os.O_RDONLY)
    for target, fd in ((0, null), (1, keep[0]), (2, keep[0]), (3, keep[1]), (4, keep[2])):
        os.dup2(fd, target)
    os.closerange(5, 1 << 16)
    os.execve(argv[0], argv, env)


def _die_with(parent):
    """SIGKILL when ``parent`` (the process that forked us) dies; exit now if it already has."""
    _ok(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != parent:
        os._exit(SETUP_FAILED)


def _child(job, pipes):
    """The forked child: unshare and jail (or fall back), then exec the candidate. Never returns."""
    _die_with(pipes["supervisor"])
    up, down = pipes["up_w"], pipes["down_r"]
    for fd in pipes["parent"]:  # the supervisor's ends
        os.close(fd)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never hold the runner's pipes (our stdout is the verdict's way out)
        os.dup2(null, fd)
    os.close(null)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # so that an unprivileged supervisor may write our id maps
    os.setsid()
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"}
    if job["isolation"] in ("auto", "namespaces") and SYS_PIVOT_ROOT is not None:
        if os.geteuid() == 0:
            os.setgroups([])
        flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
        if libc.unshare(flags) == 0:
            _die_with(pipes["supervisor"])  # (a new user namespace may reset it)
            _tell(up, "unshared")
            _await(down, "mapped")
            pid = os.fork()
            if pid:  # the intermediate: reports the jail's host pid, waits, exits with its status
                _tell(up, f"pid {pid} namespaces")
                os.closerange(0, 1 << 16)
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            _build_root(job)
            os.setresgid(INSIDE_ID, INSIDE_ID, INSIDE_ID)  # drops every capability (inside uid 0 -> 1000)
            os.setresuid(INSIDE_ID, INSIDE_ID, INSIDE_ID)
            _ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            _ok(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # the intermediate's death
            _rlimits(job)
            _tell(up, "ready")
            _await(down, "go")
            _exec(job, pipes, [python, "-I", "-S", "-B", "/.mtad/serve.py", "3", "4"], env)
        if job["isolation"] == "namespaces":
            raise RuntimeError(f"user namespaces are unavailable ({os.strerror(ctypes.get_errno())}); "
                               "use task.sandbox=auto to fall back")
    argv = [python, "-I", "-S", "-B", SERVE, "3", "4", "--fallback"]
    if os.geteuid() == 0 and job["isolation"] != "none":
        argv += [str(job["uid"])]  # the candidate drops root itself, after loading Python
        isolation = "uid"
    else:
        isolation = "none"
    env.update(HOME=job["workdir"], TMPDIR=job["workdir"])
    os.chdir(job["workdir"])
    _tell(up, f"pid {os.getpid()} {isolation}")
    _rlimits(job)
    _tell(up, "ready")
    _await(down, "go")
    _exec(job, pipes, argv, env)


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
                _child(self.job, pipes)
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
                _tell(down_w, "mapped")
                line = lines.next(setup_deadline)
            _, pid, self.isolation = line.split()
            self.pid = int(pid)
            say(started=self.isolation, pid=self.pid, child=self.child)
            if self.cgroup:
                _write(f"{self.cgroup}/cgroup.procs", str(self.pid))
            if lines.next(setup_deadline) != "ready":
                raise RuntimeError("setup protocol: expected 'ready'")
            _tell(down_w, "go")
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

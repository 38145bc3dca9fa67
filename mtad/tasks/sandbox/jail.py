"""The candidate's side of the sandbox before exec (standard library only; imported by ``worker.py``).

:func:`child` runs in the process the supervisor forked: it unshares the namespaces, builds the read-only
root (:func:`_build_root`), drops to an unprivileged id, sets the rlimits and execs ``serve.py`` -- or, where
namespaces are unavailable, falls back to a uid or to nothing (``worker.py`` describes the three levels). It
talks to the supervisor over two pipes, a word per line (``unshared`` / ``mapped``, ``pid N LEVEL``,
``ready`` / ``go``), and never returns.
"""
import ctypes
import fcntl
import os
import platform
import resource
import signal
import sys

SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")
SETUP_FAILED = 97
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


def _ok(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(text):
    return text.encode() if text is not None else None


def _mount(src, dst, fstype, flags, data=None):
    _ok(libc.mount(_enc(src), _enc(dst), _enc(fstype), ctypes.c_ulong(flags), _enc(data)), f"mount {dst}")


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


def tell(fd, line):
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


def child(job, pipes):
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
            tell(up, "unshared")
            _await(down, "mapped")
            pid = os.fork()
            if pid:  # the intermediate: reports the jail's host pid, waits, exits with its status
                tell(up, f"pid {pid} namespaces")
                os.closerange(0, 1 << 16)
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            _build_root(job)
            os.setresgid(INSIDE_ID, INSIDE_ID, INSIDE_ID)  # drops every capability (inside uid 0 -> 1000)
            os.setresuid(INSIDE_ID, INSIDE_ID, INSIDE_ID)
            _ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            _ok(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # the intermediate's death
            _rlimits(job)
            tell(up, "ready")
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
    tell(up, f"pid {os.getpid()} {isolation}")
    _rlimits(job)
    tell(up, "ready")
    _await(down, "go")
    _exec(job, pipes, argv, env)

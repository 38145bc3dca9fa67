"""The untrusted side of the HumanEval sandbox, and the wire format both sides speak (standard library only).

``python -I -S -B serve.py REQ_FD REP_FD`` runs inside the jail (see ``worker.py``). It reads
one message ``{"program": source, "entry_point": name}``, executes the program (prompt + completion) and
answers ``{"ok": true}`` or ``{"error": ...}``; then, for each ``{"args": [...]}`` it calls the entry point
and answers ``{"value": ...}`` or ``{"error": ...}``, until the request pipe closes.

The candidate never sees the tests, the expected values or the verdict: those live in the supervisor, which
calls the candidate through this protocol. Values cross the boundary only as plain data of **exactly** the
builtin types below (``type(x) is int``, not ``isinstance``), so an object whose ``==`` is always true, or an
``int`` subclass with a forged ``__eq__``, cannot be sent; the supervisor rebuilds genuine builtins, and the
tests' ``==`` then behaves as in the official harness on genuine values.

Wire format: 4-byte big-endian length + UTF-8 JSON. Values are tagged: ``null``/``true``/``false`` and JSON
strings stand for themselves; ``{"i": hex}`` int, ``{"f": float.hex()}`` float (nan/inf included),
``{"c": [re, im]}`` complex, ``{"b": hex}`` bytes, ``{"l"|"t"|"S"|"F": [...]}`` list/tuple/set/frozenset,
``{"d": [[k, v], ...]}`` dict.

What the supervisor reads from the candidate (``reply.py``) is bounded: a message is at most ``MAX_MESSAGE``
bytes and ``MAX_DEPTH`` levels deep (deeper JSON is refused, never a ``RecursionError``), decoding stops at
the supervisor's deadline, and a set, frozenset or dict whose elements share one hash more than
``MAX_COLLISIONS`` times (which would make building it quadratic) is refused: :func:`encode` never sends
equal elements twice, so a genuine value never comes close.
"""
import json
import os
import struct
import sys
import time
from collections import Counter

MAX_MESSAGE = 4 << 20  # bytes; a larger reply is a failure, not a memory or time problem for the supervisor
MAX_DEPTH = 200
MAX_COLLISIONS = 8  # elements of one set/dict sharing a hash: more is a hash-flooding value, refused
SEQUENCES = {list: "l", tuple: "t", set: "S", frozenset: "F"}
BUILD = {"l": list, "t": tuple, "S": set, "F": frozenset}


class WireError(ValueError):
    """A value that cannot cross the boundary, or a malformed message."""


class Overtime(WireError):
    """Decoding a value ran past the deadline it was given."""


def encode(x, depth=0):
    """Plain data of exactly the builtin types -> JSON-able tagged structure; anything else is refused."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return {"i": hex(x)}
    if t is float:
        return {"f": x.hex()}
    if t is complex:
        return {"c": [x.real.hex(), x.imag.hex()]}
    if t is bytes:
        return {"b": x.hex()}
    if t in SEQUENCES:
        return {SEQUENCES[t]: [encode(v, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    raise WireError(f"a value of type {t.__module__}.{t.__qualname__} cannot be returned (plain builtins only)")


def decode(x, depth=0, deadline=None):
    """The inverse of :func:`encode`, strict: unknown tags, wrong shapes and extra keys raise WireError; a
    value deeper than ``MAX_DEPTH``, or hash-flooding sets or dict keys, raise WireError too, and running
    past ``deadline`` (``time.monotonic()``) raises Overtime."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if deadline is not None and time.monotonic() > deadline:
        raise Overtime("decoding the reply ran past the time limit")
    if x is None or type(x) in (bool, str):
        return x
    if type(x) is not dict or len(x) != 1:
        raise WireError(f"malformed value {_brief(x)!r}")
    (tag, v), = x.items()
    try:
        if tag == "i":
            return int(_str(v), 16)
        if tag == "f":
            return float.fromhex(_str(v))
        if tag == "c":
            re_, im = _list(v, 2)
            return complex(float.fromhex(_str(re_)), float.fromhex(_str(im)))
        if tag == "b":
            return bytes.fromhex(_str(v))
        if tag in ("l", "t"):
            return BUILD[tag](decode(item, depth + 1, deadline) for item in _list(v))
        if tag in ("S", "F"):
            return BUILD[tag](_spread([decode(item, depth + 1, deadline) for item in _list(v)]))
        if tag == "d":
            pairs = [(decode(k, depth + 1, deadline), decode(val, depth + 1, deadline))
                     for k, val in (_list(p, 2) for p in _list(v))]
            _spread([k for k, _ in pairs])
            return dict(pairs)
    except (TypeError, ValueError, OverflowError) as err:
        if isinstance(err, WireError):
            raise
        raise WireError(f"malformed {tag!r} value: {err}") from None
    raise WireError(f"unknown value tag {tag!r}")


def _spread(items):
    """``items`` unchanged, unless more than ``MAX_COLLISIONS`` share one hash (WireError): a set or dict of
    such elements takes quadratic time to build (e.g. 150,000 multiples of 2**61 - 1, which all hash to 0).
    Hashing is linear; an unhashable element raises TypeError, as building the set would."""
    if len(items) > MAX_COLLISIONS:
        worst = max(Counter(map(hash, items)).values())
        if worst > MAX_COLLISIONS:
            raise WireError(f"{worst} elements of one set or dict share a hash (a hash-flooding value)")
    return items


def _brief(x):
    try:
        return str(x)[:80]
    except (RecursionError, ValueError):
        return f"<{type(x).__name__}>"


def _str(v):
    if type(v) is not str:
        raise WireError("expected a string")
    return v


def _list(v, n=None):
    if type(v) is not list or (n is not None and len(v) != n):
        raise WireError("expected a list" + (f" of {n}" if n else ""))
    return v


def send(fd, message):
    data = json.dumps(message, allow_nan=False).encode("utf-8")
    if len(data) > MAX_MESSAGE:
        data = json.dumps({"error": f"reply of {len(data)} bytes exceeds {MAX_MESSAGE}"}).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd, n):
    """``n`` bytes from ``fd``, or None at end of file."""
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def parse(body):
    """The message in ``body``; WireError if it is too large or not a JSON object."""
    if body is None:
        raise WireError("truncated message")
    if len(body) > MAX_MESSAGE:
        raise WireError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE}")
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WireError(f"malformed message: {err}") from None
    except RecursionError:  # the C parser's own guard against deep nesting ('[' * 200000)
        raise WireError("malformed message: nested too deeply") from None
    if type(message) is not dict:
        raise WireError("a message must be a JSON object")
    return message


def recv(fd):
    header = read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > MAX_MESSAGE:
        raise WireError(f"message of {size} bytes exceeds {MAX_MESSAGE}")
    return parse(read_exact(fd, size))


def _describe(err):
    return f"{type(err).__name__}: {err}"[:2000]


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def serve(req, rep):
    """Execute the program, then answer calls of its entry point until the request pipe closes."""
    job = recv(req)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(job["program"], "program.py", "exec"), scope)  # noqa: S102 - running it is the point
    except BaseException as err:  # noqa: BLE001 - SystemExit included: the program did not load
        _flush()
        send(rep, {"error": _describe(err)})
        return 1
    _flush()
    send(rep, {"ok": True})
    entry = job.get("entry_point")
    while True:
        message = recv(req)
        if message is None:
            return 0
        try:
            fn = scope[entry]
            reply = {"value": encode(fn(*decode(message["args"])))}
        except BaseException as err:  # noqa: BLE001 - any failure of the candidate is a failed call
            reply = {"error": _describe(err)}
        _flush()
        send(rep, reply)


PRELOAD = (  # imported before dropping root in the ``uid`` fallback, where root's Python tree is unreadable
    "abc", "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses", "datetime",
    "_strptime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "io", "itertools", "math",
    "numbers", "operator", "random", "re", "statistics", "string", "struct", "textwrap", "time", "traceback",
    "typing", "unicodedata", "warnings",
)


def _deny(*args, **kwargs):
    raise OSError(13, "network access is disabled in the mtad sandbox")


def fallback_hardening(drop_uid):
    """Only where there are no namespaces: no ``socket`` API (``_socket`` stays reachable: weak, so the row
    says which isolation ran) and, as root, preload common modules then drop to ``drop_uid``."""
    import socket

    for name in ("socket", "SocketType", "create_connection", "create_server", "getaddrinfo", "gethostbyname",
                 "gethostbyname_ex", "gethostbyaddr", "socketpair", "fromfd"):
        setattr(socket, name, _deny)
    if drop_uid is not None:
        for name in PRELOAD:
            __import__(name)
        import ctypes
        import signal

        prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getppid()
        os.setgroups([])
        os.setresgid(drop_uid, drop_uid, drop_uid)
        os.setresuid(drop_uid, drop_uid, drop_uid)
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG again: changing the uid cleared the supervisor's
        if os.getppid() != parent:  # the supervisor died meanwhile
            os._exit(1)


if __name__ == "__main__":
    if "--fallback" in sys.argv:
        args = sys.argv[sys.argv.index("--fallback") + 1:]
        fallback_hardening(int(args[0]) if args else None)
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2])))

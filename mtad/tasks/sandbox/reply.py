"""The supervisor's reading of the candidate's replies (standard library only; imported by ``worker.py``).

A reply is one ``serve.py`` message on the candidate's reply pipe: a 4-byte length, then UTF-8 JSON. Nothing
the candidate sends can stall or crash the supervisor here: a length over ``MAX_MESSAGE`` bytes is refused
before the body is read, JSON deeper than the parser allows is a malformed message, the pipe is read in
20 ms waits between which the supervisor watches the deadline and the memory cap, and a return value is
decoded against the deadline, refusing values deeper than ``MAX_DEPTH`` and sets or dicts that flood one
hash (``serve.decode``). Every error of reading or decoding is a failed call: the supervisor's ``fail``.
"""
import os
import select
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve as wire  # noqa: E402 - a sibling script, not a package import


class CandidateError(Exception):
    """The jailed function raised (``message`` is its error, as text): like an exception of the function in
    the official harness, a test may catch it."""


class Replies:
    """The replies arriving on the pipe ``fd``. ``watch()`` checks the deadline and the memory cap between
    reads; ``fail(status, message)`` raises the failed verdict (both the supervisor's ``Jail``'s)."""

    def __init__(self, fd, watch, fail):
        self.fd, self.watch, self.fail = fd, watch, fail
        self.buf = b""

    def next(self):
        """The next reply (a dict): whatever the candidate sends, the outcome is a reply or ``fail``."""
        while True:
            if len(self.buf) >= 4:
                size = int.from_bytes(self.buf[:4], "big")
                if size > wire.MAX_MESSAGE:
                    self.fail("failed", f"oversized reply ({size} bytes > {wire.MAX_MESSAGE})")
                if len(self.buf) >= 4 + size:
                    body, self.buf = self.buf[4:4 + size], self.buf[4 + size:]
                    try:
                        return wire.parse(body)
                    except Exception as err:  # noqa: BLE001 - whatever the candidate sent, it failed
                        self.fail("failed", f"bad reply: {type(err).__name__}: {err}")
            self.watch()
            if select.select([self.fd], [], [], 0.02)[0]:
                chunk = os.read(self.fd, 1 << 20)
                if not chunk:
                    self.fail("failed", "the candidate exited")
                self.buf += chunk

    def value(self, reply, deadline, timeout_s):
        """The return value in a call's ``reply``, decoded until ``deadline`` (``time.monotonic()``; past it,
        a ``timeout`` over ``timeout_s``); CandidateError if the function raised, else ``fail``."""
        if "value" not in reply:
            raise CandidateError(f"candidate raised {brief(reply.get('error'))}")
        try:
            return wire.decode(reply["value"], deadline=deadline)
        except wire.Overtime:
            self.fail("timeout", f"over the {timeout_s} s limit (decoding the reply)")
        except Exception as err:  # noqa: BLE001 - a malformed or hostile value is a failed call
            self.fail("failed", f"bad return value: {type(err).__name__}: {err}")


def brief(x):
    """``str(x)``, at most 300 characters, or ``<type>`` where even that fails."""
    try:
        return str(x)[:300]
    except Exception:  # noqa: BLE001 - str() of a hostile value (too deep, too large an int)
        return f"<{type(x).__name__}>"

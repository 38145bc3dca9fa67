"""The in-process runner of entry points (tests/inprocess.py) reports what a child process would: exit status,
stdout, stderr, a traceback for an uncaught exception; and puts the test process back as it was."""
from __future__ import annotations

import logging
import os
import signal

import pytest
from inprocess import run_module, run_script

SCRIPT = """import logging, os, signal, sys
print("out", os.getcwd(), os.environ.get("INPROCESS_PROBE"), sys.argv[1:])
print("err", file=sys.stderr)
logging.getLogger().addHandler(logging.StreamHandler(sys.stdout))
signal.signal(signal.SIGTERM, lambda *a: None)
how = sys.argv[1]
if how == "raise":
    raise RuntimeError("boom")
if how == "message":
    sys.exit("a message")
sys.exit(int(how))
"""


@pytest.mark.parametrize("how, code", [("0", 0), ("3", 3), ("raise", 1), ("message", 1)])
def test_exit_status_output_and_a_clean_process_after(tmp_path, how, code):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    before = (os.getcwd(), os.environ.get("INPROCESS_PROBE"), logging.getLogger().handlers[:],
              signal.getsignal(signal.SIGTERM))
    out = run_script(script, how, cwd=work, env={"INPROCESS_PROBE": "set"})
    assert out.returncode == code, out
    assert out.stdout.startswith(f"out {work} set ['{how}']") and out.stderr.startswith("err")
    assert ("Traceback" in out.stderr and "RuntimeError: boom" in out.stderr) == (how == "raise")
    assert ("a message" in out.stderr) == (how == "message")
    after = (os.getcwd(), os.environ.get("INPROCESS_PROBE"), logging.getLogger().handlers[:],
             signal.getsignal(signal.SIGTERM))
    assert after == before


def test_a_module_as_python_m_runs_it():
    """``python -m mtad`` with an unknown option: the entry point's own one-line refusal, exit 2."""
    out = run_module("mtad", "decoder=nosuch")
    assert out.returncode == 2 and out.stderr.startswith("mtad: error: unknown decoder 'nosuch'"), out.stderr

"""``python -m <module> args...`` inside the test process: the same entry point, without a child interpreter.

:func:`run_module` runs the module as ``__main__`` (``runpy``, as ``python -m`` does: Hydra sees the same
calling file, job name and config path), with ``sys.argv``, the working directory and extra environment
variables set for the call, and gives back a :class:`subprocess.CompletedProcess`: the exit status
(``SystemExit`` as the interpreter would map it; an uncaught exception is status 1 with its traceback on
stderr), stdout and stderr. What such a run changes in the process is put back afterwards: the working
directory, the environment, ``sys.argv``, the SIGINT/SIGTERM handlers, the logging configuration Hydra sets
up (its file handlers closed), Hydra's global state and torch's thread count.

What needs a real process stays a subprocess in the tests: a signal sent from outside, two runs at once, a
mount namespace, the interpreter's import path from another directory, and one end-to-end run per entry point.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path


def _logging_state() -> tuple:
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]


def _restore_logging(state: list) -> None:
    known = {id(lg) for lg, *_ in state}
    kept = {id(h) for _, handlers, *_ in state for h in handlers}
    every = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                     if isinstance(lg, logging.Logger)]
    for lg in every:  # handlers the run added: closed (Hydra's log file) and removed
        for h in lg.handlers[:]:
            if id(h) not in kept:
                lg.removeHandler(h)
                with contextlib.suppress(Exception):
                    h.close()
        if id(lg) not in known:
            lg.setLevel(logging.NOTSET)
    for lg, handlers, level, propagate, disabled in state:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled


def run_module(module: str, *args: str, cwd: str | Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m module *args`` in this process (see the module docstring); ``env`` adds or replaces
    variables for the call only."""
    return _run(module, None, args, cwd, env)


def run_script(path: str | Path, *args: str, cwd: str | Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python path *args`` in this process, like :func:`run_module`."""
    return _run(str(path), str(path), args, cwd, env)


def _run(module: str, path: str | None, args, cwd, env) -> subprocess.CompletedProcess:
    import torch
    from hydra.core.global_hydra import GlobalHydra

    argv = [module, *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    saved = (sys.argv[:], os.getcwd(), dict(os.environ), torch.get_num_threads(), _logging_state(),
             {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                sys.argv = argv
                with warnings.catch_warnings():  # the module may be imported already (by a test): runpy runs a
                    warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)  # fresh copy
                    if path is None:
                        runpy.run_module(module, run_name="__main__", alter_sys=True)
                    else:
                        runpy.run_path(path, run_name="__main__")
            except SystemExit as stop:
                if stop.code is None:
                    code = 0
                elif isinstance(stop.code, int):
                    code = stop.code
                else:  # sys.exit("message"): printed to stderr, status 1
                    print(stop.code, file=sys.stderr)
                    code = 1
            except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        argv_before, cwd_before, env_before, threads, logs, handlers = saved
        sys.argv = argv_before
        os.chdir(cwd_before)
        os.environ.clear()
        os.environ.update(env_before)
        torch.set_num_threads(threads)
        _restore_logging(logs)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        GlobalHydra.instance().clear()
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())

"""``python -m mtad model=<pair> decoder=<name> task=<task>`` (Hydra; ``-m`` for a sweep).

Bad input (``ValueError``, ``FileNotFoundError``, ``OSError``) ends a single run with one ``mtad: error:``
line and exit status 2; what the run created is removed unless it holds results (:mod:`mtad.harness.rundir`).
In a multirun a bad job does not stop the sweep: its error goes to the log, to stderr and to
``error.json`` in its job directory, the remaining jobs run, and the whole multirun exits with status 2
at the end, listing the failed jobs. (Only the local launcher's jobs share this process; with a remote
launcher, e.g. SLURM, each job's ``error.json`` is the record.) Ctrl-C ends the run with one line and exit
status 130, no traceback; an interrupted run appends no row (appends are atomic). SIGTERM (``scancel``,
``kill``) is handled the same way, with exit status 143: a rerun finishes the runs that were missing.

Before Hydra starts, the command line's ``group=option`` and ``key=value`` overrides are checked against
``conf/`` (:func:`mtad.harness.clicheck.check_overrides`): a misspelt option or key is one line, exit 2.
"""
from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mtad.harness.clicheck import Terminated, check_overrides, cli_overrides, terminate_like_interrupt
from mtad.harness.config import register_configs
from mtad.harness.progress import summary_table
from mtad.harness.rundir import disk_full, remove_failed_run, stop_multirun
from mtad.harness.runner import ResultsNotAppended, run

register_configs()
log = logging.getLogger("mtad")
BAD_INPUT = (ValueError, FileNotFoundError, OSError)
_FAILED_JOBS: list[str] = []  # one line per failed multirun job of this process


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from tqdm.contrib.logging import logging_redirect_tqdm

    terminate_like_interrupt()  # also in a launcher's job process (a SLURM job: scancel sends SIGTERM)
    try:
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            row = run(cfg)
        if row is not None:
            print(summary_table(row))
    except KeyboardInterrupt as err:
        if not _is_multirun():
            _drop_failed_run_dir()
        _interrupted(err)
    except Exception as err:
        multirun = _is_multirun()
        if not isinstance(err, BAD_INPUT) and not multirun:
            raise
        log.error("%s: %s", type(err).__name__, err)
        if multirun and disk_full(err):  # every later job would fail the same way, Hydra's writes first
            _record_job_error(err)
            stop_multirun(_job_num(), cfg, str(err))
        print(f"mtad: error: {err}", file=sys.stderr)
        if multirun:
            _record_job_error(err)
            if not isinstance(err, BAD_INPUT):
                raise  # Hydra marks the job failed, runs the others, and raises it at the end
            return
        if not isinstance(err, ResultsNotAppended):  # that one has written its row elsewhere: keep all
            _drop_failed_run_dir()
        sys.exit(2)


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


def _job_num() -> int:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().job.num


def _record_job_error(err: BaseException) -> None:
    """``error.json`` in the job's directory, and a line for the summary at the end of the multirun."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    record = {"error": type(err).__name__, "message": str(err), "job_num": hc.job.num,
              "overrides": overrides, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    where = out / "error.json"
    try:
        out.mkdir(parents=True, exist_ok=True)
        where.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        where = f"nowhere ({exc.strerror or exc})"
    _FAILED_JOBS.append(f"job {hc.job.num} ({' '.join(overrides)}): {type(err).__name__}: {err} [{where}]")


def _drop_failed_run_dir() -> None:
    """Remove what this failed run created, and only that (:func:`mtad.harness.rundir.remove_failed_run`)."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    removed = remove_failed_run(hc.runtime.output_dir, hc.output_subdir, f"{hc.job.name}.log")
    if removed:
        log.debug("removed what the failed run created: %s", ", ".join(map(str, removed)))


def _interrupted(err: BaseException | None = None) -> None:
    how, status = ("terminated (SIGTERM)", 143) if isinstance(err, Terminated) else ("interrupted", 130)
    print(f"mtad: {how}: no row was written for the run in progress (rows already appended stay)", file=sys.stderr)
    sys.exit(status)


def _check_command_line(argv: list[str]) -> None:
    """One ``mtad: error:`` line and exit 2 for an override naming no option or key of ``conf/``."""
    overrides = cli_overrides(argv)
    if overrides is None or any(a in ("-h", "--help", "--hydra-help") for a in argv):
        return
    try:
        check_overrides(overrides)
    except ValueError as err:
        print(f"mtad: error: {err}", file=sys.stderr)
        sys.exit(2)


def cli() -> None:
    """``main`` plus the multirun's exit status: 2 when any job failed on bad input."""
    terminate_like_interrupt()
    try:
        _check_command_line(sys.argv[1:])
        main()
    except KeyboardInterrupt as err:  # outside a job (Hydra composing, launching)
        _interrupted(err)
    if _FAILED_JOBS:
        print(f"mtad: error: {len(_FAILED_JOBS)} job(s) of the multirun failed (the others ran):",
              file=sys.stderr)
        for line in _FAILED_JOBS:
            print(f"mtad: error:   {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()

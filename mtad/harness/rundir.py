"""Where a run writes: checks before any work, and removing only what a failed run created.

- :func:`check_writable` / :func:`check_results_file`: before any model is loaded, the run directory and
  the results file (and its ``.lock``) must be creatable and writable; otherwise a :class:`NotWritable`
  (an ``OSError``) with one line naming the path and the fix. The checks leave nothing behind: a folder
  is probed with a temporary file that is removed at once, and no folder or lock file is created.
- :class:`RunDirGuard`: a Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``). ``on_run_start``
  runs before Hydra creates the run directory: it checks every setting (:func:`mtad.harness.config.check_settings`:
  ranges, finiteness, ``name`` a plain file name) and the output paths (exit 2 with one line if they fail,
  nothing written) and records what exists there (:class:`Snapshot`). When the run then fails on bad
  input, :func:`remove_failed_run` removes only what this run created, and only when the run wrote no
  results: a run directory that existed before (``hydra.run.dir=.``, an existing folder, the results
  directory) keeps everything it held and loses only Hydra's files (``.hydra/``, the job log) that were
  not there before; a fresh run directory holding only Hydra's files is removed with the empty parent
  folders this run created. Without a snapshot (the callback not configured) nothing is removed.
  ``on_job_end`` in a multirun: before the next job, the sweep folder and the results file must still be
  writable (a disk that filled during the job); otherwise the multirun ends in one line (:func:`stop_multirun`),
  as it does when a job's own write finds the disk full (``python -m mtad``, :func:`disk_full`).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from mtad._util.io import real_path
from mtad.harness.config import check_settings, experiment_name

log = logging.getLogger(__name__)


PROBE_BYTES = 64 << 10  # what the write check writes (and removes): more than Hydra writes before a run


class NotWritable(OSError):
    """A run's output path cannot be created or written (the message names the path and the fix)."""


# ------------------------------------------------------------------------------------------- checks
def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_writable(folder: str | Path, what: str, key: str) -> None:
    """``folder`` exists as a writable folder, or can be created (its nearest existing ancestor is a
    writable folder). ``what`` names it in the message, ``key`` is the setting that moves it."""
    target = Path(folder).absolute()
    probe = _nearest_existing(target)
    if not probe.is_dir():
        raise NotWritable(f"{what} {target} cannot be created: {probe} is a file, not a folder; "
                          f"remove or rename {probe}, or set {key} to another folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".mtad-probe-")
        try:
            os.write(fd, bytes(PROBE_BYTES))  # a full disk takes an empty file but not Hydra's config files
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as err:
        raise NotWritable(f"{what} {target} cannot be written: writing a file in {probe} fails "
                          f"({err.strerror or err}); free space there or set {key} to a writable folder") from None


def check_results_file(path: str | Path) -> None:
    """The results file and its ``.lock`` can be written: the folder as in :func:`check_writable`, and
    each of the two, where it exists, is a regular file that opens for appending (unchanged). A symlink is
    checked where it points (the store writes through it, :mod:`mtad.harness.store`)."""
    path = real_path(Path(path).absolute())
    check_writable(path.parent, "results folder", "results_dir")
    for f in (path, path.with_name(path.name + ".lock")):
        if not os.path.lexists(f):
            continue
        if not f.is_file():
            raise NotWritable(f"results file {f} is not a regular file; remove it or set results_dir "
                              "(or name) elsewhere")
        try:
            open(f, "ab").close()
        except OSError as err:
            raise NotWritable(f"results file {f} cannot be written ({err.strerror or err}); fix its "
                              "permissions or set results_dir to a writable folder") from None


# ------------------------------------------------------------------------------------------- snapshot
@dataclass(frozen=True)
class Snapshot:
    """What existed at a run directory before Hydra created it."""

    out: Path  # absolute run directory
    existed: bool
    entries: frozenset  # top-level names in ``out`` (when it existed)
    hydra_entries: frozenset  # names inside ``out/<output_subdir>`` (when it existed)
    created_parents: tuple  # ancestors that did not exist, nearest first


_SNAPSHOTS: dict[str, Snapshot] = {}


def snapshot(out: str | Path, output_subdir: Optional[str] = ".hydra") -> Snapshot:
    out = Path(out).absolute()
    existed = out.is_dir()
    entries = frozenset(os.listdir(out)) if existed else frozenset()
    sub = out / output_subdir if output_subdir else None
    hydra_entries = frozenset(os.listdir(sub)) if existed and sub is not None and sub.is_dir() else frozenset()
    parents, p = [], out.parent
    while not os.path.lexists(p) and p != p.parent:
        parents.append(p)
        p = p.parent
    snap = Snapshot(out, existed, entries, hydra_entries, tuple(parents))
    _SNAPSHOTS[str(out)] = snap
    return snap


def remove_failed_run(out: str | Path, output_subdir: Optional[str], log_name: Optional[str]) -> list[Path]:
    """Remove what this (failed) run created at ``out``: see the module docstring. Returns what went."""
    out = Path(out).absolute()
    snap = _SNAPSHOTS.get(str(out))
    if snap is None or not out.is_dir():
        return []
    ours = {n for n in (output_subdir, log_name) if n}
    new = set(os.listdir(out)) - snap.entries
    if new - ours:  # the run wrote something of its own (samples, a saved row, W&B files): keep it all
        return []
    removed: list[Path] = []
    if not snap.existed:
        shutil.rmtree(out, ignore_errors=True)
        removed.append(out)
        for parent in snap.created_parents:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only when empty
                removed.append(parent)
        return removed
    for name in sorted(new):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
        removed.append(out / name)
    sub = out / output_subdir if output_subdir else None
    if output_subdir and output_subdir in snap.entries and sub.is_dir():
        for name in sorted(set(os.listdir(sub)) - snap.hydra_entries):
            (sub / name).unlink()
            removed.append(sub / name)
    return removed


# ------------------------------------------------------------------------------------------- callback
def _select(config: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(config, key, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - e.g. ${hydra:...} before Hydra sets its config: no snapshot
        return None


def _results_file(config: DictConfig) -> Optional[Path]:
    results_dir = _select(config, "results_dir")
    name = experiment_name({"name": _select(config, "name"), "experiment": _select(config, "experiment")})
    return Path(str(results_dir)) / f"{name}.jsonl" if results_dir is not None else None


def _fail(err: Exception) -> None:
    print(f"mtad: error: {err}", file=sys.stderr)
    sys.exit(2)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(err: BaseException | None) -> bool:
    """``err``, or an error it was raised from, is a full disk or an exhausted quota."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in DISK_FULL:
            return True
        err = err.__cause__ or err.__context__
    return False


def stop_multirun(job: Any, config: DictConfig, why: str) -> None:
    """End a multirun after job number ``job``, in one ``mtad: error:`` line and exit status 2: ``why``, that the
    rows already appended stay (in the results file of ``config``), and how to finish (a rerun skips the configs
    that have rows). Hydra's own writes for a next job would otherwise fail with its traceback, and every later
    job would fail the same way. ``SystemExit`` passes through Hydra's job runner, which catches only errors."""
    results = _results_file(config)
    where = f" in {results}" if results is not None else ""
    print(f"mtad: error: the multirun stops after job {job}: {why}; the rows already appended stay{where}: free "
          "space (or fix the folder), then rerun the same command to run the rest (configs with a row are skipped)",
          file=sys.stderr)
    sys.exit(2)


def _is_multirun(config: DictConfig) -> bool:
    return str(_select(config, "hydra.mode")).endswith("MULTIRUN")


def _job_count(config: DictConfig) -> Optional[int]:
    """The number of jobs of a basic-sweeper multirun, as the sweeper expands them (None for another sweeper)."""
    if not str(_select(config, "hydra.sweeper._target_")).endswith("BasicSweeper"):
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # hydra: heavy, only a multirun needs it
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = _select(config, "hydra.sweeper.params") or {}
    overrides = [*(f"{k}={v}" for k, v in params.items()), *(_select(config, "hydra.overrides.task") or [])]
    try:
        return len(BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)[0])
    except Exception:  # noqa: BLE001 - an override this parser reads differently: check after every job
        return None


class RunDirGuard(Callback):
    """Checks the output paths before Hydra creates anything, and snapshots a single run's directory. In a
    multirun, after each job that another follows, checks that the sweep folder and the results file can still
    be written (a disk that filled during the job): if not, the multirun ends in one line (:func:`stop_multirun`)."""

    jobs: Optional[int] = None  # the multirun's job count (on_multirun_start)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_settings(config)
        except ValueError as err:
            _fail(err)
        out = _check_outputs(config, "hydra.run.dir", "run directory")
        if out is not None:
            snapshot(out, _select(config, "hydra.output_subdir"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_outputs(config, "hydra.sweep.dir", "sweep directory")
        self.jobs = _job_count(config)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        job = _select(config, "hydra.job.num")
        if not _is_multirun(config) or (self.jobs is not None and isinstance(job, int) and job + 1 >= self.jobs):
            return
        try:
            out = _select(config, "hydra.sweep.dir")
            if out is not None:
                check_writable(out, "sweep directory", "hydra.sweep.dir (or results_dir)")
            results = _results_file(config)
            if results is not None:
                check_results_file(results)
        except (NotWritable, ValueError) as err:
            stop_multirun(job, config, str(err))


def _check_outputs(config: DictConfig, key: str, what: str) -> Any:
    """Exit 2 with one line unless the folder at ``key`` and the results file (and its lock) can be written;
    returns the folder."""
    out = _select(config, key)
    try:
        if out is not None:
            check_writable(out, what, f"{key} (or results_dir)")
        results = _results_file(config)
        if results is not None:
            check_results_file(results)
    except (NotWritable, ValueError) as err:
        _fail(err)
    return out

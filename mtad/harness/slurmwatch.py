"""SLURM jobs that would wait for ever: a Hydra callback for ``hydra/launcher=slurm`` (``conf/config.yaml``).

Before the sweep is submitted, :func:`fit_problem` compares the launcher's request (``cpus_per_task``,
``mem_gb``, ``partition``) with what ``sinfo`` reports: a request beyond every node, or a partition that does not
exist, is logged as a warning with the overrides that fit. While the sweep runs, a thread polls ``squeue`` for
the sweep's jobs (``hydra.launcher.name``) and warns once per job and reason when one pends for a reason that
waiting will not clear (``PartitionConfig``, ``Resources`` beyond every node, ...). Without SLURM's commands, or
with another launcher, it does nothing.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("mtad.harness.slurmwatch")
POLL_S = 15.0
# pending reasons that no amount of waiting clears, with what to change
NEVER_CLEARS = {
    "PartitionConfig": "the request exceeds what the partition allows (CPUs, memory, GPUs or time)",
    "PartitionNodeLimit": "the request needs more nodes than the partition has",
    "PartitionTimeLimit": "hydra.launcher.timeout_min exceeds the partition's time limit",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "ReqNodeNotAvail": "a node the job needs is down, drained or reserved",
    "BadConstraints": "the constraints cannot be met by any node",
    "InvalidAccount": "the account is not valid: set +hydra.launcher.additional_parameters.account=...",
    "InvalidQOS": "the QOS is not valid for this account",
}


def _query(*cmd: str) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def node_limits(partition: str | None) -> tuple[int, int] | None:
    """(most CPUs, most memory in MB) of one node of ``partition`` (every partition when None)."""
    args = ["sinfo", "-h", "-o", "%c %m"] + (["-p", partition] if partition else [])
    text = _query(*args)
    if text is None:
        return None
    sizes = [(int(c), int(m)) for c, m in (line.split()[:2] for line in text.splitlines() if line.strip())
             if c.isdigit() and m.rstrip("+").isdigit()] if text else []
    return (max(c for c, _ in sizes), max(m for _, m in sizes)) if sizes else (0, 0)


def fit_problem(launcher: Any) -> str | None:
    """One line when the launcher's request cannot run on any node of its partition; None when it fits (or
    SLURM cannot be asked)."""
    partition = launcher.get("partition")
    limits = node_limits(partition)
    if limits is None:
        return None
    if limits == (0, 0):
        return (f"SLURM partition {partition!r} does not exist (sinfo lists none): set hydra.launcher.partition "
                f"to one of `sinfo -h -o %P`") if partition else None
    cpus, mem_mb = limits
    want_cpus, want_mb = int(launcher.get("cpus_per_task") or 1), int(float(launcher.get("mem_gb") or 0) * 1024)
    if want_cpus <= cpus and want_mb <= mem_mb:
        return None
    return (f"hydra.launcher.cpus_per_task={want_cpus} mem_gb={launcher.get('mem_gb')} exceed every node "
            f"{'of partition ' + repr(partition) + ' ' if partition else ''}(at most {cpus} CPUs, {mem_mb} MB): the "
            f"jobs would pend for ever; set hydra.launcher.cpus_per_task={min(want_cpus, cpus)} "
            f"hydra.launcher.mem_gb={max(1, mem_mb // 1024)}")


def pending_problems(name: str, seen: set, fit: str | None) -> list[str]:
    """Warnings for the sweep's jobs that pend for a reason waiting will not clear (each job and reason once)."""
    text = _query("squeue", "-h", "-n", name, "-t", "PENDING", "-o", "%i|%r")
    out = []
    for line in (text or "").splitlines():
        job, _, reason = line.strip().partition("|")
        why = NEVER_CLEARS.get(reason) or (fit if reason == "Resources" and fit else None)
        if why and (job, reason) not in seen:
            seen.add((job, reason))
            out.append(f"SLURM job {job} pends with reason {reason}, which waiting will not clear: {why}; "
                       f"scancel it (scancel -n {name}) and change the request")
    return out


class SlurmPendingWatch(Callback):
    """Warns about SLURM jobs of a sweep that would pend for ever (see the module's docstring)."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict:  # a launcher pickles its callbacks into each job: no thread, no lock
        return {"poll_s": self.poll_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        launcher = config.hydra.launcher
        if "SlurmLauncher" not in str(launcher.get("_target_", "")) or os.environ.get("SLURM_JOB_ID"):
            return
        fit = fit_problem(launcher)
        if fit:
            log.warning(fit)
        name = str(launcher.get("name") or config.hydra.job.name)
        self._thread = threading.Thread(target=self._watch, args=(name, fit), daemon=True, name="slurm-watch")
        self._thread.start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._stop.set()

    def _watch(self, name: str, fit: str | None) -> None:
        seen: set = set()
        while not self._stop.wait(self.poll_s):
            for line in pending_problems(name, seen, fit):
                log.warning(line)

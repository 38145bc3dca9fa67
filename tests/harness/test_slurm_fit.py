"""SLURM as documented, without a cluster: the launcher's warnings about jobs that would pend for ever (fake
``sinfo``/``squeue`` on PATH), and ``experiments/slurm_check.sh``'s own checks (its daemons alive, free ports,
the node's real CPU count)."""
from __future__ import annotations

import logging
import os
import re
import subprocess

import pytest
from omegaconf import OmegaConf

from mtad._util.paths import REPO_ROOT
from mtad.harness import slurmwatch

SCRIPT = REPO_ROOT / "experiments" / "slurm_check.sh"


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """``sinfo`` reporting one 2-CPU, 3000 MB node in partition ``check``; ``squeue`` printing $SQUEUE_OUT."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text('#!/bin/sh\ncase "$*" in *"-p nosuch"*) exit 0 ;; esac\necho "2 3000"\n')
    (bin_dir / "squeue").write_text('#!/bin/sh\nprintf "%b" "$SQUEUE_OUT"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return monkeypatch


def _launcher(**kw):
    base = {"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
            "cpus_per_task": 8, "mem_gb": 64, "partition": None, "name": "sweep"}
    return OmegaConf.create({**base, **kw})


def test_the_default_request_is_reported_beyond_a_small_node(fake_slurm):
    line = slurmwatch.fit_problem(_launcher())
    assert "cpus_per_task=8 mem_gb=64 exceed every node (at most 2 CPUs, 3000 MB)" in line
    assert "set hydra.launcher.cpus_per_task=2 hydra.launcher.mem_gb=2" in line
    assert slurmwatch.fit_problem(_launcher(cpus_per_task=1, mem_gb=1)) is None  # control: a request that fits
    assert "does not exist" in slurmwatch.fit_problem(_launcher(partition="nosuch", cpus_per_task=1, mem_gb=1))


def test_jobs_pending_for_a_reason_that_never_clears_are_warned_about_once(fake_slurm):
    fake_slurm.setenv("SQUEUE_OUT", "41_0|PartitionConfig\\n41_1|Priority\\n41_2|Resources\\n")
    seen = set()
    first = slurmwatch.pending_problems("sweep", seen, fit="beyond every node")
    assert [re.search(r"job (\S+) pends with reason (\w+)", x).groups() for x in first] == [
        ("41_0", "PartitionConfig"), ("41_2", "Resources")]  # Priority clears by waiting: no warning
    assert slurmwatch.pending_problems("sweep", seen, fit="beyond every node") == []  # once per job and reason
    assert slurmwatch.pending_problems("sweep", set(), fit=None)[1:] == []  # Resources alone: a busy cluster


def test_the_callback_warns_at_the_start_of_a_slurm_sweep(fake_slurm, caplog):
    cfg = OmegaConf.create({"hydra": {"launcher": _launcher(), "job": {"name": "x"}}})
    watch = slurmwatch.SlurmPendingWatch(poll_s=60)
    with caplog.at_level(logging.WARNING, logger="mtad.harness.slurmwatch"):
        watch.on_multirun_start(cfg)
        watch.on_multirun_end(cfg)
    assert any("exceed every node" in r.getMessage() for r in caplog.records)
    local = OmegaConf.create({"hydra": {"launcher": {"_target_": "BasicLauncher"}, "job": {"name": "x"}}})
    slurmwatch.SlurmPendingWatch().on_multirun_start(local)  # another launcher: nothing happens


def _functions() -> str:
    """The helper functions of slurm_check.sh (say, fail, free_ports, alive, ...), to run alone."""
    text = SCRIPT.read_text()
    say = re.search(r"^say\(\).*$", text, re.M).group()
    fail = re.search(r"^fail\(\).*$", text, re.M).group()
    helpers = text[text.index("free_ports() {"):text.index("start_local() {")]
    return f"PY=python3\n{say}\n{fail}\n{helpers}"


def _bash(snippet: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail\n{_functions()}\n{snippet}"], capture_output=True,
                          text=True, timeout=60)


def test_the_check_fails_when_a_daemon_it_started_died(tmp_path):
    (tmp_path / "dead.pid").write_text("999999\n")
    (tmp_path / "slurmctld.log").write_text("error: Error binding slurm stream socket: Address already in use\n")
    out = _bash(f"alive {tmp_path}/dead.pid slurmctld {tmp_path}/slurmctld.log 1")
    assert out.returncode == 1 and "FAILED: slurmctld started by this check is not running" in out.stdout
    assert "Address already in use" in out.stdout
    live = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "live.pid").write_text(f"{live.pid}\n")
        assert _bash(f"alive {tmp_path}/live.pid slurmd /dev/null 1").returncode == 0  # control: a live daemon
    finally:
        live.kill()


def test_the_local_cluster_gets_free_ports_and_the_real_cpu_count():
    ports = _bash("free_ports 3").stdout.split()
    assert len(set(ports)) == 3 and all(p.isdigit() for p in ports)
    text = SCRIPT.read_text()
    assert re.search(r"^\s*SlurmctldPort=\$ctld_port$", text, re.M) and "DbdPort=$dbd_port" in text
    cpu_line = re.search(r"^\s*cpus=\$\(([^)]*)\)", text, re.M).group(1)
    cpus = subprocess.run(["bash", "-c", f"export OMP_NUM_THREADS=1; {cpu_line}"], capture_output=True, text=True)
    assert int(cpus.stdout) == len(os.sched_getaffinity(0))  # not 1: GNU nproc reads OMP_NUM_THREADS

"""Energy of the timed decode window (ALGORITHMS.md, METRICS, "Energy").

GPU: NVML's cumulative counter ``nvmlDeviceGetTotalEnergyConsumption`` (mJ) read before and after the window
on every GPU the models use. Without NVML: Intel/AMD RAPL package counters under ``/sys/class/powercap``
when readable. Otherwise no number, with the reason kept. No command-line GPU tool is ever polled.

Usage (the runner)::

    meter = EnergyMeter(gpu_indices=[0])   # CUDA indices the parameters live on; None/[] = CPU run
    cuda_sync(devices); meter.start()
    ...decode...
    cuda_sync(devices); reading = meter.stop()

Caveats, stated rather than hidden:
- The NVML counter covers the whole GPU, so other processes on the same GPU are counted too.
- RAPL measures CPU packages (and, on some parts, DRAM is not included); it is a different quantity from
  GPU energy, which is why ``source`` is stored with every number. A RAPL counter that wraps more than once
  inside one window cannot be detected.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

log = logging.getLogger(__name__)

DEFAULT_POWERCAP_ROOT = Path("/sys/class/powercap")  # a kernel interface, not a data path
_PACKAGE_DOMAIN = re.compile(r"^intel-rapl:\d+$")  # top-level domains; "intel-rapl:0:0" are subdomains


@dataclass(frozen=True)
class EnergyReading:
    """Energy of one window. ``joules`` is None when nothing could measure it; ``reason`` says why
    (or, when RAPL stood in for NVML, why NVML was not used)."""

    joules: Optional[float]
    source: Optional[str]  # "nvml" | "rapl" | None
    reason: Optional[str] = None
    per_device: dict = field(default_factory=dict)  # "nvml:<index>" / "rapl:<domain>" -> joules

    def to_dict(self) -> dict:
        return {"joules": self.joules, "source": self.source, "reason": self.reason,
                "per_device": dict(self.per_device)}


def cuda_sync(devices: Iterable[Any] | None) -> None:
    """``torch.cuda.synchronize`` on every CUDA device in ``devices`` (torch.device, "cuda:1" or an int
    CUDA index); a no-op when none is CUDA, so CPU runs pay nothing."""
    cuda = sorted({_cuda_index(d) for d in (devices or [])} - {None})
    if not cuda:
        return
    import torch

    for index in cuda:
        torch.cuda.synchronize(index)


def _cuda_index(device: Any) -> Optional[int]:
    if isinstance(device, int):
        return device
    import torch

    d = torch.device(device)
    if d.type != "cuda":
        return None
    return d.index if d.index is not None else torch.cuda.current_device()


class EnergyMeter:
    """Reads NVML (or RAPL) counters at ``start()`` and ``stop()``.

    gpu_indices:   CUDA device indices the models live on (as torch numbers them). They are mapped
                   through ``CUDA_VISIBLE_DEVICES`` (integers or ``GPU-``/``MIG-`` UUIDs) to NVML devices.
                   None or [] means a CPU run: NVML is skipped and RAPL is tried.
    nvml:          the ``pynvml`` module, or a stand-in with the same functions (tests).
    powercap_root: the powercap directory (tests point it at a fake tree).
    env:           environment mapping used for ``CUDA_VISIBLE_DEVICES`` (default ``os.environ``).
    """

    def __init__(self, gpu_indices: list[int] | None = None, *, nvml: Any = None,
                 powercap_root: str | Path | None = None, env: Mapping[str, str] | None = None):
        self.gpu_indices = list(gpu_indices or [])
        self._nvml = nvml
        self.powercap_root = Path(powercap_root) if powercap_root is not None else DEFAULT_POWERCAP_ROOT
        self._env = os.environ if env is None else env
        self._source: Optional[str] = None
        self._reason: Optional[str] = None
        self._start: dict[str, float] = {}
        self._handles: dict[str, Any] = {}
        self._rapl_paths: dict[str, Path] = {}
        self._rapl_max: dict[str, float] = {}
        self._started = False

    # ----------------------------------------------------------------- window
    def start(self) -> None:
        """Pick a source and read its counters. Never raises for a missing/unsupported counter."""
        self._source, self._start, notes = None, {}, []
        if self.gpu_indices:
            try:
                self._start = self._nvml_open()
                self._source = "nvml"
            except Exception as exc:  # NVML absent, device unsupported, bad mapping: recorded, not raised
                notes.append(f"no NVML: {_describe(exc)}")
                self._nvml_close()
        else:
            notes.append("no CUDA device in use")
        if self._source is None:
            try:
                self._start = self._rapl_read(open_domains=True)
                self._source = "rapl"
            except Exception as exc:
                notes.append(f"RAPL not readable: {_describe(exc)}")
        self._reason = "; ".join(notes) or None
        self._started = True
        if self._reason and self._reason != getattr(self, "_told", None):  # say it once, not per prompt
            log.info("energy source %s (%s)", self._source, self._reason)
            self._told = self._reason

    def stop(self) -> EnergyReading:
        """Read the counters again; the difference is the window's energy in joules."""
        if not self._started:
            raise RuntimeError("EnergyMeter.stop() called before start(); call start() before the window")
        self._started = False
        if self._source is None:
            return EnergyReading(None, None, self._reason)
        try:
            end = self._nvml_read() if self._source == "nvml" else self._rapl_read(open_domains=False)
            per_device = {k: self._delta(k, self._start[k], end[k]) for k in self._start}
        except Exception as exc:
            reason = "; ".join(filter(None, [self._reason, f"{self._source} read failed at stop: {_describe(exc)}"]))
            return EnergyReading(None, None, reason)
        finally:
            if self._source == "nvml":
                self._nvml_close()
        return EnergyReading(sum(per_device.values()), self._source, self._reason, per_device)

    def _delta(self, key: str, before: float, after: float) -> float:
        """Joules between two counter values; RAPL counters wrap at ``max_energy_range_uj``."""
        if self._source == "nvml":
            return (after - before) / 1e3  # mJ -> J
        if after < before:
            after += self._rapl_max[key]
        return (after - before) / 1e6  # uJ -> J

    # ------------------------------------------------------------------- NVML
    def _nvml_module(self) -> Any:
        if self._nvml is None:
            import pynvml  # nvidia-ml-py

            self._nvml = pynvml
        return self._nvml

    def _nvml_open(self) -> dict[str, float]:
        nvml = self._nvml_module()
        nvml.nvmlInit()
        self._handles = {f"nvml:{i}": self._nvml_handle(nvml, i) for i in sorted(set(self.gpu_indices))}
        return self._nvml_read()

    def _nvml_read(self) -> dict[str, float]:
        nvml = self._nvml_module()
        out = {}
        for key, handle in self._handles.items():
            try:
                out[key] = float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            except Exception as exc:
                raise _CounterError(f"{_describe(exc)} on {key}") from exc
        return out

    def _nvml_handle(self, nvml: Any, cuda_index: int) -> Any:
        """CUDA index -> NVML handle through CUDA_VISIBLE_DEVICES. NVML numbers GPUs in PCI bus order;
        CUDA does too when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (and on nodes of identical GPUs)."""
        visible = self._env.get("CUDA_VISIBLE_DEVICES")
        if visible is None or visible.strip() == "":
            return nvml.nvmlDeviceGetHandleByIndex(cuda_index)
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if cuda_index >= len(entries):
            raise ValueError(f"CUDA device {cuda_index} is not in CUDA_VISIBLE_DEVICES={visible!r}")
        entry = entries[cuda_index]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)

    def _nvml_close(self) -> None:
        self._handles = {}
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # not initialised, or already shut down
                pass

    # ------------------------------------------------------------------- RAPL
    def _rapl_domains(self) -> list[Path]:
        root = self.powercap_root
        if not root.is_dir():
            raise FileNotFoundError(f"{root} absent")
        domains = []
        for d in sorted(root.iterdir()):
            if not _PACKAGE_DOMAIN.match(d.name):
                continue
            name_file = d / "name"
            name = name_file.read_text().strip() if name_file.exists() else "package"
            if name.startswith("package"):  # skip psys/platform domains that overlap the packages
                domains.append(d)
        if not domains:
            raise FileNotFoundError(f"no intel-rapl package domain under {root}")
        return domains

    def _rapl_read(self, open_domains: bool) -> dict[str, float]:
        if open_domains:
            self._rapl_paths = {f"rapl:{d.name}": d for d in self._rapl_domains()}
            self._rapl_max = {k: float((d / "max_energy_range_uj").read_text())
                              for k, d in self._rapl_paths.items()}
        return {k: float((d / "energy_uj").read_text()) for k, d in self._rapl_paths.items()}


class _CounterError(RuntimeError):
    """A counter read failed; the message already names the error and the device."""


def _describe(exc: BaseException) -> str:
    """``NVMLError_LibraryNotFound``, ``PermissionError: ...``: the class name is the useful part."""
    name = type(exc).__name__
    text = str(exc)
    if isinstance(exc, _CounterError):
        return text
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.strerror or text}: {exc.filename}"
    if name.startswith("NVMLError") or not text:
        return name
    if isinstance(exc, FileNotFoundError):
        return text
    return f"{name}: {text}"


def combine_readings(readings: Iterable[EnergyReading]) -> EnergyReading:
    """Sum per-prompt windows into one reading; None (with the first reason) if any window has none or
    the windows used different sources."""
    readings = list(readings)
    if not readings:
        return EnergyReading(None, None, "no energy windows")
    missing = [r for r in readings if r.joules is None]
    if missing:
        return EnergyReading(None, None, missing[0].reason or "energy not measured")
    sources = {r.source for r in readings}
    if len(sources) != 1:
        return EnergyReading(None, None, f"windows measured by different sources: {sorted(sources)}")
    per_device: dict[str, float] = {}
    for r in readings:
        for k, v in r.per_device.items():
            per_device[k] = per_device.get(k, 0.0) + v
    return EnergyReading(sum(r.joules for r in readings), sources.pop(), readings[0].reason, per_device)

"""EnergyMeter against a fake NVML module and a fake powercap tree; cuda_sync without CUDA."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtad.measure.energy import EnergyMeter, EnergyReading, combine_readings, cuda_sync


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's naming
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class FakeNVML:
    """Cumulative mJ counters per NVML index; each read advances to the next listed value."""

    def __init__(self, counters: dict, unsupported: tuple = (), missing_library: bool = False,
                 uuids: dict | None = None):
        self.counters = {k: list(v) for k, v in counters.items()}
        self.unsupported, self.missing_library = set(unsupported), missing_library
        self.uuids = uuids or {}
        self.reads: list[int] = []
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        if self.missing_library:
            raise NVMLError_LibraryNotFound()
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        if i not in self.counters:
            raise NVMLError(f"invalid index {i}")
        return ("handle", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return ("handle", self.uuids[uuid])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        i = handle[1]
        if i in self.unsupported:
            raise NVMLError_NotSupported()
        self.reads.append(i)
        return self.counters[i].pop(0)


def make_rapl(root: Path, domains: dict) -> Path:
    """domains: dir name -> (name, energy_uj, max_energy_range_uj)."""
    for d, (name, energy, max_range) in domains.items():
        p = root / d
        p.mkdir(parents=True)
        (p / "name").write_text(name + "\n")
        (p / "energy_uj").write_text(f"{energy}\n")
        (p / "max_energy_range_uj").write_text(f"{max_range}\n")
    return root


def set_energy(root: Path, domain: str, value: int) -> None:
    (root / domain / "energy_uj").write_text(f"{value}\n")


def test_multiple_gpus_are_summed(tmp_path):
    nvml = FakeNVML({0: [1_000, 3_500], 1: [2_000, 2_500]})
    meter = EnergyMeter([1, 0], nvml=nvml, powercap_root=tmp_path / "none", env={})
    meter.start()
    r = meter.stop()
    assert r.source == "nvml" and r.reason is None
    assert r.per_device == {"nvml:0": pytest.approx(2.5), "nvml:1": pytest.approx(0.5)}
    assert r.joules == pytest.approx(3.0)
    assert nvml.shutdowns == 1


def test_cuda_visible_devices_maps_to_nvml_index(tmp_path):
    nvml = FakeNVML({2: [0, 100], 3: [0, 7_000]}, uuids={"GPU-abc": 2})
    meter = EnergyMeter([1], nvml=nvml, powercap_root=tmp_path, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    meter.start()
    assert meter.stop().joules == pytest.approx(7.0)  # CUDA 1 is NVML 3, not NVML 1
    assert nvml.reads == [3, 3]
    by_uuid = EnergyMeter([0], nvml=nvml, powercap_root=tmp_path, env={"CUDA_VISIBLE_DEVICES": "GPU-abc"})
    by_uuid.start()
    assert by_uuid.stop().joules == pytest.approx(0.1)


def test_unsupported_device_gives_reason(tmp_path):
    nvml = FakeNVML({0: [0, 1], 1: [0, 1]}, unsupported=(1,))
    meter = EnergyMeter([0, 1], nvml=nvml, powercap_root=tmp_path / "powercap", env={})
    meter.start()
    r = meter.stop()
    assert r.joules is None and r.source is None
    assert "NVMLError_NotSupported on nvml:1" in r.reason
    assert "RAPL not readable" in r.reason


def test_nothing_available_is_none_with_reason(tmp_path):
    nvml = FakeNVML({}, missing_library=True)
    meter = EnergyMeter([0], nvml=nvml, powercap_root=tmp_path / "powercap", env={})
    meter.start()
    r = meter.stop()
    assert r == EnergyReading(None, None, f"no NVML: NVMLError_LibraryNotFound; RAPL not readable: "
                                          f"{tmp_path / 'powercap'} absent", {})


def test_real_pynvml_without_gpu_records_library_not_found(tmp_path):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    except pynvml.NVMLError:
        pass
    meter = EnergyMeter([0], powercap_root=tmp_path / "powercap")
    meter.start()
    r = meter.stop()
    assert r.joules is None and "NVMLError" in r.reason


RAPL = {
    "intel-rapl:0": ("package-0", 1_000_000, 10_000_000),
    "intel-rapl:0:0": ("core", 5, 10_000_000),  # subdomain: inside package-0, must not be added
    "intel-rapl:1": ("package-1", 9_000_000, 10_000_000),
    "intel-rapl:2": ("psys", 0, 10_000_000),  # platform domain overlapping the packages
}


def test_rapl_packages_only_and_counter_wrap(tmp_path):
    root = make_rapl(tmp_path / "powercap", RAPL)
    meter = EnergyMeter(None, powercap_root=root)
    meter.start()
    set_energy(root, "intel-rapl:0", 3_000_000)  # +2 J
    set_energy(root, "intel-rapl:1", 500_000)  # wrapped: 10e6 - 9e6 + 0.5e6 = 1.5 J
    set_energy(root, "intel-rapl:0:0", 9_999_999)
    set_energy(root, "intel-rapl:2", 9_999_999)
    r = meter.stop()
    assert r.source == "rapl" and r.reason == "no CUDA device in use"
    assert r.per_device == {"rapl:intel-rapl:0": pytest.approx(2.0), "rapl:intel-rapl:1": pytest.approx(1.5)}
    assert r.joules == pytest.approx(3.5)


def test_rapl_stands_in_for_missing_nvml_and_says_so(tmp_path):
    root = make_rapl(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 0, 10**9)})
    meter = EnergyMeter([0], nvml=FakeNVML({}, missing_library=True), powercap_root=root)
    meter.start()
    set_energy(root, "intel-rapl:0", 250_000)
    r = meter.stop()
    assert (r.joules, r.source) == (pytest.approx(0.25), "rapl")
    assert r.reason == "no NVML: NVMLError_LibraryNotFound"


def test_rapl_unreadable_counter(tmp_path):
    root = make_rapl(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 0, 10**9)})
    (root / "intel-rapl:0" / "energy_uj").unlink()
    meter = EnergyMeter(None, powercap_root=root)
    meter.start()
    r = meter.stop()
    assert r.joules is None and "RAPL not readable" in r.reason and "energy_uj" in r.reason


def test_counter_lost_during_window(tmp_path):
    root = make_rapl(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 0, 10**9)})
    meter = EnergyMeter(None, powercap_root=root)
    meter.start()
    (root / "intel-rapl:0" / "energy_uj").unlink()
    r = meter.stop()
    assert r.joules is None and "rapl read failed at stop" in r.reason


def test_stop_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="before start"):
        EnergyMeter(None).stop()


def test_combine_readings():
    a = EnergyReading(1.0, "nvml", None, {"nvml:0": 1.0})
    b = EnergyReading(2.0, "nvml", None, {"nvml:0": 2.0})
    assert combine_readings([a, b]) == EnergyReading(3.0, "nvml", None, {"nvml:0": 3.0})
    assert combine_readings([a, EnergyReading(None, None, "no NVML")]).reason == "no NVML"
    assert combine_readings([a, EnergyReading(1.0, "rapl")]).joules is None
    assert combine_readings([]).joules is None


def test_cuda_sync_is_a_noop_on_cpu_and_syncs_each_cuda_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: calls.append(i))
    cuda_sync(["cpu", torch.device("cpu")])
    cuda_sync(None)
    assert calls == []
    cuda_sync([torch.device("cuda:1"), "cuda:1", 0, "cpu"])
    assert calls == [0, 1]


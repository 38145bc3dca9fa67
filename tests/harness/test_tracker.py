"""Tracking: mode auto-selection, an offline W&B run into tmp_path, W&B failures swallowed."""
from __future__ import annotations

import json
import logging
import time

import pytest

from mtad.harness.rows import ResultRow
from mtad.harness.store import append_row
from mtad.harness.tracking import NoneTracker, TrackingConfig, WandbTracker, make_tracker, resolve_mode


def make_row(i: int) -> dict:
    return ResultRow(run_id=f"r{i}", config_hash=f"h{i}", experiment="t", timestamp="2025-01-01T00:00:00+00:00",
                     git_sha=None, git_dirty=None, versions={}, device_name="cpu", num_threads=1, seed=i,
                     decoder={"name": "greedy"}, model={"name": "tiny"}, task={"name": "t"},
                     metrics={"ms_per_token": 1.5 * i}, n_prompts=1, n_skipped=0).to_dict()


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No key, no network, every W&B file under tmp_path."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "NETRC", "WANDB_BASE_URL", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    return home


def test_mode_auto_selection(wandb_env, monkeypatch):
    assert resolve_mode(None) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode(None) == "online"
    assert resolve_mode("offline") == "offline"  # explicit wins
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = wandb_env / ".netrc"
    netrc.write_text("machine example.com login a password b\n")
    netrc.chmod(0o600)
    assert resolve_mode(None) == "offline"  # an entry for another host is no W&B key
    netrc.write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert resolve_mode(None) == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode(None) == "disabled"


def test_config_validation():
    assert isinstance(make_tracker(None, "run"), NoneTracker)
    assert isinstance(make_tracker({"backend": "none"}, "run"), NoneTracker)
    with pytest.raises(ValueError, match="tracking.backend='mlflow'"):
        TrackingConfig(backend="mlflow")
    with pytest.raises(ValueError, match="tracking.mode='sometimes'"):
        TrackingConfig(mode="sometimes")
    with pytest.raises(ValueError, match=r"unknown tracking key\(s\) \['projekt'\]"):
        TrackingConfig.from_any({"projekt": "x"})


def test_none_tracker_does_nothing(tmp_path):
    t = make_tracker(TrackingConfig(), tmp_path)
    t.start({"a": 1}, "name")
    t.log_samples([{"i": 0}])
    t.finish(make_row(0), None)
    assert list(tmp_path.iterdir()) == []


def test_offline_run_writes_into_run_dir(wandb_env, tmp_path):
    run_dir = tmp_path / "run"
    result_file = tmp_path / "results" / "t.jsonl"
    row = make_row(3)
    append_row(result_file, row)
    t = make_tracker({"backend": "wandb", "mode": "offline", "tags": ["unit"]}, run_dir)
    assert isinstance(t, WandbTracker) and t.mode == "offline"
    t.start({"decoder": {"name": "greedy"}}, name="unit-test")
    assert t.run is not None and not t.broken
    t.log_samples([{"prompt_id": 0, "tokens": [1, 2], "text": "hi"}, {"prompt_id": 1, "text": None}])
    t.finish(row, result_file)
    assert t.run is None and not t.broken
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    log_file = next(runs[0].glob("*.wandb"))  # offline: summary + artifact live in this log
    deadline = time.monotonic() + 15  # wandb-core may still be flushing it after finish() returns
    while b"results-t" not in log_file.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    log_bytes = log_file.read_bytes()
    assert b"metrics.ms_per_token" in log_bytes and b"results-t" in log_bytes
    table = json.loads(next(runs[0].glob("files/media/table/samples_*.table.json")).read_text())
    assert table["columns"] == ["prompt_id", "tokens", "text"]
    assert table["data"] == [[0, "[1, 2]", "hi"], [1, None, None]]


def test_failing_wandb_init_is_swallowed(wandb_env, tmp_path, monkeypatch, caplog):
    import wandb

    def boom(*a, **k):
        raise RuntimeError("no route to host")

    monkeypatch.setattr(wandb, "init", boom)
    t = make_tracker({"backend": "wandb", "mode": "online"}, tmp_path)
    with caplog.at_level(logging.WARNING, logger="mtad.harness.tracking"):
        t.start({}, "x")
        t.log_samples([{"a": 1}])
        t.finish(make_row(0), None)
    assert t.broken and "W&B start failed" in caplog.text and "no route to host" in caplog.text


class FakeRun:
    def __init__(self, fail_on=None):
        self.summary, self.logged, self.artifacts, self.exit_codes = {}, [], [], []
        self.fail_on = fail_on

    def log(self, d):
        if self.fail_on == "log":
            raise ConnectionError("upload failed")
        self.logged.append(d)

    def log_artifact(self, a):
        self.artifacts.append(a)

    def finish(self, exit_code=None):
        self.exit_codes.append(exit_code)


def test_finish_puts_flat_row_in_summary_and_logs_artifact(tmp_path):
    result_file = tmp_path / "t.jsonl"
    row = make_row(2)
    append_row(result_file, row)
    t = WandbTracker(TrackingConfig(backend="wandb", mode="offline"), tmp_path)
    t.run = run = FakeRun()
    t.finish(row, result_file)
    assert run.summary["metrics.ms_per_token"] == 3.0 and run.summary["decoder.name"] == "greedy"
    assert "metrics" not in run.summary
    assert run.artifacts[0].name == "results-t" and run.artifacts[0].type == "results"
    assert run.exit_codes == [0] and t.run is None


def test_failure_mid_run_is_swallowed_and_run_closed(tmp_path, caplog):
    t = WandbTracker(TrackingConfig(backend="wandb", mode="offline"), tmp_path)
    t.run = run = FakeRun(fail_on="log")
    with caplog.at_level(logging.WARNING, logger="mtad.harness.tracking"):
        t.log_samples([{"a": 1}])
    assert t.broken and run.exit_codes == [1] and "upload failed" in caplog.text
    t.finish(make_row(0), None)  # a no-op now, and still no exception
    assert run.exit_codes == [1]


def test_is_a_hydra_structured_config():
    from omegaconf import OmegaConf

    node = OmegaConf.merge(OmegaConf.structured(TrackingConfig),
                           OmegaConf.create({"backend": "wandb", "tags": ["a"], "mode": "disabled"}))
    t = make_tracker(node, "run")
    assert isinstance(t, WandbTracker) and t.cfg.tags == ["a"] and t.mode == "disabled"
    with pytest.raises(Exception, match="projekt"):
        OmegaConf.merge(OmegaConf.structured(TrackingConfig), {"projekt": "x"})

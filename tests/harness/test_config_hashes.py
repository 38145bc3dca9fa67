"""Published rows stay "already done": every row of ``results/published/*.jsonl`` has its ``config_hash``
among the hashes of its profile's grid as today's configs compose it.

The grid is what ``python -m mtad.harness.sweep --profile <p> --list`` prints; each job is composed and hashed
the way :func:`mtad.harness.runner.run` hashes it (resolved config + the draft's weight files + the task's data
files). The rows were measured by ``make reproduce-table PROFILE=<p>`` with no ``name=`` (rendering with
``name=<file>`` only picks the file) and ``results_dir`` is not hashed, so the grid is expanded without either.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from published_drafts import DRAFT

from mtad._util.paths import REPO_ROOT
from mtad.harness import sweep
from mtad.harness.rows import config_hash
from mtad.harness.runner import weights_fingerprint
from mtad.harness.store import load_results
from mtad.models.load import ModelConfig
from mtad.tasks.base import TaskConfig, get_task

PUBLISHED = sorted((REPO_ROOT / "results" / "published").glob("*.jsonl"))
PROFILE_OF = {"cpu_table": "cpu", "cpu_table_feature": "cpu_feature", "cpu_table_bf16": "cpu_bf16",
              "cpu_table_bf16_feature": "cpu_bf16_feature", "cpu_qa": "cpu_qa",
              "cpu_qa_rescored": "cpu_qa"}

# the draft each table was measured with: tests/published_drafts.py
# PROFILE=cpu_qa: its own grid (test_published_qa_rows_hash_into_the_qa_grid); the second: the first's rows, re-scored
QA = {"cpu_qa-2026-12-06", "cpu_qa_rescored-2026-12-07"}
# settings a published file ran under that its profile's grid does not have today (none at present)
MEASURED_AS: dict[str, list[str]] = {}
# rows no config of today can give the hashes of (none at present)
OLDER_SCHEMA: set[str] = set()
# publications of a script's runs, not of a profile's grid: their jobs come from the script itself
SCRIPTED = {"regime_check-2026-12-06", "regime_check-run5-2026-12-06", "regime_decoders-2026-12-06",
            "regime_temperature-2026-12-06", "forecast_check-2026-12-07"}

needs_data = pytest.mark.usefixtures("real_data_dir")  # published rows hash the real data; skips on a fresh clone


def profile_jobs(profile: str, overrides: list[str]) -> list[list[str]]:
    """The runs of ``--profile <profile> --list <overrides>``, each a list of overrides."""
    return [list(job) for job in _profile_jobs(profile, tuple(overrides))]


@functools.lru_cache(maxsize=None)
def _profile_jobs(profile: str, overrides: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sweep.main(["--profile", profile, "--list", *overrides]) == 0
    return tuple(tuple(line.split()) for line in out.getvalue().splitlines())


def resolved(job: list[str]) -> dict:
    """The job's composed and resolved config (a copy: the files share their profiles' jobs, composed once)."""
    return json.loads(_resolved(tuple(job)))


@functools.lru_cache(maxsize=None)
def _resolved(job: tuple[str, ...]) -> str:
    return json.dumps(OmegaConf.to_container(sweep.compose_job(list(job)), resolve=True))


_DATA: dict = {}  # (data folder, task config) -> (data fingerprint, resolved source), shared by the tests


def run_hash(job: list[str], draft: list[str], data: dict, resolve_source: bool = True) -> str:
    """The runner's config hash of the job, with the draft's weight files pinned to ``draft``."""
    cfg = resolved(job)
    # the runner fingerprints local target and draft directories: the embedded pair has only a local draft
    assert set(weights_fingerprint(ModelConfig(**cfg["model"]))) == {"draft"}, job
    key = (os.environ.get("MTAD_DATA_DIR"), json.dumps(cfg["task"], sort_keys=True))
    if key not in _DATA:
        task = get_task(TaskConfig.from_any(cfg["task"]))
        _DATA[key] = task.data_fingerprint(), task.resolved_source()
    fingerprint, source = data[key] = _DATA[key]
    # the runner hashes task.source as the route it took (task.source=auto -> local here)
    task = {**cfg["task"], "source": source if resolve_source else cfg["task"]["source"]}
    # a draft-free proposer runs without the pair's draft: no draft weights in its hash
    weights = {} if cfg["decoder"].get("proposer") == "ngram" else {"draft": draft}
    return config_hash({**cfg, "task": task, "weights": weights, "data": fingerprint})


def profile_grid(stem: str) -> list[list[str]]:
    """The jobs of the profile the file was measured with, under the settings it ran with."""
    return profile_jobs(PROFILE_OF[stem.split("-")[0]], MEASURED_AS.get(stem, []))


def test_every_published_file_is_checked():
    stems = {p.stem for p in PUBLISHED}
    assert stems and stems == set(DRAFT) | OLDER_SCHEMA | SCRIPTED


@needs_data
@pytest.mark.parametrize("path", [p for p in PUBLISHED if p.stem not in OLDER_SCHEMA | QA | SCRIPTED],
                         ids=lambda p: p.stem)
def test_published_rows_hash_into_their_profiles_grid(path: Path):
    published = {r["config_hash"] for r in load_results(path)}
    jobs, data = profile_grid(path.stem), {}
    hashes = {run_hash(job, DRAFT[path.stem], data) for job in jobs}
    # the grid gained block and n-gram cells (2026-12-05), then MTAD with the n-gram proposer: tables measured
    # before hold six rows, the 2026-12-05 one ten, later ones all twelve; every measured row is still among the
    # grid's (a rerun skips
    # it) and the cells added after a table are new hashes
    assert len(hashes) == len(jobs) == 12 and published <= hashes
    zoo = {run_hash(j, DRAFT[path.stem], data) for j in jobs if {"decoder=block", "decoder=speculative_ngram"} & set(j)}
    later = {run_hash(j, DRAFT[path.stem], data) for j in jobs if "decoder=mtad_ngram" in j}
    assert len(zoo) == 4 and len(later) == 2
    assert (len(published), zoo <= published, later <= published) in ((6, False, False), (10, True, False),
                                                                      (12, True, True))
    assert (zoo <= published or not zoo & published) and (later <= published or not later & published)
    # negative controls: one setting changed, and that run is not done; task.source=auto hashed as written
    # (not as the route it took) would make every published row look undone
    assert run_hash([*jobs[0], "task.n_prompts=29"], DRAFT[path.stem], data) not in published
    assert resolved(jobs[0])["task"]["source"] == "auto"
    assert not published & {run_hash(job, DRAFT[path.stem], data, resolve_source=False) for job in jobs}


def test_older_schema_rows_lack_fields_of_todays_model_config():
    fields = set(ModelConfig.__dataclass_fields__)
    for stem in OLDER_SCHEMA:
        for line in (REPO_ROOT / "results" / "published" / f"{stem}.jsonl").read_text().splitlines():
            assert fields - set(json.loads(line)["model"]), stem


@needs_data
@pytest.mark.parametrize("path", [p for p in PUBLISHED if p.stem in QA], ids=lambda p: p.stem)
def test_published_qa_rows_hash_into_the_qa_grid(path: Path):
    """Every QA row is a job of PROFILE=cpu_qa, or that job at seed 1 (a second sampling seed measured
    before the grid was cut to one seed); every job of the grid has its row."""
    published = {r["config_hash"] for r in load_results(path)}
    jobs, data = profile_grid(path.stem), {}
    hashes = {run_hash(job, DRAFT[path.stem], data) for job in jobs}
    seed1 = {run_hash([*job, "seed=1"], DRAFT[path.stem], data) for job in jobs if "decoder=sampling" in job
             and not any(o.startswith("decoder.temperature") for o in job)}
    assert hashes <= published and published <= hashes | seed1 and len(published - hashes) <= 1
    # negative control: another prompt count is another config
    assert run_hash([*jobs[0], "task.n_prompts=10"], DRAFT[path.stem], data) not in published


def test_late_keys_hold_their_config_defaults():
    """The one list of keys added later (mtad/_util/late.py) names real keys with their classes' defaults, and a
    late key at its default leaves the hash as it was before the key existed (a changed default would not)."""
    from mtad._util.late import HASHED_LATE_KEYS, LATE_KEYS
    from mtad.decoding import DecoderConfig

    classes = {"decoder": DecoderConfig, "task": TaskConfig}
    for path, value in {**LATE_KEYS, **HASHED_LATE_KEYS}.items():
        group, key = path.split(".")
        assert getattr(classes[group], key) == value, path
    old = {"decoder": {"name": "mtad", "tau": 0.5}, "task": {"name": "gsm8k"}}
    new = {"decoder": {**old["decoder"], "proposer": "draft", "ngram_max": 2}, "task": {**old["task"], "batch_size": 1}}
    assert config_hash(new) == config_hash(old)
    assert config_hash({**new, "task": {**new["task"], "batch_size": 4}}) != config_hash(old)  # control


@pytest.mark.parametrize("profile", sorted(set(PROFILE_OF.values())))
def test_published_grids_set_only_keys_their_decoders_read(profile):
    """No job of a published grid is refused for a key its decoder does not read (a row records only what ran,
    ALGORITHMS.md "Keys each decoder reads"), so every published row can still be reproduced."""
    from mtad.decoding import DecoderConfig
    from mtad.decoding.core import check_keys

    jobs = profile_jobs(profile, [])
    assert jobs
    for job in jobs:
        check_keys(DecoderConfig.from_any(resolved(job)["decoder"]))


def script_jobs(stem: str) -> list[list[str]]:
    """The runs of a scripted publication as its script composes them (the regime check's per-draft overrides
    are kept in its check files; the temperature control's from its own ``jobs``)."""
    import importlib.util

    def script(name):
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "experiments" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    if stem.startswith("regime_decoders"):
        dec = script("regime_decoders")
        from mtad.study.regimes.inputs import drafts

        return [job for d in drafts() if d["oracle_mix"] is None for task in dec.TASKS
                for job in dec.jobs(d, task, 10, 48, Path("results/regimes/decoders"))]
    if stem.startswith("forecast_check"):
        fc = script("forecast_check")
        return [job for name in fc.DRAFTS for job in fc.jobs(name, Path("results/regimes/forecast"))]
    if stem.startswith("regime_check"):  # the drafts this publication holds rows of (a draft may be re-checked)
        check = script("regime_check")
        rows = load_results(REPO_ROOT / "results" / "published" / f"{stem}.jsonl")
        held = {(r["model"]["name"], r["model"].get("draft")) for r in rows}
        jobs = [[*dec, *json.loads(f.read_text())["overrides"]]
                for f in sorted((REPO_ROOT / "results" / "regimes" / "check").glob("check-*.json"))
                for dec in check.DECODERS.values()]
        return [j for j in jobs if (resolved(j)["model"]["name"], resolved(j)["model"].get("draft")) in held]
    temp = script("regime_temperature")
    return temp.jobs(30, 48, [0.6, 0.7, 0.8, 0.9], Path("results/regimes/temperature"))


def script_hash(job: list[str], data: dict) -> str:
    """The runner's config hash of a job with the committed drafts' weights (the runner's own fingerprint)."""
    from dataclasses import replace

    from mtad.decoding import DecoderConfig
    from mtad.decoding.propose import PROPOSERS
    from mtad.models.load import resolve_alias

    cfg = OmegaConf.to_container(sweep.compose_job(job), resolve=True)
    mcfg, why = resolve_alias(ModelConfig(**cfg["model"]))
    assert not why, job  # a pair named by itself, not an alias
    if not PROPOSERS[DecoderConfig.from_any(cfg["decoder"]).proposer].model:
        mcfg = replace(mcfg, draft=None, draft_head="full")
    key = json.dumps(cfg["task"], sort_keys=True)
    if key not in data:
        task = get_task(TaskConfig.from_any(cfg["task"]))
        data[key] = task.data_fingerprint(), task.resolved_source()
    fingerprint, source = data[key]
    return config_hash({**cfg, "task": {**cfg["task"], "source": source}, "weights": weights_fingerprint(mcfg),
                        "data": fingerprint})


@needs_data
@pytest.mark.parametrize("stem", [pytest.param(s, marks=pytest.mark.slow) if s.startswith("regime_decoders") else s
                                  for s in sorted(SCRIPTED)])  # the decoders' ten drafts are loaded to be hashed: slow
def test_scripted_publications_hash_as_their_scripts_compose_them(stem):
    """Every row of a scripted publication has the hash of one of its script's jobs, and every job has a row.
    Control: a job with one setting changed hashes to none of them."""
    rows = load_results(REPO_ROOT / "results" / "published" / f"{stem}.jsonl")
    # a draft exported from git history at run time (experiments/regime_lineage.sh) is hashed where it is present
    absent = {d for r in rows if (d := r["model"].get("draft")) and d.startswith(".cache/") and
              not (REPO_ROOT / d).is_dir()}
    published = {r["config_hash"] for r in rows if r["model"].get("draft") not in absent}
    data: dict = {}
    jobs = [j for j in script_jobs(stem) if not any(a.removeprefix("model.draft=") in absent for a in j)]
    assert {script_hash(job, data) for job in jobs} == published
    assert script_hash([*jobs[0], "decoder.max_new_tokens=47"], data) not in published

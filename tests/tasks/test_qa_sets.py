"""The QA sets built from GeoNames (``cities``, ``currencies``): the fixtures load through the task, answers
are judged by the first asserted answer, and the shipped files carry their provenance and licence per row.
Each check has a control that the same check rejects."""
from __future__ import annotations

import json

import pytest

from mtad._util.paths import REPO_ROOT
from mtad.tasks import TaskConfig, get_task
from mtad.tasks.sources import SHIPPED_DIR

REPO_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "data"


def samples(name):
    return {s.id: s for s in get_task(TaskConfig(name=name)).load()}


@pytest.mark.parametrize("name, sid, answer, want", [
    ("cities", "c3", "The city of Lyon is located in France.", 1.0),
    ("cities", "c3", "Lyon is in Belgium, not France.", 0.0),  # control: a rejected answer
    ("cities", "c4", "Houston is a city in the United States of America.", 1.0),  # an alias
    ("cities", "c4", "Houston is a city in Texas.", 0.0),  # control: a state is not the country
    ("cities", "c2", "Mexico City is the capital of Mexico.", 1.0),  # the city's name holds the country's
    ("cities", "c1", "The city of Springfield Test is located in Springfield Test.", 0.0),  # control: the subject
    ("currencies", "JPN", "The currency of Japan is the Japanese yen (JPY).", 1.0),
    ("currencies", "JPN", "The currency of Japan is the won, not the yen.", 0.0),  # control
    ("currencies", "NOR", "The Norwegian kroner.", 1.0),  # the row's alias
    ("currencies", "TST", "The currency of Testland is the Testland dollar.", 0.0),  # control
])
def test_answers_are_judged_by_their_first_assertion(name, sid, answer, want):
    task = get_task(TaskConfig(name=name))
    assert task.score(samples(name)[sid], answer)["asserted"] == want


def test_the_fixture_rows_are_read_not_the_shipped_sets():
    assert set(samples("cities")) == {"c1", "c2", "c3", "c4"}
    assert samples("currencies")["TST"].reference == ["Testo", "TSO"]


@pytest.mark.parametrize("name, n", [("cities", 5822), ("currencies", 193)])
def test_the_shipped_rows_name_their_source_and_licence(name, n):
    rows = [json.loads(x) for x in (SHIPPED_DIR / name / f"{name}.jsonl").read_text().splitlines()]
    assert len(rows) == n and len({r["id"] for r in rows}) == n
    assert all(r["licence"].startswith("CC BY 4.0") and f"GeoNames {r['id']}" in r["source"] or
               name == "currencies" and "GeoNames" in r["source"] for r in rows)
    assert (SHIPPED_DIR / name / "SOURCE.md").read_text().count("CC BY 4.0") >= 1
    bad = [{**rows[0], "licence": ""}]  # control: a row without its licence fails the same check
    assert not all(r["licence"].startswith("CC BY 4.0") for r in bad)


def test_no_city_name_has_two_countries():
    rows = [json.loads(x) for x in (SHIPPED_DIR / "cities" / "cities.jsonl").read_text().splitlines()]
    seen: dict[str, str] = {}
    assert all(seen.setdefault(r["city"], r["country"]) == r["country"] for r in rows)
    assert min(r["population"] for r in rows) >= 100_000
    twice = [*rows[:2], {**rows[0], "country": "Elsewhere"}]  # control: a repeated name with another country
    seen = {}
    assert not all(seen.setdefault(r["city"], r["country"]) == r["country"] for r in twice)


@pytest.mark.parametrize("name, n, sha", [
    ("cities", 5822, "b72784f1d6d531962303be3ea46e727dc42df1d8e1b6ea1dfb9ccf3861d0139c"),
    ("currencies", 193, "b844511c09549e0644d1f6c04ab80b7e309ca80ad643526e6aeac63d58a6ca13")])
def test_the_shipped_sets_run_without_a_data_folder(monkeypatch, tmp_path, name, n, sha):
    monkeypatch.setenv("MTAD_DATA_DIR", str(tmp_path / "nowhere"))
    task = get_task(TaskConfig(name=name, n_prompts=0))
    assert len(task.samples()) == n and task.skipped == 0 and task.resolved_source() == "local"
    assert task.data_fingerprint() == {f"{name}.jsonl": sha}
    assert sha in (SHIPPED_DIR / name / "SOURCE.md").read_text()
    monkeypatch.setenv("MTAD_DATA_DIR", str(REPO_FIXTURES))  # control: the fixture is another file
    assert get_task(TaskConfig(name=name)).data_fingerprint() != {f"{name}.jsonl": sha}

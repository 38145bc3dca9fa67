"""Short-answer QA tasks (capitals, elements, nq_open): normalisation, asserted/exact scoring, loading, prompts
(the asserted answer's rules, judged by a reader: test_qa_asserted.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from realdata import REAL_DATA

from mtad.tasks import TaskConfig, get_task
from mtad.tasks.qa import answer_sentence, first_phrase, first_sentence, has_words, normalize

DATA = REAL_DATA
needs_data = pytest.mark.usefixtures("real_data_dir")  # the real data sets; skips on a fresh clone


@pytest.fixture(scope="module")
def tok():
    from mtad.models.tiny import tiny_tokenizer

    return tiny_tokenizer()


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return path


def by_id(name: str, path: Path, **kw) -> tuple:
    t = get_task(TaskConfig(name=name, data_file=str(path), n_prompts=0, **kw))
    return t, {s.id: s for s in t.samples()}


@pytest.fixture
def capitals(tmp_path):
    return by_id("capitals", write_jsonl(tmp_path / "c.jsonl", [
        {"id": "FRA", "country": "France", "capital": "Paris", "aliases": []},
        {"id": "BRA", "country": "Brazil", "capital": "Brasília", "aliases": []},
        {"id": "MCO", "country": "Monaco", "capital": "Monaco", "aliases": []},
        {"id": "USA", "country": "United States", "capital": "Washington D.C.", "aliases": []},
        {"id": "GRD", "country": "Grenada", "capital": "St. George's", "aliases": []},
        {"id": "XYZ", "country": "Testland", "capital": "Alpha", "aliases": ["Beta"]},
    ]))


def score(t, sample, text) -> tuple[float, float]:
    s = t.score(sample, text)
    assert set(s) == {"asserted", "contains", "exact"} and s["exact"] <= s["asserted"]
    return s["asserted"], s["exact"]


# ---- normalisation ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("Brasília", "brasilia"), ("Chișinău", "chisinau"), ("São Tomé", "sao tome"), ("Tórshavn Ø", "torshavn o"),
    ("Washington, D.C.", "washington dc"), ("The Hague", "hague"), ("Port-au-Prince", "port au prince"),
    ("  an  Apple\u00a0a day!", "apple day"), ("Saint John's", "saint johns"), ("**Paris**", "paris"),
    ("Paris(France)", "paris france"), ("1,000 km/h", "1000 km h"),
])
def test_normalize(text, expected):
    assert normalize(text) == expected


def test_normalize_keeps_case_for_symbols_and_separates_near_misses():
    assert normalize("Co.", keep_case=True) == "Co" and normalize("The CO", keep_case=True) == "CO"
    assert normalize("Brasilia") == normalize("Brasília")
    assert normalize("Bogota") != normalize("Brasília")  # negative control
    assert not has_words(normalize("Parisian"), "paris") and has_words(normalize("in Paris"), "paris")
    assert not has_words("anything", "")


def test_first_sentence_and_phrase():
    assert first_sentence("Paris. Not Lyon.") == "Paris."
    assert first_sentence("  Paris\nLyon") == "Paris"
    assert first_sentence("St. George's is the capital. Next.") == "St. George's is the capital."
    assert first_sentence("Washington D.C. is the capital! Yes.") == "Washington D.C. is the capital!"
    assert first_sentence("It costs 3.5 dollars. Cheap.") == "It costs 3.5 dollars."
    assert first_sentence("Season 3. Then 4.") == "Season 3."
    assert first_sentence("J. R. R. Tolkien. Yes") == "J. R. R. Tolkien."
    assert first_phrase("Paris, of course.") == "Paris" and first_phrase("Paris (France)") == "Paris"
    assert first_phrase("1,000 people; many") == "1,000 people"
    assert first_phrase("The capital is Paris.") == "The capital is Paris."


# ---- scoring ------------------------------------------------------------------------------------------
def test_capitals_contains_and_exact(capitals):
    t, s = capitals
    fra = s["FRA"]
    assert score(t, fra, "Paris") == (1, 1)
    assert score(t, fra, "Answer: Paris, of course.") == (1, 1)
    assert score(t, fra, "The capital is Paris.") == (1, 0)
    assert score(t, fra, "The capital of France is PARIS.") == (1, 0)
    assert score(t, fra, "Parisian cafés are famous.") == (0, 0)  # a substring of the answer by accident
    assert score(t, fra, "Lyon. The capital is Paris.") == (0, 0)  # the reference only in sentence two
    assert score(t, fra, "Lyon") == (0, 0)
    assert score(t, fra, "") == (0, 0)


def test_capitals_accents_aliases_and_abbreviations(capitals):
    t, s = capitals
    assert score(t, s["BRA"], "Brasilia") == (1, 1) and score(t, s["BRA"], "Brasília.") == (1, 1)
    assert score(t, s["BRA"], "Bogotá") == (0, 0)
    assert score(t, s["USA"], "Washington, D.C.") == (1, 1) and score(t, s["USA"], "Washington DC") == (1, 1)
    assert score(t, s["USA"], "New York City.") == (0, 0)
    assert score(t, s["GRD"], "St. George's is the capital of Grenada.") == (1, 0)
    assert score(t, s["GRD"], "Saint George's") == (1, 1) and score(t, s["GRD"], "St. Lucia") == (0, 0)
    assert score(t, s["XYZ"], "Beta") == (1, 1) and score(t, s["XYZ"], "Gamma") == (0, 0)  # row aliases


def test_capitals_restating_the_question_does_not_count(capitals):
    t, s = capitals
    mco = s["MCO"]
    assert score(t, mco, "Monaco.") == (1, 1)
    assert score(t, mco, "The capital of Monaco is Monaco.") == (1, 0)
    assert score(t, mco, "Monaco's capital is Monaco.") == (1, 0)
    assert score(t, mco, "The capital of Monaco is Monte Carlo.") == (0, 0)
    assert score(t, mco, "Monaco's capital city is Monte Carlo.") == (0, 0)
    assert score(t, mco, "Monaco - capital city.") == (1, 1)  # exact, though the restatement is masked


@pytest.mark.parametrize("text,expected", [
    ("Sure! The capital of Bhutan is Thimphu.", "The capital of Bhutan is Thimphu."),
    ("Certainly. Thimphu.", "Thimphu."),
    ("Of course, Thimphu.", "Thimphu."),
    ("Sure thing! Okay. Thimphu", "Thimphu"),
    ("I'd be happy to help! Here is the answer: Thimphu.", "Thimphu."),
    ("Great question! Thimphu.", "Thimphu."),
    ("Sure!", "Sure!"),  # nothing but preamble: the first sentence stays
    ("Surely Thimphu.", "Surely Thimphu."),  # not an interjection
    ("Thimphu. Sure!", "Thimphu."),
])
def test_answer_sentence_skips_a_leading_preamble(text, expected):
    assert answer_sentence(text) == expected


def test_preamble_skipping_scores_the_answer_not_a_later_sentence(tmp_path):
    t, s = by_id("capitals", write_jsonl(tmp_path / "c.jsonl", [
        {"id": "BTN", "country": "Bhutan", "capital": "Thimphu", "aliases": []}]))
    btn = s["BTN"]
    assert score(t, btn, "Sure! The capital of Bhutan is Thimphu.") == (1, 0)
    assert score(t, btn, "Certainly. Thimphu.") == (1, 1)
    assert score(t, btn, "Of course, Thimphu.") == (1, 1)
    # control: the first answering sentence names a wrong city; the right one comes later and does not count
    assert score(t, btn, "Sure! The capital of Bhutan is Paro. Thimphu is the largest city.") == (0, 0)
    assert score(t, btn, "Of course, Paro. Or Thimphu.") == (0, 0)
    # control: the old rule (the first sentence, preamble included) scores the preamble answer 0
    assert not has_words(normalize(first_sentence("Sure! The capital of Bhutan is Thimphu.")), "thimphu")


def test_postprocess_is_the_first_sentence_and_idempotent(capitals):
    t, s = capitals
    for text in ("Answer: Paris. More text.", "\n The capital is Paris!\nLyon", "St. George's. Next",
                 "Sure! Of course, Paris. Lyon."):
        once = t.postprocess(s["FRA"], text)
        assert t.postprocess(s["FRA"], once) == once
        assert t.score(s["FRA"], once) == t.score(s["FRA"], text)
    assert t.postprocess(s["FRA"], "Answer: Paris. More text.") == "Paris."


def test_elements_symbols_are_case_sensitive(tmp_path):
    t, s = by_id("elements", write_jsonl(tmp_path / "e.jsonl", [
        {"id": 27, "element": "Cobalt", "symbol": "Co", "aliases": []},
        {"id": 8, "element": "Oxygen", "symbol": "O", "aliases": []}]))
    co = s["27"]
    assert score(t, co, "Co") == (1, 1) and score(t, co, "**Co**.") == (1, 1)
    assert score(t, co, "The chemical symbol of cobalt is Co.") == (1, 0)
    assert score(t, co, "CO") == (0, 0) and score(t, co, "co") == (0, 0)  # carbon monoxide, lower case
    assert score(t, co, "The symbol is CO.") == (0, 0)
    assert score(t, co, "Cobalt.") == (0, 0)  # the name, not the symbol
    assert score(t, s["8"], "O") == (1, 1) and score(t, s["8"], "Os") == (0, 0)
    assert t.aggregate([t.score(co, "Co"), t.score(co, "The symbol is Co."), t.score(co, "CO")]) == {
        "asserted": 2 / 3, "contains": 2 / 3, "exact": 1 / 3}


def test_nq_open_answer_lists(tmp_path):
    t, s = by_id("nq_open", write_jsonl(tmp_path / "dev.jsonl", [
        {"question": "when was the last time anyone was on the moon",
         "answer": ["14 December 1972 UTC", "December 1972"]},
        {"question": "the region between the black and caspian seas",
         "answer": ["The Caucasus Mountains", "Caucasus Mountains"]}]), split="dev")
    moon, region = s["dev-0"], s["dev-1"]
    assert moon.reference == ["14 December 1972 UTC", "December 1972"]
    assert score(t, moon, "December 1972.") == (1, 1) and score(t, moon, "14 December 1972 UTC") == (1, 1)
    assert score(t, moon, "It was in December 1972.") == (1, 0)
    assert score(t, moon, "1972") == (0, 0) and score(t, moon, "December 1969.") == (0, 0)
    assert score(t, moon, "In 1969. Then December 1972.") == (0, 0)
    assert score(t, region, "the caucasus mountains") == (1, 1) and score(t, region, "The Caucasus") == (0, 0)


# ---- loading ------------------------------------------------------------------------------------------
def test_malformed_rows_are_skipped_with_their_kind(tmp_path):
    t, s = by_id("capitals", write_jsonl(tmp_path / "c.jsonl", [
        {"id": "A", "country": "A", "capital": "B"}, {"id": "C", "country": "C"},
        {"id": "D", "country": "D", "capital": "E", "aliases": "F"}, "{not json",
        {"id": "A", "country": "X", "capital": "Y"}]))
    assert list(s) == ["A"] and s["A"].reference == ["B"] and t.skipped == 4
    assert t.skip_counts() == {"data row: missing field 'capital'": 1, "data row: bad list field 'aliases'": 1,
                               "data row: not valid JSON": 1, "data row: duplicate id": 1}
    t, s = by_id("nq_open", write_jsonl(tmp_path / "dev.jsonl", [
        {"question": "q1", "answer": ["a"]}, {"question": "q2", "answer": []}, {"question": "q3", "answer": "a"},
        {"question": "q4", "answer": ["a", ""]}]), split="dev")
    assert list(s) == ["dev-0"] and t.skip_counts() == {"data row: bad list field 'answer'": 3}


@needs_data
def test_real_data_loads_with_aliases():
    caps = get_task(TaskConfig(name="capitals", n_prompts=0))
    samples = {s.id: s for s in caps.samples()}
    assert len(samples) == 193 and caps.skipped == 0
    assert samples["USA"].reference == ["Washington D.C.", "Washington"]
    assert samples["BOL"].reference == ["Sucre", "La Paz"] and samples["FRA"].reference == ["Paris"]
    assert caps.score(samples["BRA"], "Brasilia") == {"asserted": 1.0, "contains": 1.0, "exact": 1.0}
    elements = get_task(TaskConfig(name="elements", n_prompts=0))
    symbols = {s.id: s.reference for s in elements.samples()}
    assert len(symbols) == 118 and symbols["27"] == ["Co"] and elements.skipped == 0
    nq = get_task(TaskConfig(name="nq_open", split="dev", n_prompts=0))
    assert len(nq.samples()) == 3610 and nq.skipped == 0 and nq.samples()[0].turns[0].endswith("moon?")
    assert len(get_task(TaskConfig(name="nq_open", split="efficientqa.dev.1.1", n_prompts=0)).samples()) == 1800


def test_missing_data_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="capitals/capitals.jsonl"):
        get_task(TaskConfig(name="capitals", data_dir=str(tmp_path))).samples()


# ---- prompts ------------------------------------------------------------------------------------------
def test_prompts_chat_and_base(capitals, tok, tmp_path):
    t, s = capitals
    chat = t.render(s["FRA"], tok, chat=True)
    assert "What is the capital of France? Answer with the name of the city only." in chat
    assert chat != t.render(s["BRA"], tok, chat=True)
    assert t.render(s["FRA"], tok, chat=False) == "Question: What is the capital of France?\nAnswer:"
    e, es = by_id("elements", write_jsonl(tmp_path / "e.jsonl", [{"id": 1, "element": "Hydrogen", "symbol": "H"}]))
    assert "What is the chemical symbol of Hydrogen? Answer with the symbol only" in e.render(es["1"], tok)
    assert e.encode(es["1"], tok).ids and not e.encode(es["1"], tok).skip_reason


# ---- hub route ----------------------------------------------------------------------------------------
def stub_hub(monkeypatch, rows: list) -> list:
    calls = []

    def fake_load_dataset(hub_id, *args, split=None):
        calls.append((hub_id, args, split))
        return rows

    import datasets

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    return calls


def test_nq_open_hub_route(monkeypatch):
    calls = stub_hub(monkeypatch, [{"question": "who wrote hamlet", "answer": ["Shakespeare"]}, {"question": "x"}])
    t = get_task(TaskConfig(name="nq_open", source="hub", hub_id="google-research-datasets/nq_open",
                            split="validation", n_prompts=0))
    samples = t.samples()
    assert calls == [("google-research-datasets/nq_open", (), "validation")]
    assert [s.id for s in samples] == ["validation-0"] and samples[0].reference == ["Shakespeare"]
    assert t.skipped == 1 and "hub:google-research-datasets/nq_open[validation]" in t.data_fingerprint()


def test_capitals_and_elements_hub_route_needs_an_id(monkeypatch):
    for name in ("capitals", "elements"):
        with pytest.raises(ValueError, match="task.source=hub needs task.hub_id"):
            TaskConfig(name=name, source="hub")
    calls = stub_hub(monkeypatch, [{"country": "France", "capital": "Paris"}])
    t = get_task(TaskConfig(name="capitals", source="hub", hub_id="someone/capitals", split="train", n_prompts=0))
    assert [s.reference for s in t.samples()] == [["Paris"]] and calls == [("someone/capitals", (), "train")]
    stub_hub(monkeypatch, [{"name": "Iron", "sym": "Fe"}])  # another schema: every row skipped, the error says so
    with pytest.raises(ValueError, match="missing field 'element'"):
        get_task(TaskConfig(name="elements", source="hub", hub_id="someone/elements", n_prompts=0)).samples()

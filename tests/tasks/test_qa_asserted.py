"""The QA score ``asserted``: the first answer a sentence asserts counts, not any mention (docs/TASKS.md,
"Short-answer QA"). Hand-written answers in the way SmolLM2-135M-Instruct phrases them, each with a careful
reader's judgement; the earlier any-mention rule (``contains``) is the negative control."""
from __future__ import annotations

import pytest

from mtad.tasks import TaskConfig, get_task
from mtad.tasks.base import Sample
from mtad.tasks.qa import CAPITAL_ALIASES, answer_slot, asserts, marked_words, numerals

TASKS = {name: get_task(TaskConfig(name=name)) for name in ("capitals", "elements", "nq_open")}


def capital(country: str, city: str) -> tuple[str, Sample]:
    refs = [city, *CAPITAL_ALIASES.get(city, ())]
    return "capitals", Sample(country, [f"What is the capital of {country}?"], refs,
                              {"country": country, "references": refs})


def element(name: str, symbol: str) -> tuple[str, Sample]:
    return "elements", Sample(name, [f"What is the chemical symbol of {name}?"], [symbol],
                              {"element": name, "references": [symbol]})


def nq(*refs: str) -> tuple[str, Sample]:
    return "nq_open", Sample("q", ["?"], list(refs), {"references": list(refs)})


# (rule, question, answer, a careful reader's judgement: 1 correct, 0 not)
JUDGED = [
    # negation: "X, not Y", "not Y but X", "it is not Y; it is X", "isn't Y"
    ("negation", capital("Belgium", "Brussels"), "The capital of Belgium is Amsterdam, not Brussels.", 0),
    ("negation", capital("Belgium", "Brussels"), "The capital of Belgium is Brussels, not Amsterdam.", 1),
    ("negation", capital("Sudan", "Khartoum"), "The capital of Sudan is Jubbel, not Khartoum.", 0),
    ("negation", capital("Panama", "Panama City"),
     "The capital of Panama is Cartagena, not Panama City, which is the capital of a country", 0),
    ("negation", capital("France", "Paris"), "Not Lyon, but Paris.", 1),
    ("negation", capital("France", "Lyon"), "Not Lyon, but Paris.", 0),
    ("negation", capital("Netherlands", "Amsterdam"),
     "The capital of the Netherlands is not Rotterdam but Amsterdam.", 1),
    ("negation", capital("Canada", "Ottawa"), "It is not Toronto; it is Ottawa.", 1),
    ("negation", capital("Canada", "Toronto"), "It is not Toronto; it is Ottawa.", 0),
    ("negation", capital("Australia", "Canberra"), "The capital of Australia isn't Sydney, it's Canberra.", 1),
    ("negation", capital("Australia", "Sydney"), "The capital of Australia isn't Sydney, it's Canberra.", 0),
    ("negation", element("Cobalt", "Co"), "The symbol for cobalt is CO, not Co.", 0),
    # lists of candidates: the first one counts
    ("list", capital("France", "Paris"), "Paris, Lyon or Marseille.", 1),
    ("list", capital("France", "Paris"), "Lyon, Paris or Marseille.", 0),
    ("list", capital("Switzerland", "Bern"), "It could be Zurich or Bern.", 0),
    ("list", capital("Switzerland", "Bern"), "The capital of Switzerland is Bern or Zurich.", 1),
    # preambles
    ("preamble", capital("Bhutan", "Thimphu"), "Sure! Here's the answer: Thimphu.", 1),
    ("preamble", capital("Bhutan", "Thimphu"), "Sure, here's the answer: Paro, not Thimphu.", 0),
    ("preamble", capital("Kenya", "Nairobi"), "Of course! The capital of Kenya is Nairobi.", 1),
    ("preamble", capital("Kenya", "Nairobi"), "Certainly! The answer is: Nairobi.", 1),
    # diacritics and case
    ("diacritics", capital("Brazil", "Brasília"), "The capital of Brazil is BRASILIA.", 1),
    ("diacritics", capital("Moldova", "Chișinău"), "Chisinau, the capital of Moldova.", 1),
    ("diacritics", capital("Colombia", "Bogotá"),
     "The capital of Colombia is Bogota, the largest city in the country.", 1),
    ("case", element("Beryllium", "Be"), "The symbol is Be.", 1),
    ("case", element("Iodine", "I"), "I think it is Fe.", 0),
    # aliases of the data
    ("alias", capital("Ukraine", "Kyiv"), "The capital of Ukraine is Kiev, not Khanna.", 1),
    ("alias", capital("Bolivia", "Sucre"),
     "The capital of Bolivia is La Paz, the capital of the country of Bolivia.", 1),
    # the question's subject named as the answer, labels, inverted sentences
    ("subject", capital("Estonia", "Tallinn"),
     "Estonia is the capital of Estonia, and the city is known as Tallinn.", 0),
    ("subject", capital("São Tomé and Príncipe", "São Tomé"),
     "São Tomé and Principe is a sovereign state in West Africa.", 0),
    ("subject", capital("Monaco", "Monaco"), "The capital of Monaco is Monte Carlo.", 0),
    ("subject", capital("Monaco", "Monaco"), "Monaco's capital is Monaco.", 1),
    ("label", capital("Denmark", "Copenhagen"), "Danish capital, Copenhagen.", 1),
    ("label", capital("Finland", "Helsinki"), "Finnish: Helsinki", 1),
    ("label", capital("Tunisia", "Tunis"), "Tunisia, capital of Tunisia is Tunis.", 1),
    ("clause", capital("Denmark", "Copenhagen"),
     "Denmark is a country in Europe, and the capital of Denmark is Copenhagen.", 1),
    ("clause", capital("Ukraine", "Kyiv"),
     "The capital of the country is Moscow, but the city is called Kiev, and the capital of Ukraine", 0),
    ("inverted", capital("Grenada", "St. George's"), "St. George's is the capital of Grenada.", 1),
    ("inverted", element("Magnesium", "Mg"), "Mg is the chemical symbol for Magnesium.", 1),
    ("inverted", capital("Ecuador", "Quito"),
     "España is the capital of Ecuador, and the most populous city is Quito.", 0),
    # element cues and glosses
    ("cue", element("Titanium", "Ti"), "Titanium is a chemical element on the periodic table, with the symbol Ti.", 1),
    ("cue", element("Sulfur", "S"), "Sulfur is an element, and it is denoted by the chemical symbol of S.", 1),
    ("cue", element("Rhodium", "Rh"), "Rhodium is a metal, with the symbol Rh, and it is an alloy of platinum.", 1),
    ("cue", element("Manganese", "Mn"), "Manganese is an alloy of two other elements: Mangno2 and Mangni (Mn", 0),
    ("cue", element("Aluminium", "Al"), "Aluminium, denoted by the symbol Al, is a metal.", 1),
    ("gloss", element("Zirconium", "Zr"), "Zirconium (Zr)", 1),
    # numbers (NQ-open)
    ("number", nq("4"), "There are four of them.", 1),
    ("number", nq("21"), "Twenty-one.", 1),
    ("number", nq("18"), "To buy a bb gun, you need to be at least 18 years old.", 1),
    ("number", nq("1972", "December 1972"), "It was in 1969, not in 1972.", 0),
]


def judged_score(case, metric: str) -> float:
    _, (task, sample), answer, _ = case
    return TASKS[task].score(sample, answer)[metric]


@pytest.mark.parametrize("case", JUDGED, ids=[f"{c[0]}-{i}" for i, c in enumerate(JUDGED)])
def test_asserted_agrees_with_the_reader(case):
    assert judged_score(case, "asserted") == case[3], case[2]


def test_every_rule_has_a_correct_and_a_wrong_answer():
    assert len(JUDGED) >= 30
    rules = {c[0] for c in JUDGED}
    for rule in ("negation", "list", "preamble", "subject", "clause", "inverted", "cue"):
        assert {c[3] for c in JUDGED if c[0] == rule} == {0, 1}, rule
    assert {"diacritics", "case", "alias", "label", "gloss", "number"} <= rules


def test_control_contains_disagrees_with_the_reader_on_negations():
    """The earlier rule counts any mention, so it calls a rejected answer correct; the check above must fail
    for it."""
    negations = [c for c in JUDGED if c[0] == "negation"]
    wrong = [c[2] for c in negations if judged_score(c, "contains") != c[3]]
    assert "The capital of Belgium is Amsterdam, not Brussels." in wrong and len(wrong) >= 5
    agree_new = sum(judged_score(c, "asserted") == c[3] for c in JUDGED)
    agree_old = sum(judged_score(c, "contains") == c[3] for c in JUDGED)
    assert agree_new == len(JUDGED) > agree_old


def test_control_a_scorer_that_ignores_negation_fails_the_reader(monkeypatch):
    """The same judgements with negation words read as ordinary words: a rejected answer after "not" ("is not
    Toronto", "not Lyon") counts again."""
    import mtad.tasks.qa as qa

    rejected = [c for c in JUDGED if c[0] == "negation" and c[3] == 0]
    assert all(judged_score(c, "asserted") == 0 for c in rejected)
    monkeypatch.setattr(qa, "NEGATION", frozenset())
    monkeypatch.setattr(qa, "NEGATED_COPULA", frozenset())
    monkeypatch.setattr(qa, "ITEM_END", qa.ITEM_END - {"not", "never", "neither", "nor"})
    flipped = [c[2] for c in rejected if judged_score(c, "asserted") == 1]
    assert {"It is not Toronto; it is Ottawa.", "Not Lyon, but Paris."} <= set(flipped)


def test_asserted_never_exceeds_a_mention_and_exact_implies_it():
    for case in JUDGED:
        _, (task, sample), answer, _ = case
        s = TASKS[task].score(sample, answer)
        assert set(s) == {"asserted", "contains", "exact"}
        assert s["exact"] <= s["asserted"]


@pytest.mark.parametrize("sentence,slot", [
    ("The capital of Belgium is Amsterdam, not Brussels.", "amsterdam"),
    ("Not Lyon; it is Paris.", "paris"),
    ("It isn't Lyon, it's Paris.", "paris"),
    ("Paris, Lyon or Marseille", "paris"),
    ("Capital of France: Paris", "paris"),
])
def test_answer_slot(sentence, slot):
    assert " ".join(answer_slot(marked_words(sentence, False), frozenset({"capital"}), frozenset({"capital"}))) == slot


def test_first_item_and_numerals():
    assert asserts(["city", "of", "santo", "domingo"], [["santo", "domingo"]])
    assert not asserts(["lyon", "or", "paris"], [["paris"]])  # control: the second candidate
    assert asserts(["trinidad", "and", "tobago"], [["trinidad", "and", "tobago"]])  # "and" in the reference
    assert numerals(["twenty", "one", "Five", "ten"]) == ["21", "5", "10"]
    assert numerals(["twenty"]) == ["20"] and numerals(["Paris"]) == ["Paris"]

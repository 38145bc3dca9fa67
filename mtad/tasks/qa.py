"""Short-answer factual QA: country capitals, chemical-element symbols and NQ-open (docs/TASKS.md).

An answer is cut to its first answering sentence (``postprocess``: a leading preamble such as "Sure!" or
"Of course," is skipped) and scored against the sample's reference strings after ``normalize``, twice:

- ``contains``: a reference appears in the first sentence on word boundaries ("Parisian" is not "Paris");
- ``exact``: the first phrase (the first sentence up to a comma, semicolon, colon, dash or bracket)
  equals a reference.
"""
from __future__ import annotations

import re
import unicodedata
from typing import ClassVar

from mtad.tasks.base import Sample, Task, cut_at, register
from mtad.tasks.records import BadField, need_str
from mtad.tasks.sources import HubCopy

ARTICLES = frozenset({"a", "an", "the"})
# Letters that Unicode does not decompose into a base letter and an accent.
FOLD = str.maketrans({"ø": "o", "Ø": "O", "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "ı": "i", "ß": "ss",
                      "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "þ": "th", "Þ": "Th"})
# A "." after one of these words (or after a single letter or a dotted word: "D.C.", "J.") ends no sentence.
ABBREVIATIONS = frozenset({"st", "mt", "ft", "dr", "mr", "mrs", "ms", "jr", "sr", "vs", "etc", "gen", "prof",
                           "rev", "inc", "ltd"})
SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
PHRASE_END = re.compile(r"[,;:](?=\s|$)|\s[-\u2013\u2014]\s|\s*\(")
LABEL = re.compile(r"^(?:(?:final\s+)?answer\s*:\s*|a\s*:\s*)+", re.IGNORECASE)
# Words a chat model puts before its answer. A sentence made of one of these alone ("Sure!", "Certainly.",
# "Here is the answer:") is a preamble and skipped; one of the short interjections followed by a comma
# ("Of course, Paris.") is cut from the front of the sentence.
INTERJECTION = r"(?:sure(?: thing)?|certainly|of course|okay|ok|yes|absolutely|alright|all right|well|great|gladly)"
PREAMBLE = re.compile(
    rf"{INTERJECTION}|(?:that's a |what a )?(?:great|good) question|no problem|here you go|happy to help"
    r"|i(?:'d| would) be (?:happy|glad) to help(?: with that)?|i can help with that"
    r"|here(?:'s| is) (?:the|my|your) answer", re.IGNORECASE)
LEADING_INTERJECTION = re.compile(rf"^(?:{INTERJECTION}\s*,|here(?:'s| is) (?:the|my|your) answer\s*:)\s*",
                                  re.IGNORECASE)
MAX_PREAMBLES = 3  # sentences skipped at most; an answer made only of preamble keeps its first sentence


def normalize(text: str, keep_case: bool = False) -> str:
    """Accents dropped (NFKD, then combining marks removed; ``FOLD`` for letters without a decomposition),
    lower-cased unless ``keep_case``, dashes, brackets and slashes made spaces, other punctuation and symbols deleted
    ("D.C." -> "dc", "John's" -> "johns"), the words a/an/the dropped, whitespace collapsed."""
    out = []
    for ch in unicodedata.normalize("NFKD", text.translate(FOLD)):
        cat = unicodedata.category(ch)
        if ch.isspace() or ch == "/" or cat in ("Pd", "Ps", "Pe"):
            out.append(" ")
        elif cat != "Mn" and cat[0] not in "PS":
            out.append(ch)
    words = "".join(out).split() if keep_case else "".join(out).lower().split()
    return " ".join(w for w in words if w.lower() not in ARTICLES)


def first_sentence(text: str) -> str:
    """``text`` up to its first newline or sentence-ending ``.``/``!``/``?`` (abbreviations and initials
    do not end a sentence: "St. George's", "Washington D.C. is")."""
    text = text.strip()
    for end in SENTENCE_END.finditer(text):
        word = re.search(r"[\w.]*$", text[: end.start()]).group()
        if end.group() == "." and (len(word) == 1 and word.isalpha() or "." in word or word.lower() in ABBREVIATIONS):
            continue
        return text[: end.end()].strip()
    return text


def answer_sentence(text: str) -> str:
    """The first sentence of ``text`` that answers: leading preamble sentences (``PREAMBLE``: "Sure!",
    "Certainly.", "Here is the answer:") are skipped, up to ``MAX_PREAMBLES``, and a leading interjection
    with a comma ("Of course, Paris.") or a "Here is the answer:" lead-in is cut. Text that is nothing but
    preamble keeps its first sentence."""
    text = text.strip()
    for _ in range(MAX_PREAMBLES):
        sentence = first_sentence(text)
        rest = text[len(sentence):].strip()
        if not rest or not PREAMBLE.fullmatch(sentence.rstrip(".!?:; ").strip()):
            break
        text = rest
    return LEADING_INTERJECTION.sub("", first_sentence(text)) or first_sentence(text)


def first_phrase(sentence: str) -> str:
    """The sentence up to its first comma, semicolon or colon (before a space), spaced dash or bracket."""
    return PHRASE_END.split(sentence, maxsplit=1)[0]


def has_words(text: str, ref: str) -> bool:
    """Whether normalised ``ref`` occurs in normalised ``text`` as whole words."""
    return bool(ref) and f" {ref} " in f" {text} "


def string_list(row: dict, key: str, required: bool) -> list[str]:
    """``row[key]`` as a list of non-empty strings (non-empty when ``required``; absent = [] otherwise)."""
    value = row[key] if required else row.get(key, [])
    if not isinstance(value, list) or (required and not value) or not all(
            isinstance(v, str) and v.strip() for v in value):
        raise BadField(f"field {key!r} must be a {'non-empty ' if required else ''}list of non-empty strings, "
                       f"got {value!r:.60}", f"bad list field {key!r}")
    return value


class ShortAnswerTask(Task):
    """A zero-shot question with a short answer; ``Sample.reference`` is the list of accepted answers."""

    metric = "contains"
    keep_case: ClassVar[bool] = False  # element symbols are case-sensitive
    instruction: ClassVar[str] = "Answer with a short phrase only."
    user_prefix = "Question: "
    assistant_prefix = "Answer:"

    def chat_text(self, text: str) -> str:
        return f"{text} {self.instruction}"

    def postprocess(self, sample: Sample, completion: str) -> str:
        """The first answering sentence (:func:`answer_sentence`), after ``task.stop`` cuts and a leading
        "Answer:" label."""
        return answer_sentence(LABEL.sub("", cut_at(completion.strip(), self.cfg.stop).strip()))

    def mask(self, sample: Sample, text: str) -> str:
        """The normalised sentence as ``contains`` reads it (capitals hide the question's country)."""
        return text

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        sentence = self.postprocess(sample, completion)
        refs = {normalize(r, self.keep_case) for r in sample.reference} - {""}
        text = self.mask(sample, normalize(sentence, self.keep_case))
        exact = normalize(first_phrase(sentence), self.keep_case) in refs
        return {"contains": float(exact or any(has_words(text, r) for r in refs)), "exact": float(exact)}


# Other names of the same city, and the second official capital or seat of government where the source
# lists one of two (docs/TASKS.md, "capitals"). Former capitals and commercial centres are not accepted.
CAPITAL_ALIASES: dict[str, tuple[str, ...]] = {
    "Washington D.C.": ("Washington",), "Ulan Bator": ("Ulaanbaatar",), "City of San Marino": ("San Marino",),
    "Saint John's": ("St. John's",), "St. George's": ("Saint George's",), "Kyiv": ("Kiev",),
    "Bern": ("Berne",), "Naypyidaw": ("Nay Pyi Taw", "Naypyitaw"), "Astana": ("Nur-Sultan",),
    "South Tarawa": ("Tarawa",), "Sana'a": ("Sana",), "Djibouti": ("Djibouti City",),
    "Luxembourg": ("Luxembourg City",),
    # seats of government
    "Sucre": ("La Paz",), "Lobamba": ("Mbabane",), "Amsterdam": ("The Hague",), "Porto-Novo": ("Cotonou",),
    "Kuala Lumpur": ("Putrajaya",), "Colombo": ("Sri Jayawardenepura Kotte", "Sri Jayewardenepura Kotte", "Kotte"),
}


@register("capitals")
class Capitals(ShortAnswerTask):
    """Rows ``{id?, country, capital, aliases?}``; references: capital, row aliases, ``CAPITAL_ALIASES``."""

    subdir = "capitals"
    instruction = "Answer with the name of the city only."

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            country, capital = need_str(row, "country"), need_str(row, "capital")
            refs = [capital, *string_list(row, "aliases", False), *CAPITAL_ALIASES.get(capital, ())]
            return Sample(str(row.get("id", i)), [f"What is the capital of {country}?"], refs,
                          {"country": country, "references": refs})

        return self.read("capitals.jsonl", parse)

    def mask(self, sample: Sample, text: str) -> str:
        """Drop "capital (city) of <country>" and "<country>('s) capital" so that restating the question
        does not count where the capital's name is the country's ("The capital of Monaco is Monte Carlo")."""
        country = re.escape(normalize(sample.meta["country"]))
        return re.sub(rf"\bcapital (?:city )?of {country}\b|\b{country}s? capital\b", " ", text)


@register("elements")
class Elements(ShortAnswerTask):
    """Element name -> symbol (rows ``{id?, element, symbol, aliases?}``); symbols compare case-sensitively."""

    subdir = "elements"
    keep_case = True
    instruction = "Answer with the symbol only, capitalized correctly."

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            element, symbol = need_str(row, "element"), need_str(row, "symbol")
            refs = [symbol, *string_list(row, "aliases", False)]
            return Sample(str(row.get("id", i)), [f"What is the chemical symbol of {element}?"], refs,
                          {"element": element, "references": refs})

        return self.read("elements.jsonl", parse)


@register("nq_open")
class NQOpen(ShortAnswerTask):
    """NQ-open rows ``{question, answer: [...]}`` (``nq_open/<split>.jsonl``, or the hub's nq_open)."""

    subdir = "nq_open"
    hub = HubCopy("google-research-datasets/nq_open", splits=(("dev", "validation"),))

    def load(self) -> list[Sample]:
        split = self.cfg.split

        def parse(row: dict, i: int) -> Sample:
            question, refs = need_str(row, "question").strip().rstrip("?"), string_list(row, "answer", True)
            return Sample(f"{split}-{i}", [f"{question}?"], refs, {"references": refs})

        return self.read(f"{split}.jsonl", parse)

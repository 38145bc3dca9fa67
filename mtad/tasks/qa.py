"""Short-answer factual QA: country capitals, element symbols, city countries, currencies, NQ-open (docs/TASKS.md).

An answer is cut to its first answering sentence (``postprocess``: a leading preamble such as "Sure!" or
"Of course," is skipped) and scored against the sample's reference strings after ``normalize``:

- ``asserted`` (the task's score): the first answer the sentence asserts is a reference (:func:`answer_slot`):
  "Amsterdam, not Brussels" asserts Amsterdam, "It isn't Lyon; it is Paris" asserts Paris, and a list of
  candidates asserts its first one;
- ``contains``: a reference appears anywhere in the first sentence on word boundaries ("Parisian" is not
  "Paris"); the earlier score, kept to compare with rows scored by it;
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
LEADING_INTERJECTION = re.compile(
    rf"^(?:(?:{INTERJECTION}\s*,|here(?:'s|\u2019s| is) (?:the|my|your) answer\s*:)\s*)+", re.IGNORECASE)
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


# ---- the asserted answer ---------------------------------------------------------------------------
# Marks that ``normalize`` keeps as words of their own: a phrase boundary (comma, semicolon, spaced dash), a
# colon, a parenthetical's ends, and the question's own subject (the country, the element) where the answer
# names it.
BREAK, COLON, OPEN, CLOSE, SUBJECT = "\x00", "\x01", "\x03", "\x04", "\x02"
BOUNDARY = frozenset({BREAK, COLON})
MARKS = re.compile(r"[\x00-\x04]")
BREAKS = re.compile(r"[,;](?=\s|$)|\s[-\u2013\u2014]\s|[\[\]]")
PARENTHETICAL = re.compile(r"\(([^()]*)(?:\)|$)")  # "Aluminium (Al) is ...", or one cut off by the length limit
CONTRACTION = re.compile(r"\b(it|that|this|here|there|what|which|answer)['\u2019]s\b", re.IGNORECASE)
COPULA = frozenset({"is", "are", "was", "were", "be"})
NEGATED_COPULA = frozenset({"isnt", "wasnt", "arent", "werent"})
NEGATION = frozenset({"not", "never", "neither", "nor"})
# Words that end the first item of an answer: a list ("Paris or Lyon"), a negation or contrast ("Paris, not
# Lyon", "Paris but ..."), a relative or subordinate clause ("Paris, which ...").
ITEM_END = NEGATION | {"or", "and", "but", "which", "who", "whose", "where", "while", "whereas", "although",
                       "though", "instead", "rather", "than", "unlike", "because", "since", "except"}
# Words skipped before the answer that follows a rejected one ("not Lyon, but rather Paris").
CONNECTIVE = BOUNDARY | {"and", "but", "rather", "instead", "actually"}
# A sentence opening with one of these is not a bare answer ("To buy one, you need to be 18").
OPENER = frozenset({"to", "if", "when", "while", "because", "although", "though", "in", "for", "as", "since",
                    "after", "before", "during", "on", "at", "by", "with", "from", "according"})
# Words that may follow the topic's noun in a label ("Capital of Tunisia, ...", "Chemical symbol for iron: ...").
LABEL_TAIL = frozenset({"of", "for", "city", SUBJECT})
# Subjects that stand for the answer itself ("It is Paris", "The answer is Paris").
ANSWER_WORDS = frozenset({"it", "this", "that", "answer", "which", "one", "name"})
UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen".split())}
TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}


def numerals(words: list[str]) -> list[str]:
    """Number words as digits ("twenty one" -> "21", "Five" -> "5"); other words unchanged."""
    out, i = [], 0
    while i < len(words):
        w = words[i].lower()
        unit = UNITS.get(words[i + 1].lower()) if w in TENS and i + 1 < len(words) else None
        if unit is not None and 0 < unit < 10:
            out.append(str(TENS[w] + unit))
            i += 2
            continue
        out.append(str(UNITS[w]) if w in UNITS else str(TENS[w]) if w in TENS else words[i])
        i += 1
    return out


def keys(words: list[str]) -> list[str]:
    """The words as keywords are matched: lower case where a phrase starts ("Not Lyon", "It is Co"); elsewhere
    as written, so that a case-sensitive symbol ("Be", "In", "No") is never read as a word."""
    return [w.lower() if k == 0 or words[k - 1] in BOUNDARY else w for k, w in enumerate(words)]


def phrase(words: list[str], start: int) -> list[str]:
    """``words`` from ``start`` (leading boundaries skipped) to the next boundary."""
    while start < len(words) and words[start] in BOUNDARY:
        start += 1
    end = next((j for j in range(start, len(words)) if words[j] in BOUNDARY), len(words))
    return words[start:end]


def item_end(words: list[str], start: int) -> int:
    """Where the item at ``start`` ends: a boundary, or an ``ITEM_END`` word after its first word."""
    k, end = keys(words), start + 1
    while end < len(words) and words[end] not in BOUNDARY and k[end] not in ITEM_END:
        end += 1
    return end


def without_parentheticals(words: list[str]) -> tuple[list[str], list[str] | None]:
    """``words`` with every parenthetical dropped, and the first one that glosses the question's subject
    ("Zirconium (Zr)", "samarium (Sm)") when it lies in the first phrase."""
    out, gloss, depth, first_phrase = [], None, [], True
    for j, w in enumerate(words):
        if w == OPEN:
            depth.append(j)
        elif w == CLOSE:
            if depth and gloss is None and first_phrase and depth[0] > 0 and words[depth[0] - 1] == SUBJECT:
                gloss = words[depth[0] + 1:j]
            depth = []
        elif not depth:
            out.append(w)
            first_phrase = first_phrase and w not in BOUNDARY
    return out, gloss


def answer_slot(words: list[str], cues: frozenset[str] = frozenset(), nouns: frozenset[str] = frozenset()
                ) -> list[str]:
    """The phrase that holds the first answer the (normalised, marked) sentence asserts; the answer is its first
    item (:func:`asserts`). A gloss of the question's subject in the first phrase ("Zirconium (Zr) is ...") is
    that phrase; other parentheticals are dropped. The rest is read in order, from the start or from just
    after a rejected answer:

    1. a leading label is skipped: a phrase before a colon, or before a boundary when it has no verb and ends
       naming the topic (``cues``, "answer") or is only the question's subject: "Finnish: Helsinki", "Danish
       capital, Copenhagen", "Tunisia, capital of Tunisia is Tunis";
    2. a leading negation rejects the item after it: "Not Lyon, but Paris" is read from "Paris";
    3. a first phrase with no verb that does not open with a preposition or conjunction, and is not followed by
       a verb or a cue ("Iodine, a vital element, is denoted by I"), is a bare answer: "Paris.", "Paris, Lyon
       or Marseille", "Amsterdam, not Brussels";
    4. else the first assertion "<subject> is/are/was/were/be <predicate>" about the topic (its subject or its
       predicate names a cue, or the subject is "it"/"the answer"; with no cues every one is): the predicate;
       the subject where the predicate opens with the topic's noun ("Paris is the capital of France", "Mg is
       the chemical symbol for magnesium"); the words after the cue where only the predicate names it later
       ("a chemical element with the symbol Se"). A cue met between assertions, or opening the subject,
       anchors the answer there ("a metal, with the symbol Rh, and it is ...", "Aluminium, denoted by the
       symbol Al, is ..."). A negated assertion ("is not Y", "isn't Y") rejects Y and reading goes on after it;
    5. else the words after the first cue ("an element with the symbol Ti"), else the first phrase.

    [choice] Only the first assertion counts: a later clause or sentence that names another answer does not
    change it ("Paris, but some say Lyon" asserts Paris), nor does a later retraction.
    """
    words, gloss = without_parentheticals(words)
    if gloss is not None:
        return gloss
    lower = [w.lower() for w in words]
    i = 0
    while i < len(words):
        k = keys(words)
        while i < len(words) and k[i] in CONNECTIVE:
            i += 1
        first = phrase(words, i)
        end = i + len(first)
        verb = any(w in COPULA or w in NEGATED_COPULA for w in k[i:end])
        topic = [j for j in range(i, end) if lower[j] in cues or lower[j] == "answer"]
        names_topic = topic and all(w in LABEL_TAIL for w in lower[topic[-1] + 1:end])
        if end < len(words) and not verb and (words[end] == COLON or names_topic
                                              or first and all(w == SUBJECT for w in first)):
            i = end + 1  # 1. a label
            continue
        if first and k[i] in NEGATION:
            i = item_end(words, i + 1)  # 2. a leading negation
            continue
        after = phrase(words, end)
        if first and not verb and k[i] not in OPENER and not (
                after and (after[0].lower() in COPULA or after[0].lower() in cues)):
            return first  # 3. a bare answer
        last = i
        for v in range(i, len(words)):
            if k[v] not in COPULA and k[v] not in NEGATED_COPULA:
                continue
            start = max((j + 1 for j in range(i, v) if words[j] in BOUNDARY or k[j] in ITEM_END), default=i)
            cue = next((j for j in range(last, start + (lower[start] in cues - nouns)) if lower[j] in cues), None)
            if cue is not None:
                return phrase(words, cue + 1)  # a cue between assertions
            subject, rest = words[start:v], v + 1
            negated = k[v] in NEGATED_COPULA or rest < len(words) and k[rest] in NEGATION
            rest += k[v] not in NEGATED_COPULA and negated
            predicate = phrase(words, rest)
            in_subject = {w.lower() for w in subject} & (cues | ANSWER_WORDS)
            in_predicate = [j for j, w in enumerate(predicate) if w.lower() in cues]
            last = rest
            if cues and not in_subject and not in_predicate:
                continue
            if negated:
                break
            if nouns & {w.lower() for w in predicate[:2]}:
                return subject
            if in_predicate and not in_subject:
                return predicate[in_predicate[0] + 1:] or predicate
            return predicate
        else:
            cue = next((j for j in range(i, len(words)) if lower[j] in cues), None)
            return phrase(words, cue + 1) if cue is not None else first  # 5.
        i = item_end(words, rest)  # a negated assertion: read on after the rejected answer
    return []


def asserts(slot: list[str], refs: list[list[str]]) -> bool:
    """Whether a reference (as words) is the first item of ``slot``: it occurs there with no ``ITEM_END`` word
    before it ("the city of Santo Domingo" and "called Tehran" assert the city, "Lyon or Paris" asserts Lyon).
    A reference may hold such a word itself ("Trinidad and Tobago"). Number words match digits."""
    slot = numerals(slot)
    k = keys(slot)
    for ref in refs:
        ref = numerals(ref)
        for p in range(len(slot) - len(ref) + 1):
            if p and k[p - 1] in ITEM_END:
                break
            if slot[p:p + len(ref)] == ref:
                return True
    return False


def marked_words(sentence: str, keep_case: bool) -> list[str]:
    """``sentence`` normalised to words, with its phrase boundaries, colons and parentheticals kept as marks and
    "it's"/"that's"/"here's" spelt out."""
    text = CONTRACTION.sub(r"\1 is", MARKS.sub(" ", sentence))
    text = PARENTHETICAL.sub(lambda m: f" {OPEN} {m[1]} {CLOSE} ", text)
    text = re.sub(r":(?=\s|$)", f" {COLON} ", BREAKS.sub(f" {BREAK} ", text))
    return normalize(text, keep_case).split()


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

    metric = "asserted"
    keep_case: ClassVar[bool] = False  # element symbols are case-sensitive
    # Words that show a clause is about the answer (:func:`answer_slot`); none: every clause is.
    cues: ClassVar[frozenset[str]] = frozenset()
    # The topic's noun, for "<answer> is the <noun> of ..." (:func:`answer_slot` step 4).
    nouns: ClassVar[frozenset[str]] = frozenset()
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
        """The normalised sentence with a restatement of the question marked (capitals: the country)."""
        return text

    def subject(self, sample: Sample) -> str | None:
        """The question's subject, when naming it is never the answer (marked ``SUBJECT`` for ``asserted``)."""
        return None

    def slot(self, sample: Sample, sentence: str) -> list[str]:
        """The words of ``sentence`` that hold its first asserted answer (:func:`answer_slot`)."""
        text = self.mask(sample, " ".join(marked_words(sentence, self.keep_case)))
        subject = self.subject(sample)
        if subject and normalize(subject, self.keep_case):
            text = re.sub(rf"(?<!\w){re.escape(normalize(subject, self.keep_case))}s?(?!\w)", SUBJECT, text,
                          flags=re.IGNORECASE)
        return answer_slot(text.split(), self.cues, self.nouns)

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        """``asserted``, ``contains`` and ``exact`` (module docstring) of the first answering sentence; an exact
        answer also counts as asserted and contained."""
        sentence = self.postprocess(sample, completion)
        refs = {normalize(r, self.keep_case) for r in sample.reference} - {""}
        text = self.mask(sample, normalize(sentence, self.keep_case))
        exact = normalize(first_phrase(sentence), self.keep_case) in refs
        asserted = exact or asserts(self.slot(sample, sentence), [r.split() for r in refs])
        return {"asserted": float(asserted), "contains": float(exact or any(has_words(text, r) for r in refs)),
                "exact": float(exact)}


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
    cues = nouns = frozenset({"capital"})

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            country, capital = need_str(row, "country"), need_str(row, "capital")
            refs = [capital, *string_list(row, "aliases", False), *CAPITAL_ALIASES.get(capital, ())]
            return Sample(str(row.get("id", i)), [f"What is the capital of {country}?"], refs,
                          {"country": country, "references": refs})

        return self.read("capitals.jsonl", parse)

    def mask(self, sample: Sample, text: str) -> str:
        """Mark the country in "capital (city) of <country>" and "<country>('s) capital" so that restating the
        question does not count where the capital's name is the country's ("The capital of Monaco is Monte
        Carlo")."""
        country = re.escape(normalize(sample.meta["country"]))
        return re.sub(rf"\b(capital (?:city )?of) {country}\b|\b{country}s?( capital)\b",
                      lambda m: f"{m[1]} {SUBJECT}" if m[1] else f"{SUBJECT}{m[2]}", text)

    def subject(self, sample: Sample) -> str | None:
        """The country, unless a reference names it ("Monaco"; "Panama City" holds "Panama")."""
        country = normalize(sample.meta["country"])
        refs = [normalize(r) for r in sample.reference]
        return None if any(has_words(r, country) for r in refs) else sample.meta["country"]


@register("elements")
class Elements(ShortAnswerTask):
    """Element name -> symbol (rows ``{id?, element, symbol, aliases?}``); symbols compare case-sensitively."""

    subdir = "elements"
    keep_case = True
    instruction = "Answer with the symbol only, capitalized correctly."
    cues = frozenset({"symbol", "denoted", "represented", "abbreviated", "abbreviation", "written"})
    nouns = frozenset({"symbol"})

    def subject(self, sample: Sample) -> str | None:
        """The element's name: "Cobalt, Co." names the element first, then answers."""
        return sample.meta["element"]

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


# Other names of the same country, as GeoNames names it (cities, currencies; docs/TASKS.md, "cities").
COUNTRY_ALIASES: dict[str, tuple[str, ...]] = {
    "United States": ("United States of America", "USA", "US", "U.S.", "U.S.A.", "America"),
    "United Kingdom": ("UK", "U.K.", "Great Britain", "Britain"), "Russia": ("Russian Federation",),
    "China": ("People's Republic of China", "PRC"), "South Korea": ("Korea", "Republic of Korea"),
    "North Korea": ("Democratic People's Republic of Korea", "DPRK"), "The Netherlands": ("Holland",),
    "Czechia": ("Czech Republic",), "Turkey": ("Türkiye", "Turkiye"), "Myanmar": ("Burma",),
    "Ivory Coast": ("Côte d'Ivoire", "Cote d'Ivoire"), "Vietnam": ("Viet Nam",),
    "Democratic Republic of the Congo": ("DR Congo", "DRC", "Congo-Kinshasa"),
    "Republic of the Congo": ("Congo", "Congo-Brazzaville"), "Iran": ("Islamic Republic of Iran",),
    "Syria": ("Syrian Arab Republic",), "Laos": ("Lao PDR",), "Timor Leste": ("East Timor", "Timor-Leste"),
    "Eswatini": ("Swaziland",), "North Macedonia": ("Macedonia",), "Cabo Verde": ("Cape Verde",),
    "Vatican": ("Vatican City", "Holy See"), "Palestinian Territory": ("Palestine",), "Taiwan": ("Republic of China",),
    "Micronesia": ("Federated States of Micronesia",), "Bahamas": ("The Bahamas",), "Gambia": ("The Gambia",),
}


def country_refs(country: str, aliases: list[str]) -> list[str]:
    return [country, *aliases, *COUNTRY_ALIASES.get(country, ())]


@register("cities")
class Cities(ShortAnswerTask):
    """City -> country (rows ``{id?, city, country, aliases?}``; ``cities/cities.jsonl``, from GeoNames);
    references: the country, row aliases, ``COUNTRY_ALIASES``."""

    subdir = "cities"
    instruction = "Answer with the name of the country only."

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            city, country = need_str(row, "city"), need_str(row, "country")
            refs = country_refs(country, string_list(row, "aliases", False))
            return Sample(str(row.get("id", i)), [f"In which country is the city of {city}?"], refs,
                          {"city": city, "references": refs})

        return self.read("cities.jsonl", parse)

    def subject(self, sample: Sample) -> str | None:
        """The city, unless a reference holds its name ("Mexico City" is in Mexico)."""
        city = normalize(sample.meta["city"])
        refs = [normalize(r) for r in sample.reference]
        return None if any(has_words(city, r) or has_words(r, city) for r in refs) else sample.meta["city"]


@register("currencies")
class Currencies(ShortAnswerTask):
    """Country -> currency (rows ``{id?, country, currency, code?, aliases?}``; ``currencies/currencies.jsonl``,
    from GeoNames); references: the currency's name ("Yen", "Euro", "Dollar") and its ISO 4217 code."""

    subdir = "currencies"
    instruction = "Answer with the name of the currency only."
    cues = nouns = frozenset({"currency"})

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            country, currency = need_str(row, "country"), need_str(row, "currency")
            code = row.get("code")
            refs = [currency, *([code] if isinstance(code, str) and code.strip() else []),
                    *string_list(row, "aliases", False)]
            return Sample(str(row.get("id", i)), [f"What is the currency of {country}?"], refs,
                          {"country": country, "references": refs})

        return self.read("currencies.jsonl", parse)

    def subject(self, sample: Sample) -> str | None:
        return sample.meta["country"]

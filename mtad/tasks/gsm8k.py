"""GSM8K: grade-school math word problems scored by the final number (accuracy)."""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from mtad.tasks.base import Sample, Task, cut_at, register
from mtad.tasks.records import need_str
from mtad.tasks.sources import HubCopy

# A number: optional sign (not after a word character, so "10-20" reads 20), thousands commas, decimals.
NUMBER = re.compile(r"(?:(?<!\w)-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
ANSWER_IS = re.compile(r"the (?:final )?answer is", re.IGNORECASE)
CALC = re.compile(r"<<[^>]*>>")
INSTRUCTION = "Solve the problem step by step, then finish with \"The answer is N.\" where N is the final number."
STOPS = ("Question:", "\n\n\n")


def to_decimal(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        return Decimal(text.replace(",", "").replace("$", "").strip().rstrip("."))
    except InvalidOperation:
        return None


def extract_answer(text: str) -> str | None:
    """The final number of a solution, commas removed; None when it holds no number.

    Order: the first number after the last "The answer is", else after the last "####", else the last
    number in the text.
    """
    for marker in (ANSWER_IS, re.compile("####")):
        hits = list(marker.finditer(text))
        if hits:
            found = NUMBER.search(text, hits[-1].end())
            if found:
                return found.group().replace(",", "")
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def gold_answer(solution: str) -> str:
    """The number after "####" in a GSM8K solution, commas removed."""
    if "####" not in solution:
        raise ValueError("answer has no '####' final-answer marker")
    value = solution.split("####")[-1].strip().replace(",", "")
    if to_decimal(value) is None:
        raise ValueError(f"final answer {value!r} is not a number")
    return value


def few_shot_answer(solution: str) -> str:
    """A GSM8K solution as an in-context answer: no calculator annotations, ending "The answer is N."."""
    steps = CALC.sub("", solution.split("####")[0]).split("\n")
    return " ".join(s.strip() for s in steps if s.strip()) + f" The answer is {gold_answer(solution)}."


@register("gsm8k")
class GSM8K(Task):
    metric = "accuracy"
    subdir = "gsm8k"
    hub = HubCopy("openai/gsm8k", "main")
    supports_few_shot = True
    user_prefix = "Question: "
    assistant_prefix = "Answer:"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._shots: list[tuple[str, str]] | None = None

    def load(self) -> list[Sample]:
        split = self.cfg.split

        def parse(row: dict, i: int) -> Sample:
            return Sample(f"{split}-{i}", [need_str(row, "question")], gold_answer(need_str(row, "answer")))

        return self.read(f"{split}.jsonl", parse)

    def few_shot_pairs(self) -> list[tuple[str, str]]:
        if not self.cfg.few_shot:
            return []
        if self._shots is None:
            evaluated = {s.turns[0] for s in self.samples()}
            pool = self.read(f"{self.cfg.few_shot_split}.jsonl", lambda row, i: (
                need_str(row, "question"), few_shot_answer(need_str(row, "answer"))), split=self.cfg.few_shot_split)
            pool = [p for p in pool if p[0] not in evaluated]
            if len(pool) < self.cfg.few_shot:
                raise ValueError(f"task.few_shot={self.cfg.few_shot} but the {self.cfg.few_shot_split} split "
                                 f"has only {len(pool)} usable examples")
            self._shots = pool[: self.cfg.few_shot]
        return self._shots

    def chat_text(self, text: str) -> str:
        return f"{text}\n{INSTRUCTION}"

    def postprocess(self, sample: Sample, completion: str) -> str:
        return cut_at(completion.lstrip(), (*STOPS, *self.cfg.stop)).strip()

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        predicted = to_decimal(extract_answer(self.postprocess(sample, completion)))
        return {"accuracy": float(predicted is not None and predicted == to_decimal(sample.reference))}

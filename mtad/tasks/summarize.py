"""CNN/DailyMail summarisation scored with ROUGE-1/2/L F-measure (the ``rouge-score`` package)."""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from mtad.tasks.base import Sample, Task, register
from mtad.tasks.records import need_str
from mtad.tasks.sources import HubCopy

INSTRUCTION = "Summarize the following news article in a few sentences."
ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures (Porter stemming, rouge-score's default tokenizer)."""
    scores = _scorer().score(reference, prediction)
    return {k: scores[k].fmeasure for k in ROUGE_KEYS}


@register("cnn_dm")
class CNNDailyMail(Task):
    """Rows ``{id?, article, highlights}`` from ``task.data_file`` or the hub (abisee/cnn_dailymail, 3.0.0).

    With ``on_long_prompt=truncate`` the article itself is cut (its end dropped) so that the whole prompt
    fits ``max_prompt_tokens``; the instruction and template stay intact.
    """

    metric = "rougeL"
    subdir = "cnn_dm"
    hub = HubCopy("abisee/cnn_dailymail", "3.0.0")

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            return Sample(str(row.get("id", i)), [need_str(row, "article")], need_str(row, "highlights"))

        return self.read(f"{self.cfg.split}.jsonl", parse)

    def chat_text(self, text: str) -> str:
        return f"{INSTRUCTION}\n\n{text}"

    def render_base(self, sample: Sample, turn: int, history: Sequence[str]) -> str:
        return f"{sample.turns[0]}\n\nTL;DR:"

    def render(self, sample: Sample, tokenizer: Any, turn: int = 0, history: Sequence[str] = (),
               chat: bool = True) -> str:
        text = super().render(sample, tokenizer, turn, history, chat)
        limit = self.cfg.max_prompt_tokens
        if self.cfg.on_long_prompt != "truncate" or not limit or tokenizer is None:
            return text
        def count(s: str) -> int:
            return len(tokenizer(s, add_special_tokens=not chat)["input_ids"])

        article = tokenizer(sample.turns[0], add_special_tokens=False)["input_ids"]
        keep = len(article) - (count(text) - limit)
        while count(text) > limit and keep > 0:  # re-tokenising at the cut may shift a token or two
            cut = Sample(sample.id, [tokenizer.decode(article[:keep])], sample.reference, sample.meta)
            text = super().render(cut, tokenizer, turn, history, chat)
            keep -= max(1, count(text) - limit)
        return text

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        return rouge(self.postprocess(sample, completion), sample.reference)

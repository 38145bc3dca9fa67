"""A generic local task: ``task.data_file`` with rows ``{"id", "prompt", "answer"?}``.

The prompt is sent as-is to base models and as the user message to chat models. Rows with an answer are
scored by exact match of the stripped (stop-cut) completion with the stripped answer; rows without one
are prompt-only ({} scores).
"""
from __future__ import annotations

from collections.abc import Sequence

from mtad.tasks.base import Sample, Task, register
from mtad.tasks.records import BadField, need_str


@register("jsonl")
class JsonlTask(Task):
    metric = "exact_match"

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:  # duplicate ids are dropped by Task.read
            sid = row["id"]
            if not isinstance(sid, (str, int)):
                raise BadField(f"id must be a string or integer, got {sid!r:.60}", "id not a string or integer")
            answer = row.get("answer")
            if answer is not None and not isinstance(answer, (str, int, float)):
                raise BadField(f"answer must be a string or number, got {type(answer).__name__}",
                               "answer not a string or number")
            return Sample(str(sid), [need_str(row, "prompt")], None if answer is None else str(answer))

        return self.read(None, parse)

    def render_base(self, sample: Sample, turn: int, history: Sequence[str]) -> str:
        return sample.turns[0]

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        if sample.reference is None:
            return {}
        return {"exact_match": float(self.postprocess(sample, completion) == sample.reference.strip())}

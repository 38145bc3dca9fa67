"""Prompt-only chat sets (no reference, no score): MT-Bench, Spec-Bench, ChatGPT prompts, ChatAlpaca.

Every sample keeps at most ``task.turns`` user turns; the runner plays them in order, passing its own
earlier answers as ``history``.
"""
from __future__ import annotations

from mtad.tasks.base import Sample, Task, register
from mtad.tasks.records import need_str
from mtad.tasks.sources import HubCopy

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def turns_of(row: dict, key: str = "turns") -> list[str]:
    turns = row[key]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise TypeError(f"field {key!r} must be a non-empty list of non-empty strings")
    return turns


class PromptSet(Task):
    """A chat prompt set: metric None, optional category filter on ``meta['category']``/``meta['group']``."""

    metric: str | None = None

    def keep_turns(self, turns: list[str]) -> list[str]:
        return turns[: self.cfg.turns]

    def filter(self, samples: list[Sample]) -> list[Sample]:
        if not self.cfg.categories:
            return samples
        valid = sorted({s.meta.get(k) for s in samples for k in ("category", "group")} - {None})
        unknown = sorted(set(self.cfg.categories) - set(valid))
        if unknown:
            raise ValueError(f"task.categories: unknown {unknown} for {self.name}; valid: {valid}")
        wanted = set(self.cfg.categories)
        return [s for s in samples if {s.meta.get("category"), s.meta.get("group")} & wanted]


@register("mt_bench")
class MTBench(PromptSet):
    """FastChat's question.jsonl rows ``{question_id, category, turns}``; the hub copy names them
    ``{prompt_id, category, prompt}`` (its ids are hashes of the prompts, not FastChat's 81-160)."""

    subdir = "mt_bench"
    hub = HubCopy("HuggingFaceH4/mt_bench_prompts", splits=(("test", "train"),))

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            meta = {"category": need_str(row, "category")}
            turns = turns_of(row, "turns" if "turns" in row or "prompt" not in row else "prompt")
            sid = row["question_id"] if "question_id" in row or "prompt_id" not in row else row["prompt_id"]
            return Sample(str(sid), self.keep_turns(turns), None, meta)

        return self.filter(self.read("question.jsonl", parse))


@register("spec_bench")
class SpecBench(PromptSet):
    """Spec-Bench's six groups: mt_bench (its eight MT-Bench categories), translation, summarization, qa,
    math_reasoning, rag. ``meta['category']`` is the row's own label, ``meta['group']`` one of the six."""

    subdir = "spec_bench"

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            category = need_str(row, "category")
            group = "mt_bench" if category in MT_BENCH_CATEGORIES else category
            return Sample(str(row["question_id"]), self.keep_turns(turns_of(row)), None,
                          {"category": category, "group": group})

        return self.filter(self.read("question.jsonl", parse))


@register("chatgpt_prompts")
class ChatGPTPrompts(PromptSet):
    subdir = "awesome_chatgpt_prompts"
    hub = HubCopy("fka/awesome-chatgpt-prompts", splits=(("test", "train"),))  # its one split

    def load(self) -> list[Sample]:
        return self.read("prompts.csv", lambda row, i: Sample(str(i), [need_str(row, "prompt")], None,
                                                              {"act": row.get("act")}))


def conversation_turns(row: dict) -> list[str]:
    """User turns of a ChatAlpaca-style row: ``conversations`` [{from, value}], ``messages`` [{role, content}],
    or Alpaca's ``instruction`` (+ ``input``)."""
    if "conversations" in row:
        turns = [m["value"] for m in row["conversations"] if m.get("from") in ("human", "user")]
    elif "messages" in row:
        turns = [m["content"] for m in row["messages"] if m.get("role") == "user"]
    else:
        extra = row.get("input") or ""
        turns = [need_str(row, "instruction") + (f"\n\n{extra}" if extra.strip() else "")]
    return turns_of({"turns": turns})


@register("chatalpaca")
class ChatAlpaca(PromptSet):
    """ChatAlpaca (cascip/ChatAlpaca) multi-turn conversations; no copy ships here: give ``task.data_file``
    (JSON / JSONL in one of the row shapes of ``conversation_turns``) or ``task.source=hub``."""

    subdir = "chatalpaca"

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            return Sample(str(row.get("id", i)), self.keep_turns(conversation_turns(row)))

        return self.read(f"{self.cfg.split}.jsonl", parse)

"""Task configuration, samples, the `Task` base class and the task registry.

A task turns a data file into `Sample`s, renders each turn of a sample as prompt text (chat template for
instruction-tuned models, plain few-shot text for base models), cuts a completion down to the answer, and
scores it. The runner drives it; prompt formats are documented in docs/TASKS.md.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import OmegaConf

from mtad.paths import default_data_dir
from mtad.tasks.records import hub_rows, iter_rows, parse_rows

log = logging.getLogger(__name__)

_CHOICES = {
    "source": ("local", "hub"),
    "selection": ("first", "random"),
    "on_long_prompt": ("skip", "truncate", "error"),
    "schema_format": ("create_table", "compact"),
    "sandbox": ("auto", "namespaces", "uid", "none"),
}


@dataclass(frozen=True)
class TaskConfig:
    """One evaluation task (Hydra structured-config node; every field is a plain type)."""

    name: str = "gsm8k"
    source: str = "local"  # local: files under data_dir | hub: load_dataset(hub_id, hub_config, split)
    data_dir: str | None = None  # None -> mtad.paths.default_data_dir()
    data_file: str | None = None  # overrides the task's default file; relative paths are under data_dir
    hub_id: str | None = None
    hub_config: str | None = None  # second argument of load_dataset (e.g. "main", "3.0.0")
    split: str = "test"
    n_prompts: int = 10  # 0 = all
    selection: str = "first"  # first | random (seeded by selection_seed)
    selection_seed: int = 0
    few_shot: int = 0  # in-context examples from few_shot_split (never from the evaluated rows)
    few_shot_split: str = "train"
    turns: int = 1  # multi-turn sets: how many user turns to play (1 or 2)
    max_prompt_tokens: int = 512  # 0 = no limit
    on_long_prompt: str = "skip"  # skip (record reason) | truncate (keep the last tokens) | error
    system_prompt: str | None = None  # chat prompts only
    categories: list[str] = field(default_factory=list)  # mt_bench / spec_bench filter; empty = all
    stop: list[str] = field(default_factory=list)  # extra stop strings applied by postprocess
    timeout_s: float = 10.0  # humaneval: per-program wall limit; spider: per-query limit
    memory_mb: int = 1024  # humaneval: memory cap of the candidate (per process and over all its processes)
    sandbox: str = "auto"  # humaneval: auto | namespaces | uid | none (mtad/tasks/sandbox.py); recorded in the row
    db_dir: str | None = None  # spider: <db_dir>/<db_id>/<db_id>.sqlite -> execution accuracy
    schema_format: str = "create_table"  # spider: create_table | compact ("table(col, col)")

    def __post_init__(self) -> None:
        for key, allowed in _CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"task.{key}={getattr(self, key)!r} is not valid: choose one of {allowed}")
        for key, low in (("n_prompts", 0), ("few_shot", 0), ("max_prompt_tokens", 0), ("memory_mb", 64)):
            if getattr(self, key) < low:
                raise ValueError(f"task.{key}={getattr(self, key)!r} is out of range: must be >= {low}")
        if self.turns not in (1, 2):
            raise ValueError(f"task.turns={self.turns!r} is not valid: 1 (first turn) or 2 (both turns)")
        if self.timeout_s <= 0:
            raise ValueError(f"task.timeout_s={self.timeout_s!r} must be > 0 seconds")
        if self.source == "hub" and not self.hub_id:
            raise ValueError("task.source=hub needs task.hub_id (a Hugging Face dataset id)")

    @classmethod
    def from_any(cls, cfg: Any) -> TaskConfig:
        """Accept a TaskConfig, an OmegaConf node or a plain mapping; unknown keys raise ValueError."""
        if isinstance(cfg, cls):
            return cfg
        if OmegaConf.is_config(cfg):
            cfg = OmegaConf.to_container(cfg, resolve=True)
        if not isinstance(cfg, Mapping):
            raise TypeError("task config must be a TaskConfig, an OmegaConf node or a mapping, "
                            f"got {type(cfg).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(f"unknown task config key(s) {unknown}; valid keys: {sorted(known)}")
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Sample:
    """One evaluation item: its user turns, the gold reference (None for prompt-only sets) and metadata."""

    id: str
    turns: list[str]
    reference: Any = None
    meta: dict = field(default_factory=dict)


@dataclass
class Prompt:
    """A rendered and tokenized turn. ``ids`` is empty and ``skip_reason`` set when the prompt was skipped."""

    text: str
    ids: list[int]
    skip_reason: str | None = None
    n_tokens: int = 0  # before truncation
    truncated: bool = False


TASKS: dict[str, type[Task]] = {}


def register(name: str) -> Callable[[type[Task]], type[Task]]:
    def deco(cls: type[Task]) -> type[Task]:
        cls.name = name
        TASKS[name] = cls
        return cls

    return deco


def get_task(cfg: Any) -> Task:
    """The task named by ``cfg.name``; an unknown name raises ValueError listing the valid names."""
    import mtad.tasks  # noqa: F401  (importing the package registers every task)

    cfg = TaskConfig.from_any(cfg)
    if cfg.name not in TASKS:
        raise ValueError(f"unknown task {cfg.name!r}; valid names: {sorted(TASKS)}")
    return TASKS[cfg.name](cfg)


class Task:
    """Base class: conversation rendering, selection, prompt-length policy and mean aggregation."""

    name: ClassVar[str] = "task"
    metric: str | None = None
    subdir: ClassVar[str] = ""  # folder under the data dir
    supports_few_shot: ClassVar[bool] = False
    user_prefix: ClassVar[str] = "User: "
    assistant_prefix: ClassVar[str] = "Assistant:"

    def __init__(self, cfg: TaskConfig):
        self.cfg = TaskConfig.from_any(cfg)
        if self.cfg.few_shot and not self.supports_few_shot:
            raise ValueError(f"task {self.name!r} has no few-shot examples; set task.few_shot=0")
        self.skipped = 0  # malformed rows skipped while loading
        self.selected_ids: list[str] = []
        self._samples: list[Sample] | None = None

    # ---- loading -------------------------------------------------------------------------------
    def data_dir(self) -> Path:
        return Path(self.cfg.data_dir).expanduser() if self.cfg.data_dir else default_data_dir()

    def data_path(self, default: str | None, use_data_file: bool = True) -> Path:
        """``task.data_file`` if set, else ``<data_dir>/<subdir>/<default>``; a missing file raises."""
        rel = (self.cfg.data_file if use_data_file else None) or (f"{self.subdir}/{default}" if default else None)
        if rel is None:
            raise FileNotFoundError(
                f"task {self.name!r} has no default data file: set task.data_file=PATH "
                f"(or task.source=hub with task.hub_id=...)")
        path = Path(rel).expanduser()
        path = path if path.is_absolute() else self.data_dir() / path
        if not path.is_file():
            raise FileNotFoundError(
                f"task {self.name!r}: data file {path} not found; provide it with task.data_dir=DIR "
                f"(a folder holding {rel}) or MTAD_DATA_DIR, or task.data_file=PATH")
        return path

    def read(self, default_file: str | None, parse: Callable[[dict, int], Any],
             split: str | None = None, path: Path | None = None) -> list:
        """Parsed rows of the evaluated file (or hub split), or of ``split`` (few-shot pool) when given.

        Malformed rows are reported with their location and skipped; those of the evaluated rows are
        counted in ``self.skipped``.
        """
        if self.cfg.source == "hub":
            rows = hub_rows(self.cfg.hub_id, self.cfg.hub_config, split or self.cfg.split)
        else:
            rows = iter_rows(path or self.data_path(default_file, use_data_file=split is None))
        items, skipped = parse_rows(rows, parse)
        if split is None:
            self.skipped += skipped
        return items

    def load(self) -> list[Sample]:
        """Every well-formed sample of the evaluated split, in file order (subclasses implement)."""
        raise NotImplementedError

    def samples(self) -> list[Sample]:
        """Load once, then select ``n_prompts`` samples; their ids are kept in ``selected_ids``."""
        if self._samples is None:
            self._samples = self._select(self.load())
            self.selected_ids = [s.id for s in self._samples]
        return list(self._samples)

    def _select(self, rows: list[Sample]) -> list[Sample]:
        n = self.cfg.n_prompts or len(rows)
        if n > len(rows):
            log.warning("task %s: asked for %d prompts, only %d available", self.name, n, len(rows))
            n = len(rows)
        if self.cfg.selection == "first":
            return rows[:n]
        picked = sorted(random.Random(self.cfg.selection_seed).sample(range(len(rows)), n))
        return [rows[i] for i in picked]

    # ---- rendering -----------------------------------------------------------------------------
    def user_message(self, sample: Sample, turn: int) -> str:
        """The user's message for ``turn`` in a chat prompt."""
        return self.chat_text(sample.turns[turn])

    def chat_text(self, text: str) -> str:
        """Wrap a question (evaluated or few-shot) as a chat message; default: unchanged."""
        return text

    def few_shot_pairs(self) -> list[tuple[str, str]]:
        """(question, answer) pairs for in-context examples; empty unless the task supports them."""
        return []

    def render(self, sample: Sample, tokenizer: Any, turn: int = 0, history: Sequence[str] = (),
               chat: bool = True) -> str:
        """Prompt text for ``turn`` given the previous assistant answers ``history``."""
        self._check_turn(sample, turn, history)
        if chat:
            return self.render_chat(sample, tokenizer, turn, history)
        return self.render_base(sample, turn, history)

    def _check_turn(self, sample: Sample, turn: int, history: Sequence[str]) -> None:
        if not 0 <= turn < len(sample.turns):
            raise ValueError(f"sample {sample.id} has {len(sample.turns)} turn(s); turn={turn} is out of range")
        if len(history) != turn:
            raise ValueError(f"turn {turn} needs {turn} previous answer(s) in history, got {len(history)}")

    def messages(self, sample: Sample, turn: int, history: Sequence[str]) -> list[dict]:
        msgs = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        for question, answer in self.few_shot_pairs():
            msgs += [{"role": "user", "content": self.chat_text(question)}, {"role": "assistant", "content": answer}]
        for t in range(turn):
            msgs += [{"role": "user", "content": self.user_message(sample, t)},
                     {"role": "assistant", "content": history[t]}]
        return msgs + [{"role": "user", "content": self.user_message(sample, turn)}]

    def render_chat(self, sample: Sample, tokenizer: Any, turn: int, history: Sequence[str]) -> str:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
                             "render with chat=False (plain prompts for base models)")
        return tokenizer.apply_chat_template(self.messages(sample, turn, history),
                                             add_generation_prompt=True, tokenize=False)

    def render_base(self, sample: Sample, turn: int, history: Sequence[str]) -> str:
        """``User: ...\\nAssistant: ...`` exchanges (few-shot pairs first), ending with ``Assistant:``."""
        parts = [f"{self.user_prefix}{q}\n{self.assistant_prefix} {a}\n\n" for q, a in self.few_shot_pairs()]
        parts += [f"{self.user_prefix}{sample.turns[t]}\n{self.assistant_prefix} {history[t]}\n\n" for t in range(turn)]
        return "".join(parts) + f"{self.user_prefix}{sample.turns[turn]}\n{self.assistant_prefix}"

    def encode(self, sample: Sample, tokenizer: Any, turn: int = 0, history: Sequence[str] = (),
               chat: bool = True) -> Prompt:
        """Render and tokenize one turn, applying ``max_prompt_tokens`` / ``on_long_prompt``.

        Chat templates already carry their special tokens, so they are tokenized without adding more;
        base prompts get the tokenizer's usual BOS. ``truncate`` keeps the last tokens (and the BOS).
        """
        text = self.render(sample, tokenizer, turn, history, chat)
        ids = list(tokenizer(text, add_special_tokens=not chat)["input_ids"])
        return self.fit(sample, turn, text, ids, getattr(tokenizer, "bos_token_id", None))

    def fit(self, sample: Sample, turn: int, text: str, ids: list[int], bos_id: int | None = None) -> Prompt:
        limit, n = self.cfg.max_prompt_tokens, len(ids)
        if not limit or n <= limit:
            return Prompt(text, ids, None, n)
        if self.cfg.on_long_prompt == "error":
            raise ValueError(f"task {self.name}: prompt {sample.id} turn {turn} has {n} tokens > "
                             f"task.max_prompt_tokens={limit}; raise the limit or set "
                             "task.on_long_prompt=skip|truncate")
        if self.cfg.on_long_prompt == "skip":
            return Prompt(text, [], f"prompt has {n} tokens > max_prompt_tokens={limit}", n)
        keep = ids[:1] + ids[n - limit + 1:] if bos_id is not None and ids[0] == bos_id else ids[n - limit:]
        return Prompt(text, keep, None, n, truncated=True)

    # ---- answers -------------------------------------------------------------------------------
    def postprocess(self, sample: Sample, completion: str) -> str:
        """The part of ``completion`` that is scored (idempotent); default: cut at ``stop`` strings."""
        return cut_at(completion.lstrip(), self.cfg.stop).strip()

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        """Per-sample scores of the raw or postprocessed completion; {} for prompt-only sets."""
        return {}

    def row_info(self) -> dict:
        """Facts about how the run was scored, for the result row's metrics (e.g. HumanEval's sandbox)."""
        return {}

    def aggregate(self, scores: list[dict]) -> dict[str, float]:
        """Mean of each key over the samples that carry it."""
        keys = sorted({k for s in scores for k in s})
        return {k: sum(s[k] for s in scores if k in s) / sum(1 for s in scores if k in s) for k in keys}


def cut_at(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string."""
    end = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:end]

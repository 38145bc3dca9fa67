"""Task configuration, samples, the `Task` base class and the task registry.

A task turns a data file (found by one of three routes, see :meth:`Task.read`; the routes themselves are in
:mod:`mtad.tasks.sources`) into `Sample`s, renders each turn of a sample as prompt text (chat template for
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

from mtad._util.io import file_sha256
from mtad.tasks.records import SkippedRow, hub_fingerprint, hub_rows, iter_rows, parse_rows
from mtad.tasks.sources import DataRoutes

log = logging.getLogger(__name__)


_CHOICES = {
    "source": ("auto", "local", "hub"),
    "selection": ("first", "random"),
    "on_long_prompt": ("skip", "truncate", "error"),
    "schema_format": ("create_table", "compact"),
    "sandbox": ("auto", "namespaces", "uid", "none"),
}


@dataclass(frozen=True)
class TaskConfig:
    """One evaluation task (Hydra structured-config node; every field is a plain type)."""

    name: str = "gsm8k"
    source: str = "auto"  # auto: local, else hub, else a package's copy | local: files | hub: load_dataset
    data_dir: str | None = None  # None -> mtad._util.paths.default_data_dir()
    data_file: str | None = None  # overrides the task's default file; relative paths are under data_dir
    hub_id: str | None = None  # None -> the task's own hub copy (Task.hub), if it has one
    hub_config: str | None = None  # second argument of load_dataset (e.g. "main", "3.0.0")
    split: str = "test"
    n_prompts: int = 10  # 0 = all
    batch_size: int = 1  # prompts decoded together (mtad.generate on a list); > 1 for batching decoders only
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
    sandbox: str = "auto"  # humaneval: auto | namespaces | uid | none (tasks/sandbox/client.py); recorded in the row
    db_dir: str | None = None  # spider: <db_dir>/<db_id>/<db_id>.sqlite -> execution accuracy
    schema_format: str = "create_table"  # spider: create_table | compact ("table(col, col)")

    def __post_init__(self) -> None:
        for key, allowed in _CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"task.{key}={getattr(self, key)!r} is not valid: choose one of {allowed}")
        for key, low in (("n_prompts", 0), ("few_shot", 0), ("max_prompt_tokens", 0), ("memory_mb", 64),
                         ("batch_size", 1)):
            if getattr(self, key) < low:
                raise ValueError(f"task.{key}={getattr(self, key)!r} is out of range: must be >= {low}")
        if self.turns not in (1, 2):
            raise ValueError(f"task.turns={self.turns!r} is not valid: 1 (first turn) or 2 (both turns)")
        if not 0 < self.timeout_s < float("inf"):  # nan too
            raise ValueError(f"task.timeout_s={self.timeout_s!r} is out of range: a finite number of seconds > 0")
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
    skip_kind: str | None = None  # the skip reason without numbers that vary per prompt (for counting)


TASKS: dict[str, type[Task]] = {}


def register(name: str) -> Callable[[type[Task]], type[Task]]:
    def deco(cls: type[Task]) -> type[Task]:
        cls.name = name
        TASKS[name] = cls
        return cls

    return deco


def get_task(cfg: Any) -> Task:
    """The task named by ``cfg.name``; an unknown name raises ValueError listing the valid names."""
    cfg = TaskConfig.from_any(cfg)
    if cfg.name not in TASKS:
        raise ValueError(f"unknown task {cfg.name!r}; valid names: {sorted(TASKS)}")
    return TASKS[cfg.name](cfg)


class Task(DataRoutes):
    """Base class: reading and selection, conversation rendering, prompt-length policy and mean aggregation;
    where the data is found comes from :class:`mtad.tasks.sources.DataRoutes`."""

    name: ClassVar[str] = "task"
    metric: str | None = None
    supports_few_shot: ClassVar[bool] = False
    user_prefix: ClassVar[str] = "User: "
    assistant_prefix: ClassVar[str] = "Assistant:"

    def __init__(self, cfg: TaskConfig):
        self.cfg = TaskConfig.from_any(cfg)
        if self.cfg.few_shot and not self.supports_few_shot:
            raise ValueError(f"task {self.name!r} has no few-shot examples; set task.few_shot=0")
        self.skipped = 0  # rows of the evaluated file skipped while loading (malformed, duplicate id)
        self.skips: list[SkippedRow] = []  # those rows: location, kind, detail
        self.sources: dict[str, str] = {}  # every data file / hub split read -> its content id
        self.data_location: str | None = None  # the evaluated file (or hub split), for messages
        self.selected_ids: list[str] = []
        self.route: str | None = None  # local | hub | package: where the evaluated data was found
        self._path: Path | None = None  # the local or package file of the evaluated data
        self._hub_data: dict[tuple, Any] = {}
        self._samples: list[Sample] | None = None

    # ---- loading -------------------------------------------------------------------------------
    def read(self, default_file: str | None, parse: Callable[[dict, int], Any], split: str | None = None) -> list:
        """Parsed rows of the evaluated data, or of ``split`` (few-shot pool) when given.

        The evaluated data is found once (:meth:`find_route`), by ``task.source``: ``local`` reads
        ``task.data_file`` or ``<data_dir>/<subdir>/<default_file>``; ``hub`` loads ``task.hub_id``;
        ``auto`` takes the first route that has it: that local file, else the hub (``task.hub_id`` or the
        task's own ``hub`` copy), else a copy shipped in an installed package (``package``). A few-shot
        pool is read by the same route. Without data by any route, one FileNotFoundError names them all.

        Malformed rows are reported with their location and skipped. Of the evaluated rows, a row whose
        sample id repeats an earlier row's is skipped too (the first one is kept, both locations logged),
        so that per-prompt pairing across decoders never joins on an ambiguous id; both kinds are counted
        in ``self.skipped`` / ``self.skips`` and end up in the result row's ``skip_reasons``. Every file
        read is hashed into ``self.sources`` (the config hash covers the data's content).
        """
        if split is None:
            route = self.find_route(default_file)
        else:  # a few-shot pool: by the evaluated rows' route (read first), files when that was a package
            route = self.route or ("hub" if self.cfg.source == "hub" else "local")
        if route == "hub":
            hub_id, config, hub_split = self._hub_target(split or self.cfg.split)
            ds = self._load_hub(hub_id, config, hub_split)
            where = f"{hub_id}[{hub_split}]"
            self.sources[f"hub:{where}"] = hub_fingerprint(hub_id, config, hub_split, ds)
            rows = hub_rows(hub_id, hub_split, ds)
        else:
            file = self._path if split is None else self.data_path(default_file, use_data_file=False)
            where = str(file)
            self.note_source(file)
            rows = iter_rows(file)
        parsed, skipped = parse_rows(rows, parse)
        if split is None:
            self.data_location = where
            parsed, duplicates = _drop_duplicate_ids(parsed)
            self.skips += skipped + duplicates
            self.skipped += len(skipped) + len(duplicates)
        return [item for _, item in parsed]

    def resolved_source(self) -> str:
        """``task.source`` as the run took it: ``hub``, or ``local`` for files (a data folder's or a
        package's copy, hashed by content in :meth:`data_fingerprint`). The runner records this in the row
        and the config hash, so ``auto`` hashes as the route it took and rows written before ``auto`` existed
        (``source: local``) still count as done."""
        self.samples()
        return "hub" if self.route == "hub" else "local"

    def note_source(self, path: Path) -> None:
        """Record a local file the task reads (name -> sha256) for :meth:`data_fingerprint`."""
        name, digest = Path(path).name, file_sha256(path)
        while self.sources.get(name, digest) != digest:  # another file of the same name
            name = f"{name}+"
        self.sources[name] = digest

    def data_fingerprint(self) -> dict[str, str]:
        """Content ids of every data file this task reads (sha256 of local files by name; hub id, config,
        split and dataset fingerprint for hub data), including few-shot pools. Goes into the config hash,
        so editing a data file makes a rerun a new configuration."""
        self.samples()
        self.few_shot_pairs()
        return dict(sorted(self.sources.items()))

    def skip_counts(self) -> dict[str, int]:
        """Rows skipped while loading, by kind: ``{"data row: missing field 'prompt'": 2, ...}``."""
        counts: dict[str, int] = {}
        for s in self.skips:
            counts[f"data row: {s.kind}"] = counts.get(f"data row: {s.kind}", 0) + 1
        return counts

    def load(self) -> list[Sample]:
        """Every well-formed sample of the evaluated split, in file order (subclasses implement)."""
        raise NotImplementedError

    def samples(self) -> list[Sample]:
        """Load once, then select ``n_prompts`` samples; their ids are kept in ``selected_ids``.

        A file without one usable row is an error naming the file and the skipped rows' lines."""
        if self._samples is None:
            loaded = self.load()
            if not loaded and self.data_location is not None:
                raise ValueError(self._no_rows_message())
            self._samples = self._select(loaded)
            self.selected_ids = [s.id for s in self._samples]
        return list(self._samples)

    def _no_rows_message(self) -> str:
        if not self.skips:
            return (f"task {self.name}: {self.data_location} holds no usable rows (empty, or none left by "
                    f"task.categories): fix the data file or point task.data_file at the right one")
        kinds = ", ".join(f"{n} {k.removeprefix('data row: ')}" for k, n in self.skip_counts().items())
        loc = self.data_location
        lines = ", ".join(s.where[len(loc):].lstrip(": ") if s.where.startswith(loc) else s.where
                          for s in self.skips[:10])
        more = f" and {len(self.skips) - 10} more" if len(self.skips) > 10 else ""
        return (f"task {self.name}: no usable row in {self.data_location}: all {len(self.skips)} rows were "
                f"skipped ({kinds}); fix the data file at {self.data_location}, lines/rows {lines}{more} "
                f"(each is logged above with the reason)")

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
            return Prompt(text, [], f"prompt has {n} tokens > max_prompt_tokens={limit}", n,
                          skip_kind=f"longer than task.max_prompt_tokens={limit}")
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


def _drop_duplicate_ids(parsed: list[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], list[SkippedRow]]:
    """Keep the first row of every sample id; later rows with the same id are skipped and logged."""
    first: dict[str, str] = {}
    kept, dropped = [], []
    for where, item in parsed:
        sid = getattr(item, "id", None)
        if isinstance(item, Sample) and sid in first:
            detail = f"duplicate id: {sid!r} repeats the row at {first[sid]} (that first row is kept)"
            log.warning("%s: row skipped: %s", where, detail)
            dropped.append(SkippedRow(where, "duplicate id", detail))
            continue
        if isinstance(item, Sample):
            first[sid] = where
        kept.append((where, item))
    return kept, dropped


def cut_at(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string."""
    end = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:end]

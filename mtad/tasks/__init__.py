"""Evaluation tasks: ``get_task(TaskConfig(name=...))``; names in ``TASKS``. Prompt formats: docs/TASKS.md."""
from mtad.tasks import chat, gsm8k, humaneval, jsonl, qa, spider, summarize  # noqa: F401  (register the tasks)
from mtad.tasks.base import TASKS, Prompt, Sample, Task, TaskConfig, get_task, register

__all__ = ["TASKS", "Prompt", "Sample", "Task", "TaskConfig", "get_task", "register"]

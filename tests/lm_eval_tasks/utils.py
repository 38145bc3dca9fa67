"""Loaders for the test tasks: the JSONL files beside this file, read without the hub or a datasets cache.

lm-eval calls ``custom_dataset`` with the task metadata as keyword arguments; they are not needed here.
"""
from __future__ import annotations

import json
from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def _load(name: str) -> datasets.DatasetDict:
    rows = [json.loads(line) for line in (HERE / name).read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def load_gen(**_metadata) -> datasets.DatasetDict:
    return _load("tiny_gen.jsonl")


def load_mc(**_metadata) -> datasets.DatasetDict:
    return _load("tiny_mc.jsonl")

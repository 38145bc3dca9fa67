"""Layer 3: distilling a draft for a target (depends only on models and decoding).

``python -m mtad.train`` (``__main__``) runs ``trainer.Trainer`` on a config (``config``, recipes under
``conf/train/recipe/``). The trainer reads text and prompts (``corpus``), builds the student (``student``),
draws teacher data either every step (``live``) or once into cached shards (``onpolicy``, sampled by
``teacher``), takes ``losses`` against the verification filter, evaluates on held-out prompts (``heldout``)
and exports the draft with its model card (``export``, ``card_*.md``).
"""

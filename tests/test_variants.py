"""The variant lists of the "every decoder" tests (tests/variants.py) come from the registry and conf/decoder/: every
registered decoder has a decoder file, a new variant file joins every list, and an exclusion must name a variant
(controls: a planted registered name is reported missing; a planted variant file is picked up)."""
from __future__ import annotations

import shutil

import pytest
from variants import CONF, conf_variants, missing_from, variants


def test_every_registered_decoder_has_a_decoder_file():
    assert missing_from(conf_variants()) == []
    assert missing_from(conf_variants(), registered=["planted"]) == ["planted"]  # control


def test_a_variant_file_is_a_variant_of_its_base_decoder(tmp_path):
    assert ("speculative", {"accept": "block"}) in conf_variants()
    assert ("mtad", {"proposer": "ngram"}) in conf_variants()
    assert ("greedy", {}) in conf_variants()
    conf = tmp_path / "decoder"
    shutil.copytree(CONF, conf)
    (conf / "planted.yaml").write_text("defaults:\n  - speculative\n  - _self_\naccept: typical\ntypical_alpha: 0.7\n"
                                       "gamma: 9\n")
    found = conf_variants(conf)
    assert ("speculative", {"accept": "typical", "typical_alpha": 0.7}) in found  # gamma: a size the test sets
    assert len(found) == len(conf_variants()) + 1


def test_an_exclusion_must_name_a_variant():
    assert ("sampling", {}) not in variants(without=[("sampling", {})])
    with pytest.raises(ValueError, match="not a variant"):
        variants(without=[("sampling", {"accept": "nothing"})])

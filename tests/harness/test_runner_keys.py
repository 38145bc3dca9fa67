"""A row records only what ran: a decoder key that the chosen decoder does not read is refused (ALGORITHMS.md,
"Keys each decoder reads"), before any work, by the CLI (one ``mtad: error:`` line, exit 2, no files) and by
each job of a multirun (its ``error.json``; the other jobs run; exit 2 at the end).

- Every key the check refuses is truly ignored: decoding with and without it gives the same tokens, for every
  decoder (sampling at T = 1, so a key that mattered would change the draws); a decoder's key list that leaves
  out a key it reads fails the same test (the control).
- Every preset in conf/decoder/ and every job of the published grids passes the check
  (tests/harness/test_config_hashes.py: their hashes are unchanged).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import tinymodels as tm
import torch
from inprocess import run_module
from variants import missing_from, variants

import mtad
from mtad._util.paths import REPO_ROOT
from mtad.decoding import DECODERS, DecoderConfig, core
from mtad.decoding.core import SHARED_KEYS, check_keys, unread_keys
from mtad.harness.store import load_results
from mtad.models.pair import ModelPair

torch.set_num_threads(1)

# a valid value away from the default for every key a decoder may or may not read
OTHER = {"gamma": 7, "accept": "fuzzy", "proposer": "ngram", "ngram_max": 3, "typical_threshold": 0.2,
         "typical_alpha": 0.5, "fuzzy_divergence": "tv", "fuzzy_threshold": 0.1, "tau": 0.3, "beam_width": 2,
         "replacement": False, "mode": "exhaustive", "select": "nucleus", "block_top_p": 0.5, "node_budget": 10 ** 6,
         "reference": "own", "k_config": [2, 2], "tree_width": 2, "tree_nodes": 5}
# every decoder and variant of conf/decoder/ (tests/variants.py), and the exhaustive search's nucleus selection
VARIANTS = variants(("mtjd", {"mode": "exhaustive", "select": "nucleus"}))
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 1, 4]  # repeats: prompt lookup proposes


def pair() -> ModelPair:
    t = tm.model("llama", 1, 32, hidden=16)
    return ModelPair(t, tm.near(t, 5, 0.6))  # a draft that accepts some blocks: tau and the rules matter


def decode(models, cfg: dict, seed: int = 0) -> list[int]:
    c = dict(cfg, max_new_tokens=10, top_k=4, node_budget=cfg.get("node_budget", 10 ** 6))
    return mtad.generate(models, PROMPT, c, torch.Generator().manual_seed(seed)).tokens


def test_every_decoder_is_covered_and_every_key_is_listed():
    assert not missing_from(VARIANTS) and {n for n, _ in VARIANTS} == set(DECODERS)
    fields = {f for f in DecoderConfig.__dataclass_fields__}
    assert fields == set(SHARED_KEYS) | set(OTHER)  # a new key needs a value here (and a place in each decoder's list)


def ignored_but_decoded_differently(models, variants=VARIANTS) -> list[str]:
    """Every (variant, key) the check calls unread whose value changes the tokens (must be none)."""
    bad = []
    for name, extra in variants:
        base = dict(name=name, **extra)
        tokens = {s: decode(models, base, s) for s in (0, 1)}
        for key, value in OTHER.items():
            try:
                cfg = DecoderConfig(**{**base, key: value})
            except ValueError:  # a combination refused on its own (proposer=ngram with a tree decoder)
                continue
            if key in unread_keys(cfg):
                if any(decode(models, {**base, key: value}, s) != tokens[s] for s in (0, 1)):
                    bad.append(f"{name} {extra} {key}={value!r}")
    return bad


def test_every_refused_key_is_truly_ignored(monkeypatch):
    models = pair()
    assert ignored_but_decoded_differently(models) == []
    # control: a key list that leaves out tau (which mtad reads) makes tau look unread, and decoding shows it is read
    reads = core.READS["mtad"]
    monkeypatch.setitem(core.READS, "mtad", lambda cfg: tuple(k for k in reads(cfg) if k != "tau"))
    mtad_variants = [v for v in VARIANTS if v[0] == "mtad"]  # the key lists of the others are unchanged
    assert any(b.startswith("mtad {} tau") for b in ignored_but_decoded_differently(models, mtad_variants))
    # control: mtjd listed among the decoders that do not read gamma makes its gamma look unread; it is read
    monkeypatch.setattr(core, "GAMMA_UNREAD", core.GAMMA_UNREAD | {"mtjd"})
    mtjd_variants = [v for v in VARIANTS if v == ("mtjd", {})]
    assert any(b.startswith("mtjd {} gamma") for b in ignored_but_decoded_differently(models, mtjd_variants))


def test_refusal_names_every_unread_key_and_the_variant_in_one_line():
    with pytest.raises(ValueError) as e:
        check_keys(DecoderConfig(name="mtad", accept="fuzzy"))
    msg = str(e.value)
    assert "decoder.accept='fuzzy'" in msg and "decoder=mtad" in msg and "drop it" in msg and "\n" not in msg
    with pytest.raises(ValueError, match=r"decoder.beam_width=2, decoder.tau=0.3 have no effect with "
                                         r"decoder=speculative \(accept=lossless, proposer=draft\).*drop them"):
        check_keys(DecoderConfig(name="speculative", tau=0.3, beam_width=2))
    check_keys(DecoderConfig(name="speculative", accept="threshold", tau=0.3))  # read: accepted
    check_keys(DecoderConfig(name="greedy", temperature=0.0, top_k=3))  # shared keys are always recorded as set


def test_every_decoder_preset_passes():
    from omegaconf import OmegaConf

    from mtad.harness import sweep

    for path in sorted((REPO_ROOT / "conf" / "decoder").glob("*.yaml")):
        cfg = OmegaConf.to_container(sweep.compose_job([f"decoder={path.stem}"]), resolve=True)["decoder"]
        check_keys(DecoderConfig.from_any(cfg))


# ---- the CLI and a multirun ---------------------------------------------------------------------------------
def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"say hi {i}", "answer": "hi"}) + "\n"
                            for i in range(2)))
    return run_module("mtad", *args, "model=tiny", "task=jsonl", f"task.data_file={data}",  # in this process
                      f"results_dir={tmp_path / 'res'}", "name=t", "warmup=0", "decoder.max_new_tokens=4",
                      cwd=tmp_path, env={"WANDB_MODE": "disabled"})


def test_cli_refuses_an_unread_key_with_one_line_and_no_files(tmp_path):
    out = _cli(tmp_path, "decoder=mtad", "decoder.accept=fuzzy")
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [x for x in out.stderr.splitlines() if x.startswith("mtad: error:")]
    assert len(errors) == 1 and "decoder.accept='fuzzy'" in errors[0] and "decoder=mtad" in errors[0], out.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "p.jsonl"], "a refused run left files"


def test_multirun_refuses_the_job_that_would_not_run_its_key(tmp_path):
    """``-m decoder=speculative,mtad decoder.accept=block``: speculative runs block verification and gets its row;
    the mtad job is refused (its error.json), and the multirun exits 2 naming it."""
    out = _cli(tmp_path, "-m", "decoder=speculative,mtad", "decoder.accept=block")
    assert out.returncode == 2, out.stderr[-2000:]
    rows = load_results(tmp_path / "res" / "t.jsonl")
    assert [(r["decoder"]["name"], r["decoder"]["accept"]) for r in rows] == [("speculative", "block")]
    errors = list((tmp_path / "res" / "multirun").rglob("error.json"))
    assert len(errors) == 1
    record = json.loads(errors[0].read_text())
    assert "decoder=mtad" in record["overrides"] and "decoder.accept='block'" in record["message"]
    assert "1 job(s) of the multirun failed" in out.stderr

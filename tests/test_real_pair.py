"""Smoke test on the real embedded pair: SmolLM2-135M-Instruct + the committed distilled draft.

Part of the default suite (and so of CI): the first run converts the GGUF to the safetensors cache
(~35 s), later runs load it in about a second. Few prompts, few tokens.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import mtad
from mtad.loading import ModelConfig, load_pair
from mtad.paths import REPO_ROOT


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return load_pair(ModelConfig(name="smollm2", kind="smollm2", draft="models/smollm2-draft", device="cpu",
                                 chat_template=True))


def _prompt(pair, text: str) -> list[int]:
    return pair.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"]


def test_committed_draft_loads_and_shares_the_tokenizer(pair):
    assert pair.draft is not None, "models/smollm2-draft is missing: the embedded pair needs its draft"
    assert pair.draft.get_output_embeddings().weight.shape == pair.target.get_output_embeddings().weight.shape
    assert pair.info["draft_own_params"] < 20_000_000


def test_every_decoder_equals_greedy_at_t0_on_the_real_pair(pair):
    ids = _prompt(pair, "What is 12 times 7?")
    ref = mtad.generate(pair, ids, {"name": "greedy", "max_new_tokens": 12}).tokens
    for name in ("speculative", "mtad", "mmtad", "specinfer"):
        out = mtad.generate(pair, ids, {"name": name, "max_new_tokens": 12, "temperature": 0.0})
        assert out.tokens == ref, name


def _alpha(target, draft, ids: list[int], n_prompt: int) -> float:
    """Teacher-forced α = mean Σ_v min(p̃, q̃) over the continuation, under the paper's filter."""
    from mtad.decoding.filter import filter_probs

    with torch.no_grad():
        x = torch.tensor([ids])
        p = filter_probs(target(x).logits[0, n_prompt - 1:-1], 1.0, 10, 0.9)  # (T, V)
        q = filter_probs(draft(x).logits[0, n_prompt - 1:-1], 1.0, 10, 0.9)  # (T, V)
    return float(torch.minimum(p, q).sum(-1).mean())


def test_draft_predicts_the_target_and_a_scrambled_draft_does_not(pair):
    """The distilled draft must actually approximate the target (the model card reports α ≈ 0.33 on
    held-out prompts); negative control: the same draft with its layer weights permuted scores near 0."""
    import copy

    ids = _prompt(pair, "Natalia sold clips to 48 of her friends in April. How many clips did she sell?")
    out = mtad.generate(pair, ids, {"name": "sampling", "max_new_tokens": 40}, torch.Generator().manual_seed(0))
    seq = ids + out.tokens
    trained = _alpha(pair.target, pair.draft, seq, len(ids))
    scrambled = copy.deepcopy(pair.draft)
    with torch.no_grad():
        for w in scrambled.model.layers.parameters():
            if w.dim() == 2:
                w.copy_(w.flatten()[torch.randperm(w.numel(), generator=torch.Generator().manual_seed(0))].view_as(w))
    control = _alpha(pair.target, scrambled, seq, len(ids))
    assert trained > 0.2, trained
    assert control < trained / 2, (control, trained)


def test_cli_runs_mtad_on_the_real_pair(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "mtad", "model=smollm2", "decoder=mtad", "task=gsm8k",
                          "task.n_prompts=1", "task.few_shot=0", "decoder.max_new_tokens=8", "warmup=0",
                          "num_threads=1", f"results_dir={tmp_path}", "name=smoke"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads((tmp_path / "smoke.jsonl").read_text().splitlines()[0])
    assert row["model"]["name"] == "smollm2" and row["n_prompts"] == 1
    assert row["metrics"]["block_efficiency"] >= 1.0 and "accuracy" in row["metrics"]["score"]

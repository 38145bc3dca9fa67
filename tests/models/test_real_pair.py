"""Smoke test on the real embedded pair: SmolLM2-135M-Instruct + the committed distilled draft.

Part of the default suite (and so of CI): the first run converts the GGUF to the safetensors cache
(~35 s), later runs load it in about a second. Few prompts, few tokens.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import mtad
from mtad._util.paths import REPO_ROOT
from mtad.models.load import ModelConfig, load_pair


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


# The committed draft's teacher-forced α on the two sequences below (GSM8K-style and HumanEval-style prompt,
# the target's own 40 sampled tokens), measured at commit time (2026-12-03, this CPU); the bounds leave a
# margin of ~10 %. The previous draft scored 0.556 / 0.259 (it fails the code bound), the scrambled control 0.0.
ALPHA_MEASURED = {"gsm8k": 0.565, "code": 0.317}
ALPHA_BOUND = {"gsm8k": 0.50, "code": 0.28}
PROMPTS = {"gsm8k": "Natalia sold clips to 48 of her friends in April. How many clips did she sell?",
           "code": "Complete the following Python function.\n\n```python\ndef count_vowels(s: str) -> int:\n"
                   "    \"\"\"Return the number of vowels in s.\"\"\"\n```"}


@pytest.fixture(scope="module")
def sequences(pair):
    out = {}
    for name, text in PROMPTS.items():
        ids = _prompt(pair, text)
        r = mtad.generate(pair, ids, {"name": "sampling", "max_new_tokens": 40}, torch.Generator().manual_seed(0))
        out[name] = (ids + r.tokens, len(ids))
    return out


def _scrambled(draft):
    import copy

    scrambled = copy.deepcopy(draft)
    with torch.no_grad():
        for w in scrambled.model.layers.parameters():
            if w.dim() == 2:
                w.copy_(w.flatten()[torch.randperm(w.numel(), generator=torch.Generator().manual_seed(0))].view_as(w))
    return scrambled


def test_draft_predicts_the_target_and_a_scrambled_draft_does_not(pair, sequences):
    """The distilled draft must actually approximate the target (see ALPHA_MEASURED and the model card);
    negative control: the same draft with its layer weights permuted scores far lower."""
    scrambled = _scrambled(pair.draft)
    for name, (seq, n) in sequences.items():
        trained = _alpha(pair.target, pair.draft, seq, n)
        control = _alpha(pair.target, scrambled, seq, n)
        assert trained > ALPHA_BOUND[name], (name, trained)
        assert control < trained / 2, (name, control, trained)


def test_cheap_draft_heads_keep_alpha_and_exactness(pair, sequences):
    """``model.draft_head=reduced_int8`` (kept vocabulary, int8 weights): α close to the full head's, and
    every decoder still equals greedy at T = 0."""
    from mtad.models.draft_head import install_head
    from mtad.models.load import load_tied_draft, resolve_local

    path = resolve_local("models/smollm2-draft")
    cheap = load_tied_draft(path, pair.target)
    install_head(cheap, "reduced_int8", path)
    for name, (seq, n) in sequences.items():
        full, fast = _alpha(pair.target, pair.draft, seq, n), _alpha(pair.target, cheap, seq, n)
        assert fast > full - 0.05, (name, full, fast)
    cheap_pair = copy.copy(pair)
    cheap_pair.draft = cheap
    ids = _prompt(pair, "What is 12 times 7?")
    ref = mtad.generate(pair, ids, {"name": "greedy", "max_new_tokens": 12}).tokens
    for name in ("speculative", "mtad"):
        assert mtad.generate(cheap_pair, ids, {"name": name, "max_new_tokens": 12, "temperature": 0.0}).tokens == ref


def test_cli_runs_mtad_on_the_real_pair(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "mtad", "model=smollm2", "decoder=mtad", "task=gsm8k",
                          "task.n_prompts=1", "task.few_shot=0", "decoder.max_new_tokens=8", "warmup=0",
                          "num_threads=1", f"results_dir={tmp_path}", "name=smoke"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads((tmp_path / "smoke.jsonl").read_text().splitlines()[0])
    # model=smollm2 is the best pair for the machine, recorded under that pair's name
    assert row["model"]["name"] in ("smollm2_bf16_feature", "smollm2_feature") and row["n_prompts"] == 1
    assert row["model"]["draft"] == "models/smollm2-feature-draft"
    assert row["metrics"]["block_efficiency"] >= 1.0 and "accuracy" in row["metrics"]["score"]


# ----------------------------------------------------------------------------------------- the feature draft
FEATURE_DRAFT = "models/smollm2-feature-draft"


@pytest.fixture(scope="module")
def feature_draft(pair):
    from mtad.models.load import load_tied_draft, resolve_local

    return load_tied_draft(resolve_local(FEATURE_DRAFT), pair.target)


def _feature_alpha(target, draft, ids: list[int], n_prompt: int) -> float:
    """Teacher-forced α of a feature draft at depth 1: position t reads the target's final hidden state at
    t - 1 (what ``Session.link`` hands it for committed text), same filter as :func:`_alpha`."""
    from mtad.decoding.filter import filter_probs

    with torch.no_grad():
        x = torch.tensor([ids])
        out = target(x, output_hidden_states=True)
        f = out.hidden_states[-1]  # (1, L, D) after the final norm: the head's input
        parent = torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], 1)
        p = filter_probs(out.logits[0, n_prompt - 1:-1], 1.0, 10, 0.9)
        q = filter_probs(draft(x, features=parent).logits[0, n_prompt - 1:-1], 1.0, 10, 0.9)
    return float(torch.minimum(p, q).sum(-1).mean())


def _scrambled_feature(draft):
    scrambled = copy.deepcopy(draft)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in list(scrambled.model.layers.parameters()) + [scrambled.fc.weight]:
            if w.dim() == 2:
                w.copy_(w.flatten()[torch.randperm(w.numel(), generator=g)].view_as(w))
    return scrambled


# The committed feature draft's depth-1 α on the same two sequences, measured at commit time (2026-12-06, step 937 of
# its fifth run; run 4's export scored 0.761 / 0.522, run 3's 0.724 / 0.503, run 2's 0.694 / 0.386, run 1's
# 0.688 / 0.424); bounds ~10 % below. The token draft above scores 0.565 / 0.317 on them: the bounds are above
# those, so the test fails if the feature draft's features are ignored or it falls back to the token draft's
# quality. The scrambled control scores 0.0.
FEATURE_ALPHA_MEASURED = {"gsm8k": 0.842, "code": 0.554}
FEATURE_ALPHA_BOUND = {"gsm8k": 0.75, "code": 0.50}


def test_feature_draft_reads_the_target_and_a_scrambled_one_does_not(pair, feature_draft, sequences):
    """The committed feature draft beats its α bound with the target's real features; negative controls: the
    same draft with zero features (the information it reads removed) and with permuted weights score lower."""
    scrambled = _scrambled_feature(feature_draft)
    for name, (seq, n) in sequences.items():
        trained = _feature_alpha(pair.target, feature_draft, seq, n)
        control = _feature_alpha(pair.target, scrambled, seq, n)
        assert trained > FEATURE_ALPHA_BOUND[name], (name, trained)
        assert control < trained / 2, (name, control, trained)


def test_feature_draft_decodes_through_the_link_and_a_scrambled_one_is_rejected(pair, feature_draft):
    """End to end through ``Session.link`` on the real pair: T = 0 stays greedy; speculative sampling (γ = 4)
    accepts the trained feature draft's tokens far more often than the scrambled control's (32 tokens, seed 0:
    0.30 against 0.0 at the time of writing)."""
    ids = _prompt(pair, PROMPTS["gsm8k"])
    rates = {}
    for label, draft in (("trained", feature_draft), ("scrambled", _scrambled_feature(feature_draft))):
        p = copy.copy(pair)
        p.draft = draft
        r = mtad.generate(p, ids, {"name": "speculative", "max_new_tokens": 32, "gamma": 4},
                          torch.Generator().manual_seed(0))
        rates[label] = r.acceptance_rate
    assert rates["trained"] > 0.05 and rates["scrambled"] < rates["trained"] / 3, rates
    fpair = copy.copy(pair)
    fpair.draft = feature_draft
    ref = mtad.generate(pair, ids, {"name": "greedy", "max_new_tokens": 12}).tokens
    for name in ("speculative", "mtad"):
        assert mtad.generate(fpair, ids, {"name": name, "max_new_tokens": 12, "temperature": 0.0}).tokens == ref, name

"""Metrics against hand computations and a tiny in-process Llama (no hub access)."""
from __future__ import annotations

import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mtad.decoding.result import DecodeResult  # noqa: E402
from mtad.measure.energy import EnergyReading  # noqa: E402
from mtad.measure.metrics import perplexity, run_metrics, sequence_logprobs  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3)  # large init: peaked, clearly non-uniform distributions
    return LlamaForCausalLM(cfg).eval()


def oracle_logprobs(model, prompt, output, warp=lambda logits: logits):
    """Cache-free, one forward per token: log softmax(warp(logits)) of each output token."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for y in output:
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            out.append(torch.log_softmax(warp(logits.float()), -1)[y].item())
            ids.append(y)
    return torch.tensor(out)


def rollout(model, prompt, n, pick):
    """Continue ``prompt`` for n tokens choosing ``pick(logits)`` (argmax or argmin) each step."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(pick(model(input_ids=torch.tensor([ids])).logits[0, -1])))
    return ids[len(prompt):]


PROMPT = [1, 5, 9, 2]


def test_sequence_logprobs_matches_per_token_oracle(tiny_llama):
    output = [3, 17, 4, 4, 30, 0]
    lp = sequence_logprobs(tiny_llama, torch.tensor([PROMPT]), output)
    assert lp.shape == (6,) and lp.dtype == torch.float32
    torch.testing.assert_close(lp, oracle_logprobs(tiny_llama, PROMPT, output), atol=1e-5, rtol=1e-5)
    # off by one position would score different tokens
    assert not torch.allclose(lp[1:], oracle_logprobs(tiny_llama, PROMPT + [3], output[:-1]) - 1.0)


def test_raw_target_not_filtered(tiny_llama):
    output = rollout(tiny_llama, PROMPT, 5, torch.argmin)  # tokens the target itself ranks last
    lp = sequence_logprobs(tiny_llama, PROMPT, output)
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp, oracle_logprobs(tiny_llama, PROMPT, output), atol=1e-5, rtol=1e-5)

    def top1(logits):  # what a top_k=1 filtered target would give
        return logits.masked_fill(logits < logits.max(), -math.inf)

    assert torch.isinf(oracle_logprobs(tiny_llama, PROMPT, output, top1)).all()
    tempered = oracle_logprobs(tiny_llama, PROMPT, output, lambda x: x / 0.5)
    assert (tempered < lp - 1e-3).all()  # temperature 0.5 would also change the number


def test_likely_text_has_lower_perplexity(tiny_llama):
    greedy = rollout(tiny_llama, PROMPT, 8, torch.argmax)
    worst = rollout(tiny_llama, PROMPT, 8, torch.argmin)
    p_good = perplexity([sequence_logprobs(tiny_llama, PROMPT, greedy)])
    p_bad = perplexity([sequence_logprobs(tiny_llama, PROMPT, worst)])
    assert p_good["ppl_mean_logprob"] < p_bad["ppl_mean_logprob"] / 2
    assert 1.0 <= p_good["ppl_token_weighted"] < 32  # below uniform over the vocabulary


def test_sequence_logprobs_input_checks(tiny_llama):
    assert sequence_logprobs(tiny_llama, PROMPT, []).shape == (0,)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        sequence_logprobs(tiny_llama, [], [1, 2])
    with pytest.raises(ValueError, match="one prompt at a time"):
        sequence_logprobs(tiny_llama, [[1, 2], [3, 4]], [1])


def test_perplexity_aggregations_by_hand():
    samples = [torch.log(torch.tensor([0.5, 0.25])), torch.log(torch.tensor([0.5])), torch.zeros(0)]
    p = perplexity(samples)
    # m_1 = log(1/8)/2, m_2 = log(1/2): exp(-(m_1+m_2)/2) = (sqrt(8) * 2) ** 0.5
    assert p["ppl_mean_logprob"] == pytest.approx((math.sqrt(8) * 2) ** 0.5)
    # token-weighted: (1 / (0.5 * 0.25 * 0.5)) ** (1/3) = 16 ** (1/3)
    assert p["ppl_token_weighted"] == pytest.approx(16 ** (1 / 3))
    assert p["ppl_n_samples"] == 2  # the empty sample is excluded
    assert p["ppl_mean_logprob"] != pytest.approx(p["ppl_token_weighted"])
    assert perplexity([torch.zeros(0)]) == {"ppl_mean_logprob": None, "ppl_token_weighted": None,
                                            "ppl_n_samples": 0}
    assert perplexity([torch.tensor([0.0, -math.inf])])["ppl_token_weighted"] == math.inf


def two_speculative_results():
    # gamma = 4. Prompt 1: iteration 1 accepts 3 of 4 (+ bonus), iteration 2 accepts 0 (+ bonus).
    r1 = DecodeResult(tokens=[1, 2, 3, 4, 5], target_forwards=2, draft_forwards=8, accepted=[3, 0],
                      proposed=[4, 4], position_accepts=[1, 1, 1, 0], position_proposals=[2, 2, 2, 2],
                      wall_time_s=0.5, forward_time_s=0.4, stop_reason="eos")
    # Prompt 2: 2 drafts near max_new_tokens, both accepted, then the bonus.
    r2 = DecodeResult(tokens=[6, 7, 8], target_forwards=1, draft_forwards=2, accepted=[2], proposed=[2],
                      position_accepts=[1, 1], position_proposals=[1, 1], wall_time_s=0.25,
                      forward_time_s=0.2)
    return [r1, r2]


def test_run_metrics_by_hand():
    m = run_metrics(two_speculative_results(), gamma=4, energy=EnergyReading(4.0, "nvml", None, {"nvml:0": 4.0}))
    assert m["total_tokens"] == 8 and m["n_samples"] == 2 and m["stop_eos"] == 1
    assert m["total_decode_s"] == pytest.approx(0.75)
    assert m["ms_per_token"] == pytest.approx(750 / 8)
    assert m["tokens_per_s"] == pytest.approx(8 / 0.75)
    assert m["block_efficiency"] == pytest.approx(8 / 3)  # not the mean of 5/2 and 3/1
    assert (m["target_forwards"], m["draft_forwards"]) == (3, 10)
    assert m["acceptance_rate"] == pytest.approx(5 / 10)
    assert m["mean_accepted_length"] == pytest.approx(5 / 3)
    assert m["per_position_acceptance"] == pytest.approx([2 / 3, 2 / 3, 1 / 2, 0.0])
    assert m["energy_j"] == 4.0 and m["energy_j_per_token"] == pytest.approx(0.5)
    assert m["energy_source"] == "nvml" and m["forward_time_s"] == pytest.approx(0.6)


def test_run_metrics_non_draft_decoder_and_missing_energy():
    greedy = [DecodeResult(tokens=[1, 2, 3], target_forwards=3, wall_time_s=0.3)]
    m = run_metrics(greedy)
    assert m["acceptance_rate"] is None and m["per_position_acceptance"] is None
    assert m["mean_accepted_length"] is None and m["block_efficiency"] == pytest.approx(1.0)
    assert m["energy_j"] is None and m["energy_j_per_token"] is None
    assert m["energy_reason"] == "energy not measured"
    none = run_metrics(greedy, energy=EnergyReading(None, None, "no NVML: NVMLError_LibraryNotFound"))
    assert none["energy_j_per_token"] is None and "LibraryNotFound" in none["energy_reason"]
    empty = run_metrics([])
    assert empty["total_tokens"] == 0 and empty["ms_per_token"] is None and empty["block_efficiency"] is None


def test_run_metrics_per_prompt_energy_windows_and_gamma_checks():
    rs = two_speculative_results()
    windows = [EnergyReading(1.0, "rapl"), EnergyReading(3.0, "rapl")]
    assert run_metrics(rs, energy=windows)["energy_j_per_token"] == pytest.approx(0.5)
    assert run_metrics(rs, energy=windows[:1] + [EnergyReading(None, None, "x")])["energy_j"] is None
    assert run_metrics(rs)["per_position_acceptance"] == pytest.approx([2 / 3, 2 / 3, 1 / 2, 0.0])
    assert run_metrics(rs, gamma=5)["per_position_acceptance"][-1] is None  # never proposed
    with pytest.raises(ValueError, match="gamma"):
        run_metrics(rs, gamma=2)


# ------------------------------------------------------------------------------------------- diversity
def test_distinct_n_on_hand_written_texts():
    from mtad.measure.metrics import distinct_n, diversity, repeated_ngram_rate

    texts = ["the cat sat on the mat", "the cat ran"]
    # unigrams: the cat sat on the mat the cat ran -> 9 in all, distinct {the, cat, sat, on, mat, ran} = 6
    assert distinct_n(texts, 1) == pytest.approx(6 / 9)
    # bigrams: (the cat)(cat sat)(sat on)(on the)(the mat) + (the cat)(cat ran): 7, distinct 6
    assert distinct_n(texts, 2) == pytest.approx(6 / 7)
    assert distinct_n(texts, 3) == pytest.approx(5 / 5)  # 4 + 1 trigrams, all different
    assert distinct_n(["a b"], 3) is None
    # a looping sample: "a b c a b c a b c" has 7 trigrams, 3 distinct -> 4/7 repeat an earlier one
    assert repeated_ngram_rate("a b c a b c a b c", 3) == pytest.approx(4 / 7)
    assert repeated_ngram_rate("one two three four", 3) == 0.0 and repeated_ngram_rate("too short", 3) is None
    d = diversity(["a b c a b c a b c", "x y z w", "hi"])
    assert d["rep_3"] == pytest.approx((4 / 7 + 0.0) / 2)  # "hi" has no trigram: left out
    assert d["distinct_1"] == pytest.approx(8 / 14)
    # token ids work the same way as words
    assert diversity([[1, 2, 3, 1, 2, 3, 1, 2, 3]])["rep_3"] == pytest.approx(4 / 7)
    # negative control: repetitive text scores lower on distinct-2 than varied text of the same length
    assert distinct_n(["go go go go go go"], 2) < distinct_n(["we go to the big city"], 2)


def test_run_metrics_sum_forward_shapes():
    rs = two_speculative_results()
    rs[0].calls, rs[1].calls = {"target:seq:1x5": 2, "draft:seq:1x1": 8}, {"target:seq:1x5": 1}
    assert run_metrics(rs)["forward_calls"] == {"draft:seq:1x1": 8, "target:seq:1x5": 3}

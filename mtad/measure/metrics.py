"""The numbers in every table (ALGORITHMS.md, METRICS).

- ``sequence_logprobs`` / ``perplexity``: output perplexity under the RAW target (T = 1, no top-k/top-p),
  scored after the timed decode, never inside it.
- ``run_metrics``: latency, block efficiency, acceptance and energy aggregated over the prompts of a run,
  and ``forward_calls`` (every forward's shape, summed; the cost model's counts, :mod:`mtad.measure.costmodel`).
- ``acceptance_profile``: per-position conditional and marginal acceptance, the acceptance-length histogram
  and the consistency check of SPEED-Bench's speculation profile (VERIFIERS.md §5), in every
  speculative-family row (``mtad.report.speculation`` exports it).
- ``diversity``: distinct-1/2/3 over a run's outputs and the repeated-trigram rate per sample, so that a
  lower perplexity that comes from repetitive text shows.

Glossary for shape comments: B batch, T sequence, V vocab.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

import torch

from mtad.decoding.result import DecodeResult
from mtad.measure.energy import EnergyReading, combine_readings


def _as_ids(ids: Any, what: str) -> torch.Tensor:
    """A 1-D LongTensor from a list, a (T,) tensor or a (1, T) tensor."""
    t = torch.as_tensor(ids, dtype=torch.long)
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids (or shape (1, T)); got shape "
                         f"{tuple(t.shape)}: score one prompt at a time")
    return t


@torch.no_grad()
def sequence_logprobs(target_model: Any, prompt_ids: Any, output_ids: Any) -> torch.Tensor:
    """``log p(y_t | prompt, y_<t)`` for every output token, under the raw target (no temperature, no
    filter): one forward pass over ``prompt + output``. Returns a float32 CPU tensor of shape (T_out,)."""
    prompt, output = _as_ids(prompt_ids, "prompt_ids"), _as_ids(output_ids, "output_ids")
    if prompt.numel() == 0:
        raise ValueError("prompt_ids is empty: the first output token has no context to be scored "
                         "against; include at least a BOS token in the prompt")
    if output.numel() == 0:
        return torch.zeros(0, dtype=torch.float32)
    device = next(target_model.parameters()).device
    ids = torch.cat([prompt, output]).unsqueeze(0).to(device)  # (1, T)
    logits = target_model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    n_p = prompt.numel()
    logp = torch.log_softmax(logits[0, n_p - 1: -1].float(), dim=-1)  # (T_out, V): positions predicting y_t
    # a target sharded by device_map emits logits on its last device, not on its first parameter's
    return logp.gather(-1, output.to(logp.device).unsqueeze(-1)).squeeze(-1).cpu()  # (T_out,)


def perplexity(per_sample_logprobs: Sequence[torch.Tensor]) -> dict:
    """Two aggregations of output perplexity (METRICS):

    - ``ppl_mean_logprob`` = exp(-mean_i m_i), m_i = mean_t log p(y_t | ...) of sample i (the paper's);
    - ``ppl_token_weighted`` = exp(-sum log p / sum T_i).

    Samples with no generated token have no m_i and are excluded from both (``ppl_n_samples`` counts the
    ones used). With no scorable sample both values are None. A token of probability 0 gives +inf.
    """
    kept = [torch.as_tensor(lp, dtype=torch.float64) for lp in per_sample_logprobs]
    kept = [lp for lp in kept if lp.numel() > 0]
    if not kept:
        return {"ppl_mean_logprob": None, "ppl_token_weighted": None, "ppl_n_samples": 0}
    mean_m = sum(lp.mean().item() for lp in kept) / len(kept)
    total = sum(lp.sum().item() for lp in kept)
    n_tokens = sum(lp.numel() for lp in kept)
    return {"ppl_mean_logprob": _exp_neg(mean_m), "ppl_token_weighted": _exp_neg(total / n_tokens),
            "ppl_n_samples": len(kept)}


def _exp_neg(x: float) -> float:
    return math.inf if -x > 709 else math.exp(-x)  # 709 ~ log(float max)


def run_metrics(decode_results: Sequence[DecodeResult], gamma: Optional[int] = None,
                energy: EnergyReading | Iterable[EnergyReading] | None = None) -> dict:
    """Aggregate the run's ``DecodeResult`` records (METRICS). Ratios are ratios of sums, not means of
    per-prompt ratios. ``acceptance_rate``, ``per_position_acceptance`` and ``mean_accepted_length`` are
    None for decoders that propose no draft tokens. ``per_position_acceptance`` has ``gamma`` entries when
    gamma is given (None where a position was never proposed). ``energy`` is one reading for the whole
    window, or one per prompt (summed)."""
    rs = list(decode_results)
    tokens = sum(r.num_tokens for r in rs)
    seconds = sum(r.wall_time_s for r in rs)
    target_fw, draft_fw = sum(r.target_forwards for r in rs), sum(r.draft_forwards for r in rs)
    accepted = [a for r in rs for a in r.accepted]
    proposed = sum(p for r in rs for p in r.proposed)
    out = {
        "n_samples": len(rs),
        "total_tokens": tokens,
        "total_decode_s": seconds,
        "forward_time_s": sum(r.forward_time_s for r in rs),
        "total_cpu_s": sum(r.cpu_time_s for r in rs),
        "ms_per_token": 1e3 * seconds / tokens if tokens else None,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "target_forwards": target_fw,
        "draft_forwards": draft_fw,
        "block_efficiency": tokens / target_fw if target_fw else None,
        "acceptance_rate": sum(accepted) / proposed if proposed else None,
        "mean_accepted_length": sum(accepted) / len(accepted) if accepted and proposed else None,
        "per_position_acceptance": _per_position(rs, gamma) if proposed else None,
        "acceptance_profile": acceptance_profile(rs) if proposed else None,
        "stop_eos": sum(r.stop_reason == "eos" for r in rs),
        "forward_calls": _sum_calls(rs),
        "forward_call_cpu_s": _sum_calls(rs, "call_cpu_s"),
    }
    out.update(energy_metrics(energy, tokens))
    return out


def _sum_calls(rs: Sequence[DecodeResult], field: str = "calls") -> dict[str, float]:
    """``calls`` (forwards by shape) or ``call_cpu_s`` (their CPU seconds) summed over the results."""
    total: dict[str, float] = {}
    for r in rs:
        for key, n in getattr(r, field, {}).items():
            total[key] = total.get(key, 0) + n
    return dict(sorted(total.items()))


def _per_position(rs: Sequence[DecodeResult], gamma: Optional[int]) -> list[Optional[float]]:
    """sum_r position_accepts[j] / sum_r position_proposals[j] for j = 1..gamma."""
    n = gamma if gamma is not None else max((len(r.position_proposals) for r in rs), default=0)
    acc, prop = [0] * n, [0] * n
    for r in rs:
        if len(r.position_proposals) > n or len(r.position_accepts) > n:
            raise ValueError(f"a DecodeResult has {len(r.position_proposals)} draft positions but "
                             f"gamma={gamma}: pass the decoder's gamma (or None to infer it)")
        for j, (a, p) in enumerate(zip(r.position_accepts, r.position_proposals)):
            acc[j] += a
            prop[j] += p
    return [a / p if p else None for a, p in zip(acc, prop)]


MEAN_CONSISTENCY_TOLERANCE = 0.02  # |AL - (1 + Σ marginals)|, SPEED-Bench's specdec_bench tolerance


def acceptance_profile(decode_results: Sequence[DecodeResult]) -> dict:
    """The acceptance profile of a speculative-family run (VERIFIERS.md §5, SPEED-Bench's conventions).

    Over every verification step of every prompt (``DecodeResult.accepted``/``proposed``): the histogram of
    the acceptance length L = τ + 1 (tokens a step commits, the correction or bonus included; keys "1".."K+1"),
    ``marginal_accept_rates[i]`` = P(τ >= i+1), ``conditional_accept_rates[i]`` = P(τ >= i+1 | τ >= i) (0
    where no step reached i), ``mean_accept_length`` = mean L per step, ``mean_accept_length_per_request``
    (the mean of per-prompt means), K = the longest block proposed; ``truncated_steps`` proposed fewer than K
    (the last blocks of a prompt, a prompt-lookup miss), and they count as steps. ``mean_consistency``
    checks AL = 1 + Σ marginals within :data:`MEAN_CONSISTENCY_TOLERANCE` (:func:`check_profile`)."""
    taus = [a for r in decode_results for a in r.accepted]
    K = max((p for r in decode_results for p in r.proposed), default=0)
    hist = [0] * (K + 1)
    for a in taus:
        hist[a] += 1
    n = len(taus)
    reach = [sum(hist[i:]) / n for i in range(1, K + 1)] if n else [0.0] * K  # P(τ >= i), i = 1..K
    cond = [(reach[i] / (reach[i - 1] if i else 1.0)) if (i == 0 or reach[i - 1] > 0) else 0.0 for i in range(K)]
    per_req = [sum(r.accepted) / len(r.accepted) + 1 for r in decode_results if r.accepted]
    profile = {"num_speculative_tokens": K, "steps": n,
               "truncated_steps": sum(p < K for r in decode_results for p in r.proposed),
               "acceptance_length_histogram": {str(L + 1): c for L, c in enumerate(hist)},
               "conditional_accept_rates": cond, "marginal_accept_rates": reach,
               "mean_accept_length": (sum(taus) + n) / n if n else None,
               "mean_accept_length_per_request": sum(per_req) / len(per_req) if per_req else None}
    return {**profile, "mean_consistency": check_profile(profile)}


def check_profile(profile: dict, tolerance: float = MEAN_CONSISTENCY_TOLERANCE) -> dict:
    """SPEED-Bench's ``mean_consistency``: the mean acceptance length implied by the marginals, 1 + Σ_i
    marginal[i], against the reported per-step mean; passes within ``tolerance``. It catches a vector cut
    short (an understated K) or figures that were not measured together."""
    implied = 1 + sum(profile.get("marginal_accept_rates") or [])
    reported = profile.get("mean_accept_length")
    delta = abs(implied - reported) if reported is not None else None
    return {"implied_mean_accept_length": implied, "reported_mean_accept_length": reported,
            "abs_delta": delta, "tolerance": tolerance, "passed": delta is not None and delta <= tolerance}


def energy_metrics(energy: EnergyReading | Iterable[EnergyReading] | None, tokens: int) -> dict:
    """``energy_j``, ``energy_j_per_token``, ``energy_source``, ``energy_reason``; None-safe."""
    if energy is None:
        return {"energy_j": None, "energy_j_per_token": None, "energy_source": None,
                "energy_reason": "energy not measured", "energy_per_device_j": {}}
    reading = energy if isinstance(energy, EnergyReading) else combine_readings(energy)
    j = reading.joules
    return {"energy_j": j, "energy_j_per_token": j / tokens if j is not None and tokens else None,
            "energy_source": reading.source, "energy_reason": reading.reason,
            "energy_per_device_j": dict(reading.per_device)}


# ------------------------------------------------------------------------------------------- diversity
DISTINCT_N = (1, 2, 3)
REPEAT_N = 3


def _units(output: Any) -> list:
    """A text is split on whitespace (words); a sequence of token ids is used as it is."""
    return output.split() if isinstance(output, str) else list(output)


def ngrams(units: Sequence, n: int) -> list[tuple]:
    return [tuple(units[i:i + n]) for i in range(len(units) - n + 1)]


def distinct_n(outputs: Iterable[Any], n: int) -> float | None:
    """distinct-n (Li et al. 2016) over a run: distinct n-grams / all n-grams, pooled over the outputs
    (an n-gram shared by two outputs counts once). None when no output is n units long."""
    grams = [g for o in outputs for g in ngrams(_units(o), n)]
    return len(set(grams)) / len(grams) if grams else None


def repeated_ngram_rate(output: Any, n: int = REPEAT_N) -> float | None:
    """Share of one output's n-grams that repeat an n-gram seen earlier in the same output
    (1 - distinct/total within the sample; seq-rep-n of Welleck et al. 2020). None when shorter than n."""
    grams = ngrams(_units(output), n)
    return 1 - len(set(grams)) / len(grams) if grams else None


def diversity(outputs: Sequence[Any]) -> dict:
    """``distinct_1/2/3`` over the run's outputs (texts split on whitespace, or token-id sequences) and
    ``rep_3`` = the mean over samples of :func:`repeated_ngram_rate` (samples shorter than 3 left out)."""
    out: dict = {f"distinct_{n}": distinct_n(outputs, n) for n in DISTINCT_N}
    reps = [r for o in outputs if (r := repeated_ngram_rate(o, REPEAT_N)) is not None]
    out[f"rep_{REPEAT_N}"] = sum(reps) / len(reps) if reps else None
    return out

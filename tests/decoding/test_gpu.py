"""CUDA checks (``pytest -m gpu``; run by ``make gpu-check``). Every test skips cleanly without CUDA.

- every decoder at T = 0 equals greedy on CUDA with fp16 tiny models (a difference is tolerated only at an
  fp16 near-tie of the target's top-2 logits, which is reported), and sampling at T = 1 does not (control);
- a real two-device pair (CUDA target, CPU draft; CUDA or CPU generator) obeys the device rule of
  mtad/decoding/core.py: drafted decoders at T = 0 equal greedy, and T = 1 runs;
- the NVML energy counter gives a positive reading around CUDA work, and the runner records it in a row.
"""
from __future__ import annotations

import pytest
import torch

from mtad.decoding.core import DECODERS, NEEDS_DRAFT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

NEW_TOKENS = 24
TIE = 0.05  # fp16 logits: top-2 gaps below this may flip between a 1-token and a multi-token forward


@pytest.fixture(scope="module")
def cuda_pair():
    from mtad.models.tiny import tiny_pair

    pair = tiny_pair("llama", seed=0)
    pair.target = pair.target.to("cuda", torch.float16)
    pair.draft = pair.draft.to("cuda", torch.float16)
    return pair


def _prompt(pair) -> list[int]:
    return pair.tokenizer("def add(a, b):\n    return", add_special_tokens=False)["input_ids"]


def _decode(pair, name: str, temperature: float = 0.0, seed: int = 0) -> list[int]:
    from mtad import generate

    rng = torch.Generator(device="cuda").manual_seed(seed)
    cfg = {"name": name, "max_new_tokens": NEW_TOKENS, "temperature": temperature}
    return generate(pair, _prompt(pair), cfg, rng).tokens


def _top2_gap(pair, ids: list[int]) -> float:
    with torch.no_grad():
        logits = pair.target(torch.tensor([ids], device="cuda")).logits[0, -1].float()  # (V,)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("name", sorted(set(DECODERS) - {"greedy"}))  # every registered decoder against greedy
def test_decoders_at_t0_equal_greedy_on_cuda_fp16(cuda_pair, name):
    ref, out = _decode(cuda_pair, "greedy"), _decode(cuda_pair, name)
    if out != ref:
        i = next((k for k, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
        gap = _top2_gap(cuda_pair, _prompt(cuda_pair) + ref[:i])
        assert gap < TIE, f"{name} left greedy at token {i} where the top-2 logit gap is {gap:.3f} (not a tie)"
        pytest.xfail(f"{name} left greedy at an fp16 near-tie (gap {gap:.4f}) at token {i}")


@pytest.fixture(scope="module")
def split_pair():
    """A real two-device pair on one GPU: fp32 target on CUDA, fp32 draft on the CPU."""
    from mtad.models.tiny import tiny_pair

    pair = tiny_pair("llama", seed=0)
    pair.target = pair.target.to("cuda")
    return pair


DRAFTED = sorted(NEEDS_DRAFT)  # every registered decoder that drafts with a model


@pytest.mark.parametrize("rng_device", ["cuda", "cpu"])
@pytest.mark.parametrize("name", DRAFTED)
def test_cpu_draft_beside_cuda_target(split_pair, name, rng_device):
    """The device rule with real devices: the draft's logits come from the CPU, the target's from CUDA, and
    the decode device is the generator's (CUDA, or the CPU). T=0 equals the target's greedy decode (fp32:
    no near-tie allowance), and T=1 runs through every accept path."""
    from mtad import generate

    prompt = _prompt(split_pair)
    cfg = {"name": name, "max_new_tokens": NEW_TOKENS, "temperature": 0.0}
    ref = generate(split_pair, prompt, {**cfg, "name": "greedy"}, torch.Generator(device="cuda")).tokens
    out = generate(split_pair, prompt, cfg, torch.Generator(device=rng_device).manual_seed(0))
    assert out.tokens == ref
    sampled = generate(split_pair, prompt, {**cfg, "temperature": 1.0}, torch.Generator(device=rng_device))
    assert 1 <= len(sampled.tokens) <= NEW_TOKENS and sum(sampled.proposed) > 0


def test_sampling_is_not_greedy_control(cuda_pair):
    ref = _decode(cuda_pair, "greedy")
    assert any(_decode(cuda_pair, "sampling", temperature=1.0, seed=s) != ref for s in range(3))


def test_nvml_energy_reading_is_positive_around_cuda_work():
    from mtad.measure.energy import EnergyMeter, cuda_sync

    meter = EnergyMeter([torch.cuda.current_device()])
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    meter.start()
    for _ in range(200):  # ~0.5-2 s of matmuls: several updates of the NVML counter
        a = torch.tanh(a @ a)
    cuda_sync([a.device])
    reading = meter.stop()
    assert reading.source == "nvml", reading.reason
    assert reading.joules is not None and reading.joules > 0


def test_runner_records_nvml_energy_on_cuda(tmp_path):
    from hydra import compose, initialize_config_dir

    from mtad._util.paths import REPO_ROOT
    from mtad.harness.config import register_configs
    from mtad.harness.runner import run

    register_configs()
    overrides = ["model=tiny", "model.device=cuda", "model.dtype=float16", "decoder=mtad", "task=mt_bench",
                 "task.n_prompts=2", "decoder.max_new_tokens=16", "warmup=1", f"results_dir={tmp_path}",
                 "name=gpu_test"]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        row = run(compose(config_name="config", overrides=overrides), run_dir=tmp_path / "run")
    m = row["metrics"]
    assert m["energy_source"] == "nvml" and m["energy_j"] is not None and m["energy_j"] > 0
    assert m["energy_j_per_token"] > 0
    assert torch.cuda.get_device_name(0) in row["device_name"]

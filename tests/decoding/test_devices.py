"""The device rule (mtad/decoding/core.py, "Device rule") on a CPU-only machine, with two fake GPUs.

The target's logits are reported on fake ``cuda:1`` (its last layer's GPU under ``device_map``), the draft's
on fake ``cuda:0``, the generator is on the CPU (the decode device here). :class:`fakedevice.FakeDevices`
checks every torch op the way CUDA does, so a decoder that combines tensors of two devices raises, as it
would on GPUs. What this proves: no decoder or helper combines a probability, an index, a uniform or a draw
from different devices, whatever device each model emits its logits on. What only GPUs can prove: real
copies and kernels, a KV cache spread over GPUs by accelerate, CUDA generators, and speed.
"""
from __future__ import annotations

import functools

import fakedevice as fd
import pytest
import tinymodels as tm
import torch
from variants import variants

import mtad
from mtad.decoding import core
from mtad.decoding.accept import speculative_accept
from mtad.decoding.filter import draw
from mtad.decoding.kv import Session, Stats
from mtad.models.pair import ModelPair

torch.set_num_threads(1)

PROMPT = [5, 7, 11]
TARGET_DEV, DRAFT_DEV = torch.device("cuda", 1), torch.device("cuda", 0)
# every decoder and variant that takes its own code path: conf/decoder/ (tests/variants.py), the exhaustive search
# with nucleus selection on a small block in place of the argmax one, and MMTAD's other reference
DECODERS = variants(("mtjd", {"mode": "exhaustive", "select": "nucleus", "top_k": 3, "gamma": 3}),
                    ("mmtad", {"reference": "own", "replacement": False}), without=[("mtjd", {"mode": "exhaustive"})])


def ids(d):
    return d[0] + "".join(f"-{v}" for v in d[1].values())


@functools.cache
def models() -> ModelPair:
    t = tm.model("llama", 1, 32, hidden=16)
    return ModelPair(t, tm.near(t, 5, 0.05))  # a near draft: blocks are both accepted and rejected


def _decode(pair, dec, seed=0, temperature=1.0):
    cfg = dict(name=dec[0], **dec[1], max_new_tokens=10, temperature=temperature)
    return mtad.generate(pair, PROMPT, cfg, torch.Generator().manual_seed(seed))


class _Sharded:
    """The pair with the target's logits on fake cuda:1 and the draft's on fake cuda:0, inside FakeDevices."""

    def __init__(self, pair):
        self.pair, self.mode = pair, fd.FakeDevices()

    def __enter__(self):
        self.hooks = [fd.emit_on(self.pair.target, TARGET_DEV), fd.emit_on(self.pair.draft, DRAFT_DEV)]
        self.mode.__enter__()
        return self.mode

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        for h in self.hooks:
            h.remove()


# ---- the harness behaves like CUDA ------------------------------------------------------------------------
def test_fake_devices_raise_on_a_mix_like_cuda():
    with fd.FakeDevices():
        p = fd.tag(torch.rand(3, 5), TARGET_DEV)
        idx0 = fd.tag(torch.tensor([0, 1]), DRAFT_DEV)
        assert (p * 2).device == TARGET_DEV and p.sum().device == TARGET_DEV  # results keep the device
        assert p[torch.tensor([0, 2])].device == TARGET_DEV  # CPU indices: allowed, as on CUDA
        assert (p + torch.tensor(1.0)).device == TARGET_DEV  # CPU 0-dim scalar: allowed
        assert p.to("cpu").device.type == "cpu" and p.cpu().device.type == "cpu"
        assert fd.tag(torch.ones(2), "cpu").to(DRAFT_DEV).device == DRAFT_DEV
        with pytest.raises(RuntimeError, match="same device"):
            p[idx0, idx0]  # the visible mmtad defect: target rows indexed on the draft's device
        with pytest.raises(RuntimeError, match="same device"):
            p[0] - fd.tag(torch.rand(5), DRAFT_DEV)
        with pytest.raises(RuntimeError, match="same device"):
            p[0].lt(torch.rand(5))  # a CPU uniform against a GPU probability
        with pytest.raises(RuntimeError, match="same device"):
            torch.multinomial(p[0], 1, generator=torch.Generator())  # CPU generator, GPU probabilities
        with pytest.raises(RuntimeError, match="same device"):
            fd.tag(torch.rand(4, 2, 3), TARGET_DEV).index_select(-2, torch.tensor([0]))  # KV crop index


def test_emitted_logits_are_reported_on_the_fake_device():
    pair = models()
    with _Sharded(pair):
        out = pair.target(torch.tensor([PROMPT])).logits
        assert out.device == TARGET_DEV and pair.draft(torch.tensor([PROMPT])).logits.device == DRAFT_DEV
        assert out.float().softmax(-1).device == TARGET_DEV


# ---- every decoder obeys the rule ------------------------------------------------------------------------
@pytest.mark.parametrize("dec", DECODERS, ids=ids)
def test_every_decoder_on_a_sharded_target_matches_the_plain_run(dec):
    """Same tokens as without fake devices (moving a tensor changes nothing but its device)."""
    pair = models()
    plain = _decode(pair, dec)
    with _Sharded(pair) as mode:
        sharded = _decode(pair, dec)
    forwards = sharded.target_forwards + sharded.draft_forwards
    assert mode.checked >= forwards, "the harness saw no fake-device logits: the test would prove nothing"
    assert sharded.tokens == plain.tokens and sharded.accepted == plain.accepted


@pytest.mark.parametrize("name", ["mmtad", "specinfer", "speculative", "mtad"])
def test_without_the_rule_drafted_decoders_fail_control(name, monkeypatch):
    """Negative control: Sessions that leave logits on their model's device (the code before the rule)
    make the drafted decoders combine cuda:1 and cuda:0 tensors, and the harness catches it."""
    monkeypatch.setattr(core.Batch, "session", lambda batch, model, role: Session(model, [r.stats for r in batch.runs],
                                                                                   role))
    pair = models()
    with _Sharded(pair), pytest.raises((RuntimeError, ValueError), match="device"):
        _decode(pair, (name, {}))


def test_rule_checks_name_the_rule():
    p = fd.tag(torch.full((2, 4), 0.25), TARGET_DEV)
    with fd.FakeDevices(), pytest.raises(ValueError, match="decode device is cpu"):
        draw(p[0], torch.Generator())
    with fd.FakeDevices(), pytest.raises(ValueError, match="speculative_accept.*decode device"):
        speculative_accept(torch.full((2, 4), 0.25), p[:1], torch.tensor([1]), torch.rand(1))


# ---- helpers outside the decoders ----------------------------------------------------------------------
def test_keep_path_indexes_each_cache_layer_on_its_own_device():
    """A sharded target's cache layers sit on different GPUs: tree compaction indexes each on its own."""
    m = models().target
    s = Session(m, [Stats()], "target")
    s.forward([PROMPT])
    s.forward_tree([[3, 4, 6]], [[len(PROMPT) - 1, len(PROMPT), len(PROMPT) - 1]])
    with fd.FakeDevices():
        for i, layer in enumerate(s.cache.layers):
            dev = torch.device("cuda", i)
            layer.keys, layer.values = fd.tag(layer.keys, dev), fd.tag(layer.values, dev)
        s.keep_path([[len(PROMPT), len(PROMPT) + 1]])
        assert [layer.keys.device.index for layer in s.cache.layers] == list(range(len(s.cache.layers)))
    assert s.cache.layers[0].keys.shape[-2] == len(PROMPT) + 2


def test_sequence_logprobs_with_logits_on_the_last_device():
    from mtad.measure.metrics import sequence_logprobs

    pair = models()
    plain = sequence_logprobs(pair.target, PROMPT, [1, 2, 3])
    with _Sharded(pair):
        sharded = sequence_logprobs(pair.target, PROMPT, [1, 2, 3])
    assert sharded.device.type == "cpu" and torch.equal(sharded, plain)

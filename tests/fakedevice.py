"""Two fake GPUs on a CPU-only machine, to test the device rule of :mod:`mtad.decoding.core`.

``tag(t, "cuda:1")`` returns a view of the CPU tensor ``t`` that *reports* ``t.device == cuda:1``. Inside
``with FakeDevices():`` every torch call is checked the way CUDA checks it, before it runs on the real CPU
data:

* the operands of one op must share one device; exempt, as on CUDA, are 0-dim CPU tensors (scalars) and
  CPU index tensors of ``Tensor.__getitem__`` (``x_cuda[cpu_idx]`` works on CUDA; ``x_cuda1[idx_cuda0]``
  raises);
* a generator must be on the device of the op it feeds (``torch.rand(..., generator=g, device=d)``,
  ``torch.multinomial(p, n, generator=g)``);
* results carry their operands' fake device; ``.to(d)`` / ``.cpu()`` / ``device=d`` move between fake and
  real devices.

A mix of devices raises ``RuntimeError("Expected all tensors to be on the same device ...")``, as CUDA does.
:func:`emit_on` makes a model's forward return logits tagged with a fake device, as a model whose last layer
sits on that GPU (``device_map`` sharding) does. What this cannot show: real copies between GPUs, CUDA
kernels, the KV cache living on several GPUs (its tensors stay real CPU tensors here).
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CPU = torch.device("cpu")


class OnDevice(torch.Tensor):
    """A CPU tensor that reports a fake device (see the module docstring)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # FakeDevices does the dispatch

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._fake

    def __repr__(self) -> str:
        return f"OnDevice({self.as_subclass(torch.Tensor)!r}, fake={self._fake})"


def tag(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` reported on ``device``; a real CPU device gives back a plain tensor."""
    device = torch.device(device)
    with torch._C.DisableTorchFunction():  # not seen by FakeDevices (it would re-tag the result)
        plain = t.as_subclass(torch.Tensor) if isinstance(t, OnDevice) else t
        if device.type == "cpu":
            return plain
        out = plain.as_subclass(OnDevice)
    out._fake = device
    return out


def device_of(x) -> torch.device:
    return x._fake if isinstance(x, OnDevice) else x.device


def _is_device(x) -> bool:
    return isinstance(x, torch.device) or (isinstance(x, str) and x.split(":")[0] in ("cpu", "cuda"))


_MOVES = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda}


class FakeDevices(TorchFunctionMode):
    """Check and propagate fake devices on every torch call (module docstring)."""

    def __init__(self):
        super().__init__()
        self.checked = 0  # ops that saw a fake-device operand (the harness is live when > 0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        flat = tree_flatten((args, kwargs))[0]
        fake = any(isinstance(a, OnDevice) for a in flat)
        target = kwargs.get("device")
        fake_target = target is not None and _is_device(target) and torch.device(target).type != "cpu"
        if func in _MOVES and (fake or any(_is_device(a) and torch.device(a).type != "cpu" for a in args[1:])):
            self.checked += 1
            return self._move(func, args, kwargs)
        if not fake and not fake_target:
            return func(*args, **kwargs)
        self.checked += 1
        if fake_target:
            kwargs["device"] = CPU
        self._check(func, args, kwargs, torch.device(target) if fake_target else None)
        out = func(*args, **kwargs)
        dev = torch.device(target) if fake_target else self._result_device(func, args, kwargs)
        return tree_map(lambda o: tag(o, dev) if isinstance(o, torch.Tensor) else o, out)

    @staticmethod
    def _operand_devices(func, args, kwargs) -> list[torch.device]:
        devs = []
        index_args = tree_flatten(args[1:])[0] if func is torch.Tensor.__getitem__ else []
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Generator):
                devs.append(a.device)
            elif isinstance(a, torch.Tensor):
                d = device_of(a)
                cpu_scalar = d.type == "cpu" and a.dim() == 0
                cpu_index = d.type == "cpu" and any(a is b for b in index_args)
                if not (cpu_scalar or cpu_index):
                    devs.append(d)
        return devs

    def _check(self, func, args, kwargs, target) -> None:
        devs = self._operand_devices(func, args, kwargs) + ([target] if target is not None else [])
        distinct = list(dict.fromkeys(devs))
        if len(distinct) > 1:
            name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{distinct[0]} and {distinct[1]}! (fake devices; in {name})")

    def _result_device(self, func, args, kwargs) -> torch.device:
        devs = [d for d in self._operand_devices(func, args, kwargs) if d.type != "cpu"]
        if devs:
            return devs[0]
        first = next(a for a in tree_flatten((args, kwargs))[0] if isinstance(a, OnDevice))
        return first._fake  # e.g. a fake tensor indexed with CPU indices

    @staticmethod
    def _move(func, args, kwargs):
        src, rest = args[0], list(args[1:])
        if func is torch.Tensor.cpu:
            return tag(func(src, *rest, **kwargs), CPU)
        dest = kwargs.pop("device", None)
        for i, a in enumerate(rest):
            if isinstance(a, torch.Tensor):  # .to(other): device and dtype of other
                dest, rest[i] = device_of(a), a.dtype
                break
            if _is_device(a):
                dest = rest.pop(i)
                break
        dest = device_of(src) if dest is None else torch.device(dest)
        out = func(src, *rest, **kwargs) if rest or kwargs else src
        return tag(out, dest)


def emit_on(model, device):
    """Make ``model``'s forward return logits reported on ``device``; returns the hook handle (``.remove()``)."""

    def hook(module, inputs, out):
        out.logits = tag(out.logits, device)
        return out

    return model.register_forward_hook(hook)

"""A decoder setting written on one line: ``name[:key=value,...]``.

    sampling                        speculative:gamma=6            block:gamma=4 (speculative, accept=block)
    mtad:gamma=6,W=2,tau=0.3        mmtad:gamma=4,W=4              specinfer:tree=4.2.2

Keys are :class:`mtad.decoding.DecoderConfig` fields, with ``W`` for ``beam_width`` and ``tree`` for SpecInfer's
``k_config`` (dot-separated widths). Every other field keeps the decoder's preset (``conf/decoder/<name>.yaml``:
T = 1, top-k 10, top-p 0.9, γ = 4, W = 4, τ = 0.5). A spec reads back to the same canonical text
(:func:`canonical`), which keys caches and forecasts.
"""
from __future__ import annotations

from dataclasses import dataclass

from mtad.decoding import DecoderConfig

ALIASES = {"W": "beam_width", "tree": "k_config"}
PRESETS = {"block": ("speculative", {"accept": "block"})}  # a spec name that is a preset of another decoder
# the settings each decoder reads (a key it does not read is refused, not recorded)
READS = {
    "sampling": (),
    "greedy": (),
    "speculative": ("gamma",),
    "block": ("gamma",),
    "mtad": ("gamma", "beam_width", "tau"),
    "mmtad": ("gamma", "beam_width", "tau"),
    "specinfer": ("k_config",),
}
DEFAULTS = {"gamma": 4, "beam_width": 4, "tau": 0.5, "k_config": (4, 2, 2)}
SHORT = {"gamma": "gamma", "beam_width": "W", "tau": "tau", "k_config": "tree"}


@dataclass(frozen=True)
class Spec:
    """One decoder setting: the spec's name (``block`` included) and the settings it reads."""

    name: str
    settings: tuple[tuple[str, object], ...]

    def get(self, key: str):
        return dict(self.settings).get(key, DEFAULTS.get(key))

    def decoder(self, max_new_tokens: int) -> DecoderConfig:
        """The :class:`DecoderConfig` this spec decodes with (the presets' sampling parameters)."""
        base, extra = PRESETS.get(self.name, (self.name, {}))
        kw = {k: list(v) if k == "k_config" else v for k, v in self.settings}
        return DecoderConfig(name=base, max_new_tokens=max_new_tokens,
                             temperature=0.0 if base == "greedy" else 1.0, **extra, **kw)

    def overrides(self) -> list[str]:
        """Hydra overrides of ``python -m mtad`` that run this spec."""
        base, extra = PRESETS.get(self.name, (self.name, {}))
        out = [f"decoder={'block' if self.name == 'block' else base}"]
        for k, v in self.settings:
            out.append(f"decoder.{k}=[{','.join(map(str, v))}]" if k == "k_config" else f"decoder.{k}={v}")
        return out

    def __str__(self) -> str:
        return canonical(self)


def canonical(spec: Spec) -> str:
    """``name:key=value,...`` with every setting the decoder reads, in a fixed order (defaults written out)."""
    parts = []
    for key in READS[spec.name]:
        v = spec.get(key)
        parts.append(f"{SHORT[key]}={'.'.join(map(str, v)) if key == 'k_config' else _num(v)}")
    return spec.name + (":" + ",".join(parts) if parts else "")


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse(text: str) -> Spec:
    """A spec from its text; a ValueError naming the problem and what is allowed."""
    name, _, rest = str(text).strip().partition(":")
    if name not in READS:
        raise ValueError(f"decoder spec {text!r}: unknown decoder {name!r} (choose from {', '.join(READS)})")
    settings: dict[str, object] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = ALIASES.get(key.strip(), key.strip())
        if not eq or not value.strip():
            raise ValueError(f"decoder spec {text!r}: {item!r} is not key=value")
        if key not in READS[name]:
            raise ValueError(f"decoder spec {text!r}: {name} does not read {key!r} (it reads: "
                             f"{', '.join(SHORT[k] for k in READS[name]) or 'no setting'})")
        settings[key] = _value(key, value.strip(), text)
    spec = Spec(name, tuple(sorted((k, v) for k, v in settings.items() if v != DEFAULTS[k])))
    spec.decoder(1)  # DecoderConfig validates the values (a one-line ValueError)
    return spec


def _value(key: str, value: str, text: str):
    try:
        if key == "k_config":
            widths = tuple(int(x) for x in value.replace("x", ".").replace("·", ".").split("."))
            if not widths or min(widths) < 1:
                raise ValueError
            return widths
        if key == "tau":
            v = float(value)
            if not 0.0 <= v <= 1.0:
                raise ValueError
            return v
        v = int(value)
        if v < 1:
            raise ValueError
        return v
    except ValueError:
        allowed = {"k_config": "dot-separated positive widths, e.g. 4.2.2", "tau": "a number in [0, 1]"}
        raise ValueError(f"decoder spec {text!r}: {SHORT.get(key, key)}={value!r} is not allowed "
                         f"({allowed.get(key, 'a positive integer')})") from None


def from_config(d) -> Spec:
    """The spec a run's decoder config ran (a row's ``decoder``): ``block`` for speculative decoding with the
    block-verification rule; only the settings the decoder reads."""
    name = "block" if d["name"] == "speculative" and d.get("accept") == "block" else d["name"]
    if name not in READS or (name == "speculative" and d.get("accept", "lossless") != "lossless"):
        raise ValueError(f"no forecast spec for decoder {d['name']} (accept {d.get('accept')})")
    kw = {k: tuple(d[k]) if k == "k_config" else d[k] for k in READS[name] if k in d}
    return Spec(name, tuple(sorted((k, v) for k, v in kw.items() if v != DEFAULTS[k])))

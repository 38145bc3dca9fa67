"""Cost profiles for forecasts: what each forward shape costs and the harness time outside forwards.

A **measured** profile is calibrated once per machine and pair by ``python -m mtad.study.forecast calibrate``
(:func:`calibrate`), in a process of its own and on prompts of its own (GSM8K *train* prompts after the ones
the replays read): a spread of settings of every decoder decodes those prompts in rotating order, and

- every forward shape's CPU cost is the pooled CPU seconds of that shape's calls over their count (the core's
  per-shape clock, ``DecodeResult.call_cpu_s``): the curves ``<role>:<seq|tree>:<rows>`` over new tokens, read
  by linear interpolation in tokens and in rows (:meth:`mtad.measure.costmodel.Profile.cost`): t1, the draft
  step c, the W-row draft step c_W(W), the verify cost v(n) of n tokens or tree nodes, the prefills;
- each decoder's harness time (CPU time of the decode outside forwards) is fitted per prompt as
  ``h0 + h_step · steps + h_row · rows`` (non-negative least squares over the calibration decodes), where
  *rows* counts the distributions a step draws or verifies outside prefills (Σ rows × new tokens of its
  forwards): the sampling filter, beam top-k and acceptance work the core does per row.

A **declared** profile (:mod:`.declared`) gives the same terms in target steps for a GPU, each with its basis.
The calibration's settings are recorded in the profile, so a check can show it forecasts only others.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from mtad._util.io import atomic_write
from mtad._util.paths import REPO_ROOT
from mtad.decoding import generate
from mtad.measure.costmodel import Profile, parse_calls
from mtad.measure.gpu_profiles import declared_forward
from mtad.study.forecast.replay import record
from mtad.study.forecast.spec import parse

log = logging.getLogger("mtad.study.forecast")
PROFILE_DIR = REPO_ROOT / "results" / "profiles" / "forecast"
# the calibration's settings: spread so that every shape a forecast asks for lies between calibrated ones
# (verify widths 2-9, beam rows 1-8, tree nodes 9-57); a check forecasts settings outside this list
CALIBRATION = ("sampling", "speculative:gamma=2", "speculative:gamma=4", "speculative:gamma=8", "block:gamma=4",
               "mtad:gamma=4,W=4", "mtad:gamma=8,W=3", "mtad:gamma=2,W=8", "mmtad:gamma=2,W=4",
               "mmtad:gamma=6,W=5", "specinfer:tree=2.2.2", "specinfer:tree=8.2.2")
HARNESS_TERMS = ("h0", "h_step", "h_row")


def features(rec: Mapping) -> tuple[float, float, float]:
    """(prompts, steps, rows) of one decode record: rows = Σ rows × new tokens of its non-prefill forwards
    (a forward of at least the prompt's length is a prefill)."""
    rows = sum(n * r * s for role, kind, r, s, n in parse_calls(rec["calls"]) if s < rec["prompt_tokens"])
    return 1.0, float(rec["steps"]), float(rows)


@dataclass
class CostProfile:
    """Forward costs and harness terms of one machine and pair (``unit``: ms), or of a declared GPU (steps)."""

    label: str
    hardware: str
    pair: str
    kind: str = "measured"  # measured | declared
    unit: str = "ms"
    t1: float = 1.0  # one target step, in ``unit`` (a declared profile: its ms in ``terms``)
    costs: dict[str, list[list[float]]] = field(default_factory=dict)  # measured: costmodel curves, in unit
    harness: dict[str, dict[str, float]] = field(default_factory=dict)  # decoder -> h0, h_step, h_row (unit)
    terms: dict[str, dict] = field(default_factory=dict)  # declared: name -> {"value", "basis"}
    num_threads: int | None = None
    measured: str = ""
    calibration: dict = field(default_factory=dict)

    # ---- costs ----------------------------------------------------------------------------------
    def forward(self, role: str, kind: str, rows: int, new: int, prefill: bool) -> float:
        """Cost of one forward of ``rows`` × ``new`` tokens (a tree: 1 × N nodes)."""
        if self.kind == "declared":
            return declared_forward(self.terms, role, rows, new, prefill)
        return self._curves().cost(role, kind, rows, new)

    def _curves(self) -> Profile:
        if not hasattr(self, "_profile"):
            self._profile = Profile(hardware=self.hardware, pair=self.pair, costs_ms=self.costs)
        return self._profile

    def harness_of(self, decoder: str) -> dict[str, float]:
        if decoder in self.harness:
            return self.harness[decoder]
        if "*" in self.harness:
            return self.harness["*"]
        raise ValueError(f"profile {self.label!r} has no harness terms for {decoder}: calibrate with it "
                         f"(python -m mtad.study.forecast calibrate ... --setting {decoder})")

    def cost(self, rec: Mapping, decoder: str) -> float:
        """Predicted ms of one replayed decode: its forwards at their costs plus its harness time."""
        total = sum(n * self.forward(role, kind, r, s, s >= rec["prompt_tokens"])
                    for role, kind, r, s, n in parse_calls(rec["calls"]))
        h = self.harness_of(decoder)
        total += sum(h[t] * x for t, x in zip(HARNESS_TERMS, features(rec)))
        return total * (self.t1 if self.kind == "declared" else 1.0)  # declared terms are in target steps

    # ---- terms a reader wants -------------------------------------------------------------------
    def summary(self, gamma: int = 4, W: int = 4) -> dict:
        """c, c_W(W)/c, v(γ + 1) and the tree verify of W·γ + 1 nodes, in target steps."""
        t1 = self.forward("target", "seq", 1, 1, False)
        c = self.forward("draft", "seq", 1, 1, False) / t1
        cw = self.forward("draft", "seq", W, 1, False) / t1
        return {"t1_ms": self.t1 if self.kind == "declared" else t1, "c": c, "cW_over_c": cw / c if c else None,
                "v": self.forward("target", "seq", 1, gamma + 1, False) / t1,
                "v_tree": self.forward("target", "tree", 1, W * gamma + 1, False) / t1}

    # ---- files ----------------------------------------------------------------------------------
    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items()}
        return json.dumps(d, indent=1, default=float) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> "CostProfile":
        path = Path(path)
        try:
            d = json.loads(path.read_text())
            return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        except FileNotFoundError:
            raise ValueError(f"{path}: no such profile (write one with python -m mtad.study.forecast calibrate, "
                             "or name a declared one, e.g. gpu:llama8b_1b)") from None
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: not a forecast cost profile ({err})") from None


# ------------------------------------------------------------------------------------------- calibration
def nnls_fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares (columns that cannot be told apart share the fit)."""
    from scipy.optimize import nnls  # heavy optional import, only for calibration

    scale = np.where(X.max(0) > 0, X.max(0), 1.0)
    coef, _ = nnls(X / scale, y)
    return coef / scale


def fit_harness(obs: Sequence[tuple[Mapping, float]]) -> dict[str, float]:
    """``h0, h_step, h_row`` from (record, harness CPU time) pairs of one decoder."""
    X = np.array([features(rec) for rec, _ in obs], dtype=float)  # (n, 3)
    y = np.array([h for _, h in obs], dtype=float)  # (n,)
    return dict(zip(HARNESS_TERMS, map(float, nnls_fit(X, y))))


def curves(unit_ms: Mapping[str, float]) -> dict[str, list[list[float]]]:
    """``{"role:kind:rows": [[new, ms], ...]}`` from the mean cost of each calibrated shape."""
    out: dict[str, list[list[float]]] = {}
    for role, kind, rows, new, _ in parse_calls({k: 1 for k in unit_ms}):
        out.setdefault(f"{role}:{kind}:{rows}", []).append([new, unit_ms[f"{role}:{kind}:{rows}x{new}"]])
    return {k: sorted(v) for k, v in sorted(out.items())}


def calibrate(replayer, settings: Sequence[str] = CALIBRATION, hardware: str = "", warmup: int = 1) -> CostProfile:
    """Decode the replayer's prompts with every setting, prompt by prompt in rotating order (after ``warmup``
    untimed decodes each), and read the profile off their own forwards and CPU clocks (module docstring)."""
    specs = [parse(s) for s in settings]
    pair, items, w = replayer.pair, replayer.items, replayer.w
    cfgs = [s.decoder(w.tokens) for s in specs]
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    with torch.inference_mode():
        for cfg in cfgs:
            for k in range(warmup):
                generate(pair, items[0][1][:32], cfg, torch.Generator().manual_seed(999 + k))
    cpu, calls = Counter(), Counter()
    obs: dict[str, list] = {}
    for i, (pid, ids) in enumerate(items):
        order = list(range(len(specs)))
        order = order[i % len(order):] + order[:i % len(order)]
        for j in order:
            with torch.inference_mode():
                res = generate(pair, ids, cfgs[j], torch.Generator().manual_seed(w.seed + i))
            cpu.update(res.call_cpu_s)
            calls.update(res.calls)
            rec = record(pair, pid, ids, res)
            obs.setdefault(specs[j].name, []).append((rec, 1e3 * (res.cpu_time_s - sum(res.call_cpu_s.values())),
                                                      1e3 * res.cpu_time_s, str(specs[j])))
        log.info("calibration prompt %d/%d done, %.0f s", i + 1, len(items), time.perf_counter() - t0)
    unit = {k: 1e3 * cpu[k] / calls[k] for k in calls if calls[k]}
    prof = CostProfile(label="", hardware=hardware, pair=replayer.mcfg.name, costs=curves(unit),
                       num_threads=torch.get_num_threads(),
                       measured=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    prof.t1 = prof.forward("target", "seq", 1, 1, False)
    prof.harness = {d: fit_harness([(rec, h) for rec, h, _, _ in o]) for d, o in sorted(obs.items())}
    fit = {}  # in-sample: how well the fitted profile explains the calibration decodes themselves
    for d, o in obs.items():
        for rec, _, total, name in o:
            f = fit.setdefault(name, [0.0, 0.0])
            f[0] += prof.cost(rec, d)
            f[1] += total
    prof.calibration = {"workload": asdict(w), "settings": [str(s) for s in specs], "prompts": len(items),
                        "seconds": round(time.perf_counter() - t0, 1),
                        "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
                        "in_sample_error": {k: round(v[0] / v[1] - 1, 4) for k, v in sorted(fit.items())},
                        "calls": dict(sorted(calls.items()))}
    threads = f", {prof.num_threads} thread{'s' if prof.num_threads != 1 else ''}"
    prof.label = f"{hardware}{threads}, {prof.pair} (CPU time, calibrated {prof.measured[:10]})"
    return prof


def profile_path(hardware: str, pair: str, threads: int | None, out_dir: Path = PROFILE_DIR) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", hardware.lower()).strip("-")
    return Path(out_dir) / f"{slug}-{threads or 0}t-{pair}.json"


def write(prof: CostProfile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, prof.to_json())
    return path

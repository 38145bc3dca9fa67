"""Declared GPU cost profiles: every term in target steps, each with its basis; projections, not measurements.

One source for every projection in the project: the forecast's declared profiles (``gpu:<key>``,
:mod:`mtad.study.forecast.declared`), the two-axis regime map, and the simulator's corners
(:data:`mtad.measure.simulate.GPU_PROFILES`).

Terms (:func:`declared_forward`): ``c`` a one-row draft step; ``kappa`` the extra cost of each further beam row
(c_W(W) / c = 1 + kappa · (W − 1)); ``nu`` the extra cost of each further token or tree node in one pass (v(n) =
1 + nu · (n − 1): a 5-token verify costs 1 + 4 nu); ``rho`` the tokens a pass reads before it turns compute-bound
(a prefill of P tokens: max(1, P / rho) steps); ``kappa_target`` the same as kappa for target rows (batch > 1;
unused at batch 1); ``h_step`` harness time per step, ``h_row`` per drawn row, ``h0`` per prompt; ``t1_ms`` one
target step in ms. ``range``: the span the two-axis map and the simulator's corners sweep; ``value``: the
central point a forecast uses.
"""
from __future__ import annotations

from collections.abc import Mapping

_BANDWIDTH = ("batch-1 decoding is memory-bound: a pass costs about the weights it reads, so a 1-row draft step "
              "costs about the draft/target parameter ratio, raised by kernel-launch overhead for small drafts "
              "(an assumption, stated as a range)")
_NU = ("a verify pass of up to about 8 tokens or a small tree reads the weights once; the extra compute and "
       "attention per token is assumed 1-3 % of a step on a data-centre GPU at batch 1 (assumption)")
_RHO = ("a prefill turns compute-bound near the GPU's FLOP/byte ratio: about 300 tokens per step-time for a "
        "bf16 A100 (312 TFLOP/s over 2 TB/s; a published hardware figure, rounded)")
_HARNESS = ("eager PyTorch sampling, filtering and bookkeeping on the GPU: assumed about 0.05 of a target step "
            "per step and nothing per row (rows are filtered in one batched kernel); no measurement here")
_KAPPA = ("W beams in the batch dimension read the draft's weights once, but attention over W caches, beam "
          "reorders and launches add cost: c_W/c in 1.0-1.5 at W = 4 (assumption; the two-axis map's axis)")

# terms every declared GPU shares (batch 1 on an A100-class GPU)
_SHARED = {
    "nu": {"value": 0.015, "range": [0.0, 0.03], "basis": _NU},
    "rho": {"value": 300.0, "range": [200.0, 400.0], "basis": _RHO},
    "kappa_target": {"value": 0.0, "range": [0.0, 0.0], "basis": "batch 1: one target row"},
    "h0": {"value": 0.0, "range": [0.0, 0.0], "basis": "per-prompt set-up outside forwards: neglected"},
    "h_step": {"value": 0.05, "range": [0.0, 0.1], "basis": _HARNESS},
    "h_row": {"value": 0.0, "range": [0.0, 0.0], "basis": _HARNESS},
}
_T1_13B = {"value": 30.0, "range": [25.0, 40.0], "basis": "13B fp16 weights (26 GB) over about 1.5-2 TB/s effective "
           "bandwidth, plus launch overhead (assumption)"}

GPU = {
    "llama8b_1b": {
        "label": "GPU (A100-class), Llama-3.1-8B target / Llama-3.2-1B draft (the paper's camera-ready pair), bf16",
        "terms": {
            "c": {"value": 0.2, "range": [0.15, 0.25], "basis": "parameter ratio 1.24 / 8.03 = 0.15 plus launch "
                  "overhead; " + _BANDWIDTH},
            "kappa": {"value": 0.2 / 3, "range": [0.0, 0.5 / 3], "basis": _KAPPA + "; central value c_W/c = 1.2"},
            **_SHARED,
            "t1_ms": {"value": 25.0, "range": [20.0, 30.0], "basis": "the paper's per-run figures (docs/PAPER.md): "
                      "an MTAD iteration of about 139 ms at about 4.2 tokens and an eager HF loop; with c, c_W and "
                      "v above that is 2.9-5 steps, so t1 of 25-48 ms; the low end taken, since their target ran "
                      "in fp32 (a stated flaw of those figures). Speed-ups do not depend on t1"},
        },
    },
    "opt13b_125m": {
        "label": "GPU (A100-class), OPT-13B target / OPT-125m draft, fp16",
        "terms": {
            "c": {"value": 0.03, "range": [0.01, 0.05], "basis": "parameter ratio 0.125 / 13 = 0.01; a 12-layer "
                  "draft is launch-bound in eager PyTorch; " + _BANDWIDTH},
            "kappa": {"value": 0.05, "range": [0.0, 0.5 / 3], "basis": _KAPPA},
            **_SHARED,
            "t1_ms": _T1_13B,
        },
    },
    "llama13b_68m": {
        "label": "GPU (A100-class), Llama-2-13B target / llama-68m draft, fp16",
        "terms": {
            "c": {"value": 0.02, "range": [0.005, 0.04], "basis": "parameter ratio 0.068 / 13 = 0.005; a 2-layer "
                  "draft is launch-bound; " + _BANDWIDTH},
            "kappa": {"value": 0.05, "range": [0.0, 0.5 / 3], "basis": _KAPPA},
            **_SHARED,
            "t1_ms": _T1_13B,
        },
    },
}


def declared_forward(terms: Mapping[str, dict], role: str, rows: int, new: int, prefill: bool) -> float:
    """A declared GPU's forward cost in target steps (:data:`GPU` states each term's basis):

        target, n tokens or nodes     max(1 + nu · (n − 1), n / rho)      (a prefill: max(1, n / rho))
        draft, R rows × 1 token       c · (1 + kappa · (R − 1))           (c_W(W) = c · (1 + kappa (W − 1)))
        draft, 1 row × n tokens       c · max(1 + nu · (n − 1), n / rho)  (a prefill: c · max(1, n / rho))
    """
    t = {k: float(v["value"]) for k, v in terms.items()}
    width = max(1.0, new / t["rho"]) if prefill else max(1.0 + t["nu"] * (new - 1), new / t["rho"])
    if role == "target":
        return width * (1.0 + t["kappa_target"] * (rows - 1))
    return t["c"] * width * (1.0 + t["kappa"] * (rows - 1))

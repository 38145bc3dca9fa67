"""The cost model's batch width (mtad.measure.costmodel.batch_cost_per_token): predictions by hand, and the
batch width at which speculation stops paying, on a memory-bound and a compute-bound profile."""
from __future__ import annotations

import pytest

from mtad.measure.costmodel import Profile, batch_cost_per_token, speculation_stops_paying


def _profile(per_token: float, fixed: float = 10.0) -> Profile:
    """Target forward = fixed + per_token * rows * new (ms), draft a tenth of it; rows 1, 4 and 16 measured."""
    curves = {}
    for role, scale in (("target", 1.0), ("draft", 0.1)):
        for B in (1, 4, 16, 64):
            curves[f"{role}:seq:{B}"] = [[n, scale * (fixed + per_token * B * n)] for n in (1, 5, 100)]
    return Profile(hardware="box", pair="p", costs_ms=curves)


def test_batch_cost_by_hand():
    p = _profile(per_token=1.0)
    assert batch_cost_per_token(p, "sampling", 4) == pytest.approx((10 + 4) / 4)
    spec = (4 * 0.1 * (10 + 4) + (10 + 4 * 5)) / (4 * 2.0)  # gamma draft steps + one verify of 5, E = 2
    assert batch_cost_per_token(p, "speculative", 4, 4, 4, 2.0) == pytest.approx(spec)
    mtad = (0.1 * (10 + 4) + 3 * 0.1 * (10 + 16) + (10 + 20)) / (4 * 2.0)  # beams: 16 draft rows
    assert batch_cost_per_token(p, "mtad", 4, 4, 4, 2.0) == pytest.approx(mtad)
    prefill = (10 + 4 * 100 + 0.1 * (10 + 4 * 100)) / (4 * 50)  # both models prefill 100 tokens, 50 new per row
    assert batch_cost_per_token(p, "speculative", 4, 4, 4, 2.0, 100, 50) == pytest.approx(spec + prefill)
    with pytest.raises(ValueError, match="mmtad"):
        batch_cost_per_token(p, "mmtad", 4)


def test_speculation_stops_paying_only_when_wide_passes_cost():
    """Memory-bound (a pass costs the same at any width): speculation pays at every width. Compute-bound
    (cost grows with rows x tokens): it stops paying at some finite width, earlier with lower block efficiency."""
    flat = _profile(per_token=0.0)
    assert speculation_stops_paying(flat, "speculative", 2.0, max_batch=64) is None
    steep = _profile(per_token=1.0)
    wide = speculation_stops_paying(steep, "speculative", 2.5, max_batch=256)
    narrow = speculation_stops_paying(steep, "speculative", 1.5, max_batch=256)
    assert narrow is not None and wide is not None and narrow < wide

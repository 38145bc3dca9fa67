"""Declared GPU cost profiles as forecast profiles (``gpu:<key>``): the terms of
:mod:`mtad.measure.gpu_profiles`, each with its basis, any of them replaced by the caller."""
from __future__ import annotations

from mtad.measure.gpu_profiles import GPU
from mtad.study.forecast.costs import CostProfile


def profile(key: str, **values: float) -> CostProfile:
    """A declared GPU profile (``gpu:<key>``), any term replaced by ``values`` (e.g. ``kappa=0.1``): costs in
    target steps; ms/token are these times ``t1_ms``."""
    if key not in GPU:
        raise ValueError(f"gpu:{key}: no such declared profile (choose from {', '.join('gpu:' + k for k in GPU)})")
    terms = {k: dict(v) for k, v in GPU[key]["terms"].items()}
    for k, v in values.items():
        if k not in terms:
            raise ValueError(f"gpu:{key}: no term {k!r} (terms: {', '.join(terms)})")
        terms[k] = {**terms[k], "value": float(v), "basis": f"set by the caller ({k} = {float(v):g})"}
    h = {t: terms[t]["value"] for t in ("h0", "h_step", "h_row")}
    changed = f" with {', '.join(f'{k} = {float(v):g}' for k, v in values.items())}" if values else ""
    return CostProfile(label=f"projection: {GPU[key]['label']}{changed}", hardware=GPU[key]["label"], pair=key,
                       kind="declared", unit="ms", t1=terms["t1_ms"]["value"], terms=terms, harness={"*": h})

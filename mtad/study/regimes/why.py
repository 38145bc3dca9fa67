"""One answer to "why does MTAD gain little here?", rendered from one JSON for every document that gives it.

:func:`facts` reads the map (``regimes.json``'s dict) and the forecast check (``forecast/check.json``) into
``why.json``; :func:`render` writes the paragraph that README.md, docs/PAPER.md and regimes.md carry between
``<!-- why:begin -->`` and ``<!-- why:end -->`` (:func:`update`), so the figures in their prose cannot drift apart
(tests/study/test_why.py re-renders each block from ``why.json``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from mtad.report.markdown import interval
from mtad.study.forecast.regime2d import breakeven

BEGIN, END = "<!-- why:begin -->", "<!-- why:end -->"
PROFILE = "llama8b_1b"
FEATURE = "run5"
NAMES = {"mtad": "MTAD", "mmtad": "MMTAD", "specinfer": "SpecInfer 4·2·2", "block": "block verification"}


def _span(xs) -> list[float]:
    return [min(xs), max(xs)]


def facts(res: dict, check: dict | None) -> dict:
    real = [d for d in res["drafts"] if d["oracle_mix"] is None]
    out = {"joint_rule": _span([d["vs_spec"]["0.5"][0] for d in real]),
           "alpha": _span([d["alpha"][0] for d in real]), "drafts": len(real)}
    dec = res.get("decoders") or {"drafts": {}}
    out["be_vs_spec"] = {k: _span([d["vs_speculative"][k]["block_efficiency_ratio"][0]
                                   for d in dec["drafts"].values() if d["vs_speculative"].get(k)])
                         for k in NAMES if any(d["vs_speculative"].get(k) for d in dec["drafts"].values())}
    out["decoders_publication"] = dec.get("publication")
    cpu = next((m for m in res["measured"] if m["name"] == FEATURE), None)
    out["cpu_feature_mtad_vs_spec"] = cpu["mtad_vs_spec"]["measured"] if cpu else None
    out["cpu_hardware"] = res["hardware"]
    two = res.get("two_axis")
    if two and PROFILE in two["profiles"]:
        p = two["profiles"][PROFILE]
        out["gpu"] = {"label": p["label"], "terms": p["terms"], "feature": p["at_profile"].get(FEATURE)}
        run5 = next((d for d in two["drafts"] if d["name"] == FEATURE), None)
        out["gpu"]["mtad_breakeven_cw"] = breakeven(run5["be_ratio"]["mtad"][0], p["factor_cw"]["mtad"],
                                                    two["cw_axis"]) if run5 else None
    if check:
        s = check["summary"]
        out["forecast_check"] = {"publication": check.get("publication"), "checked": s["checked"],
                                 **{k: s[k] for k in ("ms_per_token", "speedup_vs_speculative") if k in s}}
    return out


def _x(v) -> str:
    return interval(v, unit="×")


def _r(v) -> str:
    return f"{v[0]:.2f}–{v[1]:.2f}×"


def render(f: dict) -> str:
    parts = [f"**Why MTAD gains little here** (one answer, rendered from `results/regimes/why.json` by "
             f"`python -m mtad.study.regimes`). The joint rule adds little at any draft strength: on the same drafts "
             f"MTAD's rule (τ = 0.5) accepts {_r(f['joint_rule'])} token-wise verification's mean length across "
             f"{f['drafts']} real drafts (α {f['alpha'][0]:.2f}–{f['alpha'][1]:.2f})."]
    if f.get("be_vs_spec"):
        parts.append("Beam drafting and trees carry the accepted-length gain: per target forward, on real text, "
                     + ", ".join(f"{NAMES[k]} commits {_r(v)}" for k, v in f["be_vs_spec"].items())
                     + f" speculative decoding's tokens ({f['decoders_publication']}).")
    if f.get("cpu_feature_mtad_vs_spec"):
        parts.append(f"On the regime map's CPU ({f['cpu_hardware']}, bf16) the feature draft's MTAD is "
                     f"{_x(f['cpu_feature_mtad_vs_spec'])} speculative decoding in CPU time: its beam steps and "
                     "harness time take back part of that gain.")
    g = f.get("gpu")
    if g and g.get("feature"):
        t = g["terms"]
        be = g.get("mtad_breakeven_cw")
        parts.append(f"At the declared costs of {g['label']} (c {t['c']:g}, c_W/c {t['cW_over_c']:.2f}, v(5) "
                     f"{t['v5']:.2f}; a **projection**), the feature draft's acceptance gives "
                     + ", ".join(f"{NAMES[k]} {_x(v)}" for k, v in g["feature"].items() if v)
                     + " speculative decoding"
                     + (f"; MTAD stops paying where a W = 4 beam step costs more than {be:.2f}× a one-row step"
                        if be else "") + ".")
    c = f.get("forecast_check")
    if c and c.get("ms_per_token"):
        m, s = c["ms_per_token"], c.get("speedup_vs_speculative")
        parts.append(f"Forecasts of this kind were checked ex ante on this project's CPU ({c['publication']}): "
                     f"for {c['checked']} settings no profile was calibrated on, the measured interval contains "
                     f"{m['contained']} of {m['points']} forecast ms/token (largest error "
                     f"{100 * m['largest_error']:+.1f} %)"
                     + (f" and {s['contained']} of {s['points']} forecast speed-ups over speculative decoding "
                        f"(largest error {100 * s['largest_error']:+.1f} %)" if s else "") + ".")
    return " ".join(parts)


def block(f: dict) -> str:
    return f"{BEGIN}\n{render(f)}\n{END}"


def update(path: Path, f: dict) -> bool:
    """Replace the marked block of ``path`` with the rendering of ``f``; False when the file has no block."""
    text = path.read_text()
    pat = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pat.search(text):
        return False
    path.write_text(pat.sub(lambda _: block(f), text, count=1))
    return True


def blocks(text: str) -> list[str]:
    return re.findall(re.escape(BEGIN) + ".*?" + re.escape(END), text, re.S)


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())

"""The regime map: MTAD against token-wise speculative decoding and block verification along the draft-strength
axis, hardware-free (accepted lengths of the same-draft study) and in time (measured here, simulated here,
projected under declared GPU profiles).

``python -m mtad.study.regimes`` reads what the regime runs wrote under ``results/regimes/``:
``alpha.jsonl`` (held-out α per draft, :mod:`mtad.study.alpha`), ``study/verifier_study-<draft>.*`` and the
per-context records ``study/<draft>.contexts.json`` (exported here from the study's raw file the first time),
``check/check-<draft>.json`` (``experiments/regime_check.py``), and writes ``regimes.md``, ``regimes.json`` and
``regimes.png`` there. Drafts are listed in ``drafts.tsv``; an oracle mixture (``--oracle-mix λ``) takes its α
from its base draft's as 1 − λ + λ·α (:func:`mtad.study.alpha.mixture_alpha`).

**[choice]** The study's MTAD row is MTAD's joint rule on a chain-sampled draft (:mod:`mtad.study.verifiers`);
the timed ``mtad`` decoder proposes by beam sampling, so its measured accepted length differs. The simulator's
curves use the study's histograms with MTAD's beam-drafting cost; the measured points use the decoder itself.
"""

from __future__ import annotations

import json
import logging
import pickle
import shlex
from pathlib import Path

import numpy as np

from mtad._util.paths import REPO_ROOT
from mtad.measure.costmodel import Profile, parse_calls
from mtad.measure.costmodel import predict as predict_calls
from mtad.measure.simulate import GPU_PROFILES, CostProfile, declared, predict
from mtad.study.alpha import mixture_alpha
from mtad.study.stats import CONFIDENCE, N_BOOT

log = logging.getLogger(__name__)
ROOT = REPO_ROOT / "results" / "regimes"
TAUS = ("0.1", "0.3", "0.5", "0.7", "0.9")
GAMMA = 4
# the paper's per-run figures (docs/PAPER.md; Llama-3.1-8B / 3.2-1B, γ = 4, W = 4): SpecInfer's acceptance,
# MTAD's and SpecInfer's block efficiency and ms/token
PAPER_RUNS = [
    ("Spider base", 0.85, 4.19, 3.55, 33.20, 35.52),
    ("Spider instruct", 0.79, 4.14, 3.36, 30.04, 32.91),
    ("HumanEval base", 0.89, 4.33, 3.66, 29.02, 30.73),
    ("HumanEval instruct", 0.88, 4.34, 3.64, 27.67, 29.48),
]
PAPER_HEADLINES = [("arXiv v2–v4", 1.42), ("camera-ready", 1.26)]


# ---- inputs --------------------------------------------------------------------------------------------------
def drafts(root: Path = ROOT) -> list[dict]:
    """``drafts.tsv`` rows: name, model, extra arguments, the oracle λ (None for a real draft)."""
    out = []
    for line in (root / "drafts.tsv").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, model, *extra = line.split("\t")
        args = shlex.split(extra[0]) if extra else []
        lam = float(args[args.index("--oracle-mix") + 1]) if "--oracle-mix" in args else None
        out.append({"name": name, "model": model, "extra": args, "oracle_mix": lam})
    return out


def alphas(root: Path = ROOT) -> dict[str, list[float]]:
    """Held-out α [point, lo, hi] per draft; oracles from their base draft (the committed feature draft)."""
    rows = [json.loads(x) for x in (root / "alpha.jsonl").read_text().splitlines() if x.strip()]
    out = {r["name"]: r["alpha"] for r in rows}
    for d in drafts(root):
        if d["oracle_mix"] is not None and "run5" in out:
            out[d["name"]] = mixture_alpha(out["run5"], d["oracle_mix"])
    return out


def contexts(name: str, root: Path = ROOT, raw_dir: Path = REPO_ROOT / ".cache" / "regimes") -> dict | None:
    """Per-context accepted counts τ of every rule (the committed record), exported from the study's raw
    pickle the first time (our own file, written by ``python -m mtad.study verifiers --save-raw``)."""
    rec = root / "study" / f"{name}.contexts.json"
    if not rec.is_file():
        raw = raw_dir / f"{name}.pkl"
        if not raw.is_file():
            return None
        saved = pickle.loads(raw.read_bytes())
        out = {"rules": saved["tasks"][0]["rules"], "task": [], "prompt": [], "tau": [], "loglik": [], "ntok": []}
        for t in saved["tasks"]:
            n = len(t["tau"])
            out["task"] += [t["task"]] * n
            out["prompt"] += list(t["prompt_of"])
            out["tau"] += t["tau"]
            out["loglik"] += [[round(x, 4) for x in row] for row in t["loglik"]]
            out["ntok"] += t["ntok"]
        rec.write_text(json.dumps(out, separators=(",", ":")))
    return json.loads(rec.read_text())


def checks(root: Path = ROOT) -> dict[str, dict]:
    """The simulator checks, each point with a second prediction from the run's own forward counts (the cost
    model's :func:`~mtad.measure.costmodel.predict` on the mean of the two profiles): where the two predictions
    agree and miss the measurement, the per-forward costs moved; where they differ, the step model did."""

    out = {}
    for p in sorted((root / "check").glob("check-*.json")):
        name = p.stem.removeprefix("check-")
        c = json.loads(p.read_text())
        rows = root / "check" / f"regime_check_{name}.jsonl"
        if rows.is_file():
            raw = [Profile.from_dict(c["raw_profiles"][k]) for k in ("before", "after")]
            by = {}
            for line in rows.read_text().splitlines():
                r = json.loads(line)
                d = r["decoder"]
                key = "block" if d.get("accept") == "block" else d["name"]
                by[key] = r["metrics"]
            for pt in c["points"]:
                m = by.get(pt["decoder"])
                if m is None:
                    continue
                dec = "speculative" if pt["decoder"] == "block" else pt["decoder"]
                vals = [predict_calls(m["forward_calls"], m["total_tokens"], prof, dec) for prof in raw]
                pt["predicted_from_calls"] = sum(vals) / 2
                pt["error_from_calls"] = pt["predicted_from_calls"] / pt["measured_ms_per_token"][0] - 1
                pt["measured_forward_share"] = m["forward_time_s"] / m["total_decode_s"]
        out[name] = c
    return out


# ---- hardware-free ratios ------------------------------------------------------------------------------------
def ratio_intervals(rec: dict, num: str, den: str, n_boot: int = N_BOOT, seed: int = 0) -> list[float]:
    """Σ L_num / Σ L_den over contexts (L = τ + 1) [point, lo, hi]: block-efficiency ratio of two rules on the
    same drafts, the interval resampling (task, prompt) clusters."""
    i, j = rec["rules"].index(num), rec["rules"].index(den)
    tau = np.array(rec["tau"], dtype=float) + 1  # (C, R)
    groups = [f"{t}/{p}" for t, p in zip(rec["task"], rec["prompt"])]
    ids, inv = np.unique(groups, return_inverse=True)
    a, b = np.bincount(inv, tau[:, i]), np.bincount(inv, tau[:, j])  # per cluster sums
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ids), size=(n_boot, len(ids)))
    dist = a[idx].sum(1) / b[idx].sum(1)
    q = (1 - CONFIDENCE) / 2
    return [float(a.sum() / b.sum()), float(np.quantile(dist, q)), float(np.quantile(dist, 1 - q))]


def histograms(rec: dict) -> dict[str, dict[int, int]]:
    """Pooled accepted-length histograms {L: steps} per rule label."""
    tau = np.array(rec["tau"], dtype=int)
    return {
        r: {int(L) + 1: int(c) for L, c in enumerate(np.bincount(tau[:, k], minlength=GAMMA + 1))}
        for k, r in enumerate(rec["rules"])
    }


def mean_L(h: dict) -> float:
    return sum(L * n for L, n in h.items()) / sum(h.values())


# ---- the map -------------------------------------------------------------------------------------------------
def cpu_profile(chk: dict) -> CostProfile:
    p = chk["profiles"]["mean"]
    return CostProfile(**{k: p[k] for k in ("label", "t1", "c", "c_W", "v", "overhead", "prefill", "kind", "unit")})


def build(root: Path = ROOT) -> dict:
    al, chk = alphas(root), checks(root)
    ref = cpu_profile(chk["run5"]) if "run5" in chk else None
    rows = []
    for d in drafts(root):
        rec = contexts(d["name"], root)
        if rec is None or d["name"] not in al:
            continue
        hist = histograms(rec)
        row = {
            "name": d["name"],
            "oracle_mix": d["oracle_mix"],
            "alpha": al[d["name"]],
            "n_contexts": len(rec["tau"]),
            "L": {r: mean_L(h) for r, h in hist.items()},
            "hist": {r: hist[r] for r in ("lossless", "block", *(f"mtad (τ={t})" for t in TAUS))},
            "vs_spec": {t: ratio_intervals(rec, f"mtad (τ={t})", "lossless") for t in TAUS},
            "vs_block": {t: ratio_intervals(rec, f"mtad (τ={t})", "block") for t in TAUS},
            "block_vs_spec": ratio_intervals(rec, "block", "lossless"),
        }
        profs = {}
        if d["name"] in chk and d["oracle_mix"] is None:
            profs["cpu_own"] = cpu_profile(chk[d["name"]])
        if ref is not None:
            profs["cpu_feature_cost"] = ref
        for key in GPU_PROFILES:
            lo, hi = declared(key)
            profs[f"{key}_lo"], profs[f"{key}_hi"] = lo, hi
        sim = {}
        for pk, prof in profs.items():
            ms = {
                r: predict(row["hist"][r], dec, prof, GAMMA)
                for r, dec in (
                    ("lossless", "speculative"),
                    ("block", "block"),
                    *((f"mtad (τ={t})", "mtad") for t in TAUS),
                )
            }
            samp = predict({1: 1}, "sampling", prof, GAMMA)
            sim[pk] = {
                "mtad_vs_spec": {t: ms["lossless"] / ms[f"mtad (τ={t})"] for t in TAUS},
                "mtad_vs_block": {t: ms["block"] / ms[f"mtad (τ={t})"] for t in TAUS},
                "spec_vs_sampling": samp / ms["lossless"],
                "mtad_vs_sampling": samp / ms["mtad (τ=0.5)"],
            }
        row["simulated"] = sim
        rows.append(row)
    measured = []
    for name, c in chk.items():
        pts = {p["decoder"]: p for p in c["points"]}
        if "mtad" not in pts or name not in al:
            continue
        m = pts["mtad"]
        measured.append(
            {
                "name": name,
                "alpha": al[name],
                "mtad_vs_spec": m["speedup_vs_speculative"],
                "mtad_vs_sampling": m["speedup_vs_sampling"],
                "be_ratio_vs_spec": m["block_efficiency"] / pts["speculative"]["block_efficiency"],
                "be_ratio_vs_block": m["block_efficiency"] / pts["block"]["block_efficiency"],
                "mtad_vs_block_predicted": pts["block"]["predicted_ms_per_token"] / m["predicted_ms_per_token"],
                "mtad_vs_block_measured": pts["block"]["measured_ms_per_token"][0] / m["measured_ms_per_token"][0],
                "points": [
                    {
                        k: p.get(k)
                        for k in (
                            "decoder",
                            "measured_ms_per_token",
                            "predicted_ms_per_token",
                            "predicted_before",
                            "predicted_after",
                            "error",
                            "predicted_from_calls",
                            "error_from_calls",
                            "block_efficiency",
                            "acceptance_rate",
                        )
                    }
                    for p in c["points"]
                ],
                "profile": c["profiles"]["mean"],
                "projected": _decoder_projection(pts),
            }
        )
    hardware = "this CPU"
    for f in sorted((root / "study").glob("verifier_study-*.jsonl")):
        hardware = json.loads(f.read_text().splitlines()[0])["study"]["device_name"]
        break
    return {
        "drafts": rows,
        "measured": measured,
        "gpu_profiles": {k: list(v) for k, v in GPU_PROFILES.items()},
        "diagnosis": diagnose(root),
        "checks": {
            k: {
                "points": [
                    {x: p.get(x) for x in ("decoder", "speedup_vs_sampling", "speedup_vs_speculative")}
                    for p in c["points"]
                ]
            }
            for k, c in chk.items()
        },
        "hardware": f"{hardware}, 2 cores shared",
    }


def _decoder_projection(pts: dict) -> dict:
    """MTAD / speculative and MTAD / block speed-ups from the *decoders'* own accepted-length histograms of a
    checked run (beam-drafted MTAD), under both corners of each declared GPU profile: projections."""
    out = {}
    for key in GPU_PROFILES:
        vals = {"mtad_vs_spec": [], "mtad_vs_block": []}
        for prof in declared(key):
            ms = {d: predict(pts[d]["histogram"], d, prof, GAMMA) for d in ("speculative", "block", "mtad")}
            vals["mtad_vs_spec"].append(ms["speculative"] / ms["mtad"])
            vals["mtad_vs_block"].append(ms["block"] / ms["mtad"])
        out[key] = {k: [min(v), max(v)] for k, v in vals.items()}
    return out


def diagnose(root: Path = ROOT) -> list[dict]:
    """Where the check's time went, per checked draft and decoder, from the run's own counters: forward time
    measured / predicted by the isolated profile (mean of before and after), harness time per step, and the
    cost of one MTAD beam step inferred from the MTAD run's forward time (its other forwards at the profile's
    costs scaled by the speculative run's measured/predicted ratio), all in target steps t1."""

    out = []
    for p in sorted((root / "check").glob("check-*.json")):
        name = p.stem.removeprefix("check-")
        rows_f = root / "check" / f"regime_check_{name}.jsonl"
        if not rows_f.is_file():
            continue
        c = json.loads(p.read_text())
        profs = [Profile.from_dict(c["raw_profiles"][k]) for k in ("before", "after")]
        rows = {}
        for line in rows_f.read_text().splitlines():
            r = json.loads(line)
            rows["block" if r["decoder"].get("accept") == "block" else r["decoder"]["name"]] = r["metrics"]

        def fwd(m, beams=True, profs=profs):
            return (
                sum(
                    n * sum(pr.cost(role, kind, b, new) for pr in profs) / 2
                    for role, kind, b, new, n in parse_calls(m["forward_calls"])
                    if beams or b == 1
                )
                / 1e3
            )

        t1 = sum(pr.cost("target", "seq", 1, 1) for pr in profs) / 2 / 1e3
        d = {"draft": name, "t1_ms": 1e3 * t1}
        for dec, m in rows.items():
            d[dec] = {
                "forward_measured_over_profile": m["forward_time_s"] / fwd(m),
                "harness_per_step_t1": (m["total_decode_s"] - m["forward_time_s"]) / m["target_forwards"] / t1,
                "forward_s_per_step": m["forward_time_s"] / m["target_forwards"],
            }
        if "mtad" in rows and "speculative" in rows:
            m, scale = rows["mtad"], rows["speculative"]["forward_time_s"] / fwd(rows["speculative"])
            nb = sum(n for _, _, b, _, n in parse_calls(m["forward_calls"]) if b > 1)
            d["beam_step_in_decode_t1"] = (m["forward_time_s"] / scale - fwd(m, beams=False)) / nb / t1
            d["beam_step_isolated_t1"] = sum(pr.cost("draft", "seq", 4, 1) for pr in profs) / 2 / 1e3 / t1
            d["mtad_over_spec_forward_per_step"] = (
                d["mtad"]["forward_s_per_step"] / d["speculative"]["forward_s_per_step"]
            )
        out.append(d)
    return out


# ---- outputs -------------------------------------------------------------------------------------------------
def _ci(t, d=2):
    return f"{t[0]:.{d}f} [{t[1]:.{d}f}, {t[2]:.{d}f}]"


def markdown(res: dict) -> str:
    out = [
        "# Regime map: MTAD against speculative decoding and block verification along draft strength",
        "",
        f"SmolLM2-135M-Instruct target (embedded, bfloat16) on {res['hardware']}, one thread; "
        "drafts of the same target. "
        "α: held-out, the draft card's method (fp32 target's own samples, 10 GSM8K test + 10 HumanEval prompts, "
        "T = 1, top-k 10, top-p 0.9; 95 % interval over prompts). L: mean accepted length per verification step "
        "(τ + 1) in the same-draft study (GSM8K + MT-Bench, 20 prompts each, 48 tokens, a context every 6; γ = 4; "
        "common random numbers), pooled over both tasks; ratios with 95 % intervals over (task, prompt) clusters. "
        "Oracle rows (λ) draft from λ·q + (1 − λ)·p: hardware-free only, never timed.",
        "",
        "| draft | held-out α | L token-wise | L block | L MTAD τ=0.1 / 0.5 / 0.9 | MTAD τ=0.5 / token-wise | "
        "MTAD τ=0.5 / block | block / token-wise |",
        "|" + " --- |" * 8,
    ]
    for r in sorted(res["drafts"], key=lambda r: r["alpha"][0]):
        name = r["name"] + (f" (oracle λ={r['oracle_mix']:g})" if r["oracle_mix"] is not None else "")
        L = r["L"]
        out.append(
            f"| {name} | {_ci(r['alpha'])} | {L['lossless']:.2f} | {L['block']:.2f} | "
            f"{L['mtad (τ=0.1)']:.2f} / {L['mtad (τ=0.5)']:.2f} / {L['mtad (τ=0.9)']:.2f} | "
            f"{_ci(r['vs_spec']['0.5'], 3)} | {_ci(r['vs_block']['0.5'], 3)} | {_ci(r['block_vs_spec'], 3)} |"
        )
    out += [
        "",
        "MTAD / token-wise block-efficiency ratio at every τ:",
        "",
        "| draft | α | " + " | ".join(f"τ={t}" for t in TAUS) + " |",
        "|" + " --- |" * (2 + len(TAUS)),
    ]
    for r in sorted(res["drafts"], key=lambda r: r["alpha"][0]):
        out.append(f"| {r['name']} | {r['alpha'][0]:.2f} | " + " | ".join(_ci(r["vs_spec"][t], 3) for t in TAUS) + " |")
    out += [
        "",
        "## Simulated speed-up MTAD (τ = 0.5) / speculative from the study's histograms",
        "",
        "This CPU: at each draft's own measured costs (where measured) and at the committed feature draft's costs "
        "(what a draft of this α would give at that cost). GPU: **projections** under the declared profiles "
        "(favourable corner c low, c_W = c, v = 1.0 – unfavourable corner c high, c_W = 1.1 c, v = 1.1).",
        "",
        "| draft | α | CPU, own cost | CPU, feature-draft cost | "
        + " | ".join(f"projection: {GPU_PROFILES[k][0]}" for k in GPU_PROFILES)
        + " |",
        "|" + " --- |" * (4 + len(GPU_PROFILES)),
    ]
    for r in sorted(res["drafts"], key=lambda r: r["alpha"][0]):
        s = r["simulated"]

        def cell(k, s=s):
            return f"{s[k]['mtad_vs_spec']['0.5']:.3f}" if k in s else "—"

        gp = [
            f"{min(s[k + '_lo']['mtad_vs_spec']['0.5'], s[k + '_hi']['mtad_vs_spec']['0.5']):.3f}–"
            f"{max(s[k + '_lo']['mtad_vs_spec']['0.5'], s[k + '_hi']['mtad_vs_spec']['0.5']):.3f}"
            for k in GPU_PROFILES
        ]
        out.append(
            f"| {r['name']} | {r['alpha'][0]:.2f} | {cell('cpu_own')} | {cell('cpu_feature_cost')} | "
            + " | ".join(gp)
            + " |"
        )
    out += [
        "",
        "## Simulator check against measured interleaved runs on this CPU",
        "",
        "Each draft: a cost profile measured just before and just after interleaved runs of sampling, speculative, "
        "block verification and MTAD (GSM8K, one thread); the prediction uses the mean of the two profiles and the "
        "run's own accepted-length histogram and prompt count; error = predicted / measured − 1. Every point:",
        "",
        "| draft | decoder | measured ms/token [95 % CI] | predicted (before / after) | error | "
        "predicted from the run's forward counts | its error | block eff. |",
        "|" + " --- |" * 8,
    ]
    for m in res["measured"]:
        for p in m["points"]:
            out.append(
                f"| {m['name']} | {p['decoder']} | {_ci(p['measured_ms_per_token'], 1)} | "
                f"{p['predicted_ms_per_token']:.1f} ({p['predicted_before']:.1f} / {p['predicted_after']:.1f}) | "
                f"{100 * p['error']:+.1f} % | "
                + (
                    f"{p['predicted_from_calls']:.1f} | {100 * p['error_from_calls']:+.1f} % | "
                    if p.get("predicted_from_calls")
                    else "— | — | "
                )
                + f"{p['block_efficiency']:.2f} |"
            )
    out += [
        "",
        "Speed-ups (ratios of ms/token; the machine's slowdown cancels): measured with paired 95 % intervals "
        "over prompts, predicted, error = predicted / measured − 1:",
        "",
        "| draft | decoder | vs sampling: measured | predicted | error | vs speculative: measured | predicted | "
        "error |",
        "|" + " --- |" * 8,
    ]
    for name, c in res.get("checks", {}).items():
        for p in c["points"]:
            cells = []
            for ref in ("sampling", "speculative"):
                v = p.get(f"speedup_vs_{ref}")
                if not v or not v.get("measured"):
                    cells += ["—", "—", "—"]
                    continue
                cells += [_ci(v["measured"], 3), f"{v['predicted']:.3f}", f"{100 * v['error']:+.1f} %"]
            out.append(f"| {name} | {p['decoder']} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Where the time went (from each run's own counters; t1 = one target step at the profiles' mean):",
        "",
        "| draft | forward time measured / isolated profile: sampling, speculative, block, MTAD | harness time per "
        "step (t1): speculative, MTAD | MTAD beam step in the decode / isolated (t1) | MTAD / speculative "
        "forward time per step |",
        "|" + " --- |" * 5,
    ]
    for d in res.get("diagnosis", []):
        if "beam_step_in_decode_t1" not in d:
            continue
        out.append(
            f"| {d['draft']} | "
            + ", ".join(
                f"{d[k]['forward_measured_over_profile']:.2f}" for k in ("sampling", "speculative", "block", "mtad")
            )
            + f" | {d['speculative']['harness_per_step_t1']:.3f}, {d['mtad']['harness_per_step_t1']:.3f} | "
            f"{d['beam_step_in_decode_t1']:.3f} / {d['beam_step_isolated_t1']:.3f} | "
            f"{d['mtad_over_spec_forward_per_step']:.2f} |"
        )
    out += [
        "",
        "| draft | α | MTAD / speculative measured [95 % CI] | predicted | MTAD / block measured | predicted | "
        "BE ratio MTAD/spec (decoder) | c | c_W | v |",
        "|" + " --- |" * 10,
    ]
    for m in res["measured"]:
        sv, pf = m["mtad_vs_spec"], m["profile"]
        out.append(
            f"| {m['name']} | {m['alpha'][0]:.2f} | {_ci(sv['measured'], 3)} | {sv['predicted']:.3f} | "
            f"{m['mtad_vs_block_measured']:.3f} | {m['mtad_vs_block_predicted']:.3f} | {m['be_ratio_vs_spec']:.3f} | "
            f"{pf['c']:.3f} | {pf['c_W']:.3f} | {pf['v']:.3f} |"
        )
    return "\n".join(out) + "\n"


def _finish(ax, title: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("held-out α of the draft (draft card's method; oracle: 1 − λ + λ·α)")
    ax.set_xlim(0.3, 1.0)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, frameon=False)


def reading(res: dict) -> str:
    """One sentence from the numbers: MTAD (τ = 0.5) / token-wise accepted-length ratio at the weakest and the
    strongest real draft, and the measured speed-up range."""
    real = sorted((r for r in res["drafts"] if r["oracle_mix"] is None), key=lambda r: r["alpha"][0])
    if not real:
        return ""
    lo, hi = real[0], real[-1]
    text = (
        f"At τ = 0.5 MTAD's joint rule accepts {lo['vs_spec']['0.5'][0]:.2f}× token-wise's mean length "
        f"with the weakest draft (α {lo['alpha'][0]:.2f}) and {hi['vs_spec']['0.5'][0]:.2f}× with the strongest "
        f"real draft (α {hi['alpha'][0]:.2f})"
    )
    if res["measured"]:
        v = [m["mtad_vs_spec"]["measured"][0] for m in res["measured"]]
        text += f"; measured here, the mtad decoder is {min(v):.2f}–{max(v):.2f}× speculative decoding"
    return text + "."


def figure(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(res["drafts"], key=lambda r: r["alpha"][0])
    hardware = res.get("hardware", "this CPU")
    fig, axes = plt.subplots(2, 2, figsize=(14, 12.5))
    colors = dict(zip(TAUS, ("#fdae61", "#f46d43", "#d73027", "#a50026", "#67001f")))
    x = np.array([r["alpha"][0] for r in rows])
    xerr = np.array([[r["alpha"][0] - r["alpha"][1], r["alpha"][2] - r["alpha"][0]] for r in rows]).T
    for ax, key, title in (
        (axes[0, 0], "vs_spec", "block-efficiency ratio MTAD / token-wise speculative"),
        (axes[0, 1], "vs_block", "block-efficiency ratio MTAD / block verification"),
    ):
        key_m = "spec" if key == "vs_spec" else "block"
        real = np.array([r["oracle_mix"] is None for r in rows])
        for k, t in enumerate(TAUS):
            y = np.array([r[key][t][0] for r in rows])
            yerr = np.array([[r[key][t][0] - r[key][t][1], r[key][t][2] - r[key][t][0]] for r in rows]).T
            for sel, fmt, mfc, lab in (
                (
                    real,
                    "o-",
                    None,
                    f"MTAD joint rule τ = {t}, same-draft study, real drafts "
                    "(x offset ±0.008 for legibility; α interval on τ = 0.5)",
                ),
                (~real, "o", "white", f"same, τ = {t}, oracle mixtures (not connected)"),
            ):
                if sel.any():
                    ax.errorbar(
                        x[sel] + 0.004 * (k - 2),
                        y[sel],
                        yerr=yerr[:, sel],
                        xerr=xerr[:, sel] if k == 2 else None,
                        fmt=fmt,
                        ms=4,
                        lw=1,
                        capsize=2,
                        color=colors[t],
                        mfc=mfc,
                        label=lab,
                    )
        for r in rows:
            if r["oracle_mix"] is not None:
                ax.annotate(
                    f"oracle λ={r['oracle_mix']:g}",
                    (r["alpha"][0], r[key]["0.5"][0]),
                    fontsize=7,
                    xytext=(4, -10),
                    textcoords="offset points",
                )
        meas = res["measured"]
        if meas:
            ax.plot(
                [m["alpha"][0] for m in meas],
                [m["be_ratio_vs_" + key_m] for m in meas],
                "D",
                color="#1f78b4",
                ms=7,
                zorder=6,
                label="the mtad decoder (beam drafts, τ = 0.5) / the same pair's run, measured here on GSM8K",
            )
        if key == "vs_spec":
            ax.scatter(
                [p[1] for p in PAPER_RUNS],
                [p[2] / p[3] for p in PAPER_RUNS],
                marker="*",
                s=120,
                color="k",
                zorder=5,
                label="paper, MTAD / SpecInfer tree (x: SpecInfer acceptance)",
            )
        ax.axhline(1, color="grey", lw=0.8, ls=":")
        _finish(ax, title, "ratio of mean accepted length (Σ L / Σ L)")
    for ax, key, title in (
        (axes[1, 0], "mtad_vs_spec", "speed-up MTAD (τ = 0.5) / speculative"),
        (axes[1, 1], "mtad_vs_block", "speed-up MTAD (τ = 0.5) / block verification"),
    ):
        own = [(r["alpha"][0], r["simulated"]["cpu_own"][key]["0.5"]) for r in rows if "cpu_own" in r["simulated"]]
        if own:
            ax.plot(
                *zip(*own),
                "s",
                color="#1f78b4",
                mfc="none",
                ms=8,
                label="simulated, this CPU, each draft at its own measured cost",
            )
        feat = [
            (r["alpha"][0], r["simulated"]["cpu_feature_cost"][key]["0.5"])
            for r in rows
            if "cpu_feature_cost" in r["simulated"] and r["oracle_mix"] is None
        ]
        if feat:
            ax.plot(
                *zip(*feat),
                "-",
                color="#1f78b4",
                lw=1.5,
                label="simulated from the study's histograms, this CPU, every real draft at the feature draft's cost",
            )
        realr = [r for r in rows if r["oracle_mix"] is None]
        xr = np.array([r["alpha"][0] for r in realr])
        for k, col in (("llama8b_1b", "#33a02c"), ("opt13b_125m", "#6a3d9a")):
            lo = [r["simulated"][f"{k}_lo"][key]["0.5"] for r in realr]
            hi = [r["simulated"][f"{k}_hi"][key]["0.5"] for r in realr]
            ax.fill_between(
                xr,
                np.minimum(lo, hi),
                np.maximum(lo, hi),
                color=col,
                alpha=0.25,
                label=f"PROJECTION: {GPU_PROFILES[k][0].removeprefix('GPU, ')} on a GPU "
                f"(declared c {GPU_PROFILES[k][1][0]:g}–{GPU_PROFILES[k][1][1]:g}, v 1.0–1.1)",
            )
        meas = res["measured"]
        for m in meas:
            lo, hi = m["projected"]["llama8b_1b"][key]
            ax.plot(
                [m["alpha"][0]] * 2,
                [lo, hi],
                "-",
                color="#33a02c",
                lw=5,
                alpha=0.8,
                solid_capstyle="butt",
                label="PROJECTION: 8B/1B GPU costs on the mtad decoder's own histograms" if m is meas[0] else None,
            )
        if meas:
            if key == "mtad_vs_spec":
                mx = [m["alpha"][0] for m in meas]
                my = [m["mtad_vs_spec"]["measured"][0] for m in meas]
                me = [
                    [m["mtad_vs_spec"]["measured"][0] - m["mtad_vs_spec"]["measured"][1] for m in meas],
                    [m["mtad_vs_spec"]["measured"][2] - m["mtad_vs_spec"]["measured"][0] for m in meas],
                ]
                ax.errorbar(
                    mx,
                    my,
                    yerr=me,
                    fmt="D",
                    color="#e31a1c",
                    capsize=3,
                    label="measured here, mtad decoder (beam drafts), paired 95 % CI",
                )
            else:
                ax.plot(
                    [m["alpha"][0] for m in meas],
                    [m["mtad_vs_block_measured"] for m in meas],
                    "D",
                    color="#e31a1c",
                    label="measured here, mtad decoder (beam drafts), ratio of ms/token",
                )
        if key == "mtad_vs_spec":
            ax.scatter(
                [p[1] for p in PAPER_RUNS],
                [p[5] / p[4] for p in PAPER_RUNS],
                marker="*",
                s=120,
                color="k",
                zorder=5,
                label="paper, MTAD / SpecInfer per-run ms/token (x: SpecInfer acceptance)",
            )
            for lbl, v in PAPER_HEADLINES:
                ax.axhline(v, color="k", lw=0.8, ls="--")
                ax.text(
                    0.99,
                    v,
                    f"paper headline vs speculative, {lbl}: {v}× (no α given) ",
                    fontsize=7,
                    va="top",
                    ha="right",
                    transform=ax.get_yaxis_transform(),
                )
        ax.axhline(1, color="grey", lw=0.8, ls=":")
        _finish(ax, title, "speed-up (ratio of ms/token)")
    fig.suptitle(
        "When does joint verification pay? Target SmolLM2-135M-Instruct (bf16) with drafts of increasing "
        f"strength, γ = 4\nmeasured on {hardware} (1 thread); GPU bands are PROJECTIONS under declared "
        "costs, not measurements",
        fontsize=11,
    )
    fig.text(0.5, 0.004, reading(res), ha="center", fontsize=8.5, wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    res = build()
    ROOT.joinpath("regimes.json").write_text(json.dumps(res, indent=1, default=float))
    ROOT.joinpath("regimes.md").write_text(markdown(res))
    figure(res, ROOT / "regimes.png")
    print(f"wrote {ROOT / 'regimes.md'}, {ROOT / 'regimes.json'}, {ROOT / 'regimes.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``regimes.md``: the map's tables, every one from :func:`table`, each cell from the dict
:func:`mtad.study.regimes.build.build` returns."""
from __future__ import annotations

from mtad.measure.simulate import DECODERS, GPU_PROFILES
from mtad.report.markdown import interval
from mtad.report.markdown import table as md_table
from mtad.study.regimes import why
from mtad.study.regimes.build import WITHIN, within
from mtad.study.regimes.inputs import TAUS
from mtad.study.regimes.two_axis import tables as two_axis_tables


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table, a blank line after it."""
    return [*md_table(header, rows), ""]


def ci(t, d: int = 2) -> str:
    """``point [lo, hi]``; the point and ``[—]`` where the interval is missing (too few prompts)."""
    return interval(t or None, d, bare=" [—]")


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:+.1f} %"


def num(x, d: int = 3) -> str:
    return "—" if x is None else f"{x:.{d}f}"


def by_alpha(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["alpha"][0])


def draft_tables(res: dict) -> list[str]:
    rows = []
    for r in by_alpha(res["drafts"]):
        name = r["name"] + (f" (oracle λ={r['oracle_mix']:g})" if r["oracle_mix"] is not None else "")
        L = r["L"]
        rows.append([name, ci(r["alpha"]), f"{L['lossless']:.2f}", f"{L['block']:.2f}",
                     f"{L['mtad (τ=0.1)']:.2f} / {L['mtad (τ=0.5)']:.2f} / {L['mtad (τ=0.9)']:.2f}",
                     ci(r["vs_spec"]["0.5"], 3), ci(r["vs_block"]["0.5"], 3), ci(r["block_vs_spec"], 3)])
    out = table(["draft", "held-out α", "L token-wise", "L block", "L MTAD τ=0.1 / 0.5 / 0.9",
                 "MTAD τ=0.5 / token-wise", "MTAD τ=0.5 / block", "block / token-wise"], rows)
    out += ["MTAD / token-wise block-efficiency ratio at every τ:", ""]
    out += table(["draft", "α", *(f"τ={t}" for t in TAUS)],
                 [[r["name"], f"{r['alpha'][0]:.2f}", *(ci(r["vs_spec"][t], 3) for t in TAUS)]
                  for r in by_alpha(res["drafts"])])
    return out


TV_RULES = (("lossless", "token-wise (Monte-Carlo floor)"), ("block", "block"), ("mtad (τ=0.1)", "MTAD τ=0.1"),
            ("mtad (τ=0.5)", "MTAD τ=0.5"), ("mtad (τ=0.9)", "MTAD τ=0.9"), ("typical (ε=0.09, δ=0.3)", "typical"),
            ("fuzzy (JS≤0.4)", "fuzzy JS≤0.4"))


def tv_table(res: dict) -> list[str]:
    tvs = res.get("tv") or {}
    if not tvs:
        return ["No first-token TV yet (`experiments/regime_tv.sh`).", ""]
    first = next(iter(tvs.values()))
    alpha = {r["name"]: r["alpha"][0] for r in res["drafts"]}
    names = sorted(tvs, key=lambda n: alpha.get(n, 9))
    rows = [[n, f"{alpha[n]:.2f}" if n in alpha else "—",
             *(" / ".join(num(tvs[n].get(t, {}).get(k, [None])[0], 3) for t in ("gsm8k", "mt_bench"))
               for k, _ in TV_RULES)] for n in names]
    return [f"Total variation between the law of the first committed token and the filtered target p̃₁ at "
            f"{first['contexts']} fixed contexts per task ({first['draws']} fresh drafts each; the study's own "
            "contexts and seeds), GSM8K / MT-Bench. A lossless rule's value is the Monte-Carlo floor; per-task "
            "intervals are in `tv/tv-<draft>.md`.", "",
            *table(["draft", "α", *(h for _, h in TV_RULES)], rows)]


def decoders_table(res: dict) -> list[str]:
    dec = res.get("decoders")
    if not dec:
        return ["No decoder runs along α yet (`experiments/regime_decoders.py`).", ""]
    others = ("block", "mtad", "mmtad", "specinfer")
    rows = []
    for name, d in sorted(dec["drafts"].items(), key=lambda kv: (kv[1]["alpha"] or [9])[0]):
        vs = d["vs_speculative"]
        rows.append([name, f"{d['alpha'][0]:.2f}" if d["alpha"] else "—",
                     num(d["decoders"]["speculative"]["block_efficiency"], 2),
                     *(ci(vs.get(k, {}).get("block_efficiency_ratio"), 3) for k in others),
                     ci(vs["mtad"].get("ppl_change"), 1), ci(vs["mtad"].get("distinct2_diff"), 3),
                     ci(vs["mmtad"].get("ppl_change"), 1), ci(vs["mmtad"].get("distinct2_diff"), 3)])
    return ["Each real draft decoding GSM8K and MT-Bench prompts with every decoder, interleaved "
            "(`decoders/decoders.md`, published as " + ", ".join(res["provenance"]["decoders"])
            + "): block efficiency (tokens per target forward) of speculative decoding, each decoder's ratio to it, "
            "and MTAD's and MMTAD's perplexity change and distinct-2 difference against it (paired 95 % intervals "
            "over prompts):", "",
            *table(["draft", "α", "BE speculative", *(f"BE {k} / spec" for k in others), "MTAD ppl change %",
                    "MTAD distinct-2 − spec", "MMTAD ppl change %", "MMTAD distinct-2 − spec"], rows)]


def simulated_table(res: dict) -> list[str]:
    def corners(s, k):
        v = sorted(s[f"{k}_{e}"]["mtad_vs_spec"]["0.5"] for e in ("lo", "hi"))
        return f"{v[0]:.3f}–{v[1]:.3f}"

    rows = [[r["name"], f"{r['alpha'][0]:.2f}",
             *(num(s[k]["mtad_vs_spec"]["0.5"]) if k in s else "—" for k in ("cpu_own", "cpu_feature_cost")),
             *(corners(s, k) for k in GPU_PROFILES)]
            for r in by_alpha(res["drafts"]) for s in (r["simulated"],)]
    return table(["draft", "α", "CPU, own cost", "CPU, feature-draft cost",
                  *(f"projection: {GPU_PROFILES[k][0]}" for k in GPU_PROFILES)], rows)


def check_tables(res: dict) -> list[str]:
    checks = res.get("checks", {})
    if not checks:
        return ["No simulator check in the calibrated format yet (`experiments/regime_check.py`).", ""]
    points = [(name, p) for name, c in checks.items() for p in c["points"]]
    rows = [[name, p["decoder"], ci(p["measured_ms_per_token"], 1), ci(p["measured_wall_ms_per_token"], 1),
             f"{p['predicted_ms_per_token']:.1f} ({p['predicted_before_after'][0]:.1f}–"
             f"{p['predicted_before_after'][1]:.1f})" if p.get("predicted_before_after")
             else num(p["predicted_ms_per_token"], 1),
             pct(p["error"]), num(p["predicted_from_calls"], 1), pct(p["error_from_calls"]),
             num(p["block_efficiency"], 2)] for name, p in points]
    out = table(["draft", "decoder", "measured CPU ms/token [95 % CI]", "measured wall ms/token [95 % CI]",
                 "predicted (before–after)", "error", "predicted from the run's forward counts", "its error",
                 "block eff."], rows)
    (k, n), (kc, nc) = within([p for _, p in points]), within([p for _, p in points], "error_from_calls")
    out += [f"{k} of {n} points are predicted within ±{100 * WITHIN:.0f} % of the measured CPU ms/token from "
            f"their histograms, {kc} of {nc} from their forward counts.", ""]
    out += ["Speed-ups (ratios of ms/token): measured in CPU time with paired 95 % intervals over prompts, the "
            "wall-clock figure beside it, predicted, error = predicted / measured CPU − 1:", ""]
    rows = []
    for name, p in points:
        cells = []
        for ref in ("sampling", "speculative"):
            v = p.get(f"speedup_vs_{ref}") or {}
            cells += ([ci(v["measured"], 3), ci(v.get("measured_wall"), 3), num(v["predicted"]), pct(v["error"])]
                      if v.get("measured") else ["—"] * 4)
        rows.append([name, p["decoder"], *cells])
    out += table(["draft", "decoder", "vs sampling: measured CPU", "measured wall", "predicted", "error",
                  "vs speculative: measured CPU", "measured wall", "predicted", "error"], rows)
    out += ["The calibrated costs (the decoders' own forwards on held-out calibration prompts, before the runs, "
            "after them, and pooled, which the predictions use): t1 one target step in CPU ms, c, c_W and v in t1, "
            "harness time per step outside forwards in t1:", ""]
    rows = [[name, which, num(pf["t1"], 1), num(pf["c"]), num(pf["c_W"]), num(pf["v"]),
             " / ".join(num(pf["overhead"].get(d)) for d in DECODERS)]
            for name, c in checks.items() for which, pf in c["calibration"].items()]
    out += table(["draft", "calibration", "t1 ms", "c", "c_W", "v",
                  "harness per step: " + " / ".join(DECODERS)], rows)
    rows = [[m["name"], f"{m['alpha'][0]:.2f}", ci(m["mtad_vs_spec"]["measured"], 3),
             num(m["mtad_vs_spec"]["predicted"]),
             ci(m["mtad_vs_block"], 3) if m.get("mtad_vs_block") else num(m["mtad_vs_block_measured"]),
             num(m["mtad_vs_block_predicted"]),
             num(m["be_ratio_vs_spec"]), ci(m.get("distinct2_vs_spec"), 3) if m.get("distinct2_vs_spec") else "—"]
            for m in res["measured"]]
    out += ["The mtad decoder against the same pair's speculative and block runs, measured (CPU time) and predicted, "
            "with the ratio of its block efficiency to speculative's and the difference of their outputs' distinct-2 "
            "(paired 95 % CI):", ""]
    return out + table(["draft", "α", "MTAD / speculative measured [95 % CI]", "predicted",
                        "MTAD / block measured [95 % CI]",
                        "predicted", "BE ratio MTAD/spec (decoder)", "distinct-2 MTAD − spec [95 % CI]"], rows)


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
        "Provenance: α rows from " + ", ".join(res["provenance"]["alpha"]) + "; study runs from "
        + ", ".join(res["provenance"]["study"]) + "; simulator-check runs published as "
        + ", ".join(res["provenance"]["checks"]) + " (rows and per-prompt records under `results/published/`)"
        + ("; TV runs from " + ", ".join(res["provenance"]["tv"]) if res["provenance"].get("tv") else "") + ".",
        "",
        why.block(res["why"]) if res.get("why") else "",
        "",
        *draft_tables(res),
        "## Distance from the target's law: first-token TV",
        "",
        *tv_table(res),
        "## Every decoder along α, on real text: MMTAD and SpecInfer beside MTAD",
        "",
        *decoders_table(res),
        "## Simulated speed-up MTAD (τ = 0.5) / speculative from the study's histograms",
        "",
        "This CPU: at each checked draft's own calibrated costs and at the committed feature draft's (what a draft "
        "of this α would give at that cost). GPU: **projections** under the declared profiles "
        "(`mtad/measure/gpu_profiles.py`; favourable corner c low, c_W = c, v = 1.0 – unfavourable corner c high, "
        + ", ".join(sorted({f"c_W = {g[3]:.2f} c, v = {g[2][1]:.2f}" for g in GPU_PROFILES.values()})) + ").",
        "",
        *simulated_table(res),
        "## Two axes: draft strength × hardware cost, every decoder against speculative decoding",
        "",
        "The real decoders' tokens per target forward over speculative decoding's (the published every-decoder "
        "runs), priced step by step at a declared GPU's costs (`mtad.study.forecast.regime2d`): **projections**. "
        "Figure: `two_axis.png` (the camera-ready pair's c, over c_W/c and over v(5)).",
        "",
        *two_axis_tables(res),
        "## Simulator check against measured interleaved runs on this CPU",
        "",
        "Each draft: a cost profile calibrated on the decoders' own forwards (held-out prompts decoded just before "
        "and just after interleaved runs of sampling, speculative, block verification and MTAD; GSM8K, one thread); "
        "the prediction uses the pooled profile and the run's own accepted-length histogram and prompt count (the "
        "before and after profiles bracket it), a second one the run's own forward counts; "
        "error = predicted / measured CPU ms/token − 1. Every point:",
        "",
        *check_tables(res),
    ]
    return "\n".join(out).rstrip("\n") + "\n"

"""Every decoder along the draft-strength axis: speculative decoding, block verification, MTAD, MMTAD and SpecInfer
decoding real text with each real draft of the regime map (``results/regimes/drafts.tsv``).

    .venv/bin/python experiments/regime_decoders.py [--draft token --draft int8 ...] [--prompts 10] [--tokens 48]
    .venv/bin/python experiments/regime_decoders.py --from results/published/NAME.jsonl   # re-render

The same-draft study scores accept rules on one draft chain per context; it has no tree decoder and writes no
free text. Here each draft's pair decodes GSM8K (test) and MT-Bench prompts with every decoder, interleaved
(``mtad.harness.runner.run_interleaved``: prompt by prompt, rotating order), one thread, γ = 4, W = 4, T = 1,
top-k 10, top-p 0.9 (the decoders' presets). Per draft, against lossless speculative decoding on the same
prompts: the block-efficiency ratio (tokens per target forward, prefills included), the output perplexity change,
the distinct-2 difference and the CPU-time speed-up, each with a paired 95 % interval over prompts (the
project's bootstrap, ``mtad.report.stats``; both tasks' prompts pooled); and each decoder's own block efficiency
and acceptance. Writes ``decoders.{json,md,png}`` to ``results/regimes/decoders/``; ``--from`` re-renders them
from (published) rows and their per-prompt records.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.paths import REPO_ROOT, repo_relative  # noqa: E402
from mtad.harness import clicheck  # noqa: E402
from mtad.report import stats  # noqa: E402
from mtad.report.markdown import DASH  # noqa: E402
from mtad.report.markdown import table as md_table  # noqa: E402
from mtad.study.regimes.inputs import alphas, drafts  # noqa: E402

DECODERS = ("speculative", "block", "mtad", "mmtad", "specinfer")
BASELINE = "speculative"
TASKS = ("gsm8k", "mt_bench")
KINDS = (("block_efficiency_ratio", "block-efficiency ratio"), ("ppl_change", "perplexity change"),
         ("distinct2_diff", "distinct-2 difference"), ("cpu_speedup", "speed-up, CPU time"))
OUT = REPO_ROOT / "results" / "regimes" / "decoders"


def overrides(d: dict) -> list[str]:
    """A drafts.tsv row as Hydra overrides: its pair and its ``model.*`` arguments (a draft from elsewhere)."""
    return [f"model={d['model']}", *(a for a in d["extra"] if a.startswith("model."))]


def jobs(d: dict, task: str, prompts: int, tokens: int, out: Path) -> list[list[str]]:
    """One draft's runs on one task as Hydra overrides, one per decoder."""
    common = [*overrides(d), f"task={task}", f"task.n_prompts={prompts}", "task.few_shot=0",
              f"decoder.max_new_tokens={tokens}", "num_threads=1", "warmup=1", "name=regime_decoders",
              "progress=false", "perplexity=true", f"results_dir={repo_relative(out)}"]
    return [[f"decoder={dec}", *common] for dec in DECODERS]


def draft_of(row: dict, table: list[dict]) -> str:
    """The drafts.tsv name of a row: the line of its pair whose ``model.draft`` is the row's draft, else the
    pair's line without one (the pair's own draft)."""
    m = row["model"]
    lines = [(d["name"], dict(a.split("=", 1) for a in overrides(d))) for d in table]
    mine = [(name, ov) for name, ov in lines if ov["model"] == m["name"]]
    named = [name for name, ov in mine if ov.get("model.draft") == m.get("draft")]
    own = [name for name, ov in mine if "model.draft" not in ov]
    if named or own:
        return (named or own)[0]
    raise SystemExit(f"row {row.get('config_hash')}: model {m['name']} with draft {m.get('draft')} is not a "
                     "draft of results/regimes/drafts.tsv")


def decoder_of(row: dict) -> str:
    """The preset a row ran: ``block`` is speculative decoding with the block-verification rule."""
    d = row["decoder"]
    return "block" if d["name"] == "speculative" and d.get("accept") == "block" else d["name"]


def _iv(iv) -> list | None:
    return stats.judged(iv)  # settled where a verdict is printed; a run's own figure has none


def analyze(rows: list[dict], search: list[Path], root: Path) -> dict:
    """Per draft and decoder: own figures and the comparisons with speculative decoding on the same prompts."""
    table, al = drafts(root), alphas(root)
    runs: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        runs.setdefault(draft_of(r, table), {}).setdefault(decoder_of(r), []).append(r)
    out = {}
    for name, by_dec in runs.items():
        recs = {}
        for dec, rs in by_dec.items():
            pooled = {}
            for r in sorted(rs, key=lambda r: r["task"]["name"]):
                got = stats.samples_for([r.get("run_dir")], None, search)
                if got is None:
                    raise SystemExit(f"per-prompt records not found for {name}/{dec} ({r.get('run_dir')}): pass "
                                     "the folder holding the run directories")
                pooled.update({(r["task"]["name"], *k): v for k, v in got.items()})
            recs[dec] = pooled
        own = {}
        for dec, rs in by_dec.items():
            toks = sum(r["metrics"]["total_tokens"] for r in rs)
            fwd = sum(v["target_forwards"] for v in recs[dec].values())
            acc = [v["accepted"] for v in recs[dec].values()]
            prop = [v["proposed"] for v in recs[dec].values()]
            own[dec] = {"block_efficiency": toks / fwd if fwd else None,
                        "acceptance": sum(acc) / sum(prop) if sum(prop) else None,
                        "perplexity": _iv(stats.run_interval(recs[dec], "ppl")),
                        "prompts": len(recs[dec]), "tokens": toks,
                        "tasks": sorted(r["task"]["name"] for r in rs)}
        comps = {dec: {kind: _iv(stats.compare(kind, recs[dec], recs[BASELINE])) for kind, _ in KINDS}
                 for dec in by_dec if dec != BASELINE and BASELINE in recs}
        out[name] = {"alpha": al.get(name), "decoders": own, "vs_speculative": comps}
    pubs = sorted({(r.get("publication") or {}).get("name") for r in rows} - {None})
    return {"drafts": out, "publication": ", ".join(pubs) or None, "git_sha": sorted({r.get("git_sha") for r in rows}),
            "git_dirty": sorted({r.get("git_dirty") for r in rows}),
            "hardware": rows[0].get("device_name", "this CPU"), "pair": "SmolLM2-135M-Instruct target, bfloat16",
            "tokens": rows[0]["decoder"].get("max_new_tokens")}


def ordered(res: dict) -> list[tuple[str, dict]]:
    return sorted(res["drafts"].items(), key=lambda kv: (kv[1]["alpha"] or [9])[0])


def render(res: dict) -> str:
    first = next(iter(res["drafts"].values()))["decoders"][BASELINE]
    out = ["# Every decoder along draft strength: speculative, block verification, MTAD, MMTAD, SpecInfer", "",
           f"{res['pair']} on {res['hardware']}, one thread; each real draft of the regime map decodes GSM8K "
           f"(test) and MT-Bench prompts ({first['prompts']} records per decoder, {res['tokens']} new tokens) with "
           "every decoder, interleaved prompt by prompt; γ = 4, W = 4, T = 1, top-k 10, top-p 0.9 (SpecInfer: its "
           "static tree of 4·2·2). Block efficiency: tokens per target forward (prefills included). Paired 95 % "
           "intervals over prompts (the project's bootstrap); ratios above 1 favour the decoder; CPU time is the "
           "process's CPU seconds. Commits: " + ", ".join(f"{s[:10]}" for s in res["git_sha"] if s)
           + ("; clean trees." if res["git_dirty"] == [False] else f"; trees dirty: {res['git_dirty']}.")
           + (f" Published as `{res['publication']}` (rows and per-prompt records under `results/published/`)."
              if res.get("publication") else ""), "",
           "## Block efficiency (tokens per target forward) and acceptance", ""]
    rows = []
    for name, d in ordered(res):
        be = [_num(d["decoders"].get(k, {}).get("block_efficiency")) for k in DECODERS]
        ac = [_num(d["decoders"].get(k, {}).get("acceptance")) for k in DECODERS]
        rows.append([name, _alpha(d), *be, " / ".join(ac)])
    out += md_table(["draft", "α", *DECODERS, "acceptance: " + " / ".join(DECODERS)], rows)
    others = [k for k in DECODERS if k != BASELINE]
    for kind, head in KINDS:
        rows = [[name, _alpha(d), *(stats.printed_interval(d["vs_speculative"].get(k, {}).get(kind), kind)
                                    for k in others)] for name, d in ordered(res)]
        out += ["", f"## Against speculative decoding: {head}", "", *md_table(["draft", "α", *others], rows)]
    return "\n".join(out) + "\n"


def _num(x) -> str:
    return DASH if x is None else f"{x:.2f}"


def _alpha(d: dict) -> str:
    return _num(d["alpha"][0] if d["alpha"] else None)


def figure(res: dict, path: Path) -> None:
    """Two panels along α (the regime map's, :func:`mtad.study.regimes.figure.decoders_panel`): block-efficiency
    ratio and distinct-2 difference against speculative decoding, per decoder, with their intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtad.study.regimes.figure import decoders_panel

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.6))
    decoders_panel(axes[0], res, "block_efficiency_ratio")
    decoders_panel(axes[1], res, "distinct2_diff")
    fig.suptitle(f"Every decoder along draft strength — {res['pair']}, {res['hardware']} (95 % CI over prompts)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = clicheck.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", action="append", help="drafts.tsv names (default: every real draft)")
    ap.add_argument("--prompts", type=clicheck.positive_int, default=10, help="prompts per task")
    ap.add_argument("--tokens", type=clicheck.positive_int, default=48, help="new tokens per prompt")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--root", default=str(REPO_ROOT / "results" / "regimes"), help="the regime map's folder",
                    type=clicheck.folder_with("drafts.tsv", "alpha.jsonl", fix="give the regime map's folder "
                                              "(results/regimes)"))
    ap.add_argument("--from", dest="rows", type=clicheck.rows_file("give a results .jsonl written by this "
                                                                   "script's runs (results/published/NAME.jsonl)"),
                    help="re-render from these rows (a results .jsonl) and their records")
    args = ap.parse_args(argv)
    out, root = clicheck.check_or_exit(ap, clicheck.writable_dir, args.out, "--out"), Path(args.root)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    real = [d for d in drafts(root) if d["oracle_mix"] is None]
    if args.draft:
        unknown = sorted(set(args.draft) - {d["name"] for d in real})
        if unknown:
            ap.error(f"--draft {' '.join(unknown)}: not a real draft of {root / 'drafts.tsv'} "
                     f"(choose from {', '.join(d['name'] for d in real)})")
        real = [d for d in real if d["name"] in args.draft]
    if args.rows:
        rows = [json.loads(x) for x in Path(args.rows).read_text().splitlines() if x.strip()]
        search = [Path(args.rows).parent, out]
    else:
        os.chdir(REPO_ROOT)  # the runs' results_dir is recorded relative to the repository
        from mtad.harness.runner import run_interleaved
        from mtad.harness.sweep import compose_job

        rows = []
        for d in real:
            for task in TASKS:
                logging.info("draft %s, task %s", d["name"], task)
                rows += run_interleaved([compose_job(j) for j in jobs(d, task, args.prompts, args.tokens, out)])
        search = [out]
    res = analyze(rows, search, root)
    (out / "decoders.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    (out / "decoders.md").write_text(render(res))
    figure(res, out / "decoders.png")
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

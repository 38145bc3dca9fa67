"""Re-score a published QA publication's per-prompt records with the current QA scorer (``asserted``, the first
answer a sentence asserts; docs/TASKS.md, "Short-answer QA") into a new results file, for the publish step.

    .venv/bin/python experiments/qa_rescore.py                     # cpu_qa-2026-12-06 -> results/cpu_qa_rescored.jsonl
    .venv/bin/python experiments/qa_rescore.py --publication NAME --out results/x.jsonl --runs results/runs-x

Nothing under results/published/ is written. Each row keeps the run's decodes, timings and identity; its
``metrics.score`` and ``score_name`` are the new scorer's, ``metrics.rescored`` names the publication and run it
came from, ``publication`` is cleared and ``run_dir`` points at the re-scored records (every record's
``scores`` replaced, everything else as published). Prints, per task and decoder, the old and new score and how
many answers changed.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from mtad._util.paths import REPO_ROOT
from mtad.tasks import TaskConfig, get_task
from mtad.tasks.base import Sample

PUBLISHED = REPO_ROOT / "results" / "published"


def label(row: dict) -> str:
    """The decoder and the settings that tell this publication's rows apart."""
    d = row["decoder"]
    if d["name"] in ("sampling", "greedy"):
        return d["name"] if d["name"] == "greedy" else f"sampling T={d['temperature']}"
    if d["name"] == "speculative":
        return f"speculative ({d['accept']})"
    return f"{d['name']} tau={d['tau']}"


def rescore(row: dict, runs: Path, tasks: dict) -> tuple[dict, list[dict], int, int]:
    """The row and its records re-scored; answers that became correct and that stopped being."""
    name = row["task"]["name"]
    task = tasks.setdefault(name, get_task(TaskConfig(name=name)))
    src = REPO_ROOT / row["run_dir"]
    records, up, down = [], 0, 0
    for line in (src / "samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        sample = Sample(rec["id"], [], rec["meta"]["references"], rec["meta"])
        old, new = rec["scores"], task.score(sample, rec["completion"])
        if new["contains"] != old["contains"] or new["exact"] != old["exact"]:
            raise SystemExit(f"qa_rescore: error: {src}: record {rec['id']}: the earlier rule no longer "
                             f"reproduces its published scores {old} (now {new})")
        up += new[task.metric] > old["contains"]
        down += new[task.metric] < old["contains"]
        records.append({**rec, "scores": new})
    dst = runs / src.name
    metrics = {**row["metrics"], "score": task.aggregate([r["scores"] for r in records]),
               "score_name": task.metric,
               "rescored": {"publication": row["publication"]["name"], "run_id": row["run_id"],
                            "run_dir": row["run_dir"], "score_name": row["metrics"]["score_name"]}}
    try:
        run_dir = str(dst.resolve().relative_to(REPO_ROOT))
    except ValueError:
        run_dir = str(dst)
    return {**row, "metrics": metrics, "run_dir": run_dir, "publication": None}, records, up, down


def write(rows: list[tuple[dict, list[dict]]], out: Path, runs: Path) -> None:
    runs.mkdir(parents=True, exist_ok=True)
    for row, records in rows:
        dst = REPO_ROOT / row["run_dir"] if not Path(row["run_dir"]).is_absolute() else Path(row["run_dir"])
        dst.mkdir(parents=True, exist_ok=True)
        src = REPO_ROOT / row["metrics"]["rescored"]["run_dir"]
        for extra in src.iterdir():
            if extra.name != "samples.jsonl" and extra.is_file():
                shutil.copy2(extra, dst / extra.name)
        (dst / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row, _ in rows))
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qa_rescore", description=__doc__.split("\n\n")[0])
    p.add_argument("--publication", default="cpu_qa-2026-12-06", help="the published QA publication")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "cpu_qa_rescored.jsonl",
                   help="the new results file (not under results/published/)")
    p.add_argument("--runs", type=Path, default=REPO_ROOT / "results" / "runs-cpu_qa_rescored",
                   help="where the re-scored per-prompt records go, one folder per run")
    args = p.parse_args(argv)
    source = PUBLISHED / f"{args.publication}.jsonl"
    if not source.is_file():
        p.error(f"no publication {args.publication!r}: {source} does not exist")
    for path in (args.out, args.runs):
        if path.resolve().is_relative_to(PUBLISHED.resolve()):
            p.error(f"{path} is under results/published/: published files are never rewritten")
    tasks: dict = {}
    rows, report = [], []
    for line in source.read_text().splitlines():
        row, records, up, down = rescore(json.loads(line), args.runs, tasks)
        rows.append((row, records))
        old = row["metrics"]["rescored"]
        report.append((row["task"]["name"], label(row), json.loads(line)["metrics"]["score"][old["score_name"]],
                       row["metrics"]["score"][row["metrics"]["score_name"]], up, down, len(records)))
    write(rows, args.out, args.runs)
    print(f"{args.publication}: {len(rows)} rows re-scored with "
          f"'{rows[0][0]['metrics']['score_name']}' -> {args.out}, records in {args.runs}/")
    print(f"{'task':<9} {'decoder':<26} {'old':>6} {'new':>6} {'changed':>8} {'(up/down)':>9} {'n':>4}")
    for task, dec, old, new, up, down, n in report:
        print(f"{task:<9} {dec:<26} {old:6.3f} {new:6.3f} {up + down:8d} {f'({up}/{down})':>9} {n:4d}")
    for task in dict.fromkeys(r[0] for r in report):
        base = next((r for r in report if r[0] == task and r[1] == "sampling T=1.0"), None)
        mtad = next((r for r in report if r[0] == task and r[1] == "mtad tau=0.5"), None)
        if base and mtad and base[2] and base[3]:
            print(f"{task}: mtad tau=0.5 vs sampling T=1.0: old {mtad[2] / base[2] - 1:+.1%}, "
                  f"new {mtad[3] / base[3] - 1:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The last check of ``make slurm-check``: after a sweep with one cancelled job (``BEFORE``: its results file)
and the same sweep again (``AFTER``), AFTER must be BEFORE plus exactly the missing run's row, every line of both
must parse as a result row (strict schema), and each decoder of the sweep must have one row.

    python experiments/slurm_check_rows.py BEFORE.jsonl AFTER.jsonl greedy,sampling,speculative,mtad
"""
from __future__ import annotations

import json
import sys

from mtad.harness import clicheck
from mtad.harness.rows import ResultRow


def rows(path: str) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                out.append(ResultRow.from_dict(json.loads(line)).to_dict())  # every field, the schema's types
            except (ValueError, TypeError, KeyError) as err:
                raise SystemExit(f"slurm-check: {path}:{n} does not parse as a result row: {err}") from err
    return out


def check(before: list[dict], after: list[dict], decoders: list[str]) -> str:
    """One line saying what pass 2 added; SystemExit naming what is wrong otherwise."""
    if after[:len(before)] != before:
        raise SystemExit("slurm-check: pass 2 changed or dropped rows of pass 1")
    new = after[len(before):]
    missing = sorted(set(decoders) - {r["decoder"]["name"] for r in before})
    if len(missing) != 1:
        raise SystemExit(f"slurm-check: pass 1 should lack exactly one run's row, it lacks {missing}")
    if [r["decoder"]["name"] for r in new] != missing:
        raise SystemExit(f"slurm-check: pass 2 added {[r['decoder']['name'] for r in new]}, expected {missing}")
    hashes = [r["config_hash"] for r in after]
    if len(set(hashes)) != len(hashes) or sorted(r["decoder"]["name"] for r in after) != sorted(decoders):
        raise SystemExit("slurm-check: duplicate or missing runs after pass 2")
    return f"slurm-check: pass 2 added exactly the cancelled run's row ({missing[0]}); all {len(after)} lines parse"


def main(argv: list[str]) -> int:
    ap = clicheck.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=clicheck.existing_file("give the results file of pass 1"))
    ap.add_argument("after", type=clicheck.existing_file("give the results file of pass 2"))
    ap.add_argument("decoders", type=clicheck.comma_list(), help="the sweep's decoders: a,b,c")
    args = ap.parse_args(argv)
    before, after = rows(args.before), rows(args.after)
    message = check(before, after, args.decoders)
    for r in after:
        print(f"  row {r['config_hash'][:12]} {r['decoder']['name']:<12} {r['n_prompts']} prompts "
              f"{r['metrics']['ms_per_token']:.2f} ms/token  job dir {r['run_dir']}")
    print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

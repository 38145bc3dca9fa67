"""``python -m mtad.results profile RESULTS.jsonl [--decoder ...] > speculation_profile.json``: the measured
acceptance of one speculative method as SPEED-Bench's ``specdec_bench`` speculation profile (VERIFIERS.md §5;
:mod:`mtad.report.speculation`), written to stdout.

When the rows hold several methods (speculative, block, n-gram, MTAD, on several pairs), pick one with
``--pair --decoder --accept --proposer --gamma`` (the error lists the choices); ``--task`` keeps one task.
Replaying the profile in vLLM's or SGLang's synthetic-acceptance mode projects a serving throughput: a
**projection** for that engine, not a measurement.

Exit status: 0; 1 when the profile was written but fails a validation check (its ``validation`` says which;
one line on stderr); 2 on bad input (a missing or unreadable file, no speculative rows, rows without
profiles, an ambiguous selection), with one ``mtad.results: error:`` line and nothing on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from mtad.harness.store import load_results
from mtad.report.speculation import ProfileError, build_profile, passed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mtad.results", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    prof = sub.add_parser("profile", help="the speculation profile (specdec_bench schema) of one method, to stdout")
    prof.add_argument("results", help="a results .jsonl file (or a folder of them)")
    for key in ("pair", "decoder", "accept", "proposer", "gamma", "task"):
        prof.add_argument(f"--{key}", default=None, help=f"keep the rows with this {key}")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rows = load_results(args.results)
        profile = build_profile(rows, pair=args.pair, decoder=args.decoder, accept=args.accept,
                                proposer=args.proposer, gamma=args.gamma, task=args.task)
    except (ProfileError, ValueError, FileNotFoundError, OSError) as err:
        print(f"mtad.results: error: {err}", file=sys.stderr)
        return 2
    json.dump(profile, sys.stdout, indent=2)
    sys.stdout.write("\n")
    if not passed(profile):
        v = profile["validation"]
        failed = [k for k in ("mean_consistency", "marginal_monotonicity", "rows") if not v[k]["passed"]]
        print(f"mtad.results: warning: the profile fails {', '.join(failed)} (see its validation): do not replay "
              "it as measured", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

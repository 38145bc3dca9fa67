"""Before/after token equality of the decoders: every conf/decoder/*.yaml (and a few variants) and every published
row's decoder config, on tiny models (llama, opt; token draft and feature draft), T as configured and T = 0, two
seeds, three prompts one at a time (and together where the decoder batches). Writes a JSON of tokens and
accounting per case; ``--compare OLD`` counts the cases that differ. Run it once per tree, from that tree:

    cd <old tree> && PYTHONPATH=$PWD python experiments/decode_equality.py old.json
    cd <new tree> && PYTHONPATH=$PWD python experiments/decode_equality.py new.json --compare old.json
"""
from __future__ import annotations

import glob
import json
import os
import sys

sys.path.insert(0, "tests")

import tinymodels as tm  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import mtad  # noqa: E402
from mtad.harness import clicheck, sweep  # noqa: E402
from mtad.models.feature_draft import FeatureDraft, feature_config  # noqa: E402
from mtad.models.pair import ModelPair  # noqa: E402

PROMPTS = [[5, 7, 11], [1, 2, 3, 4, 5, 6, 7, 8], [9, 3]]


def feature_draft(target) -> FeatureDraft:
    cfg = feature_config(target.config, 1)
    cfg.initializer_range, cfg._attn_implementation = 0.5, "sdpa"
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(3)
        return FeatureDraft(cfg).eval()


def pairs() -> dict[str, ModelPair]:
    out = {}
    for arch in ("llama", "opt"):
        t = tm.model(arch, 1, 32, hidden=16)
        out[f"{arch}-token"] = ModelPair(t, tm.near(t, 5, 0.3))
    out["llama-feature"] = ModelPair(out["llama-token"].target, feature_draft(out["llama-token"].target))
    return out


def configs() -> dict[str, dict]:
    out = {}
    for path in sorted(glob.glob("conf/decoder/*.yaml")):
        name = os.path.basename(path)[:-5]
        out[f"conf:{name}"] = OmegaConf.to_container(sweep.compose_job([f"decoder={name}"]), resolve=True)["decoder"]
    out["extra:mtad-norepl"] = dict(out["conf:mtad"], replacement=False)
    out["extra:mtad-w1"] = dict(out["conf:mtad"], beam_width=1)
    out["extra:mtjd-norepl"] = dict(out["conf:mtjd"], replacement=False)
    out["extra:spec-g1"] = dict(out["conf:speculative"], gamma=1)
    seen: set[str] = set()
    for path in sorted(glob.glob("results/published/*.jsonl")):
        for line in open(path):
            d = json.loads(line)["decoder"]
            key = json.dumps(d, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out[f"pub:{len(seen)}:{d['name']}"] = d
    return out


def record(results, calls: bool) -> list:
    return [[r.tokens, r.stop_reason, r.target_forwards, r.draft_forwards, r.accepted, r.proposed]
            + ([r.calls] if calls else []) for r in results]


def parse_args(argv=None):
    ap = clicheck.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the JSON file of this tree's tokens and accounting (written)")
    ap.add_argument("--compare", metavar="OLD", type=clicheck.json_file("give the JSON this script wrote in the "
                                                                        "other tree"),
                    help="count the cases that differ from OLD, written in another tree")
    args = ap.parse_args(argv)
    clicheck.check_or_exit(ap, clicheck.writable_file, args.out, "out")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    out = {}
    cfgs = configs()
    for cname, c in cfgs.items():
        for pname, pair in pairs().items():
            for T in ("cfg", 0):
                cc = dict(c, max_new_tokens=14, eos_token_id=None)
                if T == 0:
                    cc["temperature"] = 0.0
                if cc["name"] == "mtjd" and cc.get("mode") == "exhaustive":
                    cc["node_budget"] = 10 ** 6
                for seed in (0, 1):
                    key = f"{cname}|{pname}|T={T}|s={seed}"
                    out[key] = record([mtad.generate(pair, p, cc, torch.Generator().manual_seed(seed))
                                       for p in PROMPTS], calls=True)
                    try:
                        rows = mtad.generate(pair, PROMPTS, cc, torch.Generator().manual_seed(seed))
                        out[key + "|batch"] = record(rows, calls=False)
                    except ValueError as err:  # a decoder or draft that takes one prompt at a time
                        out[key + "|batch"] = f"refused: {str(err)[:60]}"
    json.dump(out, open(args.out, "w"), sort_keys=True)
    print(len(cfgs), "configs", len(out), "cases;", sum(isinstance(v, str) for v in out.values()), "refused")
    if args.compare:
        old = json.load(open(args.compare))
        diff = [k for k in out if old.get(k) != out[k]]
        print(f"differ: {len(diff)} of {len(out)} ({sum(not k.endswith('|batch') for k in diff)} one-prompt cases)")
        for k in diff[:20]:
            print("  ", k)


if __name__ == "__main__":
    main()

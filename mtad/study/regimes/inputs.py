"""What the regime runs wrote under ``results/regimes/``, read as plain dicts: the drafts, their held-out α
(intervals recomputed here from the per-prompt counts), the same-draft study's per-context records, the
simulator checks and their calibrated cost profiles."""
from __future__ import annotations

import json
import logging
import pickle
import shlex
from pathlib import Path

from mtad._util.paths import REPO_ROOT
from mtad.measure.simulate import CostProfile
from mtad.report.stats import ratio_interval
from mtad.study.alpha import mixture_alpha

log = logging.getLogger(__name__)
ROOT = REPO_ROOT / "results" / "regimes"
TAUS = ("0.1", "0.3", "0.5", "0.7", "0.9")
GAMMA = 4
FEATURE_DRAFT = "run5"  # the committed feature draft: the oracles' base and the reference cost
PROFILE_KEYS = ("label", "t1", "c", "c_W", "v", "overhead", "prefill", "per_prompt", "kind", "unit")


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
    """Held-out α [point, lo, hi] per draft, from ``alpha.jsonl``'s per-prompt counts ([accepted, positions,
    task] per prompt) by the project's one bootstrap; oracles from their base draft, the feature draft."""
    rows = [json.loads(x) for x in (root / "alpha.jsonl").read_text().splitlines() if x.strip()]
    out = {}
    for r in rows:
        num, den = zip(*((a, n) for a, n, _ in r["per_prompt"])) if r["per_prompt"] else ((), ())
        out[r["name"]] = ratio_interval(num, den)
    for d in drafts(root):
        if d["oracle_mix"] is not None and FEATURE_DRAFT in out:
            out[d["name"]] = mixture_alpha(out[FEATURE_DRAFT], d["oracle_mix"])
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
    """The simulator checks ``check/check-<draft>.json`` by draft; a file without ``calibration`` (written
    before the checks calibrated on the decoders' own forwards) is skipped with a warning."""
    out = {}
    for p in sorted((root / "check").glob("check-*.json")):
        c = json.loads(p.read_text())
        if "calibration" not in c:
            log.warning("%s: no calibration (an older check's format), skipped", p)
            continue
        out[p.stem.removeprefix("check-")] = c
    return out


def tv(root: Path = ROOT) -> dict[str, dict]:
    """First-token total variation to the target's law per draft (``tv/tv-<draft>.jsonl``, written by
    ``experiments/regime_tv.sh``): {task: {rule label: [point, lo, hi]}}, with the contexts and draws per task."""
    out = {}
    for p in sorted((root / "tv").glob("tv-*.jsonl")):
        rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        d = {"contexts": rows[0]["tv_contexts"], "draws": rows[0]["tv_draws"], "study": rows[0]["study"]}
        for r in rows:
            d.setdefault(r["task"], {})[r["label"]] = r["tv_first_token"]
        out[p.stem.removeprefix("tv-")] = d
    return out


def decoders(root: Path = ROOT) -> dict | None:
    """Every decoder along α (``decoders/decoders.json``, written by ``experiments/regime_decoders.py`` from its
    published rows), or None before that run."""
    p = root / "decoders" / "decoders.json"
    return json.loads(p.read_text()) if p.is_file() else None


def profile(chk: dict, which: str = "pooled") -> CostProfile:
    """A check's calibrated cost profile (``before``, ``after`` or ``pooled``) as the simulator's
    :class:`~mtad.measure.simulate.CostProfile`."""
    p = chk["calibration"][which]["profile"]
    return CostProfile(**{k: p[k] for k in PROFILE_KEYS if k in p})


def provenance(root: Path = ROOT) -> dict[str, list[str]]:
    """Where each input came from: the commits (and whether their trees were clean) of the α rows and the
    study runs, and the publications of the checks' runs."""
    def state(sha, dirty):
        tree = "clean" if dirty is False else "dirty" if dirty else "tree not recorded"
        return f"{(sha or 'no commit')[:10]} ({tree})"

    alpha = [json.loads(x) for x in (root / "alpha.jsonl").read_text().splitlines() if x.strip()]
    study = [json.loads(f.read_text().splitlines()[0])["study"] for f in sorted((root / "study").glob("*.jsonl"))]
    pubs = {json.loads(f.read_text()).get("publication") for f in sorted((root / "check").glob("check-*.json"))}
    tvs = [d["study"] for d in tv(root).values()]
    dec = decoders(root)
    return {"alpha": sorted({state(r.get("git_sha"), r.get("git_dirty")) for r in alpha}),
            "study": sorted({state(r.get("git_sha"), r.get("git_dirty")) for r in study}),
            "tv": sorted({state(r.get("git_sha"), r.get("git_dirty")) for r in tvs}),
            "decoders": [dec.get("publication") or "not published"] if dec else [],
            "checks": sorted(p or "not published" for p in pubs)}


def hardware(root: Path = ROOT) -> str:
    """The study's device name (its first record), or ``this CPU``."""
    for f in sorted((root / "study").glob("verifier_study-*.jsonl")):
        return json.loads(f.read_text().splitlines()[0])["study"]["device_name"]
    return "this CPU"

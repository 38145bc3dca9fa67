"""Held-out α of any draft of the embedded target, measured as the draft card measures it
(:mod:`mtad.train.heldout`): the fp32 target's own sampled continuations (T = 1, top-k 10, top-p 0.9, 64 tokens)
of 10 GSM8K test and 10 HumanEval prompts, teacher-forced through the draft; α = mean Σ_v min(p̃, q̃) per
position. Adds a 95 % interval that resamples prompts (a prompt's positions are correlated;
:func:`mtad.report.stats.ratio_interval`, the project's one bootstrap).

An oracle mixture q̃_λ = λ·q̃ + (1 − λ)·p̃ needs no measurement of its own: min(p̃, q̃_λ) = (1 − λ)·p̃ + λ·min(p̃, q̃),
so α_λ = 1 − λ + λ·α exactly, position by position (:func:`mixture_alpha`).
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch

from mtad._util.paths import REPO_ROOT, default_data_dir, recorded_path
from mtad.harness.clicheck import ArgumentParser, check_or_exit, positive_int, writable_file
from mtad.harness.rows import git_info
from mtad.models import smollm2
from mtad.models.draft_head import HEAD_FILE, install_head
from mtad.models.load import load_tied_draft, resolve_local
from mtad.models.selfspec import derived_draft, is_derived, parse
from mtad.report.stats import ratio_interval
from mtad.train.config import TrainDraftConfig
from mtad.train.corpus import Corpus
from mtad.train.heldout import EVAL_KEYS, _score, build_eval_set
from mtad.train.teacher import teacher_features

log = logging.getLogger(__name__)


def eval_set(target, tok, data_dir: Path, cache: Path | None = None) -> dict:
    """The card's held-out set (the trainer's defaults: seed 0, 10 + 10 prompts, 64 tokens), with the target's
    final features for feature drafts; cached at ``cache`` when given."""
    if cache is not None and cache.is_file():
        return torch.load(cache, weights_only=False)
    cfg = TrainDraftConfig()
    es = build_eval_set(cfg, Corpus(tok, data_dir), target, tok, target.device)
    for it, f in zip(es["items"], teacher_features(target, [it["ids"] for it in es["items"]])):
        it["feat"] = f
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(es, cache)
    return es


@torch.no_grad()
def heldout_alpha(draft, es: dict) -> dict:
    """α (point, 95 % interval over prompts) overall and per domain, with the per-prompt values."""
    per_prompt, domains = [], []
    for item in es["items"]:
        if len(item["ids"]) <= item["prompt_len"]:
            continue
        d = {k: [] for k in EVAL_KEYS}
        _score(draft, item, es["top_k"], es["top_p"], d)
        per_prompt.append((sum(d["alpha"]), len(d["alpha"])))
        domains.append(item["domain"])
    num, den = np.array([a for a, _ in per_prompt]), np.array([n for _, n in per_prompt], dtype=float)
    out = {"alpha": ratio_interval(num, den), "positions": int(den.sum()), "prompts": len(num),
           "per_prompt": [[float(a), int(n), dom] for (a, n), dom in zip(per_prompt, domains)]}
    for dom in sorted(set(domains)):
        m = np.array([x == dom for x in domains])
        out[f"alpha_{dom}"] = ratio_interval(num[m], den[m])
    return out


def mixture_alpha(alpha: list[float], lam: float) -> list[float]:
    """α of the oracle mixture λ·q̃ + (1 − λ)·p̃ from the draft's α (point and interval ends: the map is
    increasing in α for λ > 0)."""
    if not 0 <= lam <= 1:
        raise ValueError(f"λ={lam} is out of range [0, 1]")
    return [1 - lam + lam * a for a in alpha]


def load_draft(spec: str, target, head: str = "reduced"):
    """A draft of the fp32 target: ``target:...`` (mtad.models.selfspec) or a tied export's directory, with the
    card's inference head (``reduced`` for exports that have one)."""

    if is_derived(spec):
        return derived_draft(spec, target)
    path = resolve_local(spec)
    if path is None:
        raise FileNotFoundError(f"draft {spec!r}: no such directory (lineage exports: experiments/regime_lineage.sh)")
    draft = load_tied_draft(path, target, "float32")
    install_head(draft, head if (path / HEAD_FILE).is_file() else "full", path)
    return draft


def draft_item(text: str) -> str:
    """An argument ``name=draft``: a name and a draft :func:`load_draft` can load (a ``target:...`` spec that
    parses, or an existing directory); checked before the target loads."""
    name, eq, spec = text.partition("=")
    if not (name and eq and spec):
        raise argparse.ArgumentTypeError(f"{text!r} is not name=draft: give e.g. token=models/smollm2-draft")
    if is_derived(spec):
        try:
            parse(spec)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text}: {err}") from None
    elif resolve_local(spec) is None:
        raise argparse.ArgumentTypeError(f"{text}: no directory {spec}: give a draft's folder (lineage exports: "
                                         "experiments/regime_lineage.sh) or a target:... spec")
    return text


def main(argv=None) -> int:
    """``python -m mtad.study.alpha NAME=DRAFT ... [--out FILE]``: held-out α of each draft (a directory or a
    ``target:...`` spec), one JSON line per draft appended to ``--out`` (drafts already there are skipped)."""
    import json
    import time

    ap = ArgumentParser(prog="python -m mtad.study.alpha", description=main.__doc__.split("\n")[0])
    ap.add_argument("drafts", nargs="+", type=draft_item,
                    help="name=draft (models/smollm2-draft, .cache/regimes/lineage/run1, target:int8)")
    ap.add_argument("--out", default=str(REPO_ROOT / "results" / "regimes" / "alpha.jsonl"))
    ap.add_argument("--cache", default=str(REPO_ROOT / ".cache" / "regimes" / "eval_set.pt"))
    ap.add_argument("--threads", type=positive_int, default=1)
    args = ap.parse_args(argv)
    check_or_exit(ap, writable_file, args.out, "--out")
    check_or_exit(ap, writable_file, args.cache, "--cache")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    done = {json.loads(x)["name"] for x in out.read_text().splitlines() if x.strip()} if out.is_file() else set()
    sha, dirty = git_info(REPO_ROOT)  # the code that measures, read before the (long) run
    target, tok = smollm2.load(dtype="float32", device="cpu")
    es = eval_set(target, tok, default_data_dir(), Path(args.cache))
    for item in args.drafts:
        name, _, spec = item.partition("=")
        if name in done:
            log.info("%s: already in %s", name, out)
            continue
        t0 = time.perf_counter()
        r = heldout_alpha(load_draft(spec, target), es)
        r.update(name=name, draft=recorded_path(spec), teacher="fp32", seconds=round(time.perf_counter() - t0, 1),
                 git_sha=sha, git_dirty=dirty)
        log.info("%s (%s): alpha %.3f [%.3f, %.3f]", name, spec, *r["alpha"])
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

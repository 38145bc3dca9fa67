"""Published verdicts hold under the bootstrap's draw (mtad.report.stats.judge): every verdict word printed in
the tables of results/published/ (the claims beside the paper's, README's headline among them) and in the
regime map's tables (results/regimes/decoders/decoders.md, results/regimes/temperature/temperature.md) is
recomputed with 20 bootstrap seeds (``stats.SEED`` 0-19: every cell's resamples drawn again, and the resamples
:func:`stats.settle` adds) and must come out as published each time.

Control: the verdict as printed without a margin for Monte-Carlo error (:func:`stats.judge_printed`, the rule
before) flips with the seed on the headline's speed-up over speculative decoding and on the regime map's MMTAD
distinct-2 difference with the w4g64 draft.

The default suite checks README's headline publication (with its control) and the run-5 check; the ``slow``
tests check every other publication, temperature.md, and every cell of decoders.md with the w4g64 control
(minutes: a cell at a rounding edge draws 640,000 resamples with each seed)."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from mtad._util.paths import REPO_ROOT
from mtad.harness import publish as pub
from mtad.harness.store import load_frame
from mtad.report import stats
from mtad.report.claims import CLAIMS, by_task, claims, verdict
from mtad.report.frame import prepare

SEEDS = range(20)
WORDS = ("significant", "not significant", "borderline")
HEADLINE = "cpu_table_bf16_feature-interleaved-2026-12-06"  # README's headline table
RUN5 = "regime_check-run5-2026-12-06"
FAST = (HEADLINE, RUN5)


def redrawn(iv: stats.Interval, seed: int, monkeypatch) -> stats.Interval:
    """``iv`` as seed ``seed`` draws it: its first ``N_RESAMPLES`` resamples from that seed's generators."""
    monkeypatch.setattr(stats, "SEED", seed)
    dist = iv.resample(stats.N_RESAMPLES, 0)
    low, high = stats.percentile_interval(dist)
    return replace(iv, low=float(low), high=float(high), distribution=dist, batches=1)


def words_over_seeds(iv: stats.Interval, monkeypatch, judge=stats.judge) -> list[str]:
    out = [judge(redrawn(iv, s, monkeypatch)) for s in SEEDS]
    monkeypatch.setattr(stats, "SEED", 0)
    return out


def claim_verdicts(name: str) -> dict[str, tuple[str, stats.Interval]]:
    """A publication's printed claim verdicts: (label, its interval) -> the word, one entry per distinct interval
    (the three speed-up claims against speculative decoding share one)."""
    df = prepare(load_frame(pub.PUBLISHED / f"{name}.jsonl"), search=[pub.PUBLISHED])
    cs = claims(df)
    for c in [c for c in cs if c["kind"] == "score_change" and len(c["tasks"]) > 1]:  # claim_rows' per-task rows
        cs += [t for t in by_task(df, next(x for x in CLAIMS if x.text == c["claim"])) if t["n_cells"]]
    out = {}
    for c in cs:
        text = verdict(c)
        word = next((w for w in WORDS if text.startswith(w + " ")), None)
        if word is not None:
            iv = c["fallback"] or c["interval"]
            out.setdefault((iv.kind, iv.point, iv.low, iv.high, iv.n), (f"{c['claim']} {c.get('task', '')}", word, iv))
    return {label: (word, iv) for label, word, iv in out.values()}


def check(verdicts: dict[str, tuple[str, stats.Interval]], monkeypatch) -> None:
    assert verdicts
    flips = {}
    for label, (word, iv) in verdicts.items():
        got = words_over_seeds(iv, monkeypatch)
        if set(got) != {word}:
            flips[label] = (word, {w: got.count(w) for w in set(got)})
    assert not flips, flips


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow)
                                  for n in pub.indexed()])
def test_published_claim_verdicts_hold_over_20_seeds(name, monkeypatch):
    verdicts = claim_verdicts(name)
    if not verdicts:
        pytest.skip(f"{name} prints no claim verdict")
    check(verdicts, monkeypatch)


def test_control_the_headline_flips_without_the_margin(monkeypatch):
    """The headline speed-up over speculative decoding (1.09×, lower end near 1.005) as printed with no margin:
    another seed prints another word. With the margin it is one word (the test above)."""
    (iv,) = [iv for label, (_, iv) in claim_verdicts(HEADLINE).items() if label.startswith("1.42× speed-up")]
    assert len(set(words_over_seeds(iv, monkeypatch, stats.judge_printed))) > 1


# ------------------------------------------------------------------------------------------- the regime map
def _experiment(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def regime_verdicts(name: str, monkeypatch, keep=lambda row: True) -> dict[str, tuple[str, stats.Interval]]:
    """The verdicts of an experiment's re-render from its publication (``keep``: the rows to analyse): every
    interval it judges (through ``stats.judged``), with the word it prints."""
    mod = _experiment(name)
    rows = [json.loads(x) for x in (pub.PUBLISHED / f"{name}-2026-12-06.jsonl").read_text().splitlines() if x]
    seen, judged = [], stats.judged

    def spy(iv):
        got = judged(iv)
        if got is not None and got[3] is not None:
            seen.append((got[3], iv))
        return got

    monkeypatch.setattr(stats, "judged", spy)
    args = ([r for r in rows if keep(r)], [pub.PUBLISHED])
    mod.analyze(*args, REPO_ROOT / "results" / "regimes") if name == "regime_decoders" else mod.analyze(*args)
    monkeypatch.setattr(stats, "judged", judged)
    return {f"{iv.kind} {iv.point:.4f} #{i}": (word, iv) for i, (word, iv) in enumerate(seen)}


def _w4g64(row: dict) -> bool:
    return "w4g64" in json.dumps(row["model"])


@pytest.mark.slow
def test_temperature_control_verdicts_hold_over_20_seeds(monkeypatch):
    check(regime_verdicts("regime_temperature", monkeypatch), monkeypatch)


@pytest.mark.slow
def test_the_w4g64_mmtad_diversity_verdict_holds_and_flips_without_the_margin(monkeypatch):
    """decoders.md's MMTAD distinct-2 difference with the w4g64 draft (−0.027, its upper end near −0.0005, the
    rounding edge of no change). Control: without the margin it prints another word with another seed. (Every
    cell of decoders.md: the slow test below.)"""
    verdicts = regime_verdicts("regime_decoders", monkeypatch, _w4g64)
    near = {k: v for k, v in verdicts.items() if v[1].kind == "distinct2_diff" and -0.03 < v[1].point < -0.025}
    assert len(near) == 1
    check(near, monkeypatch)
    (word, iv), = near.values()
    assert len(set(words_over_seeds(iv, monkeypatch, stats.judge_printed))) > 1


def near_an_edge(iv: stats.Interval, margin: float = 2 * stats.MC_MARGIN) -> bool:
    """An end of ``iv`` lies within ``margin`` Monte-Carlo standard errors (twice the judge's) of printing on
    the other side of no change: only such a cell can print another word with another seed."""
    if not iv.has_interval or iv.distribution is None:
        return True
    alpha = (1 - stats.CONFIDENCE) / 2
    return any(stats._side(lo, iv.kind) != stats._side(hi, iv.kind)
               for lo, hi in (stats.mc_band(iv.distribution, q, margin) for q in (alpha, 1 - alpha)))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known open defect: two CPU speed-up cells of decoders.md (1.07x, 1.08x) print "
                   "'not significant' with some seeds and 'borderline' with others: settle() stops at the first "
                   "resample count whose band clears the edge, so the word depends on the stopping path")
def test_every_decoder_verdict_holds_over_20_seeds(monkeypatch):
    """Every cell of decoders.md: the cells whose ends lie within twice the judge's Monte-Carlo margin of an
    edge are redrawn with 20 seeds; every other cell's ends are too far from an edge for a seed to move its word.
    Control: the w4g64 MMTAD distinct-2 cell, which flips under the old rule, is among the redrawn ones."""
    verdicts = regime_verdicts("regime_decoders", monkeypatch)
    near = {k: v for k, v in verdicts.items() if near_an_edge(v[1])}
    assert any(iv.kind == "distinct2_diff" and -0.03 < iv.point < -0.025 for _, iv in near.values())
    check(near, monkeypatch)

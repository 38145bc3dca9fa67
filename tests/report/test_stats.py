"""The paired bootstrap (mtad.report.stats) and the intervals the tables print from per-prompt records."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mtad.harness.rows import flatten_dict
from mtad.harness.store import load_results
from mtad.report import stats
from mtad.report.claims import claims, verdict
from mtad.report.frame import prepare
from mtad.report.render import render_markdown

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results_small.jsonl"


# ------------------------------------------------------------------------------------------- bootstrap
def test_known_case_matches_the_normal_theory_interval():
    """A mean difference of paired normal data: the bootstrap interval is the textbook one, mean ± 1.96 s/sqrt(n)."""
    rng = np.random.default_rng(3)
    n = 400
    base = rng.normal(0.5, 0.3, n)
    method = base + rng.normal(0.1, 0.2, n)  # paired: the difference has sd 0.2
    iv = stats.bootstrap_interval("score_diff", [method], [base])
    d = method - base
    half = 1.96 * d.std(ddof=1) / math.sqrt(n)
    assert iv.point == pytest.approx(d.mean())
    assert iv.low == pytest.approx(d.mean() - half, abs=0.15 * half)
    assert iv.high == pytest.approx(d.mean() + half, abs=0.15 * half)
    assert iv.n == n and not iv.contains_no_change()
    # pairing matters: an unpaired interval would be ~1.9x wider (sd 0.36 instead of 0.2)
    assert iv.high - iv.low < 1.3 * 2 * half


def test_speedup_of_a_method_twice_as_fast_per_prompt():
    rng = np.random.default_rng(0)
    t_base = rng.uniform(1.0, 3.0, 30)
    tokens = np.full(30, 64.0)
    t_method = t_base / 2 * rng.uniform(0.9, 1.1, 30)
    iv = stats.bootstrap_interval("speedup", [t_method, tokens], [t_base, tokens])
    assert iv.point == pytest.approx(t_base.sum() / t_method.sum())
    assert iv.low < 2.0 < iv.high and iv.low > 1.8 and iv.high < 2.2
    assert iv.contains_no_change() is False


def test_negative_control_identical_samples_contain_no_change():
    rng = np.random.default_rng(1)
    t, tokens, lp = rng.uniform(1, 2, 20), np.full(20, 50.0), rng.normal(-1, 0.3, 20)
    same_speed = stats.bootstrap_interval("speedup", [t, tokens], [t, tokens])
    same_ppl = stats.bootstrap_interval("ppl_change", [lp], [lp])
    assert same_speed.contains_no_change() and same_speed.point == pytest.approx(1.0)
    assert same_ppl.contains_no_change() and same_ppl.point == pytest.approx(0.0)
    # the control can fail: a real perplexity change is detected
    shifted = stats.bootstrap_interval("ppl_change", [lp + 0.1], [lp])
    assert shifted.contains_no_change() is False
    assert shifted.point == pytest.approx(100 * math.expm1(-0.1))


def test_seeded_and_resample_count_stated():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0, 1, 25), rng.normal(0.2, 1, 25)
    one, two = stats.bootstrap_interval("score_diff", [a], [b]), stats.bootstrap_interval("score_diff", [a], [b])
    assert (one.low, one.high) == (two.low, two.high)  # a re-render draws the same resamples
    other = stats.bootstrap_interval("score_diff", [a], [b], key=7)
    assert (other.low, other.high) != (one.low, one.high)
    assert len(one.distribution) == stats.N_RESAMPLES


def test_cells_of_equal_size_draw_different_resamples():
    """Two cells with the same number of prompts get different index arrays (their own child seeds); one cell
    gets the same indices on every call, and counts are those indices as weights."""
    a = stats.resample_indices(30, stats.cell_key("gsm8k", np.arange(30.0)), 200)
    b = stats.resample_indices(30, stats.cell_key("mt_bench", np.arange(30.0)), 200)
    again = stats.resample_indices(30, stats.cell_key("gsm8k", np.arange(30.0)), 200)
    assert a.shape == (200, 30) and (a == again).all() and (a != b).any()
    counts = stats.resample_counts(30, stats.cell_key("gsm8k", np.arange(30.0)), 200)
    assert (counts.sum(axis=1) == 30).all() and (counts[0] == np.bincount(a[0], minlength=30)).all()


def _pooled_coverage(shared_indices: bool, experiments: int = 1000, n: int = 40, resamples: int = 1000) -> float:
    """Share of simulated experiments whose pooled 95 % interval covers the truth. Each experiment has two
    independent cells (different prompt sets, normal per-prompt differences with known means 0.3 and -0.1);
    the pooled figure is the mean of the cells' mean differences (truth 0.1), as the claims table pools. The
    prompt order inside a cell is arbitrary (records are sorted by id); here the ids happen to follow the
    values, ascending in one cell and descending in the other, as ids that follow difficulty would. A
    correct stratified bootstrap does not depend on that order."""
    rng = np.random.default_rng(11)
    covered = 0
    for e in range(experiments):
        cells = [np.sort(rng.normal(0.3, 1.0, n)), np.sort(rng.normal(-0.1, 1.0, n))[::-1]]
        dists = []
        for c, d in enumerate(cells):
            key = 0 if shared_indices else stats.cell_key(e, c)  # the old code: one fixed seed for every cell
            dists.append(d[stats.resample_indices(n, key, resamples)].mean(axis=1))
        low, high = stats.percentile_interval(np.mean(dists, axis=0))
        covered += low <= 0.1 <= high
    return covered / experiments


def test_pooled_intervals_cover_at_the_stated_rate():
    """Coverage of pooled 95 % intervals over 1,000 simulated experiments with known truth: within 95 ± 2.5 %
    when every cell resamples independently; the negative control, one set of resample indices reused in every
    cell of equal size (the old fixed-seed pooling), couples the cells' resamples and misses the band."""
    good = _pooled_coverage(shared_indices=False)
    assert 0.925 <= good <= 0.975, good
    bad = _pooled_coverage(shared_indices=True)
    assert not 0.925 <= bad <= 0.975, bad


def test_too_few_prompts_or_bad_arrays():
    iv = stats.bootstrap_interval("score_diff", [[1.0]], [[0.0]])
    assert iv.point == 1.0 and not iv.has_interval and "n = 1 < 5" in iv.note
    four = stats.bootstrap_interval("score_diff", [[1.0, 0.0, 1.0, 1.0]], [[0.0, 0.0, 1.0, 0.0]])
    assert four.point == pytest.approx(0.5) and not four.has_interval
    with pytest.raises(ValueError, match="paired 1-D arrays"):
        stats.bootstrap_interval("speedup", [[1.0, 2.0]], [[1.0, 2.0], [3.0, 4.0]])
    undefined = stats.bootstrap_interval("score_change", [[1.0, 0.0, 1.0, 1.0, 0.0]], [[0.0] * 5])
    assert not undefined.has_interval and undefined.point is None


def test_aggregate_combines_cells_resample_by_resample():
    rng = np.random.default_rng(4)
    tokens = np.full(20, 10.0)
    t = rng.uniform(1, 2, 20)
    a = stats.bootstrap_interval("speedup", [t / 2, tokens], [t, tokens])
    b = stats.bootstrap_interval("speedup", [t / 8, tokens], [t, tokens])
    agg = stats.aggregate("speedup", [a, b])
    assert agg.point == pytest.approx(4.0) and agg.n == 40  # geometric mean of 2 and 8
    assert agg.low == pytest.approx(4.0) and agg.high == pytest.approx(4.0)
    point_only = stats.Interval(3.0, None, None, 5, "speedup", note="no per-prompt records")
    mixed = stats.aggregate("speedup", [a, point_only])
    assert mixed.point == pytest.approx(math.sqrt(6)) and not mixed.has_interval


# ------------------------------------------------------------------------------------------- records
def _samples(prompts, seed_shift=0.0, slow=1.0, lp=-1.0, score=0.0):
    return [{"id": f"p{i}", "turn": 0, "n_tokens": 10, "time_s": slow * (1 + 0.1 * i) + seed_shift,
             "mean_logprob": lp + 0.01 * i, "energy_j": None, "scores": {"accuracy": score}} for i in range(prompts)]


def test_seeds_pool_within_a_prompt():
    pooled = stats.per_prompt([_samples(3), _samples(3, seed_shift=1.0, lp=-2.0)], "accuracy")
    assert set(pooled) == {("p0", 0), ("p1", 0), ("p2", 0)}
    assert pooled[("p0", 0)]["time_s"] == pytest.approx(1.0 + 2.0) and pooled[("p0", 0)]["n_tokens"] == 20
    assert pooled[("p0", 0)]["mean_logprob"] == pytest.approx(-1.5)
    skipped = stats.per_prompt([[{"id": "x", "turn": 0, "skip_reason": "too long"}]], None)
    assert skipped == {}


def _rows_with_records(tmp_path: Path, drop: str | None = None) -> list[dict]:
    """Fixture rows (mtad, sampling, speculative on gsm8k) with run directories holding samples.jsonl:
    mtad is 2x faster than speculative and has a lower perplexity than sampling on every prompt."""
    rows = list({r["decoder"]["name"]: json.loads(json.dumps(r)) for r in load_results(FIXTURE)
                 if r["task"]["name"] == "gsm8k" and r["decoder"]["name"] in ("mtad", "sampling", "speculative")
                 and (r["decoder"]["gamma"], r["decoder"]["beam_width"], r["decoder"]["tau"]) == (4, 4, 0.5)}.values())
    speed = {"mtad": 0.5, "sampling": 0.4, "speculative": 1.0}
    lp = {"mtad": -1.0, "sampling": -1.2, "speculative": -1.2}
    for r in rows:
        name = r["decoder"]["name"]
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        if name != drop:
            (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in _samples(
                24, slow=speed[name], lp=lp[name])))
        r["run_dir"] = str(Path("elsewhere") / "runs" / name)  # a moved results folder: found below search
        r["metrics"]["ms_per_token"] = 1e3 * speed[name] * 2.15 / 10
        r["metrics"]["ppl_mean_logprob"] = math.exp(-lp[name] - 0.115)
    return rows


def test_table_intervals_from_records_and_claims_verdicts(tmp_path):
    import pandas as pd

    frame = pd.DataFrame([flatten_dict(r) for r in _rows_with_records(tmp_path)])
    df = prepare(frame, search=[tmp_path], profiles=[])
    mtad = df[df.decoder == "mtad"].iloc[0]
    assert mtad.n == 24 and mtad.speedup_ci.has_interval
    assert mtad.speedup_ci.low == pytest.approx(2.0) and mtad.speedup_ci.high == pytest.approx(2.0)
    by = {c["claim"]: c for c in claims(df)}
    ppl = by["output perplexity −21.2 % vs single-token sampling"]
    assert ppl["ours"] == pytest.approx(100 * math.expm1(-0.2)) and ppl["n"] == 24
    assert verdict(ppl).startswith("significant at n = 24")
    text = render_markdown(frame, search=[tmp_path], profiles=[])
    assert "2.00× [2.00, 2.00]" in text and "−18.1 % [−18.1, −18.1]" in text
    assert f"{stats.N_RESAMPLES} resamples" in text and "†" not in text.split("## Settings")[0]
    # the rows do not record interleaved decoding: the speed claims get their interval but no verdict
    speed = by["1.42× speed-up vs speculative decoding"]
    assert speed["interval"].has_interval and verdict(speed).startswith("no speed verdict at n = 24")
    # task scores 0 for both: the relative change is undefined, the score difference is reported instead
    score = by["downstream score +43 % vs single-token sampling"]
    assert score["fallback"] is not None and score["ours"] == 0.0
    assert verdict(score).startswith("not significant at n = 24")


def test_speed_verdicts_need_interleaved_rows_and_state_the_load(tmp_path):
    import pandas as pd

    rows = _rows_with_records(tmp_path)
    for r in rows:
        r["timing"] = {"interleaved": True, "load_start": [1.5, 1.0, 0.5], "load_end": [3.25, 2.0, 1.0], "cpus": 2}
    text = render_markdown(pd.DataFrame([flatten_dict(r) for r in rows]), search=[tmp_path], profiles=[])
    df = prepare(pd.DataFrame([flatten_dict(r) for r in rows]), search=[tmp_path], profiles=[])
    speed = next(c for c in claims(df) if c["claim"].startswith("1.42×"))
    assert verdict(speed).startswith("significant at n = 24") and speed["load"] == "load average 1.5–3.2 on 2 CPUs"
    assert "interleaved, load average 1.5–3.2 on 2 CPUs" in text and "3 of 3 rows decoded interleaved" in text
    next(r for r in rows if r["decoder"]["name"] == "mtad")["timing"]["interleaved"] = False  # control: one row
    # decoded on its own takes the verdict away
    df = prepare(pd.DataFrame([flatten_dict(r) for r in rows]), search=[tmp_path], profiles=[])
    assert verdict(next(c for c in claims(df) if c["claim"].startswith("1.42×"))).startswith("no speed verdict")


@pytest.mark.parametrize("low,high,expected", [
    (1.004, 1.09, "borderline"),  # printed [1.00, 1.09]: the old rule (1 outside [low, high]) said significant
    (0.9996, 1.09, "borderline"),  # printed [1.00, 1.09] again, from below
    (1.006, 1.09, "significant"),  # printed [1.01, 1.09]
    (0.96, 1.09, "not significant"),
    (0.80, 0.996, "borderline"),  # printed [0.80, 1.00]: the upper end
])
def test_verdicts_read_the_interval_as_printed(low, high, expected):
    iv = stats.Interval(1.05, low, high, 60, "speedup")
    assert stats.judge(iv) == expected
    old = "not significant" if iv.contains_no_change() else "significant"  # the rule before: unrounded ends
    assert (old == expected) == (expected != "borderline")


def test_distinct2_difference_and_its_control():
    """A method whose outputs repeat the same bigrams has a lower distinct-2 than its baseline's varied outputs;
    identical outputs (the control) give 0 with an interval around it."""
    rng = np.random.default_rng(5)
    varied = {(f"p{i}", 0): {"bigrams": [tuple(x) for x in rng.integers(0, 500, (30, 2))]} for i in range(30)}
    loopy = {(f"p{i}", 0): {"bigrams": [(1, 2), (2, 1)] * 15} for i in range(30)}
    iv = stats.distinct2_diff(loopy, varied, n_resamples=2000)
    assert iv.point < -0.5 and iv.high < 0 and stats.judge(iv) == "significant"
    same = stats.distinct2_diff(varied, varied, n_resamples=2000)
    assert same.point == 0 and same.low <= 0 <= same.high and stats.judge(same) != "significant"


def test_rows_without_records_are_named_and_get_no_interval(tmp_path):
    """Bad input: a deleted run directory. Its figures are point estimates marked †, listed by row."""
    import pandas as pd

    frame = pd.DataFrame([flatten_dict(r) for r in _rows_with_records(tmp_path, drop="speculative")])
    df = prepare(frame, search=[tmp_path], profiles=[])
    mtad = df[df.decoder == "mtad"].iloc[0]
    assert mtad.speedup_ci is None and mtad.speedup == pytest.approx(2.0)
    speed = next(c for c in claims(df) if c["claim"].startswith("1.42×"))
    assert not speed["interval"].has_interval and speed["missing"] == ["speculative · gsm8k"]
    assert verdict(speed) == "point estimate only: no per-prompt records for 1 row(s)"
    text = render_markdown(frame, search=[tmp_path], profiles=[])
    assert "2.00×†" in text and "tiny · speculative · gsm8k (run_dir elsewhere/runs/speculative)" in text
    # the perplexity claim does not need the speculative row: it still has its interval
    assert "−18.1 % [−18.1, −18.1]" in text


def test_seed_sweep_rows_are_pooled_into_one_row(tmp_path):
    import pandas as pd

    rows = _rows_with_records(tmp_path)
    extra = []
    for r in rows:
        r2 = json.loads(json.dumps(r))
        r2["seed"], r2["run_id"] = 1, r["run_id"] + "-s1"
        r2["metrics"]["total_decode_s"] *= 3  # the second seed ran 3x slower: pooled ms/token = 2x the first
        extra.append(r2)
    df = prepare(pd.DataFrame([flatten_dict(r) for r in rows + extra]), search=[tmp_path], profiles=[])
    assert len(df) == 3 and set(df.n_seeds) == {2}
    m = df[df.decoder == "mtad"].iloc[0]
    first = next(r for r in rows if r["decoder"]["name"] == "mtad")["metrics"]
    assert m.ms_per_token == pytest.approx(1e3 * 4 * first["total_decode_s"] / (2 * first["total_tokens"]))
    assert m.seeds == [0, 1]
    assert "24 × 2 seeds" in render_markdown(pd.DataFrame([flatten_dict(r) for r in rows + extra]),
                                             search=[tmp_path], profiles=[])


def test_downstream_claim_is_given_pooled_and_per_task(tmp_path):
    """Two tasks: MTAD scores higher than sampling on one, equal on the other; the claims table gives the
    pooled score change and one line per task, each with its own verdict (the equal task is the control)."""
    import pandas as pd

    from mtad.report.render import claim_rows

    rows = []
    for task, gain in (("gsm8k", 0.3), ("capitals", 0.0)):
        for r in _rows_with_records(tmp_path / task):
            r = json.loads(json.dumps(r))
            r["task"]["name"] = task
            name = r["decoder"]["name"]
            run = tmp_path / task / "runs" / name
            cut = 4 + 10 * gain * (name == "mtad")
            score = lambda i, cut=cut: float((i % 10) < cut)  # noqa: E731
            samples = [{**s, "scores": {"accuracy": score(i)}} for i, s in enumerate(_samples(40))]
            (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
            r["run_dir"] = str(run)
            r["metrics"]["score"] = {"accuracy": float(np.mean([s["scores"]["accuracy"] for s in samples]))}
            rows.append(r)
    df = prepare(pd.DataFrame([flatten_dict(r) for r in rows]), search=[tmp_path], profiles=[])
    _, table = claim_rows(df)
    down = [r for r in table if "downstream" in r[1] or r[1].startswith("↳")]
    assert [r[1][:11] for r in down] == ["downstream ", "↳ capitals ", "↳ gsm8k onl"]
    assert down[0][5].startswith("significant") and "capitals, gsm8k" in down[0][6]
    assert down[1][4].startswith("+0.0 %") and down[1][5].startswith("not significant")
    assert down[2][4].startswith("+75.0 %") and down[2][5].startswith("significant at n = 40")


# ------------------------------------------------------------------------------------------- MTAD vs block verification
def _with_rivals(tmp_path: Path, block: bool = True) -> list[dict]:
    """The fixture rows plus block verification (speculative, accept=block: 0.8 s/prompt-unit, log p -1.1) and
    n-gram speculative (proposer=ngram: the fastest, 0.3) rows, each with its per-prompt records."""
    rows = _rows_with_records(tmp_path)
    spec = next(r for r in rows if r["decoder"]["name"] == "speculative")
    for r in rows:  # rows written before the proposer key existed: read as proposer=draft
        r["decoder"].pop("proposer", None)
    rivals = [("block", {"accept": "block", "proposer": "draft"}, 0.8, -1.1)] if block else []
    rivals.append(("ngram", {"accept": "lossless", "proposer": "ngram"}, 0.3, -1.3))
    for name, settings, speed, lp in rivals:
        r = json.loads(json.dumps(spec))
        r["decoder"].update(settings)
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in _samples(24, slow=speed, lp=lp)))
        r["run_dir"] = str(Path("elsewhere") / "runs" / name)
        r["metrics"]["ms_per_token"] = 1e3 * speed * 2.15 / 10
        r["metrics"]["ppl_mean_logprob"] = math.exp(-lp - 0.115)
        r["run_id"] = f"{r['run_id']}-{name}"
        rows.append(r)
    return rows


def test_claims_mtad_vs_block_verification_with_paired_intervals(tmp_path):
    import pandas as pd

    frame = pd.DataFrame([flatten_dict(r) for r in _with_rivals(tmp_path)])
    df = prepare(frame, search=[tmp_path], profiles=[])
    assert {"speculative (accept=lossless, proposer=draft)", "speculative (accept=block, proposer=draft)",
            "speculative (accept=lossless, proposer=ngram)"} <= set(df.variant)
    by = {c["claim"]: c for c in claims(df)}
    speed, ppl = by["MTAD vs block verification: speed-up"], by["MTAD vs block verification: perplexity change"]
    assert speed["paper"] is None
    assert speed["comparison"] == "mtad vs speculative (accept=block, proposer=draft): speed-up"
    assert speed["ours"] == pytest.approx(0.8 / 0.5) and speed["n"] == 24
    assert speed["interval"].low == pytest.approx(1.6) and speed["interval"].high == pytest.approx(1.6)
    assert ppl["ours"] == pytest.approx(100 * math.expm1(-0.1)) and verdict(ppl).startswith("significant at n = 24")
    # the paper's speed claims still compare against lossless token-wise speculative with a draft model, not
    # against block verification or the (faster) n-gram rows
    assert by["1.42× speed-up vs speculative decoding"]["ours"] == pytest.approx(2.0)
    text = render_markdown(frame, search=[tmp_path], profiles=[])
    line = next(x for x in text.splitlines() if "MTAD vs block verification: speed-up" in x)
    assert "1.60× [1.60, 1.60]" in line and "not in the paper" in line


def test_claims_without_a_block_row_have_no_figure(tmp_path):
    """Negative control: with no block-verification row the line stays empty (—), never silently measured
    against token-wise speculative or the n-gram row."""
    import pandas as pd

    frame = pd.DataFrame([flatten_dict(r) for r in _with_rivals(tmp_path, block=False)])
    df = prepare(frame, search=[tmp_path], profiles=[])
    by = {c["claim"]: c for c in claims(df)}
    assert by["MTAD vs block verification: speed-up"]["ours"] is None
    assert by["MTAD vs block verification: perplexity change"]["n_cells"] == 0
    assert verdict(by["MTAD vs block verification: speed-up"]) == "—"
    assert by["1.42× speed-up vs speculative decoding"]["ours"] == pytest.approx(2.0)


def test_claims_measure_mtad_with_a_draft_not_its_ngram_variant(tmp_path):
    """A grid with MTAD on n-gram drafts (decoder=mtad_ngram, much faster here) beside MTAD with its draft
    model: the paper's claims pool the drafted MTAD cells only; control: the same claim with no method variant
    picked pools both and its figure moves."""
    import dataclasses

    import pandas as pd

    from mtad.report.claims import CLAIMS

    rows = _with_rivals(tmp_path)
    mtad = next(r for r in rows if r["decoder"]["name"] == "mtad")
    r = json.loads(json.dumps(mtad))
    r["decoder"]["proposer"] = "ngram"
    r["model"]["draft"] = None
    run = tmp_path / "runs" / "mtad_ngram"
    run.mkdir(parents=True)
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in _samples(24, slow=0.1, lp=-1.4)))
    r["run_dir"] = str(run)
    r["run_id"] = f"{r['run_id']}-mtad-ngram"
    rows.append(r)
    df = prepare(pd.DataFrame([flatten_dict(x) for x in rows]), search=[tmp_path], profiles=[])
    assert {"mtad (proposer=draft)", "mtad (proposer=ngram)"} <= set(df.variant)
    claim = next(c for c in CLAIMS if c.text == "1.42× speed-up vs speculative decoding")
    (drafted,) = claims(df, [claim])
    assert drafted["ours"] == pytest.approx(2.0) and drafted["n_cells"] == 1 and drafted["n"] == 24
    (both,) = claims(df, [dataclasses.replace(claim, method_where=())])
    assert both["n_cells"] == 2 and both["ours"] > 2.5


def test_downstream_claim_pools_prompts_when_a_cells_change_is_undefined(tmp_path):
    """One task where sampling scores 0 (its relative change is undefined): the pooled claim is the change of
    the summed scores over every cell's prompts, said so; with every cell defined it stays the cells' mean."""
    import pandas as pd

    def frame(zero_task: bool):
        rows = []
        for task, base_cut, mtad_cut in (("gsm8k", 0 if zero_task else 4, 1 if zero_task else 5), ("capitals", 4, 6)):
            for r in _rows_with_records(tmp_path / f"{zero_task}-{task}"):
                r = json.loads(json.dumps(r))
                r["task"]["name"] = task
                name = r["decoder"]["name"]
                run = tmp_path / f"{zero_task}-{task}" / "runs" / name
                cut = mtad_cut if name == "mtad" else base_cut
                samples = [{**s, "scores": {"accuracy": float(i % 10 < cut)}} for i, s in enumerate(_samples(40))]
                (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
                r["run_dir"] = str(run)
                r["metrics"]["score"] = {"accuracy": cut / 10}
                rows.append(r)
        return prepare(pd.DataFrame([flatten_dict(r) for r in rows]), search=[tmp_path], profiles=[])

    down = next(c for c in claims(frame(True)) if c["kind"] == "score_change")
    assert down["pooled_prompts"] and down["fallback"] is None
    assert down["ours"] == pytest.approx(100 * ((1 + 6) / (0 + 4) - 1)) and down["interval"].has_interval
    control = next(c for c in claims(frame(False)) if c["kind"] == "score_change")
    assert not control["pooled_prompts"] and control["ours"] == pytest.approx((25.0 + 50.0) / 2)
    assert down["n_cells"] == 2 and down["tasks"] == ["capitals", "gsm8k"]


def test_draft_free_rows_join_the_drafted_speculative_baseline(tmp_path):
    """The n-gram row records no draft (the runner leaves it out): it still gets its speed-up against the
    drafted token-wise speculative row, and draft=none splits no labels. Control: a drafted row whose draft
    differs from the baseline's gets no baseline."""
    import pandas as pd

    rows = _with_rivals(tmp_path)
    for r in rows:  # a pair with a draft on disk; the n-gram row ran without it
        r["model"]["draft"] = None if r["decoder"].get("proposer") == "ngram" else "models/some-draft"
    df = prepare(pd.DataFrame([flatten_dict(r) for r in rows]), search=[tmp_path], profiles=[])
    ngram = df[df.variant == "speculative (accept=lossless, proposer=ngram)"].iloc[0]
    assert ngram.speedup == pytest.approx(1 / 0.3) and ngram.speedup_ci.n == 24  # speculative: 1.0 a unit
    assert not any("[draft=" in v for v in df.variant)
    other = [json.loads(json.dumps(r)) for r in rows]
    for r in other:
        if r["decoder"].get("accept") == "block":
            r["model"]["draft"] = "another-draft"
    df = prepare(pd.DataFrame([flatten_dict(r) for r in other]), search=[tmp_path], profiles=[])
    block = df[df.variant.str.startswith("speculative (accept=block")].iloc[0]
    assert block.speedup is None or pd.isna(block.speedup)


def test_ratio_interval_is_a_ratio_of_sums_with_its_own_resamples():
    """The ratio of sums over prompts, an interval that covers it, and resamples keyed by the data: two
    different cells never share their indices (control: the same data gives the same interval)."""
    from mtad.report.stats import ratio_interval

    rng = np.random.default_rng(3)
    num, den = rng.uniform(10, 30, 20), np.full(20, 64.0)
    point, low, high = ratio_interval(num, den)
    assert point == pytest.approx(num.sum() / den.sum()) and low < point < high
    assert ratio_interval(num, den) == [point, low, high]  # control: deterministic for the same cell
    from mtad.report.stats import cell_key

    other = ratio_interval(num + 1e-9, den)  # another cell (nearly the same data): other resamples
    assert abs(other[1] - low) + abs(other[2] - high) > 1e-4
    same = ratio_interval(num + 1e-9, den, key=cell_key(num, den))  # control: the first cell's resamples
    assert same[1:] == pytest.approx([low, high], abs=1e-8)
    assert all(np.isnan(ratio_interval([], [])))


def test_block_efficiency_ratio_from_target_forwards_and_its_control():
    """Per-prompt records carry the target forwards and the draft tokens accepted and proposed (summed over
    seeds); the block-efficiency ratio is tokens per target forward over the baseline's, paired by prompt.
    Control: equal forwards give no change."""
    def recs(fwd: int, acc: int) -> list[dict]:
        return [{"id": f"p{i}", "turn": 0, "n_tokens": 40, "time_s": 1.0, "target_forwards": fwd + i % 3,
                 "accepted": [acc, 1], "proposed": [4, 4], "output_ids": [1, 2, 3]} for i in range(12)]

    fast, slow = stats.per_prompt([recs(10, 3)], None), stats.per_prompt([recs(20, 1), recs(20, 1)], None)
    assert slow[("p1", 0)]["target_forwards"] == 42 and slow[("p1", 0)]["accepted"] == 4
    assert fast[("p0", 0)]["proposed"] == 8
    iv = stats.compare("block_efficiency_ratio", fast, slow)
    slow_per_token = sum(2 * (20 + i % 3) for i in range(12)) / (12 * 80)
    fast_per_token = sum(10 + i % 3 for i in range(12)) / (12 * 40)
    assert iv.point == pytest.approx(slow_per_token / fast_per_token)
    assert stats.judge(iv) == "significant" and iv.low > 1.5
    same = stats.compare("block_efficiency_ratio", fast, fast)
    assert same.point == pytest.approx(1.0) and stats.judge(same) == "not significant"
    no_forwards = stats.per_prompt([[{k: v for k, v in r.items() if k != "target_forwards"} for r in recs(10, 3)]],
                                   None)
    assert no_forwards[("p0", 0)]["target_forwards"] is None

"""``make reproduce-table``: presets, grid expansion, table rendering, resume, and the submitit launcher.

The fixture ``tests/fixtures/results_small.jsonl`` is real output of the tiny pair (33 runs), made from the
repository root with::

    python -m mtad.harness.sweep --profile quick results_dir=results/fixture_gen name=fixture
    T="model=tiny task=gsm8k task.n_prompts=2 task.few_shot=0 task.max_prompt_tokens=384 \\
       task.on_long_prompt=truncate decoder.max_new_tokens=16 num_threads=1 \\
       results_dir=results/fixture_gen name=fixture"
    python -m mtad.harness.sweep --experiment tau $T 'decoder.tau=0.2,0.8'
    python -m mtad.harness.sweep --experiment gamma $T 'decoder.gamma=2,6'
    python -m mtad.harness.sweep --experiment beam_width $T 'decoder.beam_width=1,2'
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtad._util.paths import REPO_ROOT
from mtad.harness import sweep as reproduce
from mtad.harness.rows import flatten_dict
from mtad.harness.store import load_frame, load_results
from mtad.report.claims import claims
from mtad.report.frame import prepare
from mtad.report.render import render_markdown, write_tables

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results_small.jsonl"
PRESETS = sorted(p.stem for p in (REPO_ROOT / "conf" / "experiment").glob("*.yaml"))
SMALL = ["task.n_prompts=1", "decoder.max_new_tokens=6", "warmup=0"]


def _rows() -> list[dict]:
    return load_results(FIXTURE)


def _frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame([flatten_dict(r) for r in rows])


def _quick_rows(rows: list[dict]) -> list[dict]:
    """The fixture's rows at the paper's default settings (the quick grid), one per (decoder, task)."""
    out = {}
    for r in rows:
        d = r["decoder"]
        if (d["gamma"], d["beam_width"], d["tau"]) == (4, 4, 0.5):
            out[(d["name"], r["task"]["name"])] = r
    return list(out.values())


# ------------------------------------------------------------------------------------------- presets
SHARED_FILE = {"cpu_qa_nq": "cpu_qa"}  # a profile's second preset writing into the first one's results file

def test_every_preset_composes_sets_its_name_and_documents_its_command():
    from hydra import compose, initialize_config_dir

    from mtad.harness.config import register_configs

    register_configs()
    assert {"paper_table", "cpu_table", "quick", "tau", "gamma", "beam_width"} <= set(PRESETS)
    for name in PRESETS:
        lines = (REPO_ROOT / "conf" / "experiment" / f"{name}.yaml").read_text().splitlines()
        assert lines[0] == "# @package _global_", name
        assert lines[1].startswith("# ") and ("python -m mtad" in lines[1] or "make reproduce-table" in lines[1]), name
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
        assert cfg.experiment == SHARED_FILE.get(name, name)
        assert cfg.hydra.sweeper.params, f"{name} has no hydra.sweeper.params grid"


def test_grids_expand_like_hydra_with_baselines_and_overrides():
    tau = reproduce.grid("tau")
    assert len(tau) == 10 and tau[0][0] == "experiment=tau"
    assert sum("decoder=mtad" in j for j in tau) == 9 and ["experiment=tau", "decoder=speculative"] in tau
    assert len(reproduce.grid("quick")) == 21 and len(reproduce.grid("gamma")) == 16
    assert len(reproduce.grid("cpu_table")) == 12 and len(reproduce.grid("cpu_full")) == 28
    cpu = reproduce.grid("cpu_table")  # the verifier zoo's lossless rivals and draft-free proposers beside them
    assert all(sum(f"decoder={d}" in j for j in cpu) == 2 for d in ("block", "speculative_ngram", "mtad_ngram"))
    # the controls: sampling at 4 temperatures and 2 more top-p, mtad and threshold speculative at 5 tau, baseline
    temperature = reproduce.grid("temperature")
    assert len(temperature) == 17 and len(reproduce.grid("quick_controls")) == 12
    assert sum("decoder=speculative_threshold" in j for j in temperature) == 5
    assert ["experiment=temperature", "decoder=speculative_threshold", "decoder.tau=0.3"] in temperature
    assert ["experiment=temperature", "decoder=speculative"] in temperature
    assert not any("decoder.temperature=0.3" in j for j in temperature if "decoder=mtad" in j)
    paper = reproduce.grid("paper_table")
    assert len(paper) == 6 * 7 * 4
    # an override replaces the preset's sweep of the same key; the baseline keeps non-decoder overrides
    jobs = reproduce.grid("tau", ["decoder.tau=0.3,0.6", "task.n_prompts=3"])
    assert len(jobs) == 3 and all("task.n_prompts=3" in j for j in jobs)
    assert not any("decoder.tau=0.3" in j for j in jobs if "decoder=speculative" in j)
    with pytest.raises(ValueError, match="no experiment preset 'nope'"):
        reproduce.grid("nope")


# ------------------------------------------------------------------------------------------- table
def test_tables_written_from_fixture_and_speedup_joins_rows_on_fields(tmp_path):
    md, tex = write_tables(load_frame(FIXTURE), tmp_path, "fx")
    text, latex = md.read_text(), tex.read_text()
    assert md.name == "fx.md" and tex.name == "fx.tex"
    for task in ("gsm8k", "humaneval", "mt_bench"):
        assert f"{task} PPL" in text and f"Speed and energy — {task}" in text
    assert "gsm8k accuracy" in text and "humaneval pass@1" in text
    assert r"\begin{tabular}" in latex and r"\toprule" in latex and "mt\\_bench" in latex
    # independent join: mtad vs the lossless speculative run with the same pair/task/prompts/budget/hardware
    rows = _quick_rows(_rows())
    df = prepare(load_frame(FIXTURE))
    for task in ("gsm8k", "humaneval", "mt_bench"):
        m = next(r for r in rows if r["decoder"]["name"] == "mtad" and r["task"]["name"] == task)
        s = next(r for r in rows if r["decoder"]["name"] == "speculative" and r["task"]["name"] == task)
        expected = s["metrics"]["ms_per_token"] / m["metrics"]["ms_per_token"]
        got = df[(df.variant.str.startswith("mtad (gamma=4, beam_width=4, tau=0.5)")) & (df.task == task)]
        assert got.speedup.iloc[0] == pytest.approx(expected)
    # the joined figure is what the markdown shows for that row
    row = df[(df.variant == "mtad (gamma=4, beam_width=4, tau=0.5)") & (df.task == "gsm8k")].iloc[0]
    # the fixture has no run directories and no forward counts: a point estimate (†), no prediction
    assert f"| 2 | {row.ms_per_token:.1f} | — | {row.speedup:.2f}×† |" in text
    assert "31 row(s) have no per-prompt records" in text


def test_baseline_join_needs_equal_fields_and_ignores_row_order():
    rows = _quick_rows(_rows())
    df = prepare(_frame(rows))
    before = dict(zip(zip(df.variant, df.task), df.speedup))
    shuffled = prepare(_frame(list(reversed(rows))))
    assert dict(zip(zip(shuffled.variant, shuffled.task), shuffled.speedup)) == pytest.approx(before)
    # negative control: the speculative row measured on other hardware is no baseline
    moved = [dict(r, device_name="another machine") if r["decoder"]["name"] == "speculative" else r for r in rows]
    df = prepare(_frame(moved))
    assert df[df.decoder == "mtad"].speedup.isna().all()
    assert "—" in render_markdown(_frame(moved))


def _synthetic(rows: list[dict]) -> list[dict]:
    """Fixture rows with known figures: mtad perplexity 0.8x sampling's, energies 2 J (speculative), 1 J (mtad)."""
    out = []
    sampling_ppl = {r["task"]["name"]: r["metrics"]["ppl_mean_logprob"] for r in rows
                    if r["decoder"]["name"] == "sampling"}
    for r in rows:
        r = json.loads(json.dumps(r))
        name, m = r["decoder"]["name"], r["metrics"]
        if name == "mtad":
            m["ppl_mean_logprob"] = 0.8 * sampling_ppl[r["task"]["name"]]
            m["energy_j_per_token"] = 1.0
        if name == "speculative":
            m["energy_j_per_token"] = 2.0
        out.append(r)
    return out


def test_claims_table_measures_the_paper_comparisons_and_dashes_the_rest():
    rows = _synthetic(_quick_rows(_rows()))
    df = prepare(_frame(rows))
    by_claim = {c["claim"]: c for c in claims(df)}
    ppl = by_claim["output perplexity −21.2 % vs single-token sampling"]
    assert ppl["paper"] == -21.2 and ppl["ours"] == pytest.approx(-20.0) and ppl["n_cells"] == 3
    assert by_claim["1.54× less energy vs speculative decoding"]["ours"] == pytest.approx(2.0)
    assert by_claim["23.6 % less energy vs vanilla speculative decoding"]["ours"] == pytest.approx(50.0)
    # no sampling energy was measured: the v1 energy claim has no figure of ours
    assert by_claim["2.84× less energy vs autoregressive decoding"]["ours"] is None
    # task scores are 0 for both: a relative change is undefined, so no figure
    assert by_claim["downstream score +43 % vs single-token sampling"]["ours"] is None
    text = render_markdown(_frame(rows))
    section = text[text.index("headline claims"):]
    for published in ("−21.2 %", "1.42×", "1.54×", "+43.0 %", "1.26×", "+23.6 %", "2.21×", "2.84×", "1.49×", "1.62×"):
        assert published in section
    assert "−20.0 %" in section and "2.00×" in section and "+50.0 %" in section
    assert "ICLR 2025 camera-ready" in section and "arXiv 2407.09722 v2–v4" in section
    line = next(x for x in section.splitlines() if "2.84×" in x)
    assert line.count("—") >= 3  # ours, measured on, hardware
    assert rows[0]["device_name"] in section  # the hardware is named


def test_empty_results_are_a_clear_error():
    import pandas as pd

    with pytest.raises(ValueError, match="no result rows"):
        render_markdown(pd.DataFrame())


# ------------------------------------------------------------------------------------------- end to end
@pytest.fixture
def _short_cost_profile(monkeypatch):
    """A sweep that measures the tiny pair's cost profile into its fresh results folder: its rounds, without the
    10-second floor per model that steadies real figures (tests/measure/test_costmodel.py keeps it, where the
    figures are compared with measured decodes, and so do the slow sweeps; here only their presence is checked)."""
    from mtad.measure import costmodel

    monkeypatch.setattr(costmodel, "MIN_SECONDS", 0.0)


@pytest.mark.usefixtures("_short_cost_profile")
def test_quick_profile_runs_renders_and_resumes(tmp_path, capsys):
    """The whole quick grid (7 decoders x 3 tasks) with 1 prompt of 6 tokens, then a second invocation
    through the CLI entry point that runs nothing new."""
    args = [f"results_dir={tmp_path / 'res'}", *SMALL]
    s = reproduce.reproduce("quick", args, progress=False)
    assert (s.ran, s.skipped, s.failed) == (21, 0, [])
    rows = load_results(tmp_path / "res" / "quick.jsonl")
    assert len(rows) == 21 and {r["experiment"] for r in rows} == {"quick"}
    md = (tmp_path / "res" / "tables" / "quick.md").read_text()
    assert (tmp_path / "res" / "tables" / "quick.tex").is_file()
    assert "| tiny | speculative | " in md and "1.00×" in md and "| tiny | mmtad | " in md
    assert "predicted ms/token" in md and "projected speed-up vs speculative‡" in md
    assert "n = 1 (interval" not in md and "not significant" not in md  # one prompt: no interval is invented
    # every run recorded its forward counts and diversity; a cost profile of this machine exists (or was made)
    df = prepare(load_frame(tmp_path / "res" / "quick.jsonl"), search=[tmp_path / "res"])
    assert df.predicted_ms.notna().all() and df.proj_speedup.notna().all()
    assert df.distinct_1.notna().all() and df.records.notna().all()
    t0 = time.perf_counter()
    assert reproduce.main(["--experiment", "quick", "--no-progress", *args]) == 0
    assert "0 runs done, 21 already had a row, 0 failed" in capsys.readouterr().out
    assert len(load_results(tmp_path / "res" / "quick.jsonl")) == 21
    assert time.perf_counter() - t0 < 90


def test_controls_preset_renders_intervals_and_the_threshold_control(tmp_path):
    """quick_controls with 5 prompts of 6 tokens: sampling at several T/top-p, mtad and threshold speculative
    at several tau, each comparison with its paired interval and n."""
    args = [f"results_dir={tmp_path}", "task.n_prompts=5", "decoder.max_new_tokens=6", "warmup=0"]
    s = reproduce.reproduce("quick_controls", args, progress=False, cost_profile=False)  # profile: the test above
    assert (s.ran, s.failed) == (12, [])
    md = (tmp_path / "tables" / "quick_controls.md").read_text()
    for label in ("sampling (temperature=0.5, top_p=0.9)", "sampling (temperature=1, top_p=0.7)",
                  "mtad (tau=0.1)", "speculative (tau=0.9, accept=threshold)",
                  "speculative (tau=0.5, accept=lossless)"):
        assert f"| tiny | {label} |" in md
    quality = md[md.index("## Quality against sampling"):md.index("## Diversity")]
    assert quality.count("] |") >= 10 and "| 5 |" in quality  # n = 5 paired prompts, intervals
    section = md[md.index("headline claims"):]
    assert "at n = 5" in section


def _outputs_by_hash(results_file: Path) -> dict:
    return {r["config_hash"]: [json.loads(x)["output_ids"]
                               for x in (Path(r["run_dir"]) / "samples.jsonl").read_text().splitlines()]
            for r in load_results(results_file)}


def test_interleaved_grid_gives_the_rows_of_separate_runs(tmp_path):
    """The default sweep decodes the runs of one pair and task interleaved: the quick grid falls into one group
    per task (7 decoders each), and its rows have the hashes and outputs of the same grid run one run after
    another (--no-interleave). Control: a grid over seeds groups by seed, never mixing two prompt streams."""
    args = [f"results_dir={tmp_path / 'inter'}", "task.n_prompts=2", "decoder.max_new_tokens=6", "warmup=0"]
    groups = reproduce.interleave_groups(reproduce.grid("quick", args))
    assert [len(g) for g in groups] == [7, 7, 7]
    tasks = [{o for job in g for o in job if o.startswith("task=")} for g in groups]
    assert all(len(t) == 1 for t in tasks) and len(set.union(*tasks)) == 3
    seeded = reproduce.interleave_groups(reproduce.grid("quick", [*args, "seed=0,1", "task=gsm8k"]))
    assert [len(g) for g in seeded] == [7, 7]
    args.append("task=mt_bench")
    s = reproduce.reproduce("quick", args, progress=False, cost_profile=False)  # the profile: the test above
    assert (s.ran, s.skipped, s.failed) == (7, 0, [])
    alone = [f"results_dir={tmp_path / 'alone'}", *args[1:]]
    assert reproduce.reproduce("quick", alone, progress=False, interleave=False, cost_profile=False).ran == 7
    inter = _outputs_by_hash(tmp_path / "inter" / "quick.jsonl")
    assert inter == _outputs_by_hash(tmp_path / "alone" / "quick.jsonl") and len(inter) == 7
    again = reproduce.reproduce("quick", args, progress=False, cost_profile=False)
    assert (again.ran, again.skipped) == (0, 7)


@pytest.mark.slow
def test_full_quick_profile(tmp_path):
    """The quick profile exactly as `make reproduce-table PROFILE=quick` runs it (2 prompts, 16 tokens)."""
    s = reproduce.reproduce("quick", [f"results_dir={tmp_path}"], progress=False)
    assert (s.ran, s.failed) == (21, [])
    assert (tmp_path / "tables" / "quick.md").is_file()


@pytest.mark.slow  # three interpreters (the sweep and its two submitit jobs): make test-slow, .ci/run
def test_submitit_local_launcher_and_in_process_route_share_config_hashes(tmp_path):
    """A 1x2 grid through ``hydra/launcher=local`` (submitit subprocesses); the in-process reproduce route
    then recognises both rows (same config hashes) and runs nothing."""
    grid = ["experiment=quick", "decoder=greedy,mtad", "task=mt_bench", "task.n_prompts=1",
            "decoder.max_new_tokens=4", "warmup=0", f"results_dir={tmp_path / 'res'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(REPO_ROOT)}  # cwd is tmp_path: the jobs import this checkout's mtad
    done = subprocess.run([sys.executable, "-m", "mtad", "-m", "hydra/launcher=local", *grid,
                           f"hydra.sweep.dir={tmp_path / 'multirun'}"], check=False, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Submitit 'local' sweep" in done.stdout + done.stderr
    rows = load_results(tmp_path / "res" / "quick.jsonl")
    assert sorted(r["decoder"]["name"] for r in rows) == ["greedy", "mtad"]
    s = reproduce.reproduce("quick", grid[1:], progress=False)
    assert (s.ran, s.skipped) == (0, 2)


# ------------------------------------------------------------------------------------------- speed benchmark
def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_hf", REPO_ROOT / "experiments" / "bench_hf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_leviathan_bound_formula():
    bench = _bench_module()
    assert bench.expected_tokens(0.5, 4) == pytest.approx((1 - 0.5 ** 5) / 0.5)
    assert bench.expected_tokens(1.0, 4) == 5 and bench.expected_tokens(0.0, 4) == 1
    assert bench.leviathan_bound(0.8, 4, c=0.05, v=1.0) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 1.2)
    assert bench.leviathan_bound(0.0, 4, c=0.05, v=1.0) < 1  # a useless draft only costs


def test_bench_quick_smoke_run_writes_rows(tmp_path, capsys):
    bench = _bench_module()
    out = tmp_path / "bench.jsonl"
    assert bench.main(["--quick", "--max-new-tokens", "8", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ratios = {(r["a"], r["b"]): r for r in rows if r["bench"] == "ratio"}
    assert set(ratios) == {("greedy", "hf_greedy"), ("speculative", "hf_assisted"), ("mtad", "speculative"),
                           ("speculative", "sampling"), ("mtad", "sampling")}
    assert ratios[("greedy", "hf_greedy")]["same_tokens"] == 1.0  # our greedy == HF greedy, token for token
    assert all(r["ratio"] > 0 and r["a_tokens"] > 0 for r in ratios.values())
    bounds = {r["decoder"]: r for r in rows if r["bench"] == "bound"}
    assert set(bounds) == {"speculative", "mtad"}
    assert all(0 <= b["alpha"] <= 1 and b["c"] > 0 and b["v"] > 0 for b in bounds.values())
    assert "hf_assisted" in capsys.readouterr().out


def test_rows_measured_under_other_settings_are_separate_table_rows():
    rows = _quick_rows(_rows())
    other = [dict(json.loads(json.dumps(r)), device_name="GPU X") for r in rows]
    for r in other:
        r["metrics"]["ms_per_token"] /= 10
    df = prepare(_frame(rows + other))
    assert {"greedy [on=GPU X]", f"greedy [on={rows[0]['device_name']}]"} <= set(df.variant)
    # each hardware's rows join with their own speculative baseline
    a = df[(df.variant == "mtad [on=GPU X]") & (df.task == "gsm8k")].speedup.iloc[0]
    b = df[(df.variant == f"mtad [on={rows[0]['device_name']}]") & (df.task == "gsm8k")].speedup.iloc[0]
    assert a == pytest.approx(b)


def test_per_run_reference_figures_only_for_the_camera_ready_pairs():
    rows = _quick_rows(_rows())
    assert "Per-run figures" not in render_markdown(_frame(rows))  # the tiny pair: not rendered
    llama = [json.loads(json.dumps(r)) for r in rows if r["task"]["name"] in ("humaneval", "mt_bench")]
    for r in llama:
        r["model"]["name"] = "llama3-8b"
    text = render_markdown(_frame(llama))
    part = text[text.index("Per-run figures"):]
    line = next(x for x in part.splitlines() if x.startswith("| humaneval | llama3-8b | mtad"))
    assert "pass@1 0.299" in line and "| 29.02 |" in line and "| 4.33 |" in line  # published figures, as in PAPER.md
    assert "pass@1 0.000" in line  # ours, joined from the row
    spider = next(x for x in part.splitlines() if x.startswith("| spider | llama3-8b | specinfer"))
    assert spider.count("—") == 4  # no spider row of ours: every figure of ours is missing


def test_a_sweep_whose_runs_all_fail_the_same_way_stops_early(tmp_path):
    """Negative control: a target that does not exist fails every run; the sweep stops after three."""
    args = [f"results_dir={tmp_path}", "model.kind=hf", "model.target=no/such/model"]
    with pytest.raises(ValueError, match="the first 3 runs all failed"):
        reproduce.reproduce("quick", args, progress=False)

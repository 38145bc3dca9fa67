"""The notebooks' figure rules (mtad.report.figures): whole-number ticks for positions, legends off the data,
error bars from per-prompt records, pair and hardware in the title, no empty or all-zero panels."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from mtad.report import figures, stats


def records(times_tokens):
    return {(f"p{i}", 0): {"time_s": t, "n_tokens": n, "energy_j": None, "mean_logprob": -1.0, "score": 0.0}
            for i, (t, n) in enumerate(times_tokens)}


ROWS = pd.DataFrame([
    {"pair": "smollm2_bf16_feature", "task": "gsm8k", "variant": v, "decoder": v, "ms_per_token": ms,
     "device_name": "AMD EPYC", "num_threads": 1,
     "records": records([(ms / 1000 * n, n) for n in (40, 50, 60, 64, 30, 64, 20, 64)] + [(ms / 250, 10)])}
    for v, ms in (("sampling", 33.0), ("mtad", 25.0))])


def overlaps(a, b) -> bool:
    return not (a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0)


def test_position_ticks_are_whole_numbers():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3, 4], [0.6, 0.4, 0.3, 0.2])
    fig.canvas.draw()
    assert any(not float(t).is_integer() for t in ax.get_xticks())  # negative control: matplotlib's 1.5, 2.5
    figures.integer_ticks(ax)
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())
    plt.close(fig)


def test_legend_covers_no_data():
    fig, ax = plt.subplots()
    figures.grouped_bars(ax, ROWS, "ms_per_token", "ms_per_token")
    figures.legend_outside(ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes_box = ax.get_window_extent(renderer)
    assert not overlaps(ax.get_legend().get_window_extent(renderer), axes_box)
    inside = ax.legend(loc="upper right")  # negative control: the check sees a legend on the axes
    fig.canvas.draw()
    assert overlaps(inside.get_window_extent(renderer), axes_box)
    plt.close(fig)


def test_variants_of_one_decoder_get_colours_of_their_own():
    """Block verification and the n-gram proposer are variants of ``speculative``: each bar and legend entry gets
    its own colour, the plain (lossless, drafted) variant keeps the decoder's; control: the old rule (colour by the
    label's first word) gives the three speculative bars one colour."""
    variants = ["sampling", "speculative (accept=block, proposer=draft)",
                "speculative (accept=lossless, proposer=draft)", "speculative (accept=lossless, proposer=ngram)",
                "mtad (proposer=draft)", "mtad (proposer=ngram)"]
    rows = pd.DataFrame([{**ROWS.iloc[0].to_dict(), "variant": v, "decoder": v.split(" ")[0]} for v in variants])
    fig, ax = plt.subplots()
    figures.grouped_bars(ax, rows, "ms_per_token", None)
    colours = {c.get_label(): c.patches[0].get_facecolor() for c in ax.containers if hasattr(c, "patches")}
    plt.close(fig)
    assert len(colours) == 6 and len(set(colours.values())) == 6
    chosen = figures.member_colors(variants)
    assert chosen["speculative (accept=lossless, proposer=draft)"] == figures.DECODER_COLORS["speculative"]
    assert chosen["mtad (proposer=draft)"] == figures.DECODER_COLORS["mtad"]
    # block verification has one colour in every figure, whatever else the table holds
    assert chosen["speculative (accept=block, proposer=draft)"] == "tab:cyan"
    alone = "speculative (accept=block, gamma=6)"
    assert figures.member_colors([alone])[alone] == "tab:cyan"
    old = {v: figures.DECODER_COLORS.get(v.split(" ")[0]) for v in variants}
    assert len({old[v] for v in variants if v.startswith("speculative")}) == 1


def test_ms_per_token_bars_carry_bootstrap_error_bars():
    iv = stats.run_interval(ROWS.records[0], "ms_per_token")
    total_t = sum(r["time_s"] for r in ROWS.records[0].values())
    total_n = sum(r["n_tokens"] for r in ROWS.records[0].values())
    assert iv.point == pytest.approx(1000 * total_t / total_n)  # a ratio of sums, as the tables print
    assert iv.low < iv.point < iv.high  # the slow last prompt gives spread
    assert stats.run_interval(records([(1.0, 10)] * 3), "ms_per_token").has_interval is False  # too few
    fig, ax = plt.subplots()
    assert figures.grouped_bars(ax, ROWS, "ms_per_token", "ms_per_token")
    assert not figures.grouped_bars(ax, ROWS.assign(records=None), "ms_per_token", "ms_per_token")
    plt.close(fig)


def test_title_names_pair_and_hardware():
    fig = plt.figure()
    figures.title(fig, "Decoding time per token", ROWS)
    assert fig._suptitle.get_text() == "Decoding time per token\npair smollm2_bf16_feature · AMD EPYC, 1 thread"
    two = pd.concat([ROWS, ROWS.assign(pair="smollm2", device_name="Xeon", num_threads=2)])
    assert figures.context(two) == "pairs smollm2, smollm2_bf16_feature · AMD EPYC, 1 thread; Xeon, 2 threads"
    plt.close(fig)


def test_empty_and_all_zero_panels_are_named():
    assert figures.why_empty([float("nan"), None]) == "no values"
    assert figures.why_empty([0.0, 0.0]) == "all zero"
    assert figures.why_empty([0.0, 0.1]) is None


def test_sweep_with_an_all_zero_panel_drops_it_and_uses_integer_ticks(capsys):
    rows = pd.DataFrame([{"pair": "tiny", "task": "t", "decoder": "mtad", "decoder.gamma": g, "ppl": 2.0 + g / 10,
                          "score": 0.0, "records": None, "device_name": "cpu", "num_threads": 1}
                         for g in (2, 3, 4, 5)])
    fig, why = figures.plot_sweep(plt, rows, "gamma", "γ", [("ppl", "perplexity"), ("score", "score")])
    assert why is None and len(fig.axes) == 1
    assert "no 'score' panel (all zero)" in capsys.readouterr().out
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())
    plt.close(fig)
    fig, why = figures.plot_sweep(plt, rows, "gamma", "γ", [("score", "score")])
    assert fig is None and why

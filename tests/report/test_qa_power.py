"""The QA power analysis (``experiments/qa_power.py``) finds known sample sizes on synthetic joint outcomes, its
bootstrap is the tables' bootstrap, and a deliberately wrong (unpaired) variant misses the known answer.

Bounds: with 100 simulated studies of 2,000 resamples each, the expected half-width is estimated within about
1 % (Monte-Carlo), so the required n within about 2 %; the checks allow 7 %, and the unpaired control is off by
a factor of five."""
from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

from mtad._util.paths import REPO_ROOT
from mtad.report import stats

spec = importlib.util.spec_from_file_location("qa_power", REPO_ROOT / "experiments" / "qa_power.py")
qa_power = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qa_power)

FAST = dict(sims=100, n_resamples=2000)
# (m, b) outcomes: agreeing on 90 % of prompts, each decoder right on half of them, no change on average
PAIRED = (np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=float), np.array([0.45, 0.05, 0.05, 0.45]))
PAIRED_N = (100 * qa_power.Z * math.sqrt(0.1) / (0.5 * 5)) ** 2  # 614.6: sd(m - b) = sqrt(0.1), mean b = 0.5


def unpaired(values, probs):
    """The wrong variant: the product of the marginals (the method's and baseline's scores drawn apart)."""
    pm = {v: probs[values[:, 0] == v].sum() for v in np.unique(values[:, 0])}
    pb = {v: probs[values[:, 1] == v].sum() for v in np.unique(values[:, 1])}
    vals = np.array([[a, b] for a in pm for b in pb])
    return vals, np.array([pm[a] * pb[b] for a in pm for b in pb])


def finds(values, probs, known: float) -> bool:
    n = qa_power.required_n(values, probs, 5.0, **FAST)
    return abs(n / known - 1) <= 0.07


def test_a_proportion_needs_the_textbook_384():
    # baseline always 1, method right half the time: the change is 100 (p - 1), its half-width 100 Z sqrt(p(1-p)/n)
    values, probs = np.array([[0, 1], [1, 1]], dtype=float), np.array([0.5, 0.5])
    assert finds(values, probs, (100 * qa_power.Z * 0.5 / 5) ** 2)  # 384.1


def test_paired_outcomes_need_the_delta_method_n_and_the_unpaired_control_does_not():
    assert finds(*PAIRED, PAIRED_N)
    assert qa_power.delta_n(*PAIRED) == pytest.approx(PAIRED_N)
    wrong = unpaired(*PAIRED)  # sd(m - b) = sqrt(0.5): five times the prompts
    assert not finds(*wrong, PAIRED_N)
    assert qa_power.required_n(*wrong, 5.0, **FAST) > 4 * PAIRED_N


def test_a_wider_target_needs_fewer_prompts():
    assert qa_power.required_n(*PAIRED, 10.0, **FAST) < qa_power.required_n(*PAIRED, 5.0, **FAST) / 3


def test_the_multinomial_bootstrap_is_the_tables_bootstrap():
    """A study's interval from multinomial resamples agrees with ``stats.bootstrap_interval`` on its prompts."""
    rng = np.random.default_rng(3)
    pairs = PAIRED[0][rng.choice(4, size=300, p=PAIRED[1])]  # (300, 2)
    iv = stats.bootstrap_interval("score_change", [pairs[:, 0]], [pairs[:, 1]])
    values, probs = qa_power.joint(pairs)
    boot = rng.multinomial(300, probs, size=stats.N_RESAMPLES) @ values  # (B, 2)
    low, high = stats.percentile_interval(100 * (boot[:, 0] / boot[:, 1] - 1))
    assert (high - low) / 2 == pytest.approx((iv.high - iv.low) / 2, rel=0.05)
    assert not (high - low) / 2 == pytest.approx((iv.high - iv.low), rel=0.05)  # control: a full width differs


def test_the_published_outcomes_are_read_paired_by_prompt():
    pairs, per_task = qa_power.paired_outcomes(qa_power.PUBLISHED, "asserted")
    assert per_task == {"capitals": 193, "elements": 118, "nq_open": 100}
    assert pairs.sum(0).tolist() == [115.0, 107.0]  # +7.5 % pooled, as README's downstream row


@pytest.mark.parametrize("args, needle", [
    (["--sims", "1"], "out of range: give an integer >= 2"),
    (["--half-width", "0"], "out of range"),
    (["--tau", "0.33"], "no task has both an mtad tau=0.33"),
])
def test_the_command_line_refuses_in_one_line(capsys, args, needle):
    with pytest.raises(SystemExit) as exit_:
        qa_power.main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and needle in err and err.count("\n") == 1 and err.startswith("qa_power: error:")


def test_a_results_file_without_records_is_one_line(tmp_path, capsys):
    row = json.loads(qa_power.PUBLISHED.read_text().splitlines()[0])
    f = tmp_path / "r.jsonl"
    f.write_text("".join(json.dumps({**row, "decoder": {**row["decoder"], **d}, "run_dir": "gone"}) + "\n"
                         for d in ({"name": "mtad"}, {"name": "sampling"})))
    with pytest.raises(SystemExit):
        qa_power.main(["--results", str(f)])
    err = capsys.readouterr().err
    assert "per-prompt records not found" in err and err.count("\n") == 1

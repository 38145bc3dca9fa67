"""Acceptance profiles (VERIFIERS.md §5): the per-run profile in every speculative-family row, and
``python -m mtad.results profile`` writing SPEED-Bench's speculation profile, on hand-made rows.

The spec's worked example (token-wise on fixture F, 1000 steps at the exact rates: histogram 200/240/560,
marginals [0.8, 0.56], AL 2.36; block verification 200/140/660, [0.8, 0.66], 2.46) is reproduced exactly.
Negative controls: a row whose marginals were cut short (an understated K) or do not fall, or whose mean was
not measured with its histogram, is flagged (exit 1); missing files, rows without speculative decoders or
without profiles, and an ambiguous selection are refused with one line (exit 2).
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from mtad._util.paths import REPO_ROOT
from mtad.decoding.result import DecodeResult
from mtad.measure.metrics import acceptance_profile, run_metrics
from mtad.report.speculation import build_profile, passed
from mtad.results import main


def result(taus: list[int], K: int = 2, proposed: list[int] | None = None) -> DecodeResult:
    return DecodeResult(tokens=[0] * (sum(taus) + len(taus)), accepted=list(taus),
                        proposed=proposed or [K] * len(taus), target_forwards=len(taus))


TOKENWISE_F = [0] * 200 + [1] * 240 + [2] * 560  # VERIFIERS.md §5 example
BLOCK_F = [0] * 200 + [1] * 140 + [2] * 660


def row(taus=TOKENWISE_F, task="gsm8k", name="speculative", accept="lossless", proposer="draft", K=2, split=1):
    """A hand-made result row of one speculative run whose prompts accepted ``taus``."""
    n = len(taus) // split
    rs = [result(taus[i * n:(i + 1) * n], K) for i in range(split)]
    return {"run_id": f"{name}-{accept}-{task}", "schema_version": 1, "config_hash": f"{name}{accept}{task}",
            "device_name": "AMD EPYC", "n_prompts": split, "task": {"name": task},
            "model": {"name": "smollm2_feature", "target": None, "draft": "models/smollm2-feature-draft",
                      "info": {"target": "SmolLM2-135M-Instruct"}},
            "decoder": {"name": name, "accept": accept, "proposer": proposer, "gamma": K, "temperature": 1.0,
                        "top_k": 10, "top_p": 0.9, "tau": 0.5, "max_new_tokens": 64},
            "metrics": run_metrics(rs, gamma=K)}


def write(tmp_path, rows) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def cli(tmp_path, rows, *args, capsys):
    code = main(["profile", write(tmp_path, rows) if not isinstance(rows, str) else rows, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- the per-run profile ---------------------------------------------------------------------------------
def test_profile_reproduces_the_spec_example():
    p = acceptance_profile([result(TOKENWISE_F[:500]), result(TOKENWISE_F[500:])])
    assert p["acceptance_length_histogram"] == {"1": 200, "2": 240, "3": 560}
    assert p["marginal_accept_rates"] == pytest.approx([0.8, 0.56])
    assert p["conditional_accept_rates"] == pytest.approx([0.8, 0.7])
    assert p["mean_accept_length"] == pytest.approx(2.36)
    assert p["mean_consistency"]["passed"] and p["mean_consistency"]["abs_delta"] == pytest.approx(0, abs=1e-12)
    b = acceptance_profile([result(BLOCK_F)])
    assert b["acceptance_length_histogram"] == {"1": 200, "2": 140, "3": 660}
    assert b["marginal_accept_rates"] == pytest.approx([0.8, 0.66]) and b["mean_accept_length"] == pytest.approx(2.46)


def test_per_request_mean_differs_from_per_step_mean():
    p = acceptance_profile([result([2, 2, 2, 2]), result([0])])  # 4 steps of L=3, one of L=1
    assert p["mean_accept_length"] == pytest.approx(13 / 5)
    assert p["mean_accept_length_per_request"] == pytest.approx((3 + 1) / 2)


def test_short_and_empty_proposals_count_as_steps():
    p = acceptance_profile([result([2, 0, 1], K=2, proposed=[2, 0, 1])])  # a lookup miss, a shortened tail
    assert p["num_speculative_tokens"] == 2 and p["steps"] == 3 and p["truncated_steps"] == 2
    assert p["mean_accept_length"] == pytest.approx(1 + sum(p["marginal_accept_rates"]))


def test_every_speculative_row_has_a_profile_and_others_none():
    assert run_metrics([result([1, 2])], gamma=2)["acceptance_profile"]["steps"] == 2
    plain = DecodeResult(tokens=[1, 2, 3], target_forwards=3)
    assert run_metrics([plain])["acceptance_profile"] is None


def test_decoders_record_profiles_consistently():
    import tinymodels as tm

    import mtad

    models = tm.pair("llama", vocab=16)
    for cfg in ({"name": "speculative"}, {"name": "speculative", "accept": "block"}, {"name": "mtad"},
                {"name": "speculative", "proposer": "ngram"}):
        rs = [mtad.generate(models, [0, 3, 5, 3, 5], max_new_tokens=24, **cfg)]
        prof = run_metrics(rs, gamma=4)["acceptance_profile"]
        assert prof["steps"] == len(rs[0].accepted) and prof["mean_consistency"]["passed"], cfg
        assert prof["mean_accept_length"] == pytest.approx(1 + sum(rs[0].accepted) / len(rs[0].accepted))


# ---- the export -------------------------------------------------------------------------------------------
def test_export_matches_the_spec_schema(tmp_path, capsys):
    code, out, err = cli(tmp_path, [row(split=4), row(task="mt_bench", split=2),
                                    row(name="sampling", accept="lossless")], "--decoder", "speculative",
                         capsys=capsys)
    assert code == 0 and not err
    p = json.loads(out)
    assert p["schema_version"] == "1.0" and p["measured"] is True and p["method"] == "draft_model"
    assert p["num_speculative_tokens"] == p["max_supported_k"] == 2 and p["block_size"] is None
    assert p["verification_method"] == "longest_prefix" and p["accept_length_model"] == "chain_analytic"
    assert p["acceptance_length_histogram"] == {"1": 400, "2": 480, "3": 1120}
    assert p["conditional_accept_rates"] == pytest.approx([0.8, 0.7])
    assert p["marginal_accept_rates"] == pytest.approx([0.8, 0.56])
    assert p["mean_accept_length"] == pytest.approx(2.36) and p["accept_length_by_k"] == {"2": pytest.approx(2.36)}
    assert set(p["per_category"]) == {"gsm8k", "mt_bench"}
    assert p["per_category"]["mt_bench"]["acceptance_length_histogram"] == {"1": 200, "2": 240, "3": 560}
    assert p["validation"]["mean_consistency"]["passed"] and p["validation"]["marginal_monotonicity"]["passed"]
    assert p["draft_checkpoint"] == "models/smollm2-feature-draft" and not p["target_model"].startswith("/")
    assert "projection" in p["measurement_conditions"]["note"]


def test_block_and_ngram_and_mtad_methods(tmp_path, capsys):
    rows = [row(), row(BLOCK_F, accept="block"), row(proposer="ngram"), row(name="mtad")]
    code, out, _ = cli(tmp_path, rows, "--accept", "block", capsys=capsys)
    p = json.loads(out)
    assert code == 0 and p["verification_method"] == "block" and p["accept_length_model"] == "measured_per_k"
    assert p["mean_accept_length"] == pytest.approx(2.46)
    p = json.loads(cli(tmp_path, rows, "--proposer", "ngram", capsys=capsys)[1])
    assert p["method"] == "ngram" and p["draft_checkpoint"] is None and p["accept_length_model"] == "measured_per_k"
    p = json.loads(cli(tmp_path, rows, "--decoder", "mtad", capsys=capsys)[1])
    assert p["method"] == "mtad" and p["accept_length_model"] == "measured_per_k"


def test_absolute_paths_are_not_exported(tmp_path):
    r = row()
    r["model"]["draft"], r["model"]["target"] = "/home/someone/drafts/my-draft", "/data/models/target-7b"
    p = build_profile([r])
    assert p["draft_checkpoint"] == "my-draft" and p["target_model"] == "target-7b"


# ---- negative controls: inconsistent profiles are flagged ----------------------------------------------
def broken(how: str) -> dict:
    r = row()
    p = r["metrics"]["acceptance_profile"]
    if how == "truncated":  # an understated K: the last position's marginal is lost
        p["marginal_accept_rates"], p["conditional_accept_rates"] = p["marginal_accept_rates"][:1], [0.8]
        p["num_speculative_tokens"] = 1
    elif how == "mean":  # a mean from another measurement
        p["mean_accept_length"] = 2.6
    elif how == "rates":  # rates that are not its histogram's
        p["marginal_accept_rates"] = [0.8, 0.66]
    return r


@pytest.mark.parametrize("how", ["truncated", "mean", "rates"])
def test_inconsistent_profile_is_flagged(tmp_path, capsys, how):
    code, out, err = cli(tmp_path, [broken(how)], capsys=capsys)
    assert code == 1 and "fails" in err and len(err.strip().splitlines()) == 1
    assert not passed(json.loads(out))
    assert build_profile([row()]) and passed(build_profile([row()]))  # the unbroken row passes


def test_non_monotone_marginals_fail_monotonicity():
    from mtad.report.speculation import monotonicity

    assert monotonicity([0.8, 0.56])["passed"] and not monotonicity([0.5, 0.6])["passed"]


@pytest.mark.parametrize("case, words", [
    ("missing", "no results at"),
    ("no_speculative", "no speculative-family rows"),
    ("no_profile", "no metrics.acceptance_profile"),
    ("ambiguous", "pick it with"),
    ("no_match", "no speculative row matches"),
])
def test_bad_input_one_line_exit_2(tmp_path, capsys, case, words):
    sampling = row(name="sampling")
    sampling["metrics"] = run_metrics([DecodeResult(tokens=[1, 2], target_forwards=2)])
    old = copy.deepcopy(row())
    del old["metrics"]["acceptance_profile"]
    inputs = {"missing": (str(tmp_path / "nope.jsonl"),), "no_speculative": ([sampling],), "no_profile": ([old],),
              "ambiguous": ([row(), row(accept="block")],), "no_match": ([row()], "--decoder", "mmtad")}[case]
    code, out, err = cli(tmp_path, inputs[0], *inputs[1:], capsys=capsys)
    assert code == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1
    assert err.startswith("mtad.results: error:")


def test_module_entry_point(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mtad.results", "profile", write(tmp_path, [row()])],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["mean_accept_length"] == pytest.approx(2.36)

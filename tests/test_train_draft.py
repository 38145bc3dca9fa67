"""Draft distillation on a tiny random teacher: the loss falls, checkpoints resume exactly, the export
re-ties to the target, the config composes."""
from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mtad import train_draft as td
from mtad.loading import load_tied_draft
from mtad.paths import REPO_ROOT


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    """A miniature copy of the shared data layout (no real data needed)."""
    d = tmp_path / "data"
    for sub in ("gsm8k", "alpaca_seed_tasks", "wikitext2", "humaneval"):
        (d / sub).mkdir(parents=True)
    qa = [{"question": f"Tom has {i} apples and buys {i + 2} more. How many now?",
           "answer": f"He has {i}+{i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2} apples.\n#### {2 * i + 2}"}
          for i in range(20)]
    for split in ("train", "test"):
        (d / "gsm8k" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qa))
    seeds = [{"instruction": f"Name {i} colours.", "instances": [{"input": "", "output": "red, blue, green"}]}
             for i in range(5)]
    (d / "alpaca_seed_tasks" / "seed_tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in seeds))
    article = " = Lobster = \n" + " The lobster is a crustacean that lives in the sea . " * 10 + "\n"
    (d / "wikitext2" / "valid.txt").write_text(article * 3)
    he = [{"task_id": f"HumanEval/{i}", "prompt": f"def add{i}(a, b):\n    \"\"\"Add.\"\"\"\n"} for i in range(4)]
    with gzip.open(d / "humaneval" / "HumanEval.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in he))
    return d


def _cfg(tmp_path, data_dir, **kw) -> td.TrainDraftConfig:
    base = dict(target="tiny", out_dir="", ckpt_dir=str(tmp_path / "ckpt"), data_dir=str(data_dir), layers=1,
                init_layers=[0], seq_len=32, batch_size=2, onpolicy_frac=0.3, gen_batch=4, gen_tokens=12,
                gen_prompt_len=48, gen_rows_per_step=2, lr=3e-3, warmup_steps=2, max_steps=24, max_minutes=0.0,
                ckpt_minutes=1e9, eval_minutes=0.0, eval_gsm8k=2, eval_humaneval=2, eval_tokens=12, log_every=1000,
                threads=1, device="cpu", tiny_hidden=32, tiny_layers=2)
    base.update(kw)
    return td.TrainDraftConfig(**base)


def test_training_lowers_held_out_kl(tmp_path, data_dir):
    meta = td.Trainer(_cfg(tmp_path, data_dir)).run()
    first, last = meta["eval_init"]["all"], meta["eval"]["all"]
    assert meta["steps"] == 24 and meta["onpolicy_steps"] > 0  # both kinds of batch ran
    assert last["kl"] < 0.8 * first["kl"]
    assert last["top1"] >= first["top1"]


def test_zero_lr_is_a_negative_control(tmp_path, data_dir):
    meta = td.Trainer(_cfg(tmp_path, data_dir, lr=0.0, max_steps=6)).run()
    assert meta["eval"]["all"]["kl"] == pytest.approx(meta["eval_init"]["all"]["kl"], rel=1e-6)


def _weights(trainer) -> dict:
    return {k: v.clone() for k, v in td.trainable_state(trainer.student).items()}


def test_checkpoint_resumes_to_the_same_step_and_weights(tmp_path, data_dir):
    cfg = _cfg(tmp_path, data_dir, max_steps=12)
    straight = td.Trainer(replace(cfg, ckpt_dir=str(tmp_path / "straight"), resume=False))
    straight.run()

    first = td.Trainer(cfg)  # "interrupted" after a few rounds
    while first.state["step"] < 5:
        first.round()
    first.save()
    stopped_at = first.state["step"]

    second = td.Trainer(cfg)
    assert second.maybe_resume() and second.state["step"] == stopped_at
    assert all(torch.equal(a, b) for a, b in zip(_weights(first).values(), _weights(second).values()))
    second.run()
    assert second.state["step"] == straight.state["step"] == 12
    for (k, a), b in zip(_weights(straight).items(), _weights(second).values()):
        assert torch.allclose(a, b, atol=1e-6), k


def test_resume_refuses_another_shape(tmp_path, data_dir):
    cfg = _cfg(tmp_path, data_dir, max_steps=1)
    td.Trainer(cfg).run()
    with pytest.raises(ValueError, match="layers"):
        td.Trainer(replace(cfg, layers=2, init_layers=[0, 1])).maybe_resume()


def test_export_reties_embedding_and_matches_student(tmp_path, data_dir):
    cfg = _cfg(tmp_path, data_dir, max_steps=2, out_dir=str(tmp_path / "draft"))
    trainer = td.Trainer(cfg)
    meta = trainer.run()
    out = tmp_path / "draft"
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "draft.json", "MODEL_CARD.md"}
    card = (out / "MODEL_CARD.md").read_text()
    assert "TO BE MEASURED" in card and f"{meta['eval']['all']['top1']:.3f}" in card
    from safetensors.torch import load_file

    stored = load_file(str(out / "model.safetensors"))
    assert "model.embed_tokens.weight" not in stored and "lm_head.weight" not in stored
    assert all(v.dtype == torch.float16 for v in stored.values())

    draft = load_tied_draft(out, trainer.teacher, "float32")
    assert draft.get_input_embeddings().weight is trainer.teacher.get_input_embeddings().weight
    x = torch.tensor([[1, 2, 3, 40, 50, 60, 70]])
    with torch.no_grad():
        ref, got = trainer.student(x).logits, draft(x).logits
        assert torch.allclose(ref, got, atol=2e-2)  # fp16 storage of the layers
        other = td.build_student(trainer.teacher, 1, [1])  # negative control: another draft differs
        assert not torch.allclose(ref, other(x).logits, atol=2e-2)


def test_load_tied_draft_refuses_another_target(tmp_path, data_dir):
    from mtad.tiny import tiny_model

    trainer = td.Trainer(_cfg(tmp_path, data_dir, max_steps=1, out_dir=str(tmp_path / "draft")))
    trainer.run()
    with pytest.raises(ValueError, match="hidden_size"):
        load_tied_draft(tmp_path / "draft", tiny_model("llama", hidden=64))


def test_evaluate_controls(tmp_path, data_dir):
    """The teacher scored as its own draft agrees perfectly; a fresh student does not."""
    trainer = td.Trainer(_cfg(tmp_path, data_dir))
    es = trainer.get_eval_set()
    perfect = td.evaluate(trainer.teacher, es)["all"]
    # log p is stored in fp16, so alpha is not exactly 1 where top-k/top-p boundaries are near-ties
    assert perfect["top1"] == 1.0 and perfect["kl"] < 1e-3 and perfect["alpha"] > 0.98
    weak = td.evaluate(trainer.student, es)["all"]
    assert weak["top1"] < 1.0 and weak["kl"] > 1e-2


def test_warp_keeps_top_k_then_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(td.warp(logits, 0, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(td.warp(logits, 1, 1.0), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert torch.allclose(td.warp(logits, 0, 1.0), logits.exp())


def test_training_text_excludes_eval_prompts(tmp_path, data_dir):
    from mtad.tiny import tiny_tokenizer

    corpus = td.Corpus(tiny_tokenizer(), data_dir)
    gsm = corpus.docs("gsm8k")
    assert "<<" not in gsm[0] and "The answer is" in gsm[0]
    assert all("test" not in Path(p).parts for p in corpus.docs("python"))
    heads = td.function_heads('def f(x):\n    """Doc."""\n    return x\n\ndef g():\n    return 1\n')
    assert heads == ['def f(x):\n    """Doc."""\n']


def test_split_rows_keeps_logits_aligned():
    select = torch.tensor([[1, 1, 0], [0, 1, 0], [1, 1, 1]], dtype=torch.bool)
    p = torch.arange(6.0)[:, None]  # one "logit row" per selected position, numbered
    batch = {"input_ids": torch.zeros(3, 3), "select": select, "p_logits": p}
    chunks = td.split_rows(batch, ["a", "b", "c"], 2)
    assert [c[1] for c in chunks] == [["a", "b"], ["c"]]
    assert chunks[0][0]["p_logits"].flatten().tolist() == [0, 1, 2]
    assert chunks[1][0]["p_logits"].flatten().tolist() == [3, 4, 5]


def test_config_validation():
    with pytest.raises(ValueError, match="init_layers"):
        td.TrainDraftConfig(layers=3)
    with pytest.raises(ValueError, match="mix"):
        td.TrainDraftConfig(mix={"gsm8k_test": 1.0})


def test_hydra_config_composes():
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    td._register()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="train_draft", overrides=["max_minutes=1"]))
        assert isinstance(cfg, td.TrainDraftConfig) and cfg.max_minutes == 1 and cfg.target == "smollm2"
        assert cfg.max_minutes <= 70
        with pytest.raises(ConfigCompositionException):
            compose(config_name="train_draft", overrides=["max_minuts=1"])

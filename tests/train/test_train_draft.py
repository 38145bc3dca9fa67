"""Draft distillation on a tiny random teacher: the loss falls, checkpoints resume exactly, the export
re-ties to the target; the cached on-policy pipeline and feature drafts (config and CLI: test_train_config.py)."""
from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mtad.models.load import load_tied_draft
from mtad.train.config import TrainDraftConfig
from mtad.train.corpus import Corpus, function_heads
from mtad.train.heldout import evaluate
from mtad.train.live import split_rows
from mtad.train.losses import filtered_loss, filtered_targets
from mtad.train.student import build_student, trainable_state
from mtad.train.teacher import sample_topk, teacher_features
from mtad.train.trainer import Trainer

_SOURCE_IDS: dict = {}  # (tokenizer, standard-library file) -> token ids, shared by the trainers of this module


@pytest.fixture(autouse=True)
def _tokenize_each_stdlib_file_once(monkeypatch):
    """The trainers here read the same standard-library files with the same tiny tokenizer (a reduced head counts
    token frequencies over 400 of them): each file is tokenized once for the module, not once per trainer."""
    ids = Corpus.ids

    def shared(self, source: str, i: int) -> list[int]:
        if source != "python":
            return ids(self, source, i)
        key = (type(self.tok).__name__, len(self.tok), self.docs(source)[i])
        if key not in _SOURCE_IDS:
            _SOURCE_IDS[key] = ids(self, source, i)
        return _SOURCE_IDS[key]

    monkeypatch.setattr(Corpus, "ids", shared)


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


def _cfg(tmp_path, data_dir, **kw) -> TrainDraftConfig:
    base = dict(target="tiny", out_dir="", ckpt_dir=str(tmp_path / "ckpt"), data_dir=str(data_dir), layers=1,
                init_layers=[0], seq_len=32, batch_size=2, onpolicy_frac=0.3, gen_batch=4, gen_tokens=12,
                gen_prompt_len=48, gen_rows_per_step=2, lr=3e-3, warmup_steps=2, max_steps=24, max_minutes=0.0,
                ckpt_minutes=1e9, eval_minutes=0.0, eval_gsm8k=2, eval_humaneval=2, eval_tokens=12, log_every=1000,
                threads=1, device="cpu", tiny_hidden=32, tiny_layers=2)
    base.update(kw)
    return TrainDraftConfig(**base)


def test_training_lowers_held_out_kl(tmp_path, data_dir):
    meta = Trainer(_cfg(tmp_path, data_dir)).run()
    first, last = meta["eval_init"]["all"], meta["eval"]["all"]
    assert meta["steps"] == 24 and meta["onpolicy_steps"] > 0  # both kinds of batch ran
    assert last["kl"] < 0.8 * first["kl"]
    assert last["top1"] >= first["top1"]


def test_zero_lr_is_a_negative_control(tmp_path, data_dir):
    meta = Trainer(_cfg(tmp_path, data_dir, lr=0.0, max_steps=6)).run()
    assert meta["eval"]["all"]["kl"] == pytest.approx(meta["eval_init"]["all"]["kl"], rel=1e-6)


def _weights(trainer) -> dict:
    return {k: v.clone() for k, v in trainable_state(trainer.student).items()}


def test_checkpoint_resumes_to_the_same_step_and_weights(tmp_path, data_dir):
    cfg = _cfg(tmp_path, data_dir, max_steps=12)
    straight = Trainer(replace(cfg, ckpt_dir=str(tmp_path / "straight"), resume=False))
    straight.run()

    first = Trainer(cfg)  # "interrupted" after a few rounds
    while first.state["step"] < 5:
        first.round()
    first.save()
    stopped_at = first.state["step"]

    second = Trainer(cfg)
    assert second.maybe_resume() and second.state["step"] == stopped_at
    assert all(torch.equal(a, b) for a, b in zip(_weights(first).values(), _weights(second).values()))
    second.run()
    assert second.state["step"] == straight.state["step"] == 12
    for (k, a), b in zip(_weights(straight).items(), _weights(second).values()):
        assert torch.allclose(a, b, atol=1e-6), k


def test_resume_refuses_another_shape(tmp_path, data_dir):
    cfg = _cfg(tmp_path, data_dir, max_steps=1)
    Trainer(cfg).run()
    with pytest.raises(ValueError, match="layers"):
        Trainer(replace(cfg, layers=2, init_layers=[0, 1])).maybe_resume()


def test_export_reties_embedding_and_matches_student(tmp_path, data_dir):
    cfg = _cfg(tmp_path, data_dir, max_steps=2, out_dir=str(tmp_path / "draft"))
    trainer = Trainer(cfg)
    meta = trainer.run()
    out = tmp_path / "draft"
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "draft.json", "MODEL_CARD.md"}
    card = (out / "MODEL_CARD.md").read_text()
    assert "Not measured at export" in card and f"{meta['eval']['all']['top1']:.3f}" in card
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
        other = build_student(trainer.teacher, 1, [1])  # negative control: another draft differs
        assert not torch.allclose(ref, other(x).logits, atol=2e-2)


def test_load_tied_draft_refuses_another_target(tmp_path, data_dir):
    from mtad.models.tiny import tiny_model

    trainer = Trainer(_cfg(tmp_path, data_dir, max_steps=1, out_dir=str(tmp_path / "draft")))
    trainer.run()
    with pytest.raises(ValueError, match="hidden_size"):
        load_tied_draft(tmp_path / "draft", tiny_model("llama", hidden=64))


def test_evaluate_controls(tmp_path, data_dir):
    """The teacher scored as its own draft agrees perfectly; a fresh student does not."""
    trainer = Trainer(_cfg(tmp_path, data_dir))
    es = trainer.get_eval_set()
    perfect = evaluate(trainer.teacher, es)["all"]
    # log p is stored in fp16, so alpha is not exactly 1 where top-k/top-p boundaries are near-ties
    assert perfect["top1"] == 1.0 and perfect["kl"] < 1e-3 and perfect["alpha"] > 0.98
    weak = evaluate(trainer.student, es)["all"]
    assert weak["top1"] < 1.0 and weak["kl"] > 1e-2


def test_training_text_excludes_eval_prompts(tmp_path, data_dir):
    from mtad.models.tiny import tiny_tokenizer

    corpus = Corpus(tiny_tokenizer(), data_dir)
    gsm = corpus.docs("gsm8k")
    assert "<<" not in gsm[0] and "The answer is" in gsm[0]
    assert all("test" not in Path(p).parts for p in corpus.docs("python"))
    heads = function_heads('def f(x):\n    """Doc."""\n    return x\n\ndef g():\n    return 1\n')
    assert heads == ['def f(x):\n    """Doc."""\n']


def test_split_rows_keeps_logits_aligned():
    select = torch.tensor([[1, 1, 0], [0, 1, 0], [1, 1, 1]], dtype=torch.bool)
    p = torch.arange(6.0)[:, None]  # one "logit row" per selected position, numbered
    batch = {"input_ids": torch.zeros(3, 3), "select": select, "p_logits": p}
    chunks = split_rows(batch, ["a", "b", "c"], 2)
    assert [c[1] for c in chunks] == [["a", "b"], ["c"]]
    assert chunks[0][0]["p_logits"].flatten().tolist() == [0, 1, 2]
    assert chunks[1][0]["p_logits"].flatten().tolist() == [3, 4, 5]


# ----------------------------------------------------------------------------- cached on-policy pipeline

def _cached(tmp_path, data_dir, **kw) -> TrainDraftConfig:
    base = dict(data="cache", loss="ce_tv", gen_batch=4, gen_tokens=12, cache_topk=12, cache_rows=2,
                train_per_gen=2.0, lr=3e-3, max_steps=16, onpolicy_frac=0.0)
    base.update(kw)
    return _cfg(tmp_path, data_dir, **base)


def test_cached_training_raises_held_out_alpha(tmp_path, data_dir):
    meta = Trainer(_cached(tmp_path, data_dir, max_steps=30, head_vocab=160, head_bias=True)).run()
    first, last = meta["eval_init"]["all"], meta["eval"]["all"]
    assert meta["cache_rows"] > 0 and meta["head_vocab"] == 160
    assert last["alpha"] > first["alpha"] + 0.02, (first["alpha"], last["alpha"])
    assert set(meta["eval_heads"]) == {"full", "int8", "reduced", "reduced_int8"}


def test_cached_zero_lr_is_a_negative_control(tmp_path, data_dir):
    meta = Trainer(_cached(tmp_path, data_dir, lr=0.0, max_steps=8)).run()
    assert meta["eval"]["all"]["alpha"] == pytest.approx(meta["eval_init"]["all"]["alpha"], abs=1e-9)


def test_cache_shards_match_the_teacher_and_resume(tmp_path, data_dir):
    """The cached top-K log-probs are the teacher's own at each position; a second trainer reuses the shards."""
    cfg = _cached(tmp_path, data_dir, max_steps=6)
    first = Trainer(cfg)
    first.run()
    n = first.cache.n_shards()
    assert n >= 1
    row = first.cache.rows[0]
    with torch.no_grad():
        logp = torch.log_softmax(first.teacher(input_ids=row["ids"][None, :-1].long()).logits[0], -1)  # (L-1, V)
    top = logp.topk(cfg.cache_topk, -1)
    assert torch.equal(top.indices.int(), row["topk_ids"])
    assert torch.allclose(top.values, row["topk_logp"].float(), atol=1e-2)
    # answer tokens are within the teacher's filtered support at their position
    ans = row["ids"][row["gen_from"] + 1:].long()
    p_f = filtered_targets(row["topk_logp"][row["gen_from"]:], cfg.gen_top_k, cfg.gen_top_p)
    hit = (row["topk_ids"][row["gen_from"]:].long() == ans[:, None]) & (p_f > 0)
    assert bool(hit.any(-1).all())
    second = Trainer(cfg)
    assert len(second.cache.rows) == len(first.cache.rows) and second.cache.n_shards() == n
    with pytest.raises(ValueError, match="other settings"):
        Trainer(replace(cfg, gen_top_k=5, cache_topk=12))


def test_filtered_loss_alpha_is_sum_min_of_filtered_distributions():
    from mtad.decoding.filter import filter_probs

    torch.manual_seed(0)
    V, K = 50, 16
    t_logits, s_logits = torch.randn(6, V) * 2, torch.randn(6, V) * 2
    p_full, q_full = filter_probs(t_logits, 1.0, 10, 0.9), filter_probs(s_logits, 1.0, 10, 0.9)
    want = torch.minimum(p_full, q_full).sum(-1)
    top = torch.log_softmax(t_logits, -1).topk(K, -1)
    p_f = filtered_targets(top.values, 10, 0.9)
    per, alpha = filtered_loss(s_logits, top.indices, p_f, "tv_filtered", 10, 0.9)
    assert torch.allclose(alpha, want, atol=1e-5) and torch.allclose(per, 1 - want, atol=1e-5)
    per_self, alpha_self = filtered_loss(t_logits, top.indices, p_f, "ce_tv", 10, 0.9)
    assert torch.allclose(alpha_self, torch.ones(6), atol=1e-5)  # the teacher as its own student
    # a column outside the head is dropped: alpha can only fall
    cols = top.indices.clone()
    cols[:, 0] = -1
    _, alpha_cut = filtered_loss(s_logits, cols, p_f, "ce_filtered", 10, 0.9)
    assert bool((alpha_cut <= alpha + 1e-6).all())


def test_export_with_reduced_head_loads_in_every_mode(tmp_path, data_dir):
    from mtad.models.draft_head import FILL, install_head

    cfg = _cached(tmp_path, data_dir, max_steps=4, head_vocab=120, head_bias=True, out_dir=str(tmp_path / "draft"))
    trainer = Trainer(cfg)
    trainer.run()
    out = tmp_path / "draft"
    assert {p.name for p in out.iterdir()} >= {"model.safetensors", "head.safetensors"}
    card = (out / "MODEL_CARD.md").read_text()
    assert "reduced head over the 120 most frequent tokens" in card and "| `reduced_int8` |" in card
    ckpt = trainer.ckpt_path().read_bytes()
    meta = Trainer(replace(cfg, export_only=True, out_dir=str(tmp_path / "again"))).run()
    assert trainer.ckpt_path().read_bytes() == ckpt and meta["steps"] == trainer.state["step"]
    from safetensors.torch import load_file

    assert all(torch.equal(a, b) for a, b in zip(load_file(str(out / "model.safetensors")).values(),
                                                 load_file(str(tmp_path / "again" / "model.safetensors")).values()))
    x = torch.tensor([[1, 2, 3, 40, 50, 60, 70]])
    with torch.no_grad():
        ref = trainer.student(x).logits
        for mode in ("full", "int8", "reduced", "reduced_int8"):
            draft = load_tied_draft(out, trainer.teacher, "float32")
            install_head(draft, mode, out)
            got = draft(x).logits
            assert got.shape == ref.shape
            outside = torch.ones(ref.shape[-1], dtype=torch.bool)
            outside[trainer.kept] = False
            if mode.startswith("reduced"):
                assert bool((got[..., outside] == FILL).all())
                assert torch.softmax(got, -1)[..., outside].max() == 0.0  # q is exactly 0 outside the head
                assert torch.allclose(got, ref, atol=5e-2 if mode == "reduced" else 0.3), mode
            else:
                assert bool((got[..., outside] > FILL / 2).all())
                diff = (got[..., ~outside] - ref[..., ~outside]).abs().max()
                assert diff < (5e-2 if mode == "full" else 0.3), (mode, float(diff))


# ----------------------------------------------------------------------------- feature drafts (arch=feature)

def _feature(tmp_path, data_dir, **kw) -> TrainDraftConfig:
    base = dict(arch="feature", init_layers=[-1], unroll=1, head_vocab=160, head_bias=True)
    base.update(kw)
    return _cached(tmp_path, data_dir, **base)


def test_feature_training_raises_held_out_alpha(tmp_path, data_dir):
    meta = Trainer(_feature(tmp_path, data_dir, max_steps=30)).run()
    first, last = meta["eval_init"]["all"], meta["eval"]["all"]
    assert last["alpha"] > first["alpha"] + 0.1, (first["alpha"], last["alpha"])
    assert {"alpha_d2", "alpha_d3"} <= set(last)


def test_feature_zero_lr_is_a_negative_control(tmp_path, data_dir):
    meta = Trainer(_feature(tmp_path, data_dir, lr=0.0, max_steps=6)).run()
    assert meta["eval"]["all"]["alpha"] == pytest.approx(meta["eval_init"]["all"]["alpha"], abs=1e-9)


def test_feature_student_from_a_token_draft_starts_as_that_draft(tmp_path, data_dir):
    """fc starts as [identity, 0]: warm-started from an exported token draft, the feature student's logits
    are the token draft's whatever the features."""
    out = tmp_path / "token"
    token = Trainer(_cached(tmp_path, data_dir, max_steps=2, out_dir=str(out)))
    token.run()
    cfg = _feature(tmp_path, data_dir, ckpt_dir=str(tmp_path / "fckpt"), init_layers=[0], init_from=str(out),
                   head_vocab=0, head_bias=False, max_steps=0)
    feat = Trainer(cfg)
    x = torch.tensor([[1, 2, 3, 40, 50]])
    with torch.no_grad():
        want = load_tied_draft(out, token.teacher)(x).logits  # the exported (fp16-stored) token draft
        got = feat.student(input_ids=x, features=torch.randn(1, 5, feat.student.config.hidden_size)).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_text_shards_hold_the_teachers_top_k_and_features_and_resume(tmp_path, data_dir):
    cfg = _feature(tmp_path, data_dir, max_steps=2, text_shards=2, text_rows=3, text_len=20,
                   text_mix={"gsm8k": 0.5, "wikitext": 0.5})
    first = Trainer(cfg)
    assert first.cache.n_text() == 2
    row = next(r for r in first.cache.rows if r["source"].startswith("text:"))
    assert row["gen_from"] == 0 and len(row["ids"]) == 20
    with torch.no_grad():
        out = first.teacher(input_ids=row["ids"][None].long(), output_hidden_states=True)
    top = torch.log_softmax(out.logits[0, :-1], -1).topk(cfg.cache_topk, -1)
    assert torch.equal(top.indices.int(), row["topk_ids"])
    torch.testing.assert_close(row["feat"].float(), out.hidden_states[-1][0], atol=1e-2, rtol=1e-2)
    onpolicy = next(r for r in first.cache.rows if not r["source"].startswith("text:"))
    with torch.no_grad():
        h = first.teacher(input_ids=onpolicy["ids"][None].long(), output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(onpolicy["feat"].float(), h, atol=1e-2, rtol=1e-2)
    files = sorted(p.name for p in first.cache.dir.iterdir())
    second = Trainer(cfg)  # reads the text shards and feature files back, builds nothing
    assert sorted(p.name for p in second.cache.dir.iterdir()) == files
    assert len(second.cache.rows) == len(first.cache.rows)


def test_exported_feature_draft_loads_and_decodes_exactly(tmp_path, data_dir):
    import tinymodels as tm

    import mtad
    from mtad.models.feature_draft import FeatureDraft
    from mtad.models.pair import ModelPair

    out = tmp_path / "fdraft"
    trainer = Trainer(_feature(tmp_path, data_dir, max_steps=4, out_dir=str(out)))
    trainer.run()
    draft = load_tied_draft(out, trainer.teacher)
    assert isinstance(draft, FeatureDraft) and draft.reads_target_features
    assert json.loads((out / "config.json").read_text())["mtad_feature_draft"] is True
    prompt = [5, 7, 11, 13]
    r = mtad.generate(ModelPair(trainer.teacher, draft), prompt,
                      dict(name="speculative", temperature=0, max_new_tokens=12, gamma=3),
                      torch.Generator().manual_seed(0))
    assert r.tokens == tm.oracle_greedy(trainer.teacher, prompt, 12)


def test_continuing_an_exported_feature_draft_starts_as_that_draft_head_included(tmp_path, data_dir):
    """init_from an exported draft with a reduced head carries its kept ids and trained bias (a run continued
    on another machine, where only the export survives, starts where the export stopped)."""
    from mtad.models.draft_head import install_head, read_head_file

    out = tmp_path / "fdraft"
    first = Trainer(_feature(tmp_path, data_dir, max_steps=6, lr=3e-2, out_dir=str(out)))
    first.run()
    stored = read_head_file(out)
    assert float(stored["bias"].abs().max()) > 1e-3  # the bias was trained: carrying it is not vacuous
    cfg = _feature(tmp_path, data_dir, ckpt_dir=str(tmp_path / "again"), init_from=str(out), max_steps=0,
                   text_shards=0)
    again = Trainer(cfg)
    assert torch.equal(again.kept.cpu(), stored["kept_ids"])
    x, f = torch.tensor([[1, 2, 3, 40, 50]]), torch.randn(1, 5, first.student.config.hidden_size)
    with torch.no_grad():
        exported = load_tied_draft(out, first.teacher, "float32")
        install_head(exported, "reduced", out)
        want = exported(x, features=f).logits
        got = again.student(input_ids=x, features=f).logits
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
        again.student.lm_head.bias.zero_()  # control: the same layers without the carried bias differ
        assert (again.student(input_ids=x, features=f).logits - want).abs().max() > 1e-2


def test_data_seed_draws_fresh_shards_and_keeps_the_eval_set(tmp_path, data_dir):
    base = Trainer(_cached(tmp_path, data_dir, max_steps=0))
    base._generate()
    fresh = Trainer(_cached(tmp_path, data_dir, max_steps=0, data_seed=7, ckpt_dir=str(tmp_path / "fresh")))
    fresh._generate()
    same = Trainer(_cached(tmp_path, data_dir, max_steps=0, data_seed=0, ckpt_dir=str(tmp_path / "same")))
    same._generate()
    ids = [[r["ids"].tolist() for r in t.cache.rows] for t in (base, fresh, same)]
    assert ids[0] != ids[1] and ids[0] == ids[2]  # data_seed=0 is the default seed's data (control)
    e0, e1 = base.get_eval_set(), fresh.get_eval_set()
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(e0["items"], e1["items"]))


def test_features_read_off_generation_equal_the_teacher_forced_pass(tmp_path, data_dir):
    """sample_topk(features=True) gives every position the teacher's final hidden state, the same as a
    teacher-forced pass over the finished row (left padding, KV cache and the extra last step included);
    shifted by one position they differ (the control)."""
    trainer = Trainer(_feature(tmp_path, data_dir, max_steps=0))
    teacher = trainer.teacher
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    rows = sample_topk(teacher, prompts, 0, teacher.generation_config.eos_token_id, 9, 10, 0.9, 12,
                          torch.Generator().manual_seed(3), features=True)
    assert len(rows) == 3
    want = teacher_features(teacher, [r["ids"] for r in rows])
    for r, w in zip(rows, want):
        assert r["feat"].shape == (len(r["ids"]), teacher.config.hidden_size)
        torch.testing.assert_close(r["feat"].float(), w.float(), atol=2e-2, rtol=2e-2)
        assert not torch.allclose(r["feat"][1:].float(), w[:-1].float(), atol=2e-2, rtol=2e-2)
    plain = sample_topk(teacher, prompts, 0, teacher.generation_config.eos_token_id, 9, 10, 0.9, 12,
                           torch.Generator().manual_seed(3))
    assert [p["ids"].tolist() for p in plain] == [r["ids"].tolist() for r in rows]  # same samples
    shard = torch.load(trainer.cache.shard_path(0), weights_only=False)
    assert all("feat" not in r for r in shard["rows"])  # features live beside the shard
    assert trainer.cache.feat_path("shard-00000").is_file()


def test_bf16_generation_labels_the_cache_with_a_bf16_teacher_and_keeps_the_fp32_eval(tmp_path, data_dir):
    """gen_dtype=bfloat16: the shards hold the bf16 copy's own top-K (not the fp32 teacher's: the control), the
    held-out set and the teacher stay fp32, and a cache of the other dtype is refused.

    Bound: the cached log-probabilities come from cached decode steps, the check's from one uncached pass, so
    they agree up to bf16 rounding, which depends on the CPU's bf16 kernels (a single value may move by 0.017
    on an AVX2 CPU without native bf16, as far as the fp32 teacher's does). The mean over the cache separates
    them on any CPU: under a quarter of bf16's epsilon (2^-9, about 0.002) for the bf16 copy (0.001 on AVX2),
    above it for the fp32 teacher (0.004), whose weights are not rounded to bf16."""
    cfg = _feature(tmp_path, data_dir, max_steps=0, gen_dtype="bfloat16")
    trainer = Trainer(cfg)
    assert trainer.teacher.dtype == torch.float32 and trainer.gen_teacher.dtype == torch.bfloat16
    trainer._generate()
    err16, err32 = [], []
    for row in trainer.cache.rows:
        x = row["ids"][None, :-1].long()
        with torch.no_grad():
            lp16 = torch.log_softmax(trainer.gen_teacher(input_ids=x).logits[0].float(), -1)
            lp32 = torch.log_softmax(trainer.teacher(input_ids=x).logits[0], -1)
        got, ids = row["topk_logp"].float(), row["topk_ids"].long()
        err16.append((lp16.gather(1, ids) - got).abs().flatten())
        err32.append((lp32.gather(1, ids) - got).abs().flatten())
    bound = torch.finfo(trainer.gen_teacher.dtype).eps / 4
    err16, err32 = float(torch.cat(err16).mean()), float(torch.cat(err32).mean())
    assert err16 < bound < err32, (err16, bound, err32)
    row = trainer.cache.rows[0]
    torch.testing.assert_close(row["feat"].float(), teacher_features(trainer.gen_teacher, [row["ids"]])[0].float(),
                               atol=3e-2, rtol=3e-2)
    plain = Trainer(_feature(tmp_path / "b", data_dir, max_steps=0, ckpt_dir=str(tmp_path / "other")))
    e0, e1 = trainer.get_eval_set(), plain.get_eval_set()
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(e0["items"], e1["items"]))
    with pytest.raises(ValueError, match="other settings"):
        Trainer(replace(cfg, gen_dtype="float32"))
    with pytest.raises(ValueError, match="gen_dtype"):
        TrainDraftConfig(gen_dtype="float16", data="cache", loss="ce_tv")

"""Tasks: loading, selection, rendering, postprocessing, scoring (HumanEval: test_humaneval_sandbox.py)."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from realdata import REAL_DATA

from mtad._util.paths import REPO_ROOT
from mtad.tasks import TASKS, Sample, TaskConfig, get_task
from mtad.tasks.gsm8k import extract_answer, gold_answer
from mtad.tasks.summarize import rouge

DATA = REAL_DATA
needs_data = pytest.mark.usefixtures("real_data_dir")  # the real data sets; skips on a fresh clone


@pytest.fixture(scope="module")
def tok():
    try:
        from mtad.models.tiny import tiny_tokenizer
    except ImportError:  # pragma: no cover - mtad.models.tiny is written elsewhere
        pytest.skip("mtad.models.tiny.tiny_tokenizer is not available")
    return tiny_tokenizer()


def task(name: str, **kw):
    return get_task(TaskConfig(name=name, **kw))


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ---- config and registry ------------------------------------------------------------------------------
CONF = sorted((REPO_ROOT / "conf" / "task").glob("*.yaml"))


def test_every_registered_task_has_a_config_file():
    assert {p.stem for p in CONF} == set(TASKS)


@pytest.mark.parametrize("path", CONF, ids=lambda p: p.stem)
def test_conf_task_yaml_loads_into_taskconfig(path):
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(path))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, TaskConfig) and cfg.name == path.stem
    assert TaskConfig.from_any(merged) == cfg
    get_task(cfg)  # constructs without touching data


def test_misspelt_yaml_key_fails_on_merge():
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError

    with pytest.raises(ConfigKeyError):
        OmegaConf.merge(OmegaConf.structured(TaskConfig), {"n_promts": 3})


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match="gsm8k.*humaneval"):
        get_task(TaskConfig(name="nope"))


@pytest.mark.parametrize("bad", [{"selection": "best"}, {"on_long_prompt": "drop"}, {"turns": 3},
                                 {"n_prompts": -1}, {"source": "hub"}, {"source": "web"}])
def test_taskconfig_rejects_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TaskConfig(**bad)


def test_from_any_rejects_unknown_key():
    with pytest.raises(ValueError, match="n_promts"):
        TaskConfig.from_any({"name": "gsm8k", "n_promts": 3})


def test_few_shot_on_a_task_without_examples_is_an_error():
    with pytest.raises(ValueError, match="few_shot"):
        task("spider", few_shot=2)


# ---- missing and malformed data ----------------------------------------------------------------------
def test_missing_data_dir_names_path_and_fix(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        task("gsm8k", data_dir=str(missing)).samples()
    assert str(missing / "gsm8k" / "test.jsonl") in str(err.value)
    assert "task.data_dir" in str(err.value) and "MTAD_DATA_DIR" in str(err.value)


def test_missing_data_file_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        task("jsonl", data_file=str(tmp_path / "absent.jsonl")).samples()
    with pytest.raises(FileNotFoundError, match="task.data_file"):
        task("jsonl").samples()
    with pytest.raises(FileNotFoundError, match="task.data_file"):
        task("cnn_dm", data_dir=str(tmp_path)).samples()


def test_malformed_rows_reported_with_line_and_skipped(tmp_path, caplog):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "prompt": "2+2=", "answer": "4"},
        "{not json",
        {"id": "b"},  # no prompt
        "",  # blank lines are ignored, not malformed
        {"id": "a", "prompt": "dup"},
        {"id": "c", "prompt": "say hi"},
    ])
    t = task("jsonl", data_file=str(path), n_prompts=0)
    with caplog.at_level(logging.WARNING):
        samples = t.samples()
    assert [s.id for s in samples] == ["a", "c"]
    assert t.skipped == 3
    text = caplog.text
    assert f"{path}:2" in text and f"{path}:3: malformed row skipped (missing field 'prompt')" in text
    assert f"{path}:5" in text and "repeats" in text
    assert f"{path}:1:" not in text and f"{path}:6" not in text


def test_malformed_csv_row_reported(tmp_path, caplog):
    path = tmp_path / "prompts.csv"
    path.write_text('"act","prompt"\n"A","Tell a joke"\n"B"\n"C","Write a poem"\n')
    t = task("chatgpt_prompts", data_file=str(path), n_prompts=0)
    with caplog.at_level(logging.WARNING):
        assert [s.turns[0] for s in t.samples()] == ["Tell a joke", "Write a poem"]
    assert t.skipped == 1 and f"{path}:3" in caplog.text


# ---- selection --------------------------------------------------------------------------------------------
def test_selection_first_random_and_recorded(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": str(i), "prompt": f"p{i}"} for i in range(20)])
    first = task("jsonl", data_file=str(path), n_prompts=5)
    assert [s.id for s in first.samples()] == ["0", "1", "2", "3", "4"] == first.selected_ids
    picks = [task("jsonl", data_file=str(path), n_prompts=5, selection="random", selection_seed=s) for s in (0, 0, 1)]
    ids = [[s.id for s in t.samples()] for t in picks]
    assert ids[0] == ids[1] == picks[0].selected_ids and ids[0] != ids[2]
    assert len(set(ids[0])) == 5
    assert len(task("jsonl", data_file=str(path), n_prompts=0).samples()) == 20
    assert len(task("jsonl", data_file=str(path), n_prompts=50).samples()) == 20


# ---- generic jsonl task --------------------------------------------------------------------------------
def test_jsonl_exact_match_and_prompt_only(tmp_path, tok):
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": 1, "prompt": "Capital of France?", "answer": " Paris "},
                                              {"id": 2, "prompt": "Say anything"}])
    t = task("jsonl", data_file=str(path), stop=["\n"])
    a, b = t.samples()
    assert t.score(a, "Paris\nmore text") == {"exact_match": 1.0}
    assert t.score(a, "London") == {"exact_match": 0.0}
    assert t.score(b, "whatever") == {}
    assert t.render(a, tok, chat=False) == "Capital of France?"
    assert "Capital of France?" in t.render(a, tok, chat=True)
    assert t.aggregate([{"exact_match": 1.0}, {"exact_match": 0.0}, {}]) == {"exact_match": 0.5}


# ---- prompt length policy -----------------------------------------------------------------------------
def test_long_prompt_skip_truncate_error(tmp_path, tok):
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": "x", "prompt": "a" * 100}])
    skip = task("jsonl", data_file=str(path), max_prompt_tokens=20)
    p = skip.encode(skip.samples()[0], tok, chat=False)
    assert p.ids == [] and "20" in p.skip_reason and p.n_tokens > 20
    trunc = task("jsonl", data_file=str(path), max_prompt_tokens=20, on_long_prompt="truncate")
    p = trunc.encode(trunc.samples()[0], tok, chat=False)
    full = tok("a" * 100)["input_ids"]
    assert p.truncated and len(p.ids) == 20 and p.skip_reason is None and p.n_tokens == len(full)
    bos = tok.bos_token_id
    assert p.ids == (full[:1] + full[-19:] if full[0] == bos else full[-20:])
    kept = trunc.fit(trunc.samples()[0], 0, "text", [bos] + list(range(30)), bos_id=bos).ids
    assert kept == [bos] + list(range(11, 30))  # a leading BOS survives truncation
    err = task("jsonl", data_file=str(path), max_prompt_tokens=20, on_long_prompt="error")
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        err.encode(err.samples()[0], tok, chat=False)
    ok = task("jsonl", data_file=str(path), max_prompt_tokens=0)
    assert len(ok.encode(ok.samples()[0], tok, chat=False).ids) == len(full)


def test_chat_prompt_is_not_given_a_second_bos(tmp_path, tok):
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": "x", "prompt": "hi"}])
    t = task("jsonl", data_file=str(path))
    p = t.encode(t.samples()[0], tok, chat=True)
    assert p.ids == tok(p.text, add_special_tokens=False)["input_ids"]


# ---- GSM8K ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("She pays 5 + 3 = 8 dollars.\nThe answer is 1,234.", "1234"),
    ("The answer is $18.00.", "18.00"),
    ("#### 72", "72"),
    ("Step 1: 3 apples. #### 1,000,000 and then 7", "1000000"),
    ("so 5 + 3 = 8 apples", "8"),
    ("It drops to -5 degrees", "-5"),
    ("pages 10-20", "20"),
    ("The answer is 4. Then 99 more words 12.", "4"),
    ("the final answer is: 0.5", "0.5"),
    ("I think 3. The answer is unclear, maybe 7", "7"),
    ("no digits here", None),
])
def test_gsm8k_extraction(text, expected):
    assert extract_answer(text) == expected


def test_gsm8k_scorer_right_wrong_and_stop():
    t = task("gsm8k")
    s = Sample("x", ["q"], gold_answer("Some work\n#### 1,080"))
    assert s.reference == "1080"
    assert t.score(s, "So 1080 total. The answer is 1,080.") == {"accuracy": 1.0}
    assert t.score(s, "The answer is 1080.00") == {"accuracy": 1.0}
    assert t.score(s, "The answer is 1081.") == {"accuracy": 0.0}
    assert t.score(s, "I do not know") == {"accuracy": 0.0}
    # a base model that starts the next few-shot question is cut before it
    assert t.score(s, "The answer is 1080.\n\nQuestion: Tom has 3 pens") == {"accuracy": 1.0}
    assert t.score(s, "12 apples\n\nQuestion: what is 1080?") == {"accuracy": 0.0}
    assert t.score(s, "\n\n\n1080") == {"accuracy": 1.0}  # leading blank lines are not a stop
    with pytest.raises(ValueError, match="####"):
        gold_answer("no marker")


@needs_data
def test_gsm8k_real_data_and_few_shot(tok):
    t = task("gsm8k", n_prompts=3, few_shot=2)
    samples = t.samples()
    assert [s.id for s in samples] == ["test-0", "test-1", "test-2"] and samples[0].reference == "18"
    base = t.render(samples[0], tok, chat=False)
    assert base.count("Question: ") == 3 and base.endswith("\nAnswer:")
    assert "The answer is" in base and "<<" not in base  # calculator annotations removed
    shots = [q for q, _ in t.few_shot_pairs()]
    assert not set(shots) & {s.turns[0] for s in t.samples()}
    chat = t.render(samples[0], tok, chat=True)
    assert chat.count("<|im_start|>user") == 3 and chat.endswith("<|im_start|>assistant\n")
    assert len(task("gsm8k", n_prompts=0).samples()) == 1319


# ---- ROUGE / CNN-DM ------------------------------------------------------------------------------------
def test_rouge_hand_examples():
    ref = "the cat sat on the mat"
    assert rouge(ref, ref) == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})
    assert rouge("dogs bark loudly", ref) == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    # overlap: unigrams the,the,cat,on (4/6); bigrams "the cat","on the" (2/5); LCS the cat on the (4/6)
    got = rouge("the cat lay on the rug", ref)
    assert got == pytest.approx({"rouge1": 4 / 6, "rouge2": 2 / 5, "rougeL": 4 / 6})


def test_cnn_dm_local_file_scores_and_truncates_article(tmp_path, tok):
    article = "The council approved the new park on Monday. " * 40
    row = {"id": "n1", "article": article, "highlights": "Council approves park ."}
    path = write_jsonl(tmp_path / "cnn.jsonl", [row])
    t = task("cnn_dm", data_file=str(path), max_prompt_tokens=200, on_long_prompt="truncate")
    (s,) = t.samples()
    assert t.score(s, "Council approves park .")["rougeL"] == pytest.approx(1.0)
    assert t.score(s, "Weather sunny tomorrow")["rougeL"] == 0.0
    for chat in (False, True):
        p = t.encode(s, tok, chat=chat)
        assert len(p.ids) <= 200 and not p.truncated  # the article was cut, the template kept
        assert p.text.startswith("The council" if not chat else "<|im_start|>user\nSummarize")
        assert p.text.endswith("TL;DR:" if not chat else "<|im_start|>assistant\n")


# ---- Spider -------------------------------------------------------------------------------------------
def test_spider_postprocess():
    t = task("spider")
    s = Sample("x", ["q"], "SELECT 1", {"db_id": "d"})
    assert t.postprocess(s, "Here it is:\n```sql\nSELECT name\nFROM singer;\n```\nDone") == "SELECT name FROM singer"
    assert t.postprocess(s, " SELECT count(*) FROM singer;\n-- Question: next") == "SELECT count(*) FROM singer"
    assert t.postprocess(s, "SQL: SELECT a FROM b\n\nQuestion: more") == "SELECT a FROM b"
    assert t.postprocess(s, "\n\n  SELECT a\n  FROM b;") == "SELECT a FROM b"
    once = t.postprocess(s, "```sql\nSELECT a\nFROM b")
    assert once == "SELECT a FROM b" == t.postprocess(s, once)


def test_spider_exact_match_sqlglot_is_named_honestly():
    t = task("spider")
    assert t.metric == "exact_match_sqlglot"
    s = Sample("x", ["q"], "SELECT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.id = T2.sid WHERE T2.year = 2014",
               {"db_id": "d"})
    same = "select singer.Name  from Singer join CONCERT on singer.id = concert.sid where concert.year=2014;"
    assert t.score(s, same) == {"exact_match_sqlglot": 1.0}
    assert t.score(s, "SELECT name FROM singer WHERE year = 2015") == {"exact_match_sqlglot": 0.0}
    assert t.score(s, "SELEC broken (((") == {"exact_match_sqlglot": 0.0}
    assert t.score(s, "") == {"exact_match_sqlglot": 0.0}


@pytest.fixture
def spider_db(tmp_path):
    import sqlite3

    db = tmp_path / "dbs" / "shop" / "shop.sqlite"
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
        conn.executemany("INSERT INTO item VALUES (?, ?, ?)", [(1, "pen", 2.0), (2, "ink", 5.0), (3, "cap", 2.0)])
    conn.close()
    return tmp_path / "dbs"


def test_spider_execution_accuracy(spider_db):
    t = task("spider", db_dir=str(spider_db), timeout_s=2.0)
    assert t.metric == "exec_accuracy"
    unordered = Sample("u", ["q"], "SELECT name FROM item WHERE price = 2", {"db_id": "shop"})
    assert t.score(unordered, "SELECT name FROM item WHERE price < 3") == {"exec_accuracy": 1.0}
    assert t.score(unordered, "SELECT name FROM item WHERE price = 2 ORDER BY name DESC") == {"exec_accuracy": 1.0}
    assert t.score(unordered, "SELECT name FROM item") == {"exec_accuracy": 0.0}
    assert t.score(unordered, "SELECT nme FROM item") == {"exec_accuracy": 0.0}  # invalid SQL
    assert t.score(unordered, "not sql at all") == {"exec_accuracy": 0.0}
    # multiset, not set: a duplicated row is wrong
    assert t.score(unordered, "SELECT name FROM item WHERE price = 2 UNION ALL SELECT 'pen'") == {"exec_accuracy": 0.0}
    ordered = Sample("o", ["q"], "SELECT name FROM item ORDER BY price DESC, name", {"db_id": "shop"})
    assert t.score(ordered, "SELECT name FROM item ORDER BY price DESC, name ASC") == {"exec_accuracy": 1.0}
    assert t.score(ordered, "SELECT name FROM item ORDER BY price ASC, name") == {"exec_accuracy": 0.0}
    # a write is refused on the read-only connection, and the database is unchanged
    assert t.score(unordered, "DELETE FROM item") == {"exec_accuracy": 0.0}
    assert t.score(ordered, "SELECT name FROM item ORDER BY price DESC, name") == {"exec_accuracy": 1.0}


def test_spider_timeout_gold_error_and_missing_db(spider_db, caplog):
    import time

    t = task("spider", db_dir=str(spider_db), timeout_s=0.5)
    s = Sample("u", ["q"], "SELECT count(*) FROM item", {"db_id": "shop"})
    slow = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    start = time.monotonic()
    assert t.score(s, slow) == {"exec_accuracy": 0.0}
    assert time.monotonic() - start < 3
    bad_gold = Sample("g", ["q"], "SELECT missing FROM item", {"db_id": "shop"})
    with caplog.at_level(logging.WARNING):
        assert t.score(bad_gold, "SELECT 1") == {}
    assert "gold query fails" in caplog.text
    with pytest.raises(FileNotFoundError, match="nope.sqlite"):
        t.score(Sample("m", ["q"], "SELECT 1", {"db_id": "nope"}), "SELECT 1")
    with pytest.raises(FileNotFoundError, match="db_dir"):
        task("spider", db_dir=str(spider_db / "absent"))


@needs_data
def test_spider_real_data_prompts(tok):
    t = task("spider", split="dev", n_prompts=3)
    samples = t.samples()
    assert len(samples) == 3 and samples[0].meta["db_id"] == "concert_singer"
    base = t.render(samples[0], tok, chat=False)
    assert "CREATE TABLE singer (" in base and base.endswith("-- Question: How many singers do we have?\n-- SQL:\n")
    assert "FOREIGN KEY (Stadium_ID) REFERENCES stadium(Stadium_ID)" in base
    chat = t.render(samples[0], tok, chat=True)
    assert "CREATE TABLE singer (" in chat and chat.endswith("<|im_start|>assistant\n")
    compact = task("spider", split="dev", n_prompts=1, schema_format="compact")
    assert "singer(Singer_ID, Name, Country" in compact.render(compact.samples()[0], tok, chat=False)
    # every gold query of the first 100 canonicalises and matches itself; a neighbour does not
    full = task("spider", split="dev", n_prompts=100)
    rows = full.samples()
    assert all(full.score(s, s.reference) == {"exact_match_sqlglot": 1.0} for s in rows)
    assert full.score(rows[0], rows[2].reference) == {"exact_match_sqlglot": 0.0}
    assert len(task("spider", split="dev", n_prompts=0).samples()) == 1034


# ---- prompt-only sets ---------------------------------------------------------------------------------
@needs_data
def test_mt_bench_one_and_two_turns(tok):
    one = task("mt_bench", n_prompts=0)
    samples = one.samples()
    assert len(samples) == 80 and all(len(s.turns) == 1 for s in samples) and one.metric is None
    assert one.score(samples[0], "anything") == {}
    two = task("mt_bench", n_prompts=2, turns=2)
    s = two.samples()[0]
    assert s.id == "81" and s.meta["category"] == "writing" and len(s.turns) == 2
    chat = two.render(s, tok, turn=1, history=["MY BLOG POST"], chat=True)
    assert chat.index(s.turns[0]) < chat.index("MY BLOG POST") < chat.index(s.turns[1])
    assert chat.endswith("<|im_start|>assistant\n")
    base = two.render(s, tok, turn=1, history=["MY BLOG POST"], chat=False)
    assert base == f"User: {s.turns[0]}\nAssistant: MY BLOG POST\n\nUser: {s.turns[1]}\nAssistant:"
    with pytest.raises(ValueError, match="history"):
        two.render(s, tok, turn=1, history=[], chat=False)
    with pytest.raises(ValueError, match="out of range"):
        one.render(samples[0], tok, turn=1, history=["x"], chat=False)
    assert len(task("mt_bench", n_prompts=0, categories=["coding"]).samples()) == 10


@needs_data
def test_spec_bench_categories(tok):
    t = task("spec_bench", n_prompts=0)
    samples = t.samples()
    assert len(samples) == 480
    groups = {s.meta["group"] for s in samples}
    assert groups == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert len(task("spec_bench", n_prompts=0, categories=["translation"]).samples()) == 80
    mixed = task("spec_bench", n_prompts=0, categories=["mt_bench", "rag"]).samples()
    assert len(mixed) == 160 and {s.meta["group"] for s in mixed} == {"mt_bench", "rag"}
    assert len(task("spec_bench", n_prompts=0, categories=["coding"]).samples()) == 10
    with pytest.raises(ValueError, match="valid"):
        task("spec_bench", categories=["poetry"]).samples()
    assert t.render(samples[-1], tok, chat=False).endswith("\nAssistant:")


@needs_data
def test_chatgpt_prompts(tok):
    t = task("chatgpt_prompts", n_prompts=0)
    samples = t.samples()
    assert len(samples) == 171 and samples[0].meta["act"] == "An Ethereum Developer" and t.skipped == 0
    assert samples[0].turns[0] in t.render(samples[0], tok, chat=True)


def test_chatalpaca_row_shapes(tmp_path, tok):
    path = write_jsonl(tmp_path / "ca.jsonl", [
        {"id": "c1", "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello"},
                                       {"from": "human", "value": "Tell me more"}]},
        {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
        {"instruction": "Translate to French", "input": "cat"},
        {"conversations": []},
    ])
    t = task("chatalpaca", data_file=str(path), n_prompts=0, turns=2)
    samples = t.samples()
    assert [s.turns for s in samples] == [["Hi there", "Tell me more"], ["What is 2+2?"],
                                          ["Translate to French\n\ncat"]]
    assert samples[0].id == "c1" and samples[1].id == "1" and t.skipped == 1 and t.metric is None
    assert "Tell me more" in t.render(samples[0], tok, turn=1, history=["Hello!"], chat=True)


def test_hub_source_goes_through_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(hub_id, *args, split=None):
        calls.append((hub_id, args, split))
        return [{"question": "1+1?", "answer": "it is 2\n#### 2"}, {"question": "bad row"}]

    import datasets

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    t = task("gsm8k", source="hub", hub_id="openai/gsm8k", hub_config="main", n_prompts=0)
    samples = t.samples()
    assert calls == [("openai/gsm8k", ("main",), "test")]
    assert [s.reference for s in samples] == ["2"] and t.skipped == 1

"""HumanEval: postprocessing, the execution sandbox and pass@1 (right -> 1, wrong and malicious -> 0)."""
from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mtad.tasks import Sample, TaskConfig, get_task
from mtad.tasks.sandbox import Limits, run_python

TIMEOUT = 2.0
PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b.\n    >>> add(1, 2)\n    3\n    """\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-4, 4) == 0\n"
SAMPLE = Sample("toy/0", [PROMPT], TEST, {"entry_point": "add", "canonical_solution": "    return a + b\n"})


@pytest.fixture(scope="module")
def he():
    return get_task(TaskConfig(name="humaneval", timeout_s=TIMEOUT, memory_mb=512, n_prompts=2))


def timed_score(task, sample, completion):
    start = time.monotonic()
    score = task.score(sample, completion)
    return score, time.monotonic() - start


# ---- right and wrong ------------------------------------------------------------------------------------
def test_canonical_scores_one_and_wrong_scores_zero(he):
    assert he.score(SAMPLE, "    return a + b\n") == {"pass@1": 1.0}
    assert he.score(SAMPLE, "    return a - b\n") == {"pass@1": 0.0}
    assert he.score(SAMPLE, "    return a +\n") == {"pass@1": 0.0}  # syntax error
    assert he.score(SAMPLE, "") == {"pass@1": 0.0}


def test_real_problems_canonical_passes(he):
    samples = he.samples()
    assert [s.id for s in samples] == ["HumanEval/0", "HumanEval/1"]
    for s in samples:
        assert he.score(s, s.meta["canonical_solution"]) == {"pass@1": 1.0}
        assert he.score(s, "    return None\n") == {"pass@1": 0.0}


def test_falls_back_to_package_copy_without_data_dir(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MTAD_DATA_DIR", str(tmp_path))  # an empty data dir
    t = get_task(TaskConfig(name="humaneval", n_prompts=0))
    assert len(t.samples()) == 164
    with pytest.raises(FileNotFoundError, match="HumanEval.jsonl.gz"):  # an explicit data dir must exist
        get_task(TaskConfig(name="humaneval", data_dir=str(tmp_path))).samples()


# ---- postprocessing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, expected", [
    ("    return a + b\n\ndef helper():\n    pass\n", "    return a + b\n"),
    ("    return a + b\n\n\nif __name__ == '__main__':\n    print(add(1, 2))\n", "    return a + b\n"),
    ("    return a + b\nprint(add(1, 2))\n", "    return a + b\n"),
    ("    return a + b\n\nclass X:\n    pass", "    return a + b\n"),
    ("    return a + b\n```\nSome prose", "    return a + b\n"),
])
def test_base_model_continuation_is_cut(he, completion, expected):
    assert he.postprocess(SAMPLE, completion) == expected


def test_chat_code_block_with_whole_function(he):
    reply = ("Sure! Here is the function:\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n\n"
             "if __name__ == '__main__':\n    print(add(2, 2))\n```\nIt adds the numbers.")
    code = he.postprocess(SAMPLE, reply)
    assert code == "def add(a: int, b: int) -> int:\n    return a + b\n"
    assert he.postprocess(SAMPLE, code) == code  # idempotent
    assert he.score(SAMPLE, reply) == {"pass@1": 1.0}
    wrong = reply.replace("return a + b", "return a * b")
    assert he.score(SAMPLE, wrong) == {"pass@1": 0.0}
    # the block that defines the entry point is chosen over an earlier usage example
    two = "```python\nprint(add(1, 2))\n```\n\n```python\ndef add(a, b):\n    return a + b\n```"
    assert he.score(SAMPLE, two) == {"pass@1": 1.0}
    # an unterminated block (generation hit max_new_tokens) and prose without fences
    assert he.score(SAMPLE, "```python\ndef add(a, b):\n    return a + b\n") == {"pass@1": 1.0}
    assert he.score(SAMPLE, "Here you go:\ndef add(a, b):\n    return b + a\n") == {"pass@1": 1.0}


def test_chat_render_shows_the_prompt(he):
    from mtad.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    assert he.render(SAMPLE, tok, chat=False) == PROMPT
    chat = he.render(SAMPLE, tok, chat=True)
    assert f"```python\n{PROMPT}```" in chat and chat.endswith("<|im_start|>assistant\n")


# ---- malicious completions: each scores 0 and the run continues quickly ---------------------------------------
MALICIOUS = {
    "infinite_loop": "    while True:\n        pass\n",
    "sleep": "    import time\n    time.sleep(60)\n",
    "fork_bomb": "    import os\n    while True:\n        try:\n            os.fork()\n"
                 "        except OSError:\n            pass\n",
    "huge_print": "    while True:\n        print('x' * 10000)\n",
    "memory_hog": "    hog = []\n    while True:\n        hog.append(bytearray(50 * 2**20))\n",
    "one_huge_allocation": "    x = bytearray(64 * 2**30)\n    return a + b\n",
    "sys_exit_0": "    import sys\n    sys.exit(0)\n",
    "os_exit_0": "    import os\n    os._exit(0)\n",
    "exit_before_tests": "    return a + b\nimport sys\nsys.exit(0)\n",
    "network": "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n    return a + b\n",
    "kill_parent": "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
}


@pytest.mark.parametrize("name", sorted(MALICIOUS))
def test_malicious_completion_scores_zero_quickly(he, name):
    # exit_before_tests exits at module level, before the tests are even defined
    score, took = timed_score(he, SAMPLE, MALICIOUS[name])
    assert score == {"pass@1": 0.0}, name
    assert took < TIMEOUT + 3.0, f"{name} took {took:.1f}s"
    assert he.score(SAMPLE, "    return a + b\n") == {"pass@1": 1.0}  # the sandbox still works afterwards


def test_exit_inside_check_is_not_a_pass(he):
    sneaky = "    import sys\n    if (a, b) == (-4, 4):\n        sys.exit(0)\n    return a + b\n"
    assert he.score(SAMPLE, sneaky) == {"pass@1": 0.0}


def test_orphans_are_killed_and_reaped():
    """A child that escapes the process group with setsid must not outlive the call."""
    src = ("import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\n"
           "print('child', pid)\n")
    result = run_python(src, Limits(timeout_s=TIMEOUT))
    assert result.passed
    child = int(result.output.split("child")[-1].split()[0])
    deadline = time.monotonic() + 2.0
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}"), "escaped child is still alive (or a zombie)"


def test_throwaway_working_directory_and_no_network_env():
    src = ("import os\nopen('scratch.txt', 'w').write('x')\nprint('cwd', os.getcwd())\n"
           "assert not any(k.lower().endswith('_proxy') for k in os.environ)\n")
    result = run_python(src, Limits(timeout_s=TIMEOUT))
    assert result.passed, result.output
    cwd = result.output.split("cwd")[-1].split()[0]
    assert "mtad-sandbox-" in cwd and not os.path.exists(cwd)
    assert not os.path.exists("scratch.txt")


@pytest.mark.skipif(os.geteuid() != 0, reason="privilege drop only happens when running as root")
def test_root_drops_to_nobody_and_cannot_write_here(tmp_path):
    target = tmp_path / "owned.txt"
    src = f"import os\nassert os.getuid() == 65534\nopen({str(target)!r}, 'w').write('x')\n"
    result = run_python(src, Limits(timeout_s=TIMEOUT))
    assert not result.passed and "Permission denied" in result.output
    assert not target.exists()

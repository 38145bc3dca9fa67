"""Training text and prompts: GSM8K train and the Alpaca seed tasks in the chat template, WikiText-2 valid, and the
Python standard library shipped with the interpreter (whole files, or documented functions cut after their
docstring as HumanEval-like prompts). No evaluation prompt is read here: the held-out set is ``heldout.py``'s.
"""
from __future__ import annotations

import ast
import functools
import json
import logging
import random
import re
import sysconfig
import textwrap
from pathlib import Path

log = logging.getLogger(__name__)

CODE_INSTRUCTION = "Complete the following Python function.\n\n```python\n{code}```"


class Corpus:
    """Training documents and prompts, read lazily from the shared data and the interpreter's stdlib."""

    def __init__(self, tokenizer, data_dir: Path):
        self.tok = tokenizer
        self.data_dir = data_dir
        self._docs: dict[str, list[str]] = {}
        self._ids: dict[tuple[str, int], list[int]] = {}
        self._heads: dict[int, list[str]] = {}

    def chat(self, user: str, assistant: str | None = None) -> str:
        messages = [{"role": "user", "content": user}]
        if assistant is not None:
            messages.append({"role": "assistant", "content": assistant})
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=assistant is None)

    def docs(self, source: str) -> list[str]:
        if source not in self._docs:
            self._docs[source] = getattr(self, f"_read_{source}")()
            log.info("source %s: %d documents", source, len(self._docs[source]))
        return self._docs[source]

    def _read_gsm8k(self) -> list[str]:
        rows = read_jsonl(self.data_dir / "gsm8k" / "train.jsonl")
        return [self.chat(r["question"], _clean_gsm8k(r["answer"])) for r in rows]

    def _read_alpaca(self) -> list[str]:
        rows = read_jsonl(self.data_dir / "alpaca_seed_tasks" / "seed_tasks.jsonl")
        return [self.chat(_alpaca_prompt(r["instruction"], inst["input"]), inst["output"])
                for r in rows for inst in r["instances"]]

    def _read_wikitext(self) -> list[str]:
        text = (self.data_dir / "wikitext2" / "valid.txt").read_text(encoding="utf-8")
        articles = re.split(r"\n(?= = [^=].* = \n)", text)  # split before each top-level heading
        return [a.strip("\n") for a in articles if len(a) > 200]

    def _read_python(self) -> list[str]:
        return [str(p) for p in stdlib_files()]  # paths: read on demand

    def ids(self, source: str, i: int) -> list[int]:
        key = (source, i)
        if key not in self._ids:
            doc = self.docs(source)[i]
            if source == "python":
                doc = Path(doc).read_text(encoding="utf-8", errors="replace")
            self._ids[key] = self.tok(doc, add_special_tokens=False)["input_ids"]
        return self._ids[key]

    def window(self, source: str, rng: random.Random, length: int) -> list[int]:
        """``length`` tokens: a random document continued by further random documents, EOS between."""
        eos = self.tok.eos_token_id
        n = len(self.docs(source))
        first = self.ids(source, rng.randrange(n))
        chat = source in ("gsm8k", "alpaca")  # chat documents start at their beginning
        start = 0 if chat or len(first) <= length else rng.randrange(len(first) - length + 1)
        out = list(first[start:start + length])
        while len(out) < length:
            out += [eos] + self.ids(source, rng.randrange(n))
        return out[:length]

    def prompt(self, source: str, rng: random.Random) -> str:
        if source == "gsm8k":
            rows = self._gsm8k_questions()
            return self.chat(rows[rng.randrange(len(rows))])
        if source == "alpaca":
            rows = self._alpaca_instructions()
            return self.chat(rows[rng.randrange(len(rows))])
        head = self._code_head(rng)
        return head if rng.random() < 0.5 else self.chat(CODE_INSTRUCTION.format(code=head))

    def _gsm8k_questions(self) -> list[str]:
        if "gsm8k_q" not in self._docs:
            self._docs["gsm8k_q"] = [r["question"] for r in read_jsonl(self.data_dir / "gsm8k" / "train.jsonl")]
        return self._docs["gsm8k_q"]

    def _alpaca_instructions(self) -> list[str]:
        if "alpaca_q" not in self._docs:
            rows = read_jsonl(self.data_dir / "alpaca_seed_tasks" / "seed_tasks.jsonl")
            self._docs["alpaca_q"] = [_alpaca_prompt(r["instruction"], inst["input"])
                                      for r in rows for inst in r["instances"]]
        return self._docs["alpaca_q"]

    def _code_head(self, rng: random.Random) -> str:
        """A documented standard-library function cut after its docstring, like a HumanEval prompt."""
        files = self.docs("python")
        for _ in range(100):
            i = rng.randrange(len(files))
            if i not in self._heads:
                self._heads[i] = function_heads(Path(files[i]).read_text(encoding="utf-8", errors="replace"))
            if self._heads[i]:
                return rng.choice(self._heads[i])
        raise RuntimeError("found no documented functions in the standard library sources")


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: set $MTAD_DATA_DIR or train_draft.data_dir to the shared data")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _clean_gsm8k(answer: str) -> str:
    """Drop the calculator annotations ``<<48/2=24>>`` and spell out the final ``#### 72``."""
    answer = re.sub(r"<<[^>]*>>", "", answer)
    return re.sub(r"\n?#### *(.*)$", r"\nThe answer is \1.", answer.strip())


def _alpaca_prompt(instruction: str, inp: str) -> str:
    return f"{instruction}\n\n{inp}" if inp else instruction


def stdlib_files() -> list[Path]:
    """Python sources shipped with the interpreter, without test suites and demos."""
    return list(_stdlib_files())


@functools.lru_cache(maxsize=1)
def _stdlib_files() -> tuple[Path, ...]:  # the interpreter's own files: walked once per process
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}")
    return tuple(files)


def function_heads(source: str, max_lines: int = 30) -> list[str]:
    """Signature + docstring of every documented function in ``source``, dedented, ending in a newline."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    heads = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)) or len(node.body) < 2:
            continue
        span = lines[node.lineno - 1:doc.end_lineno]
        if len(span) <= max_lines:
            heads.append(textwrap.dedent("\n".join(span)) + "\n")
    return heads

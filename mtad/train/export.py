"""Export a trained draft: config.json, the non-embedding weights (fp16 ``model.safetensors``), a reduced head's
ids and bias (``head.safetensors``), ``draft.json`` (the run's metadata) and ``MODEL_CARD.md``, rendered from
``card_cache.md`` or ``card_live.md`` beside this file (``string.Template``). The embedding and the tied output
head are not stored: ``mtad.models.load`` re-ties them from the target."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from string import Template

import torch
from safetensors.torch import save_file

from mtad._util.io import atomic_replace_dir
from mtad.models.draft_head import HEAD_FILE
from mtad.train.student import head_tensors, layer_state

log = logging.getLogger(__name__)

CARDS = Path(__file__).resolve().parent  # card_cache.md (data=cache), card_live.md (data=live)
NAN = float("nan")
DOMAINS = ("gsm8k", "humaneval", "all")


def export(student, out_dir: Path, meta: dict) -> Path:
    """Write the draft's folder atomically (a crash leaves the previous export whole)."""

    def build(tmp: Path) -> None:
        weights = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in layer_state(student).items()}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        head = head_tensors(student)
        if head:
            save_file(head, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        student.config.save_pretrained(tmp)
        (tmp / "draft.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        (tmp / "MODEL_CARD.md").write_text(model_card(meta, out_dir.name))
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors/mkstemp may leave 0600: committed files are world-readable

    atomic_replace_dir(out_dir, build)
    log.info("exported the draft to %s", out_dir)
    return out_dir


def model_card(meta: dict, name: str) -> str:
    """The card of an export, from the template of its pipeline (``config.data``)."""
    cached = meta["config"].get("data") == "cache"
    template = Template((CARDS / ("card_cache.md" if cached else "card_live.md")).read_text(encoding="utf-8"))
    return template.substitute(name=name, **_common_fields(meta), **(_cache_fields(meta) if cached else {}))


def _common_fields(meta: dict) -> dict:
    c = meta["config"]
    feature = c.get("arch") == "feature"
    return dict(
        kind="feature draft" if feature else "draft",
        arch="`fc([embed(token); f_parent])` (`mtad.models.feature_draft`), then a Llama decoder" if feature
        else "Llama decoder",
        layers=meta["layers"], hidden=meta["hidden"], heads=meta["heads"], kv_heads=meta["kv_heads"],
        vocab=f"{meta['vocab']:,}", init_layers=c["init_layers"], own_params=f"{meta['own_params']:,}",
        shared_params=f"{meta['shared_params']:,}", total_params=f"{meta['own_params'] + meta['shared_params']:,}",
        file_mb=f"{meta['file_mb']:.1f}", lr=c["lr"], min_lr_frac=f"{c['min_lr_frac']:g}", lr_schedule=c["lr_schedule"],
        steps=f"{meta['steps']:,}", onpolicy_steps=f"{meta['onpolicy_steps']:,}", tokens=f"{meta['tokens']:,}",
        by_src=", ".join(f"{k} {v:,}" for k, v in sorted(meta["tokens_by_source"].items())),
        train_minutes=f"{meta['train_minutes']:.1f}", device_desc=meta["device_desc"],
        seq_len=c["seq_len"], mix=_shares(c["mix"]), onmix=_shares(c["onpolicy_mix"]),
        onpolicy_frac=f"{c['onpolicy_frac']:.0%}", gen_rows_per_step=c["gen_rows_per_step"],
        gen_top_k=c["gen_top_k"], gen_top_p=c["gen_top_p"], gen_tokens=c["gen_tokens"],
        loss_window=meta["loss_window"], final_loss=f"{meta['final_loss']:.3f}",
        eval_tokens=c["eval_tokens"], eval_gsm8k=c["eval_gsm8k"], eval_humaneval=c["eval_humaneval"],
        table=_eval_table(meta, "coverage" if c.get("data") == "cache" else "kl"), command=meta["command"],
    )


def _cache_fields(meta: dict) -> dict:
    c = meta["config"]
    gen_dtype = c.get("gen_dtype", "float32")
    head = (f"a reduced head over the {meta['head_vocab']:,} most frequent tokens (`head.safetensors`: kept ids"
            f"{' + a trained per-token bias' if c['head_bias'] else ''}; q = 0 outside them)"
            if c["head_vocab"] else "the full-vocabulary tied head")
    return dict(
        head=head, warm_start=c["init_from"] or f"target layers {c['init_layers']}",
        gen_batch=c["gen_batch"], cache_topk=c["cache_topk"], cache_rows=f"{meta['cache_rows']:,}",
        gen_by="" if gen_dtype == "float32" else f" by a {gen_dtype} copy of the target (its own top-K labels them)",
        cache_answer_tokens=f"{meta['cache_answer_tokens']:,}", gen_minutes=f"{meta['gen_minutes']:.0f}",
        train_per_gen=f"{c['train_per_gen']:g}", loss=c["loss"],
        tv_term=f" + {c['tv_weight']:g} × TV(p̃, q̃)" if c["loss"] == "ce_tv" else "",
        train_alpha=f"{meta['train_alpha']:.3f}",
        head_rows=_rows([f"`{mode}`", *(f"{r[d]['alpha']:.3f}" for d in DOMAINS if d in r)]
                        for mode, r in meta.get("eval_heads", {}).items()),
        curve=_rows([f"{e['step']:,}", f"{e['tokens']:,}", *(f"{e.get(d, NAN):.3f}" for d in DOMAINS)]
                    for e in meta.get("alpha_vs_tokens", [])),
    )


def _eval_table(meta: dict, third: str) -> str:
    """Rows of the held-out table: trained then initial, per domain (top-1, alpha, ``third``, block eff., n)."""
    def cells(label: str, e: dict) -> list[str]:
        return [label, f"{e.get('top1', NAN):.3f}", f"{e.get('alpha', NAN):.3f}", f"{e.get(third, NAN):.3f}",
                f"{e.get('block_efficiency', NAN):.2f}", str(e.get("positions", 0))]

    ev, ev0 = meta.get("eval", {}), meta.get("eval_init", {})
    return _rows([cells(f"trained, {d}", ev[d]) for d in ev] + [cells(f"initial (step 0), {d}", ev0[d]) for d in ev0])


def _rows(rows) -> str:
    return "\n".join("| " + " | ".join(cells) + " |" for cells in rows)


def _shares(mix: dict) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in mix.items())

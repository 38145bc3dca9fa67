"""The live pipeline (``recipe=live``, superseded by the cached one): every step runs the teacher. Offline steps
take packed windows of training text and the teacher's logits on them; on-policy steps let the teacher sample
answers with ``generate`` (T = 1, top-k, top-p) and learn its raw logits at each sampled step. The loss is the
full-vocabulary forward KL (``losses.forward_kl``). Shapes: B rows, S positions, P prompt, G generated, V vocab.
"""
from __future__ import annotations

import random

import torch

from mtad.train.config import TrainDraftConfig
from mtad.train.corpus import Corpus
from mtad.train.teacher import before_eos, left_pad, rng_devices


def offline_batch(cfg: TrainDraftConfig, corpus: Corpus, rng: random.Random, teacher, device):
    """Packed windows from the text mix and the teacher's logits on every position."""
    sources, weights = zip(*cfg.mix.items())
    rows, used = [], []
    for _ in range(cfg.batch_size):
        src = rng.choices(sources, weights)[0]
        rows.append(corpus.window(src, rng, cfg.seq_len))
        used.append(src)
    ids = torch.tensor(rows, device=device)  # (B, S)
    with torch.no_grad():
        p_logits = teacher(input_ids=ids).logits  # (B, S, V)
    select = torch.ones_like(ids, dtype=torch.bool)
    return dict(input_ids=ids, attention_mask=None, position_ids=None, select=select,
                p_logits=p_logits.reshape(-1, p_logits.shape[-1])), used


def onpolicy_batch(cfg: TrainDraftConfig, corpus: Corpus, rng: random.Random, teacher, tok, device, gen_seed: int):
    """The teacher samples answers to training prompts; ``p`` is the raw logits of each sampled step."""
    sources, weights = zip(*cfg.onpolicy_mix.items())
    used = [rng.choices(sources, weights)[0] for _ in range(cfg.gen_batch)]  # one source per row
    prompts = [corpus.prompt(src, rng) for src in used]
    enc = left_pad([tok(p, add_special_tokens=False)["input_ids"][-cfg.gen_prompt_len:] for p in prompts],
                    tok.pad_token_id, device)
    with torch.no_grad(), torch.random.fork_rng(devices=rng_devices(device)):
        torch.manual_seed(gen_seed)  # local: fork_rng restores the global generator afterwards
        out = teacher.generate(**enc, do_sample=True, temperature=1.0, top_k=cfg.gen_top_k,
                               top_p=cfg.gen_top_p, max_new_tokens=cfg.gen_tokens, output_logits=True,
                               return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    P = enc["input_ids"].shape[1]
    gen = out.sequences[:, P:]  # (B, G)
    valid = before_eos(gen, teacher.generation_config.eos_token_id)  # (B, G)
    p_logits = torch.stack(out.logits, dim=1)[:, :gen.shape[1]]  # (B, G, V)
    seq = out.sequences[:, :-1]  # (B, P+G-1): the last token is never an input
    mask = torch.cat([enc["attention_mask"], torch.ones_like(gen)], dim=1)[:, :-1]  # (B, P+G-1)
    select = torch.zeros_like(seq, dtype=torch.bool)
    select[:, P - 1:] = valid
    return dict(input_ids=seq, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                select=select, p_logits=p_logits[valid]), used


def split_rows(batch: dict, used: list[str], rows: int) -> list[tuple[dict, list[str]]]:
    """Cut a batch into chunks of ``rows`` rows; ``p_logits`` follows its rows' selected positions."""
    counts = batch["select"].sum(1).tolist()
    out, start = [], 0
    for r0 in range(0, len(counts), rows):
        r1 = min(r0 + rows, len(counts))
        n = int(sum(counts[r0:r1]))
        if n:
            out.append(({k: (v[r0:r1] if k != "p_logits" else v[start:start + n]) for k, v in batch.items()},
                        used[r0:r1]))
        start += n
    return out

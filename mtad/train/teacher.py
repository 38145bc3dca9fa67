"""The teacher and its passes: loading it, batching prompts, sampling answers with its top-K log-probs
(``sample_topk``, the cached pipeline's generator) and teacher-forced top-K / final hidden states.

``sample_topk`` is the trainer's own batched KV-cached loop (training code, not a decoder, so it does not go
through ``mtad.decoding.kv``); it samples from ``mtad.decoding.filter.filter_probs`` (T = 1, top-k, top-p), the
verification filter. Shapes: B rows, P prompt width, G generated steps, K cached top-k, D hidden, V vocab.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from mtad.decoding.filter import filter_probs
from mtad.models import smollm2
from mtad.models.tiny import tiny_model, tiny_tokenizer
from mtad.train.config import TrainDraftConfig


def load_teacher(cfg: TrainDraftConfig, device: torch.device):
    """(teacher, tokenizer): the embedded SmolLM2 or, for tests, a tiny random llama."""
    if cfg.target == "tiny":
        teacher = tiny_model("llama", hidden=cfg.tiny_hidden, layers=cfg.tiny_layers, seed=cfg.seed,
                             max_positions=max(cfg.seq_len, cfg.gen_prompt_len + cfg.gen_tokens) + 8)
        tok = tiny_tokenizer()
    else:
        teacher, tok = smollm2.load(dtype="float32", device="cpu")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.to(device).eval(), tok


def rng_devices(device: torch.device) -> list:
    return [device.index or 0] if device.type == "cuda" else []


def left_pad(rows: list[list[int]], pad: int, device) -> dict:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)  # (B, P)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)  # (B, P)
    return {"input_ids": ids, "attention_mask": mask}


def before_eos(gen: torch.Tensor, eos) -> torch.Tensor:
    """(B, G) mask of generated positions up to and including the first EOS."""
    eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=gen.device)
    is_eos = torch.isin(gen, eos_ids).int()
    return (is_eos.cumsum(1) - is_eos) == 0


class _KVPasses:
    """The teacher's KV-cached passes over a left-padded batch: the prompts at once, then one token a step."""

    def __init__(self, teacher, enc: dict):
        self.teacher, self.mask = teacher, enc["attention_mask"]  # (B, P)
        self.pos = (self.mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        self.cache = DynamicCache(config=teacher.config)

    def prompts(self, ids: torch.Tensor) -> torch.Tensor:
        return self.teacher.model(input_ids=ids, attention_mask=self.mask, position_ids=self.pos, cache=self.cache,
                                  use_cache=True).last_hidden_state  # (B, P, D)

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,); the final hidden state after it (B, D)."""
        self.mask = torch.cat([self.mask, torch.ones(len(tok), 1, dtype=self.mask.dtype, device=tok.device)], 1)
        self.pos = self.pos[:, -1:] + 1
        return self.teacher.model(input_ids=tok[:, None], attention_mask=self.mask, position_ids=self.pos,
                                  cache=self.cache, use_cache=True).last_hidden_state[:, -1]  # (B, D)


@torch.no_grad()
def sample_topk(teacher, rows: list[list[int]], pad: int, eos, max_new: int, top_k: int, top_p: float, K: int,
                gen: torch.Generator, features: bool = False) -> list[dict]:
    """The teacher samples (T=1, top-k, top-p: ``mtad.decoding.filter``) up to ``max_new`` tokens after each
    prompt, batched with left padding; returns per row the ids and the top-K log-probs at every position.
    ``features``: also the teacher's final hidden state at every position of the row (``feat``, fp16 (L, D),
    what ``teacher_features`` computes teacher-forced), read off the same passes (one extra step feeds the
    last sampled token), so a feature draft's shard needs no second teacher pass."""
    device = teacher.get_input_embeddings().weight.device
    enc = left_pad(rows, pad, device)
    passes, P = _KVPasses(teacher, enc), enc["input_ids"].shape[1]
    h = passes.prompts(enc["input_ids"])  # (B, P, D)
    prompt_h = [h[b, P - len(r):].to("cpu", torch.float16) for b, r in enumerate(rows)] if features else []
    prompt_top = [F.log_softmax(teacher.lm_head(h[b, P - len(r):]).float(), -1).topk(K, dim=-1)  # (len r, K)
                  for b, r in enumerate(rows)]
    vals = torch.stack([t.values[-1] for t in prompt_top])  # (B, K)
    idx = torch.stack([t.indices[-1] for t in prompt_top])
    eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=device)
    done = torch.zeros(len(rows), dtype=torch.bool, device=device)
    steps_v, steps_i, steps_h, toks = [], [], [], []
    for step in range(max_new):
        if step:
            h = passes.step(toks[-1])  # (B, D)
            if features:
                steps_h.append(h.to("cpu", torch.float16))  # the feature of answer token step - 1
            vals, idx = F.log_softmax(teacher.lm_head(h).float(), -1).topk(K, dim=-1)  # (B, K)
        steps_v.append(vals)
        steps_i.append(idx)
        probs = filter_probs(vals, 1.0, top_k, top_p)  # (B, K): the filter needs only the top-k values
        choice = torch.multinomial(probs, 1, generator=gen)[:, 0]  # (B,)
        tok = idx.gather(1, choice[:, None])[:, 0]
        toks.append(torch.where(done, torch.full_like(tok, pad), tok))
        done |= torch.isin(toks[-1], eos_ids)
        if bool(done.all()):
            break
    if features:  # the last sampled token's feature: one more step
        steps_h.append(passes.step(toks[-1]).to("cpu", torch.float16))
    steps = {"v": torch.stack(steps_v, 1), "i": torch.stack(steps_i, 1),  # (B, G, K)
             "h": torch.stack(steps_h, 1) if features else None}  # (B, G, D): answer tokens 0..G-1
    return _answer_rows(rows, prompt_top, prompt_h, torch.stack(toks, 1), steps, eos)


def _answer_rows(rows, prompt_top, prompt_h, gen_ids: torch.Tensor, steps: dict, eos) -> list[dict]:
    """Rows of the cache format: prompt + answer up to its EOS, the top-K at every position (``feat`` too)."""
    valid = before_eos(gen_ids, eos)  # (B, G)
    out = []
    for b, r in enumerate(rows):
        g = int(valid[b].sum())
        if g == 0:
            continue
        # positions 0..len(r)-1 (prompt, last one predicts answer token 0), then answer tokens 0..g-2
        tv = torch.cat([prompt_top[b].values, steps["v"][b, 1:g]], 0)  # (len r + g - 1, K)
        ti = torch.cat([prompt_top[b].indices, steps["i"][b, 1:g]], 0)
        out.append({"ids": torch.tensor(r + gen_ids[b, :g].tolist(), dtype=torch.int32),
                    "gen_from": len(r) - 1, "topk_ids": ti.to(torch.int32).cpu(),
                    "topk_logp": tv.to(torch.float16).cpu()})
        if steps["h"] is not None:
            out[-1]["feat"] = torch.cat([prompt_h[b], steps["h"][b, :g]], 0)  # (len r + g, D)
    return out


@torch.no_grad()
def teacher_features(teacher, sequences: list[torch.Tensor], batch: int = 8) -> list[torch.Tensor]:
    """The teacher's final hidden state (after its last norm: what ``Session`` hands a feature draft) at every
    position of each sequence, teacher-forced: fp16 CPU tensors (L, D). Rows of similar length are batched
    with right padding, which causal attention keeps out of every real position."""
    device = teacher.get_input_embeddings().weight.device
    out: list = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        x = torch.zeros(len(idx), max(len(sequences[i]) for i in idx), dtype=torch.long)
        for b, i in enumerate(idx):
            x[b, :len(sequences[i])] = sequences[i].long()
        h = teacher.model(input_ids=x.to(device)).last_hidden_state  # (B, L, D)
        for b, i in enumerate(idx):
            out[i] = h[b, :len(sequences[i])].to("cpu", torch.float16)
    return out


@torch.no_grad()
def teacher_topk(teacher, sequences: list[torch.Tensor], K: int, batch: int = 8) -> list[dict]:
    """Teacher-forced rows of the cache format (gen_from = 0) for equal-length ``sequences``: the teacher's
    top-K raw log-probs at every position and its final hidden states (``feat``, fp16)."""
    device = teacher.get_input_embeddings().weight.device
    out = []
    for start in range(0, len(sequences), batch):
        x = torch.stack(sequences[start:start + batch]).long().to(device)  # (B, L)
        h = teacher.model(input_ids=x).last_hidden_state  # (B, L, D)
        top = F.log_softmax(teacher.lm_head(h[:, :-1]).float(), -1).topk(K, dim=-1)  # (B, L-1, K)
        for b in range(x.shape[0]):
            out.append({"ids": x[b].to("cpu", torch.int32), "gen_from": 0,
                        "topk_ids": top.indices[b].to("cpu", torch.int32),
                        "topk_logp": top.values[b].to("cpu", torch.float16),
                        "feat": h[b].to("cpu", torch.float16)})
    return out

"""The student: the target's architecture cut to a few layers (or a feature draft), its embedding and output
head shared with the target and frozen; what of it is trained and stored; its (reduced) training head."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from mtad.models.draft_head import DraftHead
from mtad.models.feature_draft import FeatureDraft, feature_config
from mtad.models.load import tie_to_target
from mtad.train.corpus import Corpus


def build_student(teacher, layers: int, init_layers: list[int], arch: str = "token"):
    """The teacher's architecture with ``layers`` layers copied from ``init_layers``; embedding/head shared, frozen.
    ``arch=feature``: a :class:`mtad.models.feature_draft.FeatureDraft` (Llama layers) whose ``fc`` starts as
    [identity, 0] (it reads the token embedding only: at step 0 it is the token draft it was built from)."""
    n = teacher.config.num_hidden_layers
    if any(not -1 <= i < n for i in init_layers):
        raise ValueError(f"init_layers={list(init_layers)} out of range for a target with {n} layers (-1: random)")
    if arch == "feature":
        config = feature_config(teacher.config, layers)
        config._attn_implementation = "sdpa"
        student = FeatureDraft(config).float()
        D = config.hidden_size
        with torch.no_grad():
            student.fc.weight.zero_()
            student.fc.weight[:, :D] = torch.eye(D)
            student.fc.bias.zero_()
    else:
        config = teacher.config.__class__.from_dict(teacher.config.to_dict())
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = config.layer_types[:layers]
        student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for dst, src in ((d, i) for d, i in zip(student.model.layers, init_layers) if i >= 0):  # -1 keeps the random init
        dst.load_state_dict(teacher.model.layers[src].state_dict())
    student.model.norm.load_state_dict(teacher.model.norm.state_dict())
    tie_to_target(student, teacher)
    return student.to(teacher.device)


def trainable_state(student) -> dict[str, torch.Tensor]:
    """The student's own weights: everything but the shared embedding and head (a head bias is kept)."""
    shared = {"model.embed_tokens.weight", "lm_head.weight"}
    return {k: v for k, v in student.state_dict().items() if k not in shared}


def layer_state(student) -> dict[str, torch.Tensor]:
    """What ``model.safetensors`` stores: the layers and the final norm (no head parameters)."""
    return {k: v for k, v in trainable_state(student).items() if not k.startswith("lm_head.")}


def init_from_draft(student, path: Path) -> None:
    """Copy an exported draft's layers and norm into ``student`` (same shape required)."""
    f = path / "model.safetensors"
    if not f.is_file():
        raise FileNotFoundError(f"train_draft.init_from={str(path)!r}: {f} is missing")
    weights = load_file(str(f))
    own = layer_state(student)
    if not any(k.startswith("fc.") for k in weights):  # a token draft into a feature student: fc stays [I, 0]
        own = {k: v for k, v in own.items() if not k.startswith("fc.")}
    if set(weights) != set(own) or any(weights[k].shape != own[k].shape for k in own):
        raise ValueError(f"train_draft.init_from={str(path)!r} does not fit the student (layers/shape differ)")
    student.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)


def install_train_head(student, kept: Optional[torch.Tensor], bias: bool) -> None:
    """A ``DraftHead`` over ``kept`` (None: all ids) on the student's shared embedding; trainable bias optional."""
    head = student.get_output_embeddings().weight  # the target's head (its embedding when tied)
    student.lm_head = DraftHead(head, kept, None, trainable_bias=bias)


def head_vocab_ids(corpus: Corpus, rows: list[dict], n: int, vocab: int, special: list[int]) -> torch.Tensor:
    """The ``n`` ids kept by a reduced head: special tokens, then by frequency in the teacher's cached top-10
    supports (on-policy training prompts) and in the training text (GSM8K train, Alpaca seeds, stdlib)."""
    counts = torch.zeros(vocab, dtype=torch.float64)
    for r in rows:
        counts += torch.bincount(r["topk_ids"][:, :10].reshape(-1).long(), minlength=vocab).double() * 4.0
    rng = random.Random(0)
    for source in ("gsm8k", "alpaca", "python"):
        docs = corpus.docs(source)
        for i in rng.sample(range(len(docs)), min(len(docs), 400)):
            counts += torch.bincount(torch.tensor(corpus.ids(source, i), dtype=torch.long), minlength=vocab).double()
    counts[torch.tensor(sorted(set(special)), dtype=torch.long)] = float("inf")
    n = min(n, vocab)
    return counts.argsort(descending=True, stable=True)[:n].sort().values


def head_tensors(student) -> dict[str, torch.Tensor]:
    """What ``head.safetensors`` stores for a trained ``DraftHead``: kept ids (int64) and bias (fp32), or {}."""
    head = student.lm_head
    if not hasattr(head, "compact"):
        return {}
    V = head.vocab_size
    kept = head.kept_ids if head.kept_ids is not None else torch.arange(V)
    out = {"kept_ids": kept.detach().to("cpu", torch.int64).contiguous()}
    if head.bias is not None:
        out["bias"] = head.bias.detach().to("cpu", torch.float32).contiguous()
    return out

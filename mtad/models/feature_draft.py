"""A draft that reads the target's hidden state (a *feature draft*, after EAGLE: Li et al., ICML 2024).

A token-only draft of a few layers must rebuild from the text alone what the 30-layer target already
computed; a feature draft starts from it. At cache index ``t`` its input is

    x_t = fc([embed(token_t) ; f_parent(t)])          (2D -> D)

where ``f_parent(t)`` is the target's final hidden state (after its last norm, the input of its head) at
the parent of ``t`` (the previous position on a chain, the parent node in a tree) when the target has
computed it for the committed text, else the draft's *own* output there, which it is trained to make close
to the target's (the feature regression of ``mtad.train_feature_draft``). One or more Llama decoder layers,
the final norm and the head follow: ``h_t`` (the output after the norm) predicts ``f_t`` and ``head(h_t)``
gives ``q`` of the next token. So the first drafted token of a block sees the target's exact features up to
the last committed token but one, deeper ones the draft's predictions.

Wiring (:class:`mtad.decoding.kv.Session`): :meth:`mtad.decoding.core.Batch.blocks` links the draft's session
to the target's (``Session.link``) when the draft has ``reads_target_features``; both sessions then keep
their model's final hidden state per cache index, mirrored through every crop, beam reorder and path
compaction, and the draft session passes ``features`` (B, S, D) to this model. Draft cache entries
computed from the draft's own features are provisional: the next ``sync`` rolls the draft back to the last
entry computed from target features and re-feeds the accepted tokens (one parallel draft forward).
**[choice]** The first block's target forward is split in two: the prompt minus its last token is fed to
the target before the draft's first forward (the draft needs the prompt's features), so a feature draft
costs one extra target forward per prompt and no extra target tokens.

Every decoder stays what it is: speculative sampling is exact for whatever ``q`` the draft outputs, and
nothing here reads the target's distribution. Baselines that call ``model.generate`` on the draft
(HF assisted generation) cannot feed it features and are refused.

Files: a feature draft is an ordinary exported draft directory (``config.json`` with
``"mtad_feature_draft": true``, ``model.safetensors`` with ``fc.*``, the layers and the norm; the embedding
and head are the target's, re-tied at load by :func:`mtad.models.load.load_tied_draft`).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep

from mtad.decoding.kv import Session

CONFIG_FLAG = "mtad_feature_draft"


def is_feature_config(config) -> bool:
    return bool(getattr(config, CONFIG_FLAG, False))


def feature_config(target_config, layers: int = 1) -> LlamaConfig:
    """A Llama config for a feature draft of ``target_config``'s width and vocabulary."""
    c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    keys = set(LlamaConfig().to_dict())
    config = LlamaConfig(**{k: v for k, v in c.to_dict().items() if k in keys})
    config.num_hidden_layers = layers
    config.architectures = ["LlamaForCausalLM"]
    setattr(config, CONFIG_FLAG, True)
    return config


class FeatureDraft(LlamaForCausalLM):
    """``fc`` + a Llama decoder of ``config.num_hidden_layers`` layers + norm + the (shared) head."""

    reads_target_features = True

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        D = config.hidden_size
        self.fc = nn.Linear(2 * D, D, bias=True)

    def forward(self, input_ids: torch.Tensor, features: Optional[torch.Tensor] = None, cache=None,
                use_cache: bool = True, logits_to_keep: int | torch.Tensor = 0, attention_mask=None, position_ids=None,
                output_hidden_states: bool = False, **kwargs) -> CausalLMOutputWithPast:
        """input_ids (B, S); features (B, S, D): the target's (or the draft's own) final hidden state at
        each token's parent. Returns logits of the last ``logits_to_keep`` positions (all when 0) and, with
        ``output_hidden_states``, ``hidden_states=(h,)``, h (B, S, D) the draft's output after its norm."""
        if features is None:
            raise ValueError("this draft is a feature draft: it needs the target's hidden states at every step, "
                             "which only mtad's decoders pass (mtad.decoding); HF generate / assisted generation "
                             "cannot drive it: use a token-only draft for those baselines")
        h = self.hidden(input_ids, features, cache=cache, use_cache=use_cache, attention_mask=attention_mask,
                        position_ids=position_ids, **kwargs)  # (B, S, D)
        kept = slice_logits_to_keep(h, logits_to_keep)  # an int (last n; 0 = all) or an index tensor
        return CausalLMOutputWithPast(logits=self.lm_head(kept), cache=cache,
                                      hidden_states=(h,) if output_hidden_states else None)

    def hidden(self, input_ids: torch.Tensor, features: torch.Tensor, **kwargs) -> torch.Tensor:
        """The draft's output after its norm, (B, S, D): its prediction of the target's features."""
        emb = self.get_input_embeddings()(input_ids)  # (B, S, D)
        x = self.fc(torch.cat([emb, features.to(emb.dtype)], -1))
        return self.model(inputs_embeds=x, **kwargs).last_hidden_state

    def generate(self, *args, **kwargs):  # noqa: D102 - refuse with the same message
        self.forward(None)


class ZeroSource:
    """A stand-in for the target's Session when a feature draft is timed alone (``mtad.measure.costmodel``, the
    benchmark's step costs): it "computes" every position of its ``rows`` rows with a zero feature, so the draft
    runs exactly the tensor operations of a decode (its inputs just carry no information). Rows are
    right-aligned in ``feats`` like a Session's."""

    def __init__(self, hidden: int, device, rows: int = 1):
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.row = list(range(rows))
        self.hidden, self.device = hidden, device
        self.feats = torch.zeros(rows, 0, hidden, device=device)

    def _base(self, i: int) -> int:
        return self.feats.shape[1] - len(self.ids[i])  # row i's position 0

    def _zeros(self) -> None:
        width = max((len(ids) for ids in self.ids), default=0)
        self.feats = torch.zeros(len(self.ids), width, self.hidden, device=self.device)

    def sync(self, tokens: list[list[int]]) -> list[list[int]]:
        for ids, t in zip(self.ids, tokens):
            del ids[max(len(t) - 1, 0):]
        self._zeros()
        return [t[len(ids):] for ids, t in zip(self.ids, tokens)]

    def forward(self, new: list[list[int]], keep: int = 1) -> None:
        for ids, b in zip(self.ids, new):
            ids.extend(b)
        self._zeros()


def timing_session(model, stats, role: str):
    """A one-row Session of ``model`` for cost measurements: a feature draft is linked to a :class:`ZeroSource`."""
    s = Session(model, [stats], role)
    if getattr(model, "reads_target_features", False):
        s.link(ZeroSource(model.config.hidden_size, s.device))
    return s

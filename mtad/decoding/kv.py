"""The only module that touches the transformers KV-cache API (STYLE.md, "State").

A :class:`Session` is one model's cache for one ``generate`` call. Its cache holds

* a *linear* part: tokens ``ids`` at positions ``0..len(ids)-1`` (the committed context), then
* optionally *tree* nodes appended by :meth:`Session.forward_tree`; each node knows its parent's cache
  index and attends to the linear part and its own ancestors through a 4D mask with explicit
  ``position_ids`` (the model's own attention; no patched modeling code).

Operations: crop/rollback (:meth:`sync`), beam expand/reorder (:meth:`expand`, :meth:`select`) and
tree-path compaction (:meth:`keep_path`). Transformers 5.x notes: the forward kwarg is ``cache`` (the old
``past_key_values`` is deprecated) and ``DynamicCache.crop`` takes a negative count of tokens to drop.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

# Architectures whose attention is known to honour a float 4D mask + position_ids (tested: llama, opt).
TREE_ARCHITECTURES = {"llama", "opt", "mistral", "qwen2", "qwen3"}


@dataclass
class Stats:
    """Forward counts and time inside model forwards, shared by the sessions of one call."""

    target_forwards: int = 0
    draft_forwards: int = 0
    forward_time_s: float = 0.0
    accepted: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)
    position_accepts: list[int] = field(default_factory=list)
    position_proposals: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        """One speculative iteration: ``proposed`` draft positions, the first ``accepted`` of them kept."""
        self.proposed.append(proposed)
        self.accepted.append(accepted)
        for store in (self.position_accepts, self.position_proposals):
            store.extend([0] * (proposed - len(store)))
        for j in range(proposed):
            self.position_proposals[j] += 1
            self.position_accepts[j] += j < accepted


def check_tree_support(model, role: str) -> None:
    """Tree decoders need a 4D float mask; refuse architectures/attention kernels that cannot take one."""
    arch = getattr(model.config, "model_type", "?")
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if arch not in TREE_ARCHITECTURES or impl not in ("sdpa", "eager"):
        raise ValueError(
            f"tree attention is not supported for the {role} model (architecture '{arch}', attention '{impl}'): "
            f"tree decoders need a 4D attention mask, tested for {sorted(TREE_ARCHITECTURES)} with sdpa/eager; "
            "use decoder=mtad or speculative, or load the model with attn_implementation=sdpa")


class Session:
    """One model + its KV cache for one decode. ``role`` is 'target' or 'draft' (for forward counts).

    Devices: inputs go to ``device`` (the input embedding's); logits come back on ``out_device``, the
    call's *decode device* (:class:`mtad.decoding.core.Run`), whatever device the model's last layer is on
    (a target sharded by ``device_map`` emits logits on its last GPU). None leaves them where they are."""

    def __init__(self, model, stats: Stats, role: str, out_device: torch.device | None = None):
        self.model, self.stats, self.role = model, stats, role
        self.cache = DynamicCache(config=model.config)
        self.device = model.get_input_embeddings().weight.device
        self.out_device = out_device
        self.ids: list[int] = []  # linear part of the cache
        self.node_parent: list[int] = []  # tree nodes: parent cache index
        self.node_pos: list[int] = []  # tree nodes: position id
        self._anc = torch.zeros(0, 0, dtype=torch.bool)  # (N, N) ancestor-or-self among tree nodes
        self.batch = 1
        self._stable = 0  # ids[:_stable] are known to be committed

    def __len__(self) -> int:
        return len(self.ids) + len(self.node_parent)

    # ---- forwards -------------------------------------------------------------------------------
    def _run(self, input_ids: torch.Tensor, keep: int, **kw) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.model(input_ids=input_ids.to(self.device), cache=self.cache, use_cache=True,
                         logits_to_keep=keep, **kw)
        self.stats.forward_time_s += time.perf_counter() - t0
        if self.role == "target":
            self.stats.target_forwards += 1
        else:
            self.stats.draft_forwards += 1
        logits = out.logits.float()  # (B, S', V)
        return logits if self.out_device is None else logits.to(self.out_device)

    def forward(self, new_ids: list[int], keep: int = 1) -> torch.Tensor:
        """Append ``new_ids`` to the linear part (batch 1); logits of the last ``keep`` positions (keep, V)."""
        assert not self.node_parent and self.batch == 1, "linear forward on a cache holding tree nodes or beams"
        x = torch.tensor([new_ids], dtype=torch.long)  # (1, S)
        logits = self._run(x, keep)[0]  # (keep, V)
        self.ids.extend(new_ids)
        return logits

    def forward_beams(self, tokens: torch.Tensor) -> torch.Tensor:
        """One step of ``W`` beams held in the batch dimension: tokens (W,) -> logits (W, V)."""
        return self._run(tokens.view(-1, 1), 1)[:, -1]  # (W, V)

    def forward_tree(self, tokens: list[int], parents: list[int], keep: int = 0) -> torch.Tensor:
        """Append tree nodes; ``parents[i]`` is the cache index of node i's parent: the last linear token,
        an earlier tree node, or an earlier node of this call (so pending tokens can travel as a chain).
        Returns logits of the last ``keep`` new nodes (all when 0): (keep or S, V)."""
        L, P, S = len(self), len(self.ids), len(tokens)
        pos, anc = self._extend_tree(parents)
        mask = torch.zeros(S, L + S, dtype=torch.bool)  # (S, L+S) True = attend
        mask[:, :P] = True
        mask[:, P:] = anc[L - P:]
        dtype = self.model.get_input_embeddings().weight.dtype
        mask4d = torch.zeros(1, 1, S, L + S, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
        x = torch.tensor([tokens], dtype=torch.long)  # (1, S)
        positions = torch.tensor([pos], dtype=torch.long, device=self.device)  # (1, S)
        return self._run(x, keep, attention_mask=mask4d.to(self.device), position_ids=positions)[0]  # (S', V)

    def _extend_tree(self, parents: list[int]) -> tuple[list[int], torch.Tensor]:
        P, N0 = len(self.ids), len(self.node_parent)
        N = N0 + len(parents)
        anc = torch.zeros(N, N, dtype=torch.bool)  # (N, N)
        anc[:N0, :N0] = self._anc
        pos = []
        for i, parent in enumerate(parents, start=N0):
            if parent >= P:  # parent is a tree node: inherit its ancestors
                anc[i] = anc[parent - P]
                pos.append(self.node_pos[parent - P] + 1)
            else:
                assert parent == P - 1, "a tree root must hang off the last linear token"
                pos.append(P)
            anc[i, i] = True
            self.node_parent.append(parent)
            self.node_pos.append(pos[-1])
        self._anc = anc
        return pos, anc

    # ---- cache surgery ---------------------------------------------------------------------------
    def sync(self, tokens: list[int]) -> None:
        """Roll the linear cache back to its longest prefix shared with ``tokens`` (the committed text).
        Committed text only grows, so the scan starts where the last sync stopped. The last committed
        token is always left out, so the next forward has at least one token to produce logits from
        (a resampled token can equal the draft token the cache already holds)."""
        assert not self.node_parent and self.batch == 1
        n = min(len(self.ids), len(tokens) - 1)
        k = min(self._stable, n)
        while k < n and self.ids[k] == tokens[k]:
            k += 1
        self._crop(len(self.ids) - k)
        del self.ids[k:]
        self._stable = k

    def _crop(self, drop: int) -> None:
        if drop > 0:
            self.cache.crop(-drop)  # transformers 5.x: negative count = tokens to remove

    def expand(self, W: int) -> None:
        """Replicate the batch-1 cache into ``W`` beams."""
        self.cache.batch_repeat_interleave(W)
        self.batch = W

    def select(self, rows: torch.Tensor) -> None:
        """Reorder/select beams: row b of the new cache is old row ``rows[b]`` (beam parent indices)."""
        self.cache.reorder_cache(rows.to(self.device))
        self.batch = len(rows)

    def collapse(self, row: int, tokens: list[int]) -> None:
        """Keep beam ``row`` only; ``tokens`` are the ids its cache rows now hold beyond ``ids``."""
        self.select(torch.tensor([row]))
        self.ids.extend(tokens)

    def keep_path(self, nodes: list[int]) -> None:
        """Tree-path compaction: keep the linear part plus tree nodes ``nodes`` (cache indices, root to
        leaf, each the parent of the next), which become linear; drop every other tree node."""
        P = len(self.ids)
        keep = torch.cat([torch.arange(P), torch.tensor(nodes, dtype=torch.long)])
        for layer in self.cache.layers:
            if layer.is_initialized and layer.keys.numel():  # a sharded model's layers sit on different GPUs
                idx = keep.to(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, idx)  # (B, H, P + len(nodes), D)
                layer.values = layer.values.index_select(-2, idx)
        self.node_parent.clear()
        self.node_pos.clear()
        self._anc = torch.zeros(0, 0, dtype=torch.bool)

    def commit_path(self, nodes: list[int], tokens: list[int]) -> None:
        """:meth:`keep_path` and record the kept nodes' ``tokens`` as linear ids."""
        self.keep_path(nodes)
        self.ids.extend(tokens)

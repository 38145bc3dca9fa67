"""The only module that touches the transformers KV-cache API (STYLE.md, "State").

A :class:`Session` is one model's cache for one ``generate`` call. Its cache holds

* a *linear* part: tokens ``ids`` at positions ``0..len(ids)-1`` (the committed context), then
* optionally *tree* nodes appended by :meth:`Session.forward_tree`; each node knows its parent's cache
  index and attends to the linear part and its own ancestors through a 4D mask with explicit
  ``position_ids`` (the model's own attention; no patched modeling code).

Operations: crop/rollback (:meth:`sync`), beam expand/reorder (:meth:`expand`, :meth:`select`) and
tree-path compaction (:meth:`keep_path`). :class:`Rows` holds several prompts (padding, per-row rollback);
every decoder loops over rows, and a batch of one reads its Session through :class:`One` (Rows' interface).
Transformers 5.x notes: the forward kwarg is ``cache`` (the old ``past_key_values`` is deprecated) and
``DynamicCache.crop`` takes a negative count of tokens to drop.

Sliding-window attention (Mistral; Gemma 3 and Qwen2/3 mix sliding and full layers): every layer of the
session's cache is a *full-length* ``DynamicLayer``, and the window lives in the attention mask alone.
``DynamicCache(config=...)`` would give sliding layers a ``DynamicSlidingWindowLayer``, which keeps only the
last ``W - 1`` tokens: past the window it cannot roll back (the dropped tokens are gone; ``crop`` raises),
and tree nodes take cache slots that evict linear tokens a deeper node still sees. Its
``activate_past_recording`` keeps the past only until the next crop and hands the forward only the last
``W - 1 + S`` keys, which again loses linear tokens once an earlier tree call holds slots. With full-length
layers every cache index is a position's key, so crop, beam reorder and path compaction are the same for all
layers; linear forwards get the model's own sliding mask (transformers' mask functions use absolute key
indices, offset 0 for a full-length layer), tree forwards one mask per layer type (:meth:`Session._tree_mask`).
Cost: a sliding layer's cache grows with the context like a full layer's (memory and attention over ``L``
keys, masked to ``W``).

Feature drafts (:mod:`mtad.models.feature_draft`): :meth:`Session.link` makes a draft session read the target
session's final hidden states. Both then keep one hidden state per cache index (``feats``), carried through
every crop, beam reorder and path compaction like the keys and values; each new draft token gets its
parent's feature, the target's where the target computed the same text, else the draft's own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

# Architectures whose attention honours a float 4D mask (one per layer type) + position_ids:
# tests/decoding/test_kv_tree.py (llama, opt) and tests/decoding/test_sliding_window.py (mistral, gemma3_text,
# qwen2, qwen3 with sliding windows).
TREE_ARCHITECTURES = {"llama", "opt", "mistral", "gemma3_text", "qwen2", "qwen3"}
MASK_LAYER_TYPES = ("full_attention", "sliding_attention")  # layer types a tree mask is built for


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
    # forward shapes for the cost model (mtad.measure.costmodel): "<role>:<seq|tree>:<rows>x<new tokens>" -> count
    calls: dict[str, int] = field(default_factory=dict)
    call_cpu_s: dict[str, float] = field(default_factory=dict)  # the same keys -> CPU seconds of those calls

    def count_call(self, role: str, kind: str, rows: int, new: int, cpu_s: float = 0.0) -> None:
        key = f"{role}:{kind}:{rows}x{new}"
        self.calls[key] = self.calls.get(key, 0) + 1
        self.call_cpu_s[key] = self.call_cpu_s.get(key, 0.0) + cpu_s

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
    other = sorted(set(getattr(_text_config(model.config), "layer_types", None) or ()) - set(MASK_LAYER_TYPES))
    if other:
        raise ValueError(f"tree attention is not supported for the {role} model (architecture '{arch}'): its layer "
                         f"types {other} need masks mtad does not build (only {list(MASK_LAYER_TYPES)}); "
                         "use decoder=mtad or speculative")


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def mask_windows(config) -> dict[str | None, int | None]:
    """How the model takes a 4D mask: ``{layer type: sliding window or None}`` for models that take one mask
    per layer type (``config.layer_types`` with a sliding type: Gemma 3, Qwen2/3, whose ``forward`` uses an
    ``attention_mask`` dict as its layer type -> mask mapping), else ``{None: window}`` for one tensor that
    every layer gets as is (Llama, OPT: no window; Mistral: every layer slides)."""
    c = _text_config(config)
    window, types = getattr(c, "sliding_window", None), getattr(c, "layer_types", None)
    if not types:
        return {None: window}
    if "sliding_attention" not in types:
        return {None: None}
    return {t: window if t == "sliding_attention" else None for t in dict.fromkeys(types)}


def full_length_cache(config) -> DynamicCache:
    """``DynamicCache(config=...)`` with every sliding-window layer replaced by a full-length one (module
    docstring: rollback and tree nodes need every past key)."""
    cache = DynamicCache(config=config)
    cache.layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer for layer in cache.layers]
    return cache


class NonFiniteLogits(ValueError):
    """A model returned NaN/inf logits: ``role`` (target/draft), its forward count and cache length."""

    def __init__(self, role: str, forward: int, length: int):
        super().__init__(f"the {role} model returned NaN/inf logits at decoding step {forward} (its forward "
                         f"{forward} on this prompt, {length} tokens cached): check the {role} weights for NaN/inf "
                         "or use a wider dtype (float16 overflows: try bfloat16 or float32)")


class Session:
    """One model + its KV cache for one decode. ``role`` is 'target' or 'draft' (for forward counts).

    Devices: inputs go to ``device`` (the input embedding's); logits come back on ``out_device``, the
    call's *decode device* (:class:`mtad.decoding.core.Run`), whatever device the model's last layer is on
    (a target sharded by ``device_map`` emits logits on its last GPU). None leaves them where they are."""

    def __init__(self, model, stats: Stats, role: str, out_device: torch.device | None = None):
        self.model, self.stats, self.role = model, stats, role
        self.cache = full_length_cache(model.config)
        self.windows: dict | None = None  # layer type -> window of its tree mask (set by the first tree call)
        kinds = {type(layer).__name__ for layer in self.cache.layers} - {"DynamicLayer"}
        self._surgery_error = (f"{role} model (architecture '{model.config.model_type}'): its cache layers "
                               f"{sorted(kinds)} hold no per-token keys to crop or compact") if kinds else ""
        self.device = model.get_input_embeddings().weight.device
        self.out_device = out_device
        self.ids: list[int] = []  # linear part of the cache
        self.node_parent: list[int] = []  # tree nodes: parent cache index
        self.node_pos: list[int] = []  # tree nodes: position id
        self._anc = torch.zeros(0, 0, dtype=torch.bool)  # (N, N) ancestor-or-self among tree nodes
        self.batch = 1
        self._stable = 0  # ids[:_stable] are known to be committed
        # feature drafts (mtad.models.feature_draft): final hidden state per cache index, and the linked source
        self.feats: torch.Tensor | None = None  # (B, len(self), D) when keep_feats
        self.keep_feats = False
        self.source: "Session | None" = None  # the target session whose features this draft reads
        self._exact: int | None = None  # ids[:_exact] were computed from source features (None: not linked)

    def __len__(self) -> int:
        return len(self.ids) + len(self.node_parent)

    def link(self, source: "Session") -> None:
        """Make this (feature draft) session read ``source``'s final hidden states (mtad.models.feature_draft)."""
        self.source, self.keep_feats, self._exact = source, True, 0
        source.keep_feats = True  # a Session (or mtad.models.feature_draft.ZeroSource when timing the draft alone)

    # ---- forwards -------------------------------------------------------------------------------
    def _run(self, input_ids: torch.Tensor, keep: int, parents: list[int] | None = None,
             text: list[int] | None = None, **kw) -> torch.Tensor:
        """One model forward. A feature draft also gets each new token's parent feature: ``parents`` are
        their parents' cache indices, ``text`` the linear tokens including this call's (linear forwards)."""
        t0, c0 = time.perf_counter(), time.process_time()
        if self.source is not None:
            kw["features"] = self._parent_features(parents, self.ids if text is None else text)  # (B, S, D)
        if self.keep_feats:
            kw["output_hidden_states"] = True
        S = input_ids.shape[1]
        if 0 < keep < S:  # kept positions as an index: the head then reads a fresh (B, keep, D) tensor, not a
            keep = torch.arange(S - keep, S, device=self.device)  # strided view (a bf16 CPU matmul copies the head)
        out = self.model(input_ids=input_ids.to(self.device), cache=self.cache, use_cache=True,
                         logits_to_keep=keep, **kw)
        if self.keep_feats:
            h = out.hidden_states[-1]  # (B, S, D): the final hidden state (after the last norm)
            self.feats = h if self.feats is None else torch.cat([self.feats, h], 1)
        self.stats.forward_time_s += time.perf_counter() - t0
        if self.role == "target":
            self.stats.target_forwards += 1
        else:
            self.stats.draft_forwards += 1
        self.stats.count_call(self.role, "tree" if "position_ids" in kw else "seq", *input_ids.shape,
                              cpu_s=time.process_time() - c0)
        logits = out.logits.float()  # (B, S', V)
        if not torch.isfinite(logits).all():  # every decoder's logits pass here
            raise NonFiniteLogits(self.role, getattr(self.stats, f"{self.role}_forwards"), len(self))
        return logits if self.out_device is None else logits.to(self.out_device)

    def forward(self, new_ids: list[int], keep: int = 1) -> torch.Tensor:
        """Append ``new_ids`` to the linear part (batch 1); logits of the last ``keep`` positions (keep, V)."""
        assert not self.node_parent and self.batch == 1, "linear forward on a cache holding tree nodes or beams"
        x = torch.tensor([new_ids], dtype=torch.long)  # (1, S)
        L = len(self.ids)
        parents = list(range(L - 1, L + len(new_ids) - 1))
        if self.source is not None and len(new_ids) > 1:
            self._fill_source(new_ids)
        logits = self._run(x, keep, parents, self.ids + new_ids)[0]  # (keep, V)
        if self._exact == L and parents[-1] < self._source_valid(self.ids + new_ids):  # all source features
            self._exact = L + len(new_ids)
        self.ids.extend(new_ids)
        return logits

    def forward_beams(self, tokens: torch.Tensor) -> torch.Tensor:
        """One step of ``W`` beams held in the batch dimension: tokens (W,) -> logits (W, V)."""
        last = None if self.feats is None else [self.feats.shape[1] - 1]  # beams are not in ids: cache length
        return self._run(tokens.view(-1, 1), 1, last)[:, -1]  # (W, V)

    def forward_tree(self, tokens: list[int], parents: list[int], keep: int = 0) -> torch.Tensor:
        """Append tree nodes; ``parents[i]`` is the cache index of node i's parent: the last linear token,
        an earlier tree node, or an earlier node of this call (so pending tokens can travel as a chain).
        Sliding-window layers get their own mask (:meth:`_tree_mask`). Returns logits of the last ``keep``
        new nodes (all when 0): (keep or S, V)."""
        L, P, S = len(self), len(self.ids), len(tokens)
        assert self.source is None or max(parents) < L, "a feature draft's tree nodes hang off earlier calls"
        pos, anc = self._extend_tree(parents)
        mask = torch.zeros(S, L + S, dtype=torch.bool)  # (S, L+S) True = attend
        mask[:, :P] = True
        mask[:, P:] = anc[L - P:]
        x = torch.tensor([tokens], dtype=torch.long)  # (1, S)
        positions = torch.tensor([pos], dtype=torch.long)  # (1, S)
        return self._run(x, keep, parents, attention_mask=self._tree_mask(mask, positions[0]),
                         position_ids=positions.to(self.device))[0]  # (S', V)

    # ---- feature drafts (mtad.models.feature_draft) ---------------------------------------------------------
    def _source_valid(self, text: list[int]) -> int:
        """How many leading tokens of ``text`` the source's linear part shares (its features hold there)."""
        a, b = text, self.source.ids
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        k = 0
        while a[k] == b[k]:
            k += 1
        return k

    def _fill_source(self, new_ids: list[int]) -> None:
        """A multi-token linear forward feeds committed text (``Run.pending``): the parents of its tokens
        that the source has not computed (the prompt, in the first block) are fed to the source first."""
        text = self.ids + new_ids
        self.source.sync(text)  # the source's cache keeps its longest prefix shared with the text, minus one
        missing = text[len(self.source.ids):len(text) - 1]
        if missing:
            self.source.forward(missing)

    def _parent_features(self, parents: list[int], text: list[int]) -> torch.Tensor:
        """(B, S, D): for each new token, the source's feature at its parent when the source computed that
        position for the same text, else this session's own output there (zeros before position 0)."""
        valid = self._source_valid(text)
        src, own = self.source.feats, self.feats
        D = self.model.config.hidden_size
        cols = []
        for p in parents:
            if p < 0:
                cols.append(torch.zeros(self.batch, D, device=self.device))
            elif p < valid:
                cols.append(src[0, p].to(self.device).expand(self.batch, D))
            else:
                cols.append(own[:, p].to(self.device))
        return torch.stack(cols, 1)  # (B, S, D)

    def _tree_mask(self, visible: torch.Tensor, pos: torch.Tensor):
        """Float 4D mask(s) from ``visible`` (S, L+S) for queries at positions ``pos`` (S,): one tensor, or a
        dict layer type -> mask; a sliding layer also hides keys ``W`` or more positions back (a node's
        position, not its cache index, counts: its ancestors are near, the linear part far)."""
        dtype = self.model.get_input_embeddings().weight.dtype
        if self.windows is None:
            self.windows = mask_windows(self.model.config)

        def to4d(w):  # window or None -> (1, 1, S, L+S) additive float mask
            m = visible
            if w is not None:
                key_pos = torch.cat([torch.arange(len(self.ids)), torch.tensor(self.node_pos)])  # (L+S,)
                m = visible & (pos[:, None] - key_pos[None, :] < w)
            return torch.zeros(1, 1, *m.shape, dtype=dtype).masked_fill_(~m, torch.finfo(dtype).min).to(self.device)

        masks = {w: to4d(w) for w in set(self.windows.values())}
        if None in self.windows:
            return masks[self.windows[None]]
        return {t: masks[w] for t, w in self.windows.items()}

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
        if self._exact is not None:  # a feature draft re-feeds tokens it computed from its own features
            n = min(n, self._exact)
        k = min(self._stable, n)
        while k < n and self.ids[k] == tokens[k]:
            k += 1
        self._crop(len(self.ids) - k)
        del self.ids[k:]
        self._stable = k
        if self._exact is not None:
            self._exact = min(self._exact, k)

    def _crop(self, drop: int) -> None:
        if drop > 0:
            self._check_surgery("roll back")
            self.cache.crop(-drop)  # transformers 5.x: negative count = tokens to remove
            if self.feats is not None:
                self.feats = self.feats[:, :-drop]

    def _check_surgery(self, what: str) -> None:
        if self._surgery_error:
            raise ValueError(f"cannot {what} the KV cache of the {self._surgery_error}; "
                             "use decoder=greedy or sampling for this model")

    def expand(self, W: int) -> None:
        """Replicate the batch-1 cache into ``W`` beams."""
        self.cache.batch_repeat_interleave(W)
        if self.feats is not None:
            self.feats = self.feats.repeat_interleave(W, 0)
        self.batch = W

    def select(self, rows: torch.Tensor) -> None:
        """Reorder/select beams: row b of the new cache is old row ``rows[b]`` (beam parent indices)."""
        self.cache.reorder_cache(rows.to(self.device))
        if self.feats is not None:
            self.feats = self.feats.index_select(0, rows.to(self.feats.device))
        self.batch = len(rows)

    def collapse(self, row: int, tokens: list[int]) -> None:
        """Keep beam ``row`` only; ``tokens`` are the ids its cache rows now hold beyond ``ids``."""
        self.select(torch.tensor([row]))
        self.ids.extend(tokens)

    def keep_path(self, nodes: list[int]) -> None:
        """Tree-path compaction: keep the linear part plus tree nodes ``nodes`` (cache indices, root to
        leaf, each the parent of the next), which become linear; drop every other tree node."""
        self._check_surgery("compact")
        P = len(self.ids)
        keep = torch.cat([torch.arange(P), torch.tensor(nodes, dtype=torch.long)])
        for layer in self.cache.layers:
            if layer.is_initialized and layer.keys.numel():  # a sharded model's layers sit on different GPUs
                idx = keep.to(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, idx)  # (B, H, P + len(nodes), D)
                layer.values = layer.values.index_select(-2, idx)
        if self.feats is not None:
            self.feats = self.feats.index_select(1, keep.to(self.feats.device))
        self.node_parent.clear()
        self.node_pos.clear()
        self._anc = torch.zeros(0, 0, dtype=torch.bool)

    def commit_path(self, nodes: list[int], tokens: list[int]) -> None:
        """:meth:`keep_path` and record the kept nodes' ``tokens`` as linear ids."""
        self.keep_path(nodes)
        self.ids.extend(tokens)


class Rows:
    """One model's cache for several prompts decoded together (``generate`` on a list of prompts): the only
    place that knows about padding. Rows are *left-padded and right-aligned*: between forwards, row b's
    committed-so-far tokens ``ids[b]`` fill the last ``len(ids[b])`` cache slots; every other slot is padding,
    hidden by the 2D attention mask. Each token gets its row's own position (``len(ids[b])`` + offset,
    :meth:`_positions`), never its cache slot, so rows of different lengths share one forward.

    A forward takes a ragged block, one list of new ids per row, *right*-padded to the longest: a row's real
    tokens come first, so causality alone hides the pad tokens after them, and no real token ever has a
    hole between it and its row's earlier keys (slot distance = position distance, which the model's own
    sliding-window mask relies on). The pads after a row's block are its ``junk``; a per-row rollback
    (:meth:`sync`) adds the rejected tail to the junk. Junk is removed by :meth:`_pack` before the next
    forward: one gather per layer that moves every row's kept tokens back to the right edge (a per-row crop;
    ``DynamicCache.crop`` takes a negative count and can only cut every row alike, which :meth:`_pack` uses
    when all rows drop the same number). A rejected tail is thus never in a key slot the mask shows.

    Finished rows leave the batch (:meth:`keep`), so they stop costing compute. Beams (MTAD's draft) live in
    the batch dimension, W per row (:meth:`expand`, :meth:`select`, :meth:`forward_beams`). ``row`` maps each batch
    position to the caller's row index, and forwards are counted in each row's own :class:`Stats`
    (``stats[row]``); the forward time is shared out equally among the rows in the call (:meth:`_count`).
    No feature drafts and no tree nodes here: those decode one prompt at a time (:class:`Session`)."""

    def __init__(self, model, stats: list[Stats], role: str, out_device: torch.device | None = None):
        self.model, self.stats, self.role = model, stats, role
        self.cache = full_length_cache(model.config)
        self.device = model.get_input_embeddings().weight.device
        self.out_device = out_device
        self.row: list[int] = list(range(len(stats)))  # batch position -> caller's row
        self.ids: list[list[int]] = [[] for _ in stats]  # per batch position: tokens in the cache
        self.junk: list[int] = [0 for _ in stats]  # per batch position: trailing slots to drop before a forward
        self._stable: list[int] = [0 for _ in stats]

    def __len__(self) -> int:
        """Cache slots (padding included)."""
        return self.cache.get_seq_length()

    def _positions(self, lengths: torch.Tensor, S: int) -> torch.Tensor:
        """(B, S) position ids of a block: row b's tokens continue its own length ``lengths[b]``."""
        return lengths[:, None] + torch.arange(S)[None, :]  # (B, S)

    def forward(self, new: list[list[int]], keep: int = 1) -> torch.Tensor:
        """Append ``new[b]`` (at least one id each) to row b; logits (B, keep, V) *right-aligned per row*:
        ``[b, keep - k:]`` are the logits of row b's last k new tokens for any k <= len(new[b])."""
        self._pack()
        n = [len(x) for x in new]
        assert len(new) == len(self.ids) and min(n) >= 1, "one non-empty block per row"
        B, S, C = len(new), max(n), len(self)
        x = torch.tensor([b + [b[-1]] * (S - len(b)) for b in new], dtype=torch.long)  # (B, S) right-padded
        lengths = torch.tensor([len(ids) for ids in self.ids])  # (B,)
        slot = torch.arange(C + S)  # (C+S,)
        n_t = torch.tensor(n)
        mask = (slot[None, :] >= C - lengths[:, None]) & (slot[None, :] < C + n_t[:, None])  # (B, C+S)
        need = min(S, max(keep + S - k for k in n))  # logits from the first position any row needs
        t0, c0 = time.perf_counter(), time.process_time()
        out = self.model(input_ids=x.to(self.device), cache=self.cache, use_cache=True, logits_to_keep=need,
                         attention_mask=mask.long().to(self.device),
                         position_ids=self._positions(lengths, S).to(self.device))
        self._count(time.perf_counter() - t0, B, S, time.process_time() - c0)
        logits = out.logits.float()  # (B, need, V): block positions S - need .. S - 1
        cols = (n_t[:, None] - keep + torch.arange(keep)[None, :] - (S - need)).clamp(min=0)  # (B, keep)
        logits = logits.gather(1, cols.to(logits.device)[:, :, None].expand(-1, -1, logits.shape[-1]))
        if not torch.isfinite(logits).all():
            raise NonFiniteLogits(self.role, getattr(self.stats[self.row[0]], f"{self.role}_forwards"), C)
        for b, ids in enumerate(self.ids):
            ids.extend(new[b])
            self.junk[b] += S - n[b]
        return logits if self.out_device is None else logits.to(self.out_device)  # (B, keep, V)

    def _count(self, seconds: float, B: int, S: int, cpu_s: float = 0.0) -> None:
        """Every row in the call counts one forward and an equal share of its time; the call's shape
        (``<role>:seq:<B>x<S>``, B with beams) is counted once, in its first row's ``calls``, so that summing
        ``calls`` over the rows gives the batch's forwards (:mod:`mtad.measure.costmodel`)."""
        rows = sorted(set(self.row))  # beams of one row count once
        for r in rows:
            st = self.stats[r]
            st.forward_time_s += seconds / len(rows)
            if self.role == "target":
                st.target_forwards += 1
            else:
                st.draft_forwards += 1
        self.stats[rows[0]].count_call(self.role, "seq", B, S, cpu_s)

    def sync(self, tokens: list[list[int]]) -> list[list[int]]:
        """Roll each row back to its longest prefix shared with ``tokens[b]`` (its committed text), keeping
        the last committed token out as :meth:`Session.sync` does; return each row's pending tokens."""
        pending = []
        for b, (ids, text) in enumerate(zip(self.ids, tokens)):
            n = min(len(ids), len(text) - 1)
            k = min(self._stable[b], n)
            while k < n and ids[k] == text[k]:
                k += 1
            self.junk[b] += len(ids) - k  # the rejected tail: hidden now (outside the row's run), dropped by _pack
            del ids[k:]
            self._stable[b] = k
            pending.append(text[k:])
        return pending

    def _pack(self) -> None:
        """Drop every row's junk and the padding columns no row needs: row b's kept tokens end at the last slot."""
        C = len(self)
        if C == 0 or not any(self.junk) and C == max(len(ids) for ids in self.ids):
            return
        junk, lengths = torch.tensor(self.junk), torch.tensor([len(ids) for ids in self.ids])  # (B,)
        if junk.min() == junk.max() and C - int(junk[0]) == int(lengths.max()):  # every row drops alike: crop
            self.cache.crop(-int(junk[0]))  # transformers 5.x: a negative count of tokens to remove
        else:
            width = int(lengths.max())
            src = (torch.arange(width)[None, :] - width + C - junk[:, None]).clamp(min=0)  # (B, C') old slot
            for layer in self.cache.layers:
                if layer.is_initialized and layer.keys.numel():
                    idx = src.to(layer.keys.device)[:, None, :, None].expand(-1, layer.keys.shape[1], -1,
                                                                          layer.keys.shape[-1])  # (B, H, C', D)
                    layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
        self.junk = [0] * len(self.junk)

    def keep(self, positions: list[int]) -> None:
        """Keep only the rows at batch ``positions`` (finished rows leave the batch)."""
        if positions != list(range(len(self.ids))):
            self.select(torch.tensor(positions, dtype=torch.long))

    def select(self, rows: torch.Tensor) -> None:
        """Row b of the new batch is old row ``rows[b]`` (finished rows dropped, beams reordered)."""
        rows_l = rows.tolist()
        if len(self):
            self.cache.reorder_cache(rows.to(self.device))
        self.row = [self.row[i] for i in rows_l]
        self.ids = [list(self.ids[i]) for i in rows_l]
        self.junk = [self.junk[i] for i in rows_l]
        self._stable = [self._stable[i] for i in rows_l]

    def expand(self, W: int) -> None:
        """Replicate every row into ``W`` beams: batch position b*W + w is beam w of row b."""
        self._pack()
        self.select(torch.arange(len(self.ids)).repeat_interleave(W))

    def forward_beams(self, tokens: torch.Tensor) -> torch.Tensor:
        """One step of every beam of every row: tokens (B*W,) -> logits (B*W, V). Each beam's ``ids`` follow
        it through :meth:`select`, so selecting the best beam's row leaves that row holding its tokens."""
        return self.forward([[int(t)] for t in tokens.tolist()])[:, -1]

    def keep_beams(self, rows: list[int], tokens: list[list[int]]) -> None:
        """Keep beam ``rows[b]`` for row b (batch positions); its ``ids`` already hold ``tokens[b]``."""
        self.select(torch.tensor(rows, dtype=torch.long))


class One:
    """One prompt's :class:`Session` seen through the interface of :class:`Rows` (a batch of one row), so that
    a decoder's loop is written once, over rows. A batch of one keeps the one-prompt cache: no padding, no 2D
    mask and no explicit positions, so its forwards are the one-prompt forwards and a seed gives the same tokens
    as before the loops were merged; feature drafts (:meth:`Session.link`) and tree nodes live here too."""

    def __init__(self, session: Session):
        self.session = session
        self.row = [0]  # batch position -> caller's row

    @property
    def ids(self) -> list[list[int]]:
        return [self.session.ids]

    def __len__(self) -> int:
        return len(self.session)

    def forward(self, new: list[list[int]], keep: int = 1) -> torch.Tensor:
        """:meth:`Rows.forward` for one row: logits (1, keep, V)."""
        return self.session.forward(new[0], keep)[None]

    def sync(self, tokens: list[list[int]]) -> list[list[int]]:
        """Roll back to the committed text ``tokens[0]``; the pending tokens, as one row."""
        self.session.sync(tokens[0])
        return [tokens[0][len(self.session.ids):]]

    def keep(self, positions: list[int]) -> None:
        assert positions == [0], "a batch of one ends when its row stops"

    def expand(self, W: int) -> None:
        self.session.expand(W)

    def select(self, rows: torch.Tensor) -> None:
        self.session.select(rows)

    def forward_beams(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.session.forward_beams(tokens)  # (W, V)

    def keep_beams(self, rows: list[int], tokens: list[list[int]]) -> None:
        """Keep beam ``rows[0]``, which holds ``tokens[0]`` beyond the committed ids (:meth:`Session.collapse`)."""
        self.session.collapse(rows[0], tokens[0])

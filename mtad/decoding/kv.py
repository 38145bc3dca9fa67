"""The only module that touches the transformers KV-cache API (STYLE.md, "State").

A :class:`Session` is one model's cache for one ``generate`` call, over the B rows of its batch (one prompt is a
batch of one). Each batch position ``i`` (a prompt, or one beam of a prompt) holds

* a *linear* part: tokens ``ids[i]`` at positions ``0..len(ids[i])-1`` (the committed context), then
* optionally *tree* nodes appended by :meth:`Session.forward_tree`; each node knows its parent's index and
  attends to the linear part and its own ancestors through a 4D mask with explicit ``position_ids`` (the
  model's own attention; no patched modeling code).

Indices are *per row*: index ``j`` of position i is its j-th entry (linear tokens first, then tree nodes in the
order they were added), whatever cache slot holds it. Layout: rows are *left-padded and right-aligned*; between
forwards row i's entries fill slots ``[C - junk[i] - n_i, C - junk[i])`` of the C cache slots, where ``n_i`` is
its entry count and ``junk[i]`` the trailing slots it no longer uses (the pads after a shorter block, a rejected
tail). Every slot outside a row's entries is hidden by the attention mask. A forward takes a ragged block, one
list of new ids per row, *right*-padded to the longest: a row's real tokens come first, so causality alone hides
the pads after them, and no real token ever has a hole between it and its row's earlier keys (slot distance =
position distance, which the model's own sliding-window mask relies on). Each token gets its row's own position,
never its slot. Before a forward, :meth:`Session._pack` removes the junk: a crop when every row drops the same
tail (``DynamicCache.crop`` takes a negative count of tokens to drop and cuts every row alike), else one gather
per layer that moves each row's entries back to the right edge. A batch of one never has padding, so its
forwards take no 2D mask and no explicit positions: they are the plain one-prompt forwards.

Operations: crop/rollback (:meth:`sync`), finished rows leaving (:meth:`keep`), beam expand/reorder
(:meth:`expand`, :meth:`select`, :meth:`keep_beams`: beams live in the batch dimension, any number per row) and
tree-path compaction (:meth:`keep_path`, one path per row). Forwards are counted in each row's own
:class:`Stats`; the forward time is shared out equally among the rows in the call (:meth:`_count`).
Transformers 5.x notes: the forward kwarg is ``cache`` (the old ``past_key_values`` is deprecated) and
``DynamicCache.crop`` takes a negative count of tokens to drop.

Sliding-window attention (Mistral; Gemma 3 and Qwen2/3 mix sliding and full layers): every layer of the
session's cache is a *full-length* ``DynamicLayer``, and the window lives in the attention mask alone.
``DynamicCache(config=...)`` would give sliding layers a ``DynamicSlidingWindowLayer``, which keeps only the
last ``W - 1`` tokens: past the window it cannot roll back (the dropped tokens are gone; ``crop`` raises),
and tree nodes take cache slots that evict linear tokens a deeper node still sees. Its
``activate_past_recording`` keeps the past only until the next crop and hands the forward only the last
``W - 1 + S`` keys, which again loses linear tokens once an earlier tree call holds slots. With full-length
layers every cache slot is a position's key, so crop, beam reorder and path compaction are the same for all
layers; linear forwards get the model's own sliding mask (transformers' mask functions use absolute key
indices, offset 0 for a full-length layer), tree forwards one mask per layer type (:meth:`Session._tree_mask`).
Cost: a sliding layer's cache grows with the context like a full layer's (memory and attention over ``L``
keys, masked to ``W``).

Feature drafts (:mod:`mtad.models.feature_draft`): :meth:`Session.link` makes a draft session read the target
session's final hidden states. Both then keep one hidden state per cache slot (``feats``, per row), carried
through every crop, reorder, gather and path compaction like the keys and values; each new draft token gets its
parent's feature, the target's where the target computed the same text for that row, else the draft's own.
"""
from __future__ import annotations

import math
import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from mtad.decoding.attention import mask_windows
from mtad.decoding.result import Stats


def full_length_cache(config) -> DynamicCache:
    """``DynamicCache(config=...)`` with every sliding-window layer replaced by a full-length one (module
    docstring: rollback and tree nodes need every past key)."""
    cache = DynamicCache(config=config)
    cache.layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer for layer in cache.layers]
    return cache


def _finite(x: torch.Tensor) -> bool:
    """No NaN or inf in ``x``. A NaN or inf makes the sum non-finite, so one sum (a few µs) clears the common case;
    ``isfinite().all()`` (tens of µs on a CPU vocabulary row) decides only when the sum overflowed."""
    return math.isfinite(x.detach().sum().item()) or bool(torch.isfinite(x).all())


class NonFiniteLogits(ValueError):
    """A model returned NaN/inf logits: ``role`` (target/draft), its forward count and cache length."""

    def __init__(self, role: str, forward: int, length: int):
        super().__init__(f"the {role} model returned NaN/inf logits at decoding step {forward} (its forward "
                         f"{forward} on this prompt, {length} tokens cached): check the {role} weights for NaN/inf "
                         "or use a wider dtype (float16 overflows: try bfloat16 or float32)")



class Session:
    """One model + its KV cache for the rows of one decode (module docstring). ``role`` is 'target' or 'draft'
    (for forward counts); ``stats[r]`` is the :class:`Stats` of the caller's row r, and ``row[i]`` the caller's
    row at batch position i (beams of one row share it).

    Devices: inputs go to ``device`` (the input embedding's); logits come back on ``out_device``, the
    call's *decode device* (:class:`mtad.decoding.core.Batch`), whatever device the model's last layer is on
    (a target sharded by ``device_map`` emits logits on its last GPU). None leaves them where they are."""

    def __init__(self, model, stats: list[Stats], role: str, out_device: torch.device | None = None):
        self.model, self.stats, self.role = model, stats, role
        self.cache = full_length_cache(model.config)
        self.windows: dict | None = None  # layer type -> window of its tree mask (set by the first tree call)
        kinds = {type(layer).__name__ for layer in self.cache.layers} - {"DynamicLayer"}
        self._surgery_error = (f"{role} model (architecture '{model.config.model_type}'): its cache layers "
                               f"{sorted(kinds)} hold no per-token keys to crop or compact") if kinds else ""
        self.device = model.get_input_embeddings().weight.device
        self.out_device = out_device
        B = len(stats)
        self.row: list[int] = list(range(B))  # batch position -> caller's row
        self.ids: list[list[int]] = [[] for _ in range(B)]  # per position: its linear part
        self.junk: list[int] = [0] * B  # per position: trailing slots to drop before the next forward
        self.node_parent: list[list[int]] = [[] for _ in range(B)]  # per position, tree nodes: parent index
        self.node_pos: list[list[int]] = [[] for _ in range(B)]  # per position, tree nodes: position id
        self._anc = [torch.zeros(0, 0, dtype=torch.bool) for _ in range(B)]  # (N, N) ancestor-or-self per position
        self._stable = [0] * B  # ids[i][:_stable[i]] are known to be committed
        # feature drafts (mtad.models.feature_draft): final hidden state per cache slot, and the linked source
        self.feats: torch.Tensor | None = None  # (B, C, D) when keep_feats
        self.keep_feats = False
        self.source: "Session | None" = None  # the target session whose features this draft reads
        self._exact: list[int] | None = None  # ids[i][:_exact[i]] were computed from source features
        self._beams: list[int] | None = None  # while beams grow (expand .. keep_beams): each one's committed length

    def __len__(self) -> int:
        """Cache slots (padding included)."""
        return self.cache.get_seq_length()

    def size(self, i: int) -> int:
        """Entries of batch position i: its linear part and tree nodes (the next node's index)."""
        return len(self.ids[i]) + len(self.node_parent[i])

    def _base(self, i: int) -> int:
        """The cache slot of position i's entry 0 (module docstring: entry j is in slot ``_base(i) + j``)."""
        return len(self) - self.junk[i] - self.size(i)

    def link(self, source: "Session") -> None:
        """Make this (feature draft) session read ``source``'s final hidden states (mtad.models.feature_draft)."""
        self.source, self.keep_feats, self._exact = source, True, [0] * len(self.ids)
        source.keep_feats = True  # a Session (or mtad.models.feature_draft.ZeroSource when timing the draft alone)

    # ---- forwards -------------------------------------------------------------------------------
    def forward(self, new: list[list[int]], keep: int = 1) -> torch.Tensor:
        """Append ``new[i]`` to position i's linear part; logits (B, keep, V) *right-aligned per row*:
        ``[i, keep - k:]`` are the logits of row i's last k new tokens for any k <= len(new[i]) (``keep=0``: all).
        A row may get no tokens (a feature draft's source feeding some rows only); its logits mean nothing."""
        assert len(new) == len(self.ids) and not any(self.node_parent), "one block per row, on a linear cache"
        if self.source is not None and self._beams is None:
            self._fill_source(new)
        self._pack()
        n = [len(b) for b in new]
        B, S, C = len(new), max(n), len(self)
        L = [len(ids) for ids in self.ids]
        x = torch.tensor([b + [b[-1] if b else 0] * (S - len(b)) for b in new], dtype=torch.long)  # (B, S)
        kw = {}
        if min(L) < C:  # a left-padded row: hide its pads, give every token its row's own position
            lengths = torch.tensor(L)  # (B,)
            visible = torch.arange(C + S)[None, :] >= C - lengths[:, None]  # (B, C+S): pads of the block stay
            kw = dict(attention_mask=visible.long().to(self.device),  # visible (to themselves only, by causality)
                      position_ids=self._positions(lengths, S).to(self.device))
        feats, valid = None, None
        if self.source is not None:
            texts = [ids + b for ids, b in zip(self.ids, new)]
            valid = [self._valid(i, t) for i, t in enumerate(texts)]
            parents = [[L[i] - 1 + k if k < n[i] else -1 for k in range(S)] for i in range(B)]  # pads: no parent
            feats = self._features(parents, valid)  # (B, S, D)
        logits = self._run(x, n, keep, "seq", feats, **kw)  # (B, keep, V)
        for i, b in enumerate(new):
            if valid is not None and self._beams is None and b and self._exact[i] == L[i] \
                    and L[i] + len(b) - 2 < valid[i]:  # every parent's feature was the source's
                self._exact[i] = L[i] + len(b)
            self.ids[i].extend(b)
            self.junk[i] += S - len(b)
        return logits

    def _positions(self, lengths: torch.Tensor, S: int) -> torch.Tensor:
        """(B, S) position ids of a block: row i's tokens continue its own length ``lengths[i]``."""
        return lengths[:, None] + torch.arange(S)[None, :]  # (B, S)

    def forward_beams(self, tokens: torch.Tensor) -> torch.Tensor:
        """One step of every beam (batch position, :meth:`expand`): tokens (n,) -> logits (n, V). Each beam's
        ``ids`` follow it through :meth:`select`, so the beam kept by :meth:`keep_beams` holds its tokens."""
        return self.forward([[int(t)] for t in tokens.tolist()])[:, -1]  # (n, V)

    def forward_tree(self, tokens: list[list[int]], parents: list[list[int]], keep: int = 0) -> torch.Tensor:
        """Append tree nodes to every row; ``parents[i][k]`` is the index of the parent of row i's node k: the
        last linear token, an earlier tree node, or an earlier node of this call (so pending tokens can travel as
        a chain). A row may get no nodes. Sliding-window layers get their own mask (:meth:`_tree_mask`). Logits
        (B, keep, V), right-aligned per row as in :meth:`forward` (``keep=0``: all)."""
        self._pack()
        m = [len(t) for t in tokens]
        B, S, C = len(tokens), max(m), len(self)
        feats = None
        if self.source is not None:
            assert all(not ps or max(ps) < self.size(i) for i, ps in enumerate(parents)), \
                "a feature draft's tree nodes hang off earlier calls"
            valid = [self._valid(i, ids) for i, ids in enumerate(self.ids)]
            feats = self._features([ps + [-1] * (S - len(ps)) for ps in parents], valid)  # (B, S, D), pads: 0
        visible = torch.zeros(B, S, C + S, dtype=torch.bool)  # (B, S, C+S) True = attend
        pos = torch.zeros(B, S, dtype=torch.long)  # (B, S)
        key_pos = torch.zeros(B, C + S, dtype=torch.long)  # (B, C+S) position of each slot's key
        for i in range(B):
            P, L, k = len(self.ids[i]), self.size(i), m[i]
            base = C - L
            new_pos, anc = self._extend_tree(i, parents[i])  # anc (N, N) over row i's nodes
            visible[i, :k, base:base + P] = True
            visible[i, :k, base + P:C + k] = anc[L - P:]
            visible[i, torch.arange(k, S), torch.arange(C + k, C + S)] = True  # a pad sees itself only
            pos[i, :k] = torch.tensor(new_pos, dtype=torch.long)
            key_pos[i, base:C + k] = torch.tensor(list(range(P)) + self.node_pos[i], dtype=torch.long)
        x = torch.tensor([t + [0] * (S - len(t)) for t in tokens], dtype=torch.long)  # (B, S)
        logits = self._run(x, m, keep, "tree", feats, attention_mask=self._tree_mask(visible, pos, key_pos),
                           position_ids=pos.to(self.device))  # (B, keep, V)
        for i in range(B):
            self.junk[i] += S - m[i]
        return logits

    def _run(self, x: torch.Tensor, n: list[int], keep: int, kind: str, feats: torch.Tensor | None,
             **kw) -> torch.Tensor:
        """One model forward of the block x (B, S), row i's first n[i] tokens real; logits of each row's last
        ``keep`` real tokens, right-aligned (B, keep, V), on the decode device."""
        B, S = x.shape
        keep = min(keep or S, S)
        need = min(S, max(keep + S - k for k in n))  # logits from the first block position any row needs
        t0, c0 = time.perf_counter(), time.process_time()
        if feats is not None:
            kw["features"] = feats  # (B, S, D)
        if self.keep_feats:
            kw["output_hidden_states"] = True
        kept = torch.arange(S - need, S, device=self.device) if need < S else need  # an index: the head then
        out = self.model(input_ids=x.to(self.device), cache=self.cache, use_cache=True,  # reads a fresh tensor,
                         logits_to_keep=kept, **kw)  # not a strided view (a bf16 CPU matmul copies the head)
        if self.keep_feats:
            h = out.hidden_states[-1]  # (B, S, D): the final hidden state (after the last norm)
            self.feats = h if self.feats is None else torch.cat([self.feats, h], 1)
        self._count(time.perf_counter() - t0, kind, B, S, n, time.process_time() - c0)
        logits = out.logits.float()  # (B, need, V): block positions S - need .. S - 1
        if min(n) < S:
            cols = (torch.tensor(n)[:, None] - keep + torch.arange(keep)[None, :] - (S - need)).clamp(min=0)
            logits = logits.gather(1, cols.to(logits.device)[:, :, None].expand(-1, -1, logits.shape[-1]))
        real = [i for i, k in enumerate(n) if k]
        if not _finite(logits if len(real) == B else logits[real]):  # every decoder's logits pass here
            first = self.stats[self.row[real[0]]]
            raise NonFiniteLogits(self.role, getattr(first, f"{self.role}_forwards"), len(self))
        return logits if self.out_device is None else logits.to(self.out_device)  # (B, keep, V)

    def _count(self, seconds: float, kind: str, B: int, S: int, n: list[int], cpu_s: float = 0.0) -> None:
        """Every row with tokens in the call counts one forward and an equal share of its time; the call's shape
        (``<role>:<seq|tree>:<B>x<S>``, B with beams) is counted once, in its first row's ``calls``, so that
        summing ``calls`` over the rows gives the batch's forwards (:mod:`mtad.measure.costmodel`)."""
        if len(n) == 1:  # one position: its row (the common batch of one, without a set and a sort)
            rows = self.row
        else:
            rows = sorted({self.row[i] for i, k in enumerate(n) if k})  # beams of one row count once
        for r in rows:
            st = self.stats[r]
            st.forward_time_s += seconds / len(rows)
            if self.role == "target":
                st.target_forwards += 1
            else:
                st.draft_forwards += 1
        self.stats[rows[0]].count_call(self.role, kind, B, S, cpu_s)

    # ---- feature drafts (mtad.models.feature_draft) ---------------------------------------------------------
    def _valid(self, i: int, text: list[int]) -> int:
        """How many leading tokens of position i's ``text`` its row in the source shares (its features hold
        there). A beam is checked on its committed text only."""
        if self._beams is not None:
            text = text[:self._beams[i]]
        a, b = text, self.source.ids[self.source.row.index(self.row[i])]
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        k = 0
        while a[k] == b[k]:
            k += 1
        return k

    def _fill_source(self, new: list[list[int]]) -> None:
        """A multi-token linear forward feeds committed text (:meth:`sync`'s pending tokens): the parents of its
        tokens that the source has not computed (the prompt, in the first block) are fed to the source first,
        for the rows that feed several tokens."""
        src = self.source
        texts = {src.row.index(self.row[i]): ids + b for i, (ids, b) in enumerate(zip(self.ids, new)) if len(b) > 1}
        if not texts:
            return
        # the source keeps each such row's longest prefix shared with the text, minus one; other rows stay
        src.sync([texts.get(j, ids + [-1]) for j, ids in enumerate(src.ids)])
        missing = [texts[j][len(ids):len(texts[j]) - 1] if j in texts else [] for j, ids in enumerate(src.ids)]
        if any(missing):
            src.forward(missing)

    def _features(self, parents: list[list[int]], valid: list[int]) -> torch.Tensor:
        """(B, S, D): for each new token, the source's feature at its parent index when the source computed that
        position for the same text (``valid[i]``), else this session's own output there (zeros before index 0)."""
        src = self.source
        B, S, D = len(parents), len(parents[0]), self.model.config.hidden_size
        own = ([], [], [], [])  # out row, out column, feats row, feats slot
        theirs = ([], [], [], [])
        for i, ps in enumerate(parents):
            j = src.row.index(self.row[i])
            for k, p in enumerate(ps):
                if 0 <= p < valid[i]:
                    for lst, v in zip(theirs, (i, k, j, src._base(j) + p)):
                        lst.append(v)
                elif p >= 0:
                    for lst, v in zip(own, (i, k, i, self._base(i) + p)):
                        lst.append(v)
        ref = src.feats if src.feats is not None else self.feats
        out = torch.zeros(B, S, D, device=self.device, dtype=torch.float32 if ref is None else ref.dtype)
        if theirs[0]:
            out[theirs[0], theirs[1]] = src.feats[theirs[2], theirs[3]].to(self.device, out.dtype)
        if own[0]:
            out[own[0], own[1]] = self.feats[own[2], own[3]].to(out.dtype)
        return out  # (B, S, D)

    # ---- trees ----------------------------------------------------------------------------------
    def _tree_mask(self, visible: torch.Tensor, pos: torch.Tensor, key_pos: torch.Tensor):
        """Float 4D mask(s) from ``visible`` (B, S, C+S) for queries at positions ``pos`` (B, S), keys at
        ``key_pos`` (B, C+S): one tensor, or a dict layer type -> mask; a sliding layer also hides keys ``W`` or
        more positions back (a node's position, not its slot, counts: its ancestors are near, the linear part far)."""
        dtype = self.model.get_input_embeddings().weight.dtype
        if self.windows is None:
            self.windows = mask_windows(self.model.config)

        def to4d(w):  # window or None -> (B, 1, S, C+S) additive float mask
            m = visible if w is None else visible & (pos[:, :, None] - key_pos[:, None, :] < w)
            return torch.zeros(m.shape[0], 1, *m.shape[1:], dtype=dtype).masked_fill_(
                ~m[:, None], torch.finfo(dtype).min).to(self.device)

        masks = {w: to4d(w) for w in set(self.windows.values())}
        if None in self.windows:
            return masks[self.windows[None]]
        return {t: masks[w] for t, w in self.windows.items()}

    def _extend_tree(self, i: int, parents: list[int]) -> tuple[list[int], torch.Tensor]:
        """Add nodes with ``parents`` to position i: their positions and i's ancestor-or-self matrix (N, N)."""
        P, N0 = len(self.ids[i]), len(self.node_parent[i])
        N = N0 + len(parents)
        anc = torch.zeros(N, N, dtype=torch.bool)  # (N, N)
        anc[:N0, :N0] = self._anc[i]
        pos = []
        for k, parent in enumerate(parents, start=N0):
            if parent >= P:  # parent is a tree node: inherit its ancestors
                anc[k] = anc[parent - P]
                pos.append(self.node_pos[i][parent - P] + 1)
            else:
                assert parent == P - 1, "a tree root must hang off the last linear token"
                pos.append(P)
            anc[k, k] = True
            self.node_parent[i].append(parent)
            self.node_pos[i].append(pos[-1])
        self._anc[i] = anc
        return pos, anc

    # ---- cache surgery ---------------------------------------------------------------------------
    def sync(self, tokens: list[list[int]]) -> list[list[int]]:
        """Roll each row back to its longest prefix shared with ``tokens[i]`` (its committed text) and return
        each row's pending tokens. Committed text only grows, so the scan starts where the last sync stopped.
        The last committed token is always left out, so the next forward has at least one token to produce
        logits from (a resampled token can equal the draft token the cache already holds)."""
        assert not any(self.node_parent), "a rollback on a cache holding tree nodes"
        pending = []
        for i, (ids, text) in enumerate(zip(self.ids, tokens)):
            n = min(len(ids), len(text) - 1)
            if self._exact is not None:  # a feature draft re-feeds tokens it computed from its own features
                n = min(n, self._exact[i])
            k = min(self._stable[i], n)
            while k < n and ids[k] == text[k]:
                k += 1
            self.junk[i] += len(ids) - k  # the rejected tail: outside the row's entries now, dropped by _pack
            del ids[k:]
            self._stable[i] = k
            if self._exact is not None:
                self._exact[i] = min(self._exact[i], k)
            pending.append(text[k:])
        self._pack()
        return pending

    def _pack(self) -> None:
        """Drop every row's junk and the padding columns no row needs: row i's entries end at the last slot."""
        C = len(self)
        sizes = [self.size(i) for i in range(len(self.ids))]
        if any(self.junk):
            self._check_surgery("roll back")
        if C == 0 or not any(self.junk) and C == max(sizes):
            return
        W, drop = max(sizes), self.junk[0]
        if min(self.junk) == max(self.junk) and C - drop == W:  # every row drops the same tail: crop
            self._crop(drop)
        else:
            junk = torch.tensor(self.junk)  # (B,)
            self._gather((torch.arange(W)[None, :] - W + C - junk[:, None]).clamp(min=0))  # (B, W) old slots
        self.junk = [0] * len(self.junk)

    def _crop(self, drop: int) -> None:
        """Drop the last ``drop`` slots of every row."""
        self.cache.crop(-drop)  # transformers 5.x: a negative count of tokens to remove
        if self.feats is not None:
            self.feats = self.feats[:, :-drop]

    def _gather(self, src: torch.Tensor) -> None:
        """New slot t of position i is old slot ``src[i, t]`` (B, C'), in every layer and in ``feats``."""
        for layer in self.cache.layers:
            if layer.is_initialized and layer.keys.numel():  # a sharded model's layers sit on different GPUs
                idx = src.to(layer.keys.device)[:, None, :, None]  # (B, 1, C', 1)
                layer.keys = layer.keys.gather(2, idx.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1]))
                layer.values = layer.values.gather(2, idx.expand(-1, layer.values.shape[1], -1,
                                                                 layer.values.shape[-1]))  # (B, H, C', D)
        if self.feats is not None:
            idx = src.to(self.feats.device)[:, :, None]  # (B, C', 1)
            self.feats = self.feats.gather(1, idx.expand(-1, -1, self.feats.shape[-1]))  # (B, C', D)

    def _check_surgery(self, what: str) -> None:
        if self._surgery_error:
            raise ValueError(f"cannot {what} the KV cache of the {self._surgery_error}; "
                             "use decoder=greedy or sampling for this model")

    def keep_path(self, nodes: list[list[int]]) -> None:
        """Tree-path compaction: each position keeps its linear part plus its tree nodes ``nodes[i]`` (indices,
        root to leaf, each the parent of the next), which become linear; every other tree node is dropped."""
        self._check_surgery("compact")
        if len(self.ids) == 1 and self._base(0) == 0:  # a batch of one: only the tail moves
            self._compact_tail(len(self.ids[0]), nodes[0])
        elif len(self):
            keep = [torch.cat([torch.arange(len(ids)), torch.tensor(path, dtype=torch.long)]) + self._base(i)
                    for i, (ids, path) in enumerate(zip(self.ids, nodes))]
            W = max(len(k) for k in keep)
            self._gather(torch.stack([torch.cat([torch.zeros(W - len(k), dtype=torch.long), k]) for k in keep]))
        for i in range(len(self.ids)):
            self.node_parent[i], self.node_pos[i] = [], []
            self._anc[i] = torch.zeros(0, 0, dtype=torch.bool)
        self.junk = [0] * len(self.junk)

    def _compact_tail(self, P: int, path: list[int]) -> None:
        """:meth:`keep_path` of a batch of one whose entries start at slot 0: the path's slots are copied behind the
        linear part, the rest cropped; the linear part is not copied (a gather would copy every layer's cache)."""
        src, m = torch.tensor(path, dtype=torch.long), len(path)
        if m:
            for layer in self.cache.layers:
                if layer.is_initialized and layer.keys.numel():
                    idx = src.to(layer.keys.device)
                    layer.keys[:, :, P:P + m] = layer.keys.index_select(2, idx)  # (1, H, m, D)
                    layer.values[:, :, P:P + m] = layer.values.index_select(2, idx)
            if self.feats is not None:
                self.feats[:, P:P + m] = self.feats.index_select(1, src.to(self.feats.device))  # (1, m, D)
        if len(self) > P + m:
            self._crop(len(self) - P - m)

    def commit_path(self, nodes: list[list[int]], tokens: list[list[int]]) -> None:
        """:meth:`keep_path` and record the kept nodes' ``tokens`` as linear ids, per position."""
        self.keep_path(nodes)
        for ids, t in zip(self.ids, tokens):
            ids.extend(t)

    def keep(self, positions: list[int]) -> None:
        """Keep only the batch ``positions`` (finished rows leave the batch)."""
        if positions != list(range(len(self.ids))):
            self.select(torch.tensor(positions, dtype=torch.long))

    def select(self, rows: torch.Tensor) -> None:
        """Position b of the new batch is old position ``rows[b]`` (finished rows dropped, beams reordered)."""
        rows_l = rows.tolist()
        if len(self):
            self.cache.reorder_cache(rows.to(self.device))
        if self.feats is not None:
            self.feats = self.feats.index_select(0, rows.to(self.feats.device))
        for name in ("ids", "node_parent", "node_pos"):  # a position kept twice: its later copies get new lists
            old, seen = getattr(self, name), set()
            setattr(self, name, [old[i] if i not in seen and not seen.add(i) else list(old[i]) for i in rows_l])
        for name in ("row", "junk", "_stable", "_anc", "_exact", "_beams"):
            old = getattr(self, name)
            if old is not None:
                setattr(self, name, [old[i] for i in rows_l])

    def expand(self, W: int | list[int]) -> None:
        """Replicate every position into beams, ``W`` each (or ``W[i]`` for position i): position i's beams
        are consecutive. Beams grow with :meth:`forward_beams` until :meth:`keep_beams`."""
        self._pack()
        counts = torch.tensor([W] * len(self.ids) if isinstance(W, int) else W)
        self.select(torch.arange(len(self.ids)).repeat_interleave(counts))
        self._beams = [len(ids) for ids in self.ids]

    def keep_beams(self, positions: list[int]) -> None:
        """Keep one beam per row (batch ``positions``); its ``ids`` already hold the beam's fed tokens."""
        self.select(torch.tensor(positions, dtype=torch.long))
        self._beams = None

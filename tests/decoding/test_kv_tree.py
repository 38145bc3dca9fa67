"""The KV-cache owner :class:`mtad.decoding.kv.Session` against cache-free forwards of the same text.

Tolerance: every logit within 1e-4 (absolute) of the cache-free logits (float32 models; the observed
difference is at most 4e-6). Negative controls: a leaky tree mask (siblings visible) and wrong position ids are
caught by the same comparison.
"""
from __future__ import annotations

import pytest
import tinymodels as tm
import torch

from mtad.decoding import attention
from mtad.decoding.kv import Session, Stats

torch.set_num_threads(1)
ATOL = 1e-4
PREFIX = [3, 9, 14, 2, 27, 8]  # 4 tokens go in the linear cache, the last 2 travel as a pending chain
CASES = [(a, i) for a in ("llama", "opt") for i in ("sdpa", "eager")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{i}" for a, i in CASES])
def model(request):
    arch, attn = request.param
    return tm.model(arch, 1, 32, hidden=16, attn=attn)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) < ATOL


def alone(m, ids: list[int]) -> torch.Tensor:
    return tm.logits_alone(m, ids)[-1]  # (V,)


def build_tree(m) -> tuple[Session, tm.Tree, dict[int, torch.Tensor]]:
    """Linear cache PREFIX[:4]; one tree call with the pending chain PREFIX[4:] and 2 levels below it;
    a second call adding a third level under existing nodes (as beam steps do)."""
    s = Session(m, [Stats()], "target")
    s.forward([PREFIX[:4]])
    tree = tm.Tree(s, PREFIX[:4])
    # cache indices: 4, 5 = pending chain; 6, 7, 8 children of 5; 9, 10 children of 6; 11 child of 8
    out = tree.add(PREFIX[4:] + [1, 5, 1, 30, 7, 7], [3, 4, 5, 5, 5, 6, 6, 8])
    out.update(tree.add([2, 2, 17], [9, 11, 11]))  # 12 under 9, 13 and 14 under 11
    return s, tree, out


@torch.no_grad()
def test_tree_node_logits_equal_the_path_alone(model):
    _, tree, out = build_tree(model)
    assert len(out) == 11
    for idx, logits in out.items():
        assert close(logits, alone(model, PREFIX[:4] + tree.paths[idx])), idx


@torch.no_grad()
def test_leaky_mask_is_caught(model, monkeypatch):
    """Negative control: if nodes also saw their siblings/cousins, the comparison above fails."""
    orig = Session._extend_tree

    def leaky(self, i, parents):
        pos, anc = orig(self, i, parents)
        return pos, torch.ones_like(anc)

    monkeypatch.setattr(Session, "_extend_tree", leaky)
    _, tree, out = build_tree(model)
    assert sum(not close(logits, alone(model, PREFIX[:4] + tree.paths[i])) for i, logits in out.items()) >= 5


@torch.no_grad()
def test_wrong_positions_are_caught(model, monkeypatch):
    """Negative control: position ids off by one (ignored by neither llama's rotary nor OPT's learned
    positions) break the comparison."""
    orig = Session._extend_tree

    def shifted(self, i, parents):
        pos, anc = orig(self, i, parents)
        return [p + 1 for p in pos], anc

    monkeypatch.setattr(Session, "_extend_tree", shifted)
    _, tree, out = build_tree(model)
    assert not all(close(logits, alone(model, PREFIX[:4] + tree.paths[i])) for i, logits in out.items())


@torch.no_grad()
def test_keep_path_then_linear_forward(model):
    """Compaction to the path 4 -> 5 -> 8 -> 11 -> 14 (tokens 27 8 | 1 7 17), then a linear forward."""
    s, tree, _ = build_tree(model)
    path = [4, 5, 8, 11, 14]
    s.commit_path([path], [tree.paths[14]])
    text = PREFIX[:4] + tree.paths[14]
    assert s.ids[0] == text and len(s) == len(text) and s.cache.get_seq_length() == len(text)
    assert close(s.forward([[11]], keep=1)[0][-1], alone(model, text + [11]))
    # and a second tree round on the compacted cache
    s2 = tm.Tree(s, s.ids[0])
    out = s2.add([4, 6, 6], [len(text), len(text), len(text) + 1])
    for idx, logits in out.items():
        assert close(logits, alone(model, text + [11] + s2.paths[idx]))


@torch.no_grad()
def test_keep_path_without_pending_chain(model):
    """A tree hanging directly off the linear cache, compacted to a depth-1 node."""
    s = Session(model, [Stats()], "target")
    s.forward([PREFIX])
    s.forward_tree([[5, 6, 7]], [[5, 5, 7]])
    s.commit_path([[7]], [[6]])
    assert close(s.forward([[9]])[0][-1], alone(model, PREFIX + [6, 9]))


@torch.no_grad()
def test_sync_crops_to_the_committed_text(model):
    s = Session(model, [Stats()], "target")
    s.forward([PREFIX + [1, 2, 3, 4]])
    committed = PREFIX + [1, 20]  # diverges after PREFIX + [1]
    s.sync([committed])
    assert s.ids[0] == PREFIX + [1] and s.cache.get_seq_length() == len(PREFIX) + 1
    pending = committed[len(s.ids[0]):]
    assert close(s.forward([pending])[0][-1], alone(model, committed))
    # syncing to the same text leaves the last token pending (a next forward always has input)
    s.sync([committed])
    assert committed[len(s.ids[0]):] == [20]
    assert close(s.forward([[20]])[0][-1], alone(model, committed))
    # growing text: nothing is cropped
    s.sync([committed + [5, 6]])
    assert s.ids[0] == committed
    assert close(s.forward([[5, 6]], keep=2)[0][0], alone(model, committed + [5]))


@torch.no_grad()
def test_beams_expand_select_collapse(model):
    """Beams in the batch dimension: every row's logits equal its own text alone, through a reorder."""
    s = Session(model, [Stats()], "draft")
    s.forward([PREFIX])
    s.expand(3)
    t1 = torch.tensor([4, 12, 19])
    out = s.forward_beams(t1)  # (W, V)
    for b in range(3):
        assert close(out[b], alone(model, PREFIX + [int(t1[b])]))
    parent, t2 = torch.tensor([2, 0, 2]), torch.tensor([1, 1, 30])
    s.select(parent)
    out = s.forward_beams(t2)
    beams = [PREFIX + [int(t1[parent[b]]), int(t2[b])] for b in range(3)]
    for b in range(3):
        assert close(out[b], alone(model, beams[b]))
    s.keep_beams([2])
    assert len(s.ids) == 1 and s.ids[0] == beams[2]
    s.sync([beams[2] + [9]])
    assert close(s.forward([[9]])[0][-1], alone(model, beams[2] + [9]))
    # negative control: a wrong reorder is caught
    s2 = Session(model, [Stats()], "draft")
    s2.forward([PREFIX])
    s2.expand(3)
    s2.forward_beams(t1)
    s2.select(torch.tensor([0, 0, 0]))
    assert not close(s2.forward_beams(t2)[2], alone(model, beams[2]))


@torch.no_grad()
def test_forward_counts_and_time():
    m = tm.model("llama", 1, 32, hidden=16)
    st = Stats()
    t, d = Session(m, [st], "target"), Session(m, [st], "draft")
    t.forward([PREFIX])
    d.forward([PREFIX])
    d.forward_tree([[1, 2]], [[5, 5]])
    assert (st.target_forwards, st.draft_forwards) == (1, 2) and st.forward_time_s > 0


def test_tree_architectures_listed():
    assert {"llama", "opt"} <= attention.TREE_ARCHITECTURES


@torch.no_grad()
def test_kept_logits_reach_the_head_as_a_fresh_tensor(model):
    """A linear forward that keeps fewer positions than it feeds hands the head a (1, keep, D) tensor with the
    strides of a new one (a strided view makes a bf16 CPU matmul copy the whole head: 3x a 5-token step),
    and the kept logits equal the last rows of keep=0. Control: HF's own int slicing gives the strided view."""
    seen = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda mod, args: seen.append(args[0].stride()))
    try:
        s = Session(model, [Stats()], "target")
        s.forward([PREFIX[:2]])
        kept = s.forward([PREFIX[2:]], keep=2)[0]  # (2, V)
        D = model.config.hidden_size
        assert seen[-1] == (2 * D, D, 1)
        full = Session(model, [Stats()], "target")
        full.forward([PREFIX[:2]])
        assert close(kept, full.forward([PREFIX[2:]], keep=0)[0][-2:])
        model(input_ids=torch.tensor([PREFIX]), logits_to_keep=2)
        assert seen[-1] == (len(PREFIX) * D, D, 1)  # the control: an int keeps a view of the whole row
    finally:
        hook.remove()


# ---- several rows: per-row tree masks, paths, beams ---------------------------------------------------------
ROW_PREFIXES = [PREFIX[:4], [7, 1], [5, 5, 6, 2, 9, 30, 4]]  # different lengths: the shorter rows are left-padded


def build_rows(m) -> tuple[Session, list[dict[int, list[int]]], list[dict[int, torch.Tensor]], list[dict[int, int]]]:
    """Three rows of different lengths, each with its own tree in one call (different node counts, so the shorter
    trees are right-padded) and a second call that adds nodes to two rows only. Returns the session, each row's
    node index -> path after its prefix, each row's node logits and each row's node index -> parent index."""
    s = Session(m, [Stats(), Stats(), Stats()], "target")
    s.forward(ROW_PREFIXES)
    P = [len(p) for p in ROW_PREFIXES]
    calls = [([[1, 5, 1, 30], [4], [2, 8, 8]], [[P[0] - 1, P[0], P[0], P[0] + 1], [P[1] - 1], [P[2] - 1] * 3]),
             ([[7, 7], [], [3]], [[P[0] + 1, P[0] + 3], [], [P[2] + 2]])]
    paths, out, up = [{} for _ in P], [{} for _ in P], [{} for _ in P]
    for tokens, parents in calls:
        start = [s.size(i) for i in range(3)]
        logits = s.forward_tree(tokens, parents)  # (3, S, V) right-aligned per row
        for i, (toks, pars) in enumerate(zip(tokens, parents)):
            for k, (t, par) in enumerate(zip(toks, pars)):
                paths[i][start[i] + k] = paths[i].get(par, []) + [t]
                up[i][start[i] + k] = par
                out[i][start[i] + k] = logits[i, logits.shape[1] - len(toks) + k]
    return s, paths, out, up


@torch.no_grad()
def test_row_trees_equal_each_path_alone(model):
    """Each row's tree nodes see only their own row's prefix and ancestors (per-row 4D masks, per-row positions),
    then each row keeps a different path and continues linearly."""
    s, paths, out, up = build_rows(model)
    for i, prefix in enumerate(ROW_PREFIXES):
        for idx, logits in out[i].items():
            assert close(logits, alone(model, prefix + paths[i][idx])), (i, idx)
    keep = [max(out[0]), min(out[1]), max(out[2])]  # a depth-3 leaf, a root, a depth-2 leaf
    chains = []
    for i in range(3):
        chain = [keep[i]]
        while up[i][chain[-1]] in up[i]:  # up to the root (whose parent is the last linear token)
            chain.append(up[i][chain[-1]])
        chains.append(chain[::-1])
    s.commit_path(chains, [paths[i][keep[i]] for i in range(3)])
    texts = [p + paths[i][keep[i]] for i, p in enumerate(ROW_PREFIXES)]
    assert s.ids == texts
    got = s.forward([[11], [12, 13], [14]], keep=1)[:, -1]  # (3, V)
    for i, (text, new) in enumerate(zip(texts, [[11], [12, 13], [14]])):
        assert close(got[i], alone(model, text + new)), i


@torch.no_grad()
def test_one_mask_for_all_rows_is_caught(model, monkeypatch):
    """Negative control: every row given row 0's tree mask (as if trees were one prompt at a time)."""
    orig = Session._tree_mask

    def shared(self, visible, pos, key_pos):
        return orig(self, visible[:1].expand_as(visible), pos, key_pos)

    monkeypatch.setattr(Session, "_tree_mask", shared)
    _, paths, out, _ = build_rows(model)
    assert not all(close(lg, alone(model, ROW_PREFIXES[i] + paths[i][idx]))
                   for i in (1, 2) for idx, lg in out[i].items())


@torch.no_grad()
def test_rows_keep_different_numbers_of_beams(model):
    """Beams of rows of different lengths, 3 and 1 per row, through a reorder: each beam equals its text alone,
    and the kept beam of each row continues linearly."""
    s = Session(model, [Stats(), Stats()], "draft")
    s.forward([PREFIX, [7, 1]])
    s.expand([3, 1])
    t1 = torch.tensor([4, 12, 19, 6])
    out = s.forward_beams(t1)  # (4, V)
    texts = [PREFIX + [4], PREFIX + [12], PREFIX + [19], [7, 1, 6]]
    for b in range(4):
        assert close(out[b], alone(model, texts[b]))
    s.select(torch.tensor([2, 2, 3]))  # row 0 keeps two copies of its third beam, row 1 its only one
    out = s.forward_beams(torch.tensor([1, 30, 8]))
    texts = [PREFIX + [19, 1], PREFIX + [19, 30], [7, 1, 6, 8]]
    for b in range(3):
        assert close(out[b], alone(model, texts[b]))
    s.keep_beams([1, 2])
    assert s.ids == [texts[1], texts[2]]
    s.sync([texts[1] + [9], texts[2] + [9]])
    got = s.forward([[9], [9]])[:, -1]
    assert close(got[0], alone(model, texts[1] + [9])) and close(got[1], alone(model, texts[2] + [9]))


@torch.no_grad()
def test_batch_of_one_compaction_moves_only_the_tail_and_equals_the_gather(model):
    """A batch of one compacts by copying its path's slots behind the linear part (no copy of the whole cache):
    every layer's keys and values equal the general per-row gather's, bit for bit. Control: another path's
    slots differ."""
    def session():
        s = Session(model, [Stats()], "target")
        s.forward([PREFIX])
        s.forward_tree([[5, 6, 7, 8]], [[5, 6, 6, 8]])  # nodes 6, 7, 8, 9: 6 -> 7, 6 -> 8 -> 9
        return s

    def gathered(path):
        s = session()
        s._gather(torch.tensor([list(range(len(PREFIX))) + path]))
        return s

    tail = session()
    tail.keep_path([[6, 8, 9]])
    ref, other = gathered([6, 8, 9]), gathered([6, 7, 9])
    for a, b, c in zip(tail.cache.layers, ref.cache.layers, other.cache.layers):
        assert a.keys.shape == b.keys.shape and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert not torch.equal(a.keys, c.keys)

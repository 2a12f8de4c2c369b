"""Tree packing, core: tries from tokens, the layout, the predicate and its views, the loss.

Every view is held against what each original sequence sees when it runs
alone (its own cells, causal, windowed), computed from ``seq_cells`` with
no reference to nodes, and against :func:`exactpack.core.permission.permitted`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput, OversizedExample
from exactpack.core.examples import next_at_most, prev_at_most
from exactpack.core.loss import token_weighted_loss
from exactpack.core.permission import pairwise, permitted
from exactpack.core.policies import POLICIES
from exactpack.core.tree import SequenceGroups, pack_tree

BINDING = Binding(50, "test-tokenizer", "sha256:test")


@st.composite
def tree_groups(draw, max_groups: int = 4, max_members: int = 5):
    """Groups of sequences over a tiny alphabet (so prefixes and duplicates are common)."""
    groups, masks = [], []
    for _ in range(draw(st.integers(1, max_groups))):
        stem = draw(st.lists(st.integers(0, 3), min_size=0, max_size=6))
        members, member_masks = [], []
        for _ in range(draw(st.integers(1, max_members))):
            keep = draw(st.integers(0, len(stem)))
            tail = draw(st.lists(st.integers(0, 3), min_size=0, max_size=5))
            seq = stem[:keep] + tail
            if len(seq) < 2:
                seq = seq + [1, 2][: 2 - len(seq)]
            members.append(seq)
            member_masks.append(
                draw(st.lists(st.booleans(), min_size=len(seq) - 1, max_size=len(seq) - 1))
            )
        groups.append(members)
        masks.append(member_masks)
    return SequenceGroups.from_lists(groups, BINDING, masks)


def alone_mask(batch, window=None) -> np.ndarray:
    """Keys each cell sees in the sequences that contain it, run alone: bool [R, T, T]."""
    rows, width = batch.shape
    allowed = np.zeros((rows * width, rows * width), dtype=bool)
    for i in range(batch.seq_index.shape[0]):
        cells = batch.sequence_cells(i)
        depth = np.arange(cells.shape[0])
        lag = depth[:, None] - depth[None, :]
        see = (lag >= 0) & (True if window is None else lag < window)
        allowed[np.ix_(cells, cells)] |= see
    out = np.zeros((rows, width, rows, width), dtype=bool)
    out.reshape(rows * width, rows * width)[:] = allowed
    return np.stack([out[r, :, r, :] for r in range(rows)])


def drawn_example():
    """The layout drawn in exactpack.core.tree's docstring (ids: p0..p3 = 10..13, a..f = 20..)."""
    a, b, c, d, e, f = 20, 21, 22, 23, 30, 31
    return SequenceGroups.from_prompt_completions(
        [[10, 11, 12, 13]], [[[a, b, c], [a, d], [e, f]]], BINDING
    )


def test_drawn_layout_is_computed():
    epoch = pack_tree(drawn_example(), 12)
    (batch,) = epoch.batches
    row = {
        name: getattr(batch, name)[0, :9].tolist()
        for name in ("inputs", "targets", "positions", "segments", "node_ends", "weights")
    }
    assert row["inputs"] == [10, 11, 12, 13, 20, 21, 20, 13, 30]
    assert row["targets"] == [11, 12, 13, 20, 21, 22, 23, 30, 31]
    assert row["positions"] == [0, 1, 2, 3, 4, 5, 4, 3, 4]
    assert row["segments"] == [0, 0, 0, 1, 2, 2, 3, 4, 4]
    assert row["node_ends"] == [5, 5, 5, 4, 3, 3, 4, 5, 5]
    assert row["weights"] == [0, 0, 0, 2, 1, 1, 1, 1, 1]
    assert batch.node_parent.tolist() == [-1, 0, 1, 1, 0]
    assert not batch.input_valid[0, 9:].any()
    stats = epoch.stats()
    assert (stats["tokens_stored"], stats["tokens_flat"]) == (9, 16)
    assert batch.eligible_count == int(drawn_example().loss_mask.sum()) == 7
    # the sibling a->d (column 6) sees the path 0-3 and itself, never a->b (4) or b->c (5)
    assert batch.key_spans(0, 6) == [(0, 3), (3, 4), (6, 7)]


@settings(max_examples=60, deadline=None)
@given(tree_groups(), st.one_of(st.none(), st.integers(1, 12)), st.integers(0, 6))
# the docstring's layout at capacity 12: column 6 (a->d, depth 4) sees column 3 (depth 3),
# three columns away
@example(drawn_example(), 2, 6)
@example(drawn_example(), 3, 6)
@example(drawn_example(), None, 6)
def test_predicate_is_what_each_sequence_sees_alone(groups, window, slack):
    """Windows from 1 to past the deepest path: a window smaller than a branch's depth
    must count depth (positions), never columns (a sibling's cells lie between)."""
    capacity = int(groups.lengths.max()) + slack
    epoch = pack_tree(groups, capacity, policy="best-fit-decreasing")
    for batch in epoch.batches:
        dense = batch.dense_mask(window)
        np.testing.assert_array_equal(dense, alone_mask(batch, window))
        # key spans are the same relation, query by query
        rows, width = batch.shape
        for r in range(rows):
            for q in range(width):
                seen = np.zeros(width, dtype=bool)
                for s, e in batch.key_spans(r, q, window):
                    assert not seen[s:e].any()  # spans are disjoint
                    seen[s:e] = True
                np.testing.assert_array_equal(seen, dense[r, q])


@settings(max_examples=60, deadline=None)
@given(tree_groups(), st.integers(0, 4), st.sampled_from(sorted(POLICIES)), st.integers(1, 3))
@example(drawn_example(), 4, "best-fit-decreasing", 1)  # the drawn trie: 9 cells in a row of 10
def test_every_pair_once_per_sequence_and_weights(groups, slack, policy, rows_per_batch):
    capacity = int(groups.lengths.max()) + slack
    epoch = pack_tree(groups, capacity, policy=policy, max_rows_per_batch=rows_per_batch)
    assert sum(b.shape[0] for b in epoch.batches) == epoch.plan.num_rows
    seen = np.zeros(len(groups), dtype=int)
    stored = 0
    for batch in epoch.batches:
        stored += batch.tokens_stored
        flat_inputs, flat_targets = batch.inputs.reshape(-1), batch.targets.reshape(-1)
        for i, s in enumerate(batch.seq_index):
            seq = groups.sequence(s)
            cells = batch.sequence_cells(i)
            assert np.unique(cells).shape[0] == cells.shape[0]
            np.testing.assert_array_equal(flat_inputs[cells], seq[:-1])
            np.testing.assert_array_equal(flat_targets[cells], seq[1:])
            np.testing.assert_array_equal(
                batch.positions.reshape(-1)[cells], np.arange(seq.size - 1)
            )
            seen[s] += 1
        # weight of a cell = sequences through it that supervise its target
        expect = np.zeros(batch.inputs.size, dtype=int)
        cells, _, supervised = batch.sequences()
        np.add.at(expect, cells[supervised], 1)
        np.testing.assert_array_equal(batch.weights.reshape(-1), expect)
    assert (seen == 1).all()  # every sequence exactly once, whole
    assert stored <= int(groups.lengths.sum())


@settings(max_examples=40, deadline=None)
@given(tree_groups(), st.integers(0, 2**31 - 1))
@example(drawn_example(), 0)
def test_weighted_loss_equals_flat_objective(groups, seed):
    # micro-batches of one row: raw sums and counts add up, divided once (accumulation, DDP)
    epoch = pack_tree(groups, int(groups.lengths.max()) + 2, max_rows_per_batch=1)
    rng = np.random.default_rng(seed)
    # a logit per (context, next token): identical contexts get identical logits, as in a model
    table: dict[bytes, np.ndarray] = {}

    def logits_of(prefix: np.ndarray) -> np.ndarray:
        return table.setdefault(prefix.tobytes(), rng.normal(size=50) * 3)

    flat_sum, flat_n = 0.0, 0
    for i in range(len(groups)):
        seq = groups.sequence(i)
        mask = groups.pair_mask(np.array([i]))
        for d in np.flatnonzero(mask):
            z = logits_of(seq[: d + 1])
            flat_sum += float(np.log(np.exp(z - z.max()).sum()) + z.max() - z[seq[d + 1]])
            flat_n += 1
    tree_sum, tree_n = 0.0, 0
    for batch in epoch.batches:
        logits = np.full((*batch.shape, 50), np.nan)  # padding and unsupervised: never read
        for i, s in enumerate(batch.seq_index):
            seq = groups.sequence(s)
            for d, cell in enumerate(batch.sequence_cells(i)):
                logits.reshape(-1, 50)[cell] = logits_of(seq[: d + 1])
        if batch.eligible_count:
            result = token_weighted_loss(logits, batch)
            tree_sum, tree_n = tree_sum + result.sum, tree_n + result.count
    assert tree_n == flat_n
    # float64, summation order only: the seed's tolerance
    assert abs(tree_sum - flat_sum) <= 1e-10 + 1e-9 * max(abs(tree_sum), abs(flat_sum))


def test_flat_packing_is_the_one_node_case():
    rng = np.random.default_rng(3)
    valid = rng.random((3, 9)) < 0.8
    seg = np.sort(rng.integers(0, 4, (3, 9)), axis=1)
    pos = rng.integers(0, 5, (3, 9))
    for window in (None, 2):
        np.testing.assert_array_equal(
            pairwise(valid, seg, pos, window), pairwise(valid, seg, pos, window, seg + 1)
        )
    assert bool(permitted(True, True, 4, 3, 2, 1, None, 5))  # node 3 is an ancestor of 4
    assert not bool(permitted(True, True, 5, 3, 2, 1, None, 5))  # node 5 is outside 3's subtree


def test_oversized_tries_split_repeating_their_prefix():
    prompt = list(range(10, 30))  # 20 tokens
    groups = SequenceGroups.from_prompt_completions(
        [prompt], [[[1, 2, 3], [4, 5, 6], [7, 8, 9], [40, 41, 42]]], BINDING
    )
    epoch = pack_tree(groups, 30)  # the whole trie needs 19 + 4*3 = 31 cells
    assert epoch.stats()["tries"] == 2 and epoch.plan.num_rows == 2
    (batch,) = epoch.batches
    assert sorted(batch.seq_index.tolist()) == [0, 1, 2, 3]
    assert batch.tokens_stored == 2 * 19 + 4 * 3  # the prompt's cells stored once per sub-trie
    with pytest.raises(OversizedExample, match="capacity is 20"):
        pack_tree(groups, 20)


def test_bad_groups_are_refused():
    with pytest.raises(InvalidInput, match="at least 2"):
        SequenceGroups.from_lists([[[1, 2], [3]]], BINDING)
    with pytest.raises(InvalidInput, match="outside"):
        SequenceGroups.from_lists([[[1, 99]]], BINDING)
    with pytest.raises(InvalidInput, match="not contiguous"):
        groups = SequenceGroups.from_lists([[[1, 2]], [[3, 4]], [[1, 3]]], BINDING)
        bad = SequenceGroups(
            groups.tokens, groups.offsets, np.array([0, 1, 0]), groups.loss_mask, BINDING
        )
        pack_tree(bad, 8)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.data())
def test_nearest_searches(values, data):
    v = np.array(values, dtype=np.int64)
    n = v.shape[0]
    i = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10)))
    lim = np.array(data.draw(st.lists(st.integers(0, 6), min_size=i.size, max_size=i.size)))
    ends = np.minimum(
        n,
        i + 1 + np.array(data.draw(st.lists(st.integers(0, n), min_size=i.size, max_size=i.size))),
    )
    got = next_at_most(v, lim, i + 1, ends)
    for q in range(i.size):
        hits = [m for m in range(i[q] + 1, ends[q]) if v[m] <= lim[q]]
        assert got[q] == (hits[0] if hits else ends[q])
    lows = np.array([data.draw(st.integers(0, int(x))) for x in i])
    got = prev_at_most(v, lim, lows, i)
    for q in range(i.size):
        hits = [k for k in range(lows[q], i[q] + 1) if v[k] <= lim[q]]
        assert got[q] == (hits[-1] if hits else lows[q] - 1)

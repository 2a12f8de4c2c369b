"""The 0.2 spellings of renamed options, keywords and flags (docs/architecture.md's
glossary) still work for one release: the same result as the new spelling, and a
DeprecationWarning (a keyword) or one warning line on stderr (a flag).

``scripts/codemods/vocab.py`` skips this file: it keeps the old spellings on purpose.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from seqpack.pipeline.options import PackOptions

from support.packed_helpers import assert_same_batches, random_records, write_jsonl
from support.strategies import BINDING


def seqpack(*args):
    env = os.environ | {"SEQPACK_KERNELS": "python"}  # no line about unbuilt C kernels
    return subprocess.run(
        [sys.executable, "-m", "seqpack", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    records = random_records(np.random.default_rng(11), 60, vocab=1000, max_len=90)
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "data.jsonl", records)


def same_output(a: Path, b: Path) -> None:
    """Two outputs hold the same bytes: manifest and every shard."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def old_flag_packs_the_same(tmp_path, jsonl, old, new, *rest, command="pack"):
    """``seqpack pack`` with ``old`` and with ``new``: byte-identical outputs, one line."""
    base = (command, jsonl, "--vocab-size", 1000, "--max-length", 48, *rest)
    fresh = seqpack(*base, *new, "--out", tmp_path / "new")
    assert fresh.returncode == 0 and fresh.stderr == "", fresh.stderr
    stale = seqpack(*base, *old, "--out", tmp_path / "old")
    assert stale.returncode == 0, stale.stderr
    assert stale.stderr.count("\n") == 1
    assert f"seqpack pack: warning: {old[0]} is deprecated; pass {new[0]}" in stale.stderr
    same_output(tmp_path / "new", tmp_path / "old")
    both = seqpack(*base, *old, *new, "--out", tmp_path / "both")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def deprecated(old: str, make, new_make):
    """``make()`` (the old keyword) warns naming ``old`` and equals ``new_make()``."""
    with pytest.warns(DeprecationWarning, match=f"{old}="):
        got = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = new_make()
    return got, want


# -- cut_long (was split_long / --split-long)


def test_split_long_flag_is_cut_long(tmp_path, jsonl):
    old_flag_packs_the_same(tmp_path, jsonl, ["--split-long"], ["--cut-long"])


def test_split_long_keyword_is_cut_long():
    from seqpack.training.stream import StreamDataset

    got, want = deprecated(
        "split_long",
        lambda: PackOptions(max_length=8, split_long=True),
        lambda: PackOptions(max_length=8, cut_long=True),
    )
    assert got == want and got.cut_long is True
    base = PackOptions(max_length=8)
    got, want = deprecated(
        "split_long",
        lambda: PackOptions.of(base, split_long=True),
        lambda: PackOptions.of(base, cut_long=True),
    )
    assert got == want
    docs = [{"input_ids": list(range(3, 3 + n))} for n in (30, 5, 17, 9)]
    kw = {"binding": BINDING, "max_length": 8, "rows_per_micro_batch": 2}
    stream = deprecated(
        "split_long",
        lambda: StreamDataset(docs, split_long=True, **kw),
        lambda: StreamDataset(docs, cut_long=True, **kw),
    )
    old, new = ([item.batch for item in ds] for ds in stream)
    assert len(old) > 2
    assert_same_batches(old, new)
    assert stream[0].state_dict() == stream[1].state_dict()


# -- split (was partition / --partition)


def test_partition_flag_is_split(tmp_path, jsonl):
    old, new = ["--partition", "validation"], ["--split", "validation"]
    old_flag_packs_the_same(tmp_path, jsonl, old, new, "--cut-long")
    from seqpack.io.store import load_packed

    assert load_packed(tmp_path / "old").partition.value == "validation"


def test_partition_keyword_is_split():
    got, want = deprecated(
        "partition",
        lambda: PackOptions(max_length=8, partition="test"),
        lambda: PackOptions(max_length=8, split="test"),
    )
    assert got == want and got.split.value == "test"
    got, want = deprecated(
        "partition",
        lambda: PackOptions.of(want, partition="validation"),
        lambda: PackOptions.of(want, split="validation"),
    )
    assert got == want and got.split.value == "validation"


# -- lookahead (was the stream packer's window)


def test_window_option_is_lookahead(tmp_path, jsonl):
    """``--option window=N`` packs what ``--option lookahead=N`` packs (the manifest
    records the option under its on-disk key window either way), with one line."""
    base = ("pack", jsonl, "--vocab-size", 1000, "--max-length", 48, "--cut-long")
    base += ("--policy", "stream-best-fit")
    new = seqpack(*base, "--option", "lookahead=5", "--out", tmp_path / "new")
    assert new.returncode == 0 and new.stderr == "", new.stderr
    old = seqpack(*base, "--option", "window=5", "--out", tmp_path / "old")
    assert old.returncode == 0 and old.stderr.count("\n") == 1
    assert "warning: --option window= is deprecated; pass --option lookahead=" in old.stderr
    same_output(tmp_path / "new", tmp_path / "old")
    assert '"window": 5' in (tmp_path / "new" / "manifest.json").read_text()


def test_window_keyword_is_lookahead():
    from seqpack import plan_rows
    from seqpack.core.stream_packer import StreamPacker
    from seqpack.training.stream import StreamDataset

    lengths = np.random.default_rng(3).integers(1, 9, 200)
    packers = deprecated(
        "window",
        lambda: StreamPacker(8, window=3, max_open_rows=2, seed=1),
        lambda: StreamPacker(8, lookahead=3, max_open_rows=2, seed=1),
    )
    old, new = ([p.push(lengths), p.finish()] for p in packers)
    pairs = [(a, b) for x, y in zip(old, new, strict=True) for a, b in zip(x, y, strict=True)]
    assert all(np.array_equal(a, b) for a, b in pairs)
    assert packers[0].state_dict() == packers[1].state_dict()
    assert packers[0].state_dict()["window"] == packers[0].lookahead == 3  # on-disk key
    plans = deprecated(
        "window",
        lambda: plan_rows(lengths, 8, "stream-best-fit", window=3),
        lambda: plan_rows(lengths, 8, "stream-best-fit", lookahead=3),
    )
    assert plans[0].to_dict() == plans[1].to_dict()
    opts = deprecated(
        "window",
        lambda: PackOptions(8, policy="stream-best-fit", policy_options={"window": 3}),
        lambda: PackOptions(8, policy="stream-best-fit", policy_options={"lookahead": 3}),
    )
    assert opts[0] == opts[1] and dict(opts[0].policy_options) == {"lookahead": 3}
    docs = [{"input_ids": list(range(3, 3 + n))} for n in (7, 5, 8, 9, 3, 6)]
    kw = {"binding": BINDING, "max_length": 8, "rows_per_micro_batch": 2}
    stream = deprecated(
        "window",
        lambda: StreamDataset(docs, window=2, **kw),
        lambda: StreamDataset(docs, lookahead=2, **kw),
    )
    assert_same_batches([i.batch for i in stream[0]], [i.batch for i in stream[1]])
    assert stream[0].state_dict() == stream[1].state_dict()


# -- max_length (was capacity= on StreamDataset and the tree entry points)


def test_capacity_keyword_is_max_length():
    """The same number: StreamDataset's and pack_tree's max_length is the packer's
    capacity (a cell is one input token, PackOptions(max_length=N).capacity == N)."""
    from seqpack.core.binding import Binding
    from seqpack.core.tree import groups_from_columns, pack_tree
    from seqpack.training.stream import StreamDataset

    assert PackOptions(max_length=12).capacity == 12
    docs = [{"input_ids": list(range(3, 3 + n))} for n in (7, 5, 8, 9, 3, 6)]
    kw = {"binding": BINDING, "rows_per_micro_batch": 2}
    stream = deprecated(
        "capacity",
        lambda: StreamDataset(docs, capacity=8, **kw),
        lambda: StreamDataset(docs, max_length=8, **kw),
    )
    assert stream[0].capacity == stream[1].capacity == 8
    assert_same_batches([i.batch for i in stream[0]], [i.batch for i in stream[1]])
    assert stream[0].state_dict() == stream[1].state_dict()
    columns = {"prompt_ids": [[1, 2, 3], [4, 5]], "completion_ids": [[[6, 7], [8]], [9, 6, 7]]}
    groups = groups_from_columns(columns, Binding(10, "t", "s"))
    trees = deprecated(
        "capacity",
        lambda: pack_tree(groups, capacity=16),
        lambda: pack_tree(groups, max_length=16),
    )
    old, new = (t.batches[0] for t in trees)
    assert old.inputs.shape[1] == 16
    assert np.array_equal(old.inputs, new.inputs)
    assert trees[0].plan.to_dict() == trees[1].plan.to_dict()


# -- --tree-block (was --tree-window: fixed blocks of documents, not a look-ahead)


def test_tree_window_flag_is_tree_block(tmp_path):
    import json

    rows = [{"input_ids": [1, 2, 3, 4, 5 + i % 3, 9, 9 - i % 2]} for i in range(30)]
    data = tmp_path / "tree.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ("--tree", "auto", "--tree-prefix", 4)
    old_flag_packs_the_same(tmp_path, data, ["--tree-window", "7"], ["--tree-block", "7"], *args)
    from seqpack.pipeline.pack_tree import TreeOptions

    got, want = deprecated(
        "tree_window",
        lambda: TreeOptions(tree="auto", tree_window=7),
        lambda: TreeOptions(tree="auto", tree_block=7),
    )
    assert got == want and got.tree_block == 7


# -- sliding_window (was window= on the permission views and the attention functions)


def test_window_keyword_of_the_permission_views_is_sliding_window():
    from seqpack.core.permission import check_sliding_window, key_ranges, permitted, tiled_edges
    from seqpack.verify.fixture import fixture_batch

    b = fixture_batch()
    v, s, p = b.input_valid[0], b.segments[0], b.positions[0]
    args = (v[:, None], v[None], s[:, None], s[None], p[:, None], p[None])
    got, want = deprecated(
        "window", lambda: permitted(*args, window=2), lambda: permitted(*args, sliding_window=2)
    )
    assert np.array_equal(got, want) and not got[2, 0] and got[2, 1]
    assert deprecated(
        "window",
        lambda: check_sliding_window(window=3),
        lambda: check_sliding_window(sliding_window=3),
    ) == (3, 3)
    for view in ("dense_mask", "edges"):
        got, want = deprecated(
            "window",
            lambda view=view: getattr(b, view)(window=2),
            lambda view=view: getattr(b, view)(sliding_window=2),
        )
        assert np.array_equal(got, want)
    got, want = deprecated(
        "window",
        lambda: b.allowed_key(0, 2, 0, window=2),
        lambda: b.allowed_key(0, 2, 0, sliding_window=2),
    )
    assert got is want is False
    got, want = deprecated(
        "window", lambda: key_ranges(b, window=2), lambda: b.key_ranges(sliding_window=2)
    )
    assert got.get(0, 2) == want.get(0, 2) == (1, 3)
    got, want = deprecated(
        "window", lambda: tiled_edges(b, window=2), lambda: tiled_edges(b, sliding_window=2)
    )
    assert np.array_equal(got, want)


def test_window_keyword_of_the_tree_views_is_sliding_window():
    from seqpack.core.binding import Binding
    from seqpack.core.tree import groups_from_columns, pack_tree

    columns = {"prompt_ids": [[1, 2, 3], [4, 5]], "completion_ids": [[[6, 7], [8]], [9, 6, 7]]}
    batch = pack_tree(groups_from_columns(columns, Binding(10, "t", "s")), 16).batches[0]
    got, want = deprecated(
        "window", lambda: batch.dense_mask(window=2), lambda: batch.dense_mask(sliding_window=2)
    )
    assert np.array_equal(got, want) and not np.array_equal(got, batch.dense_mask())
    got, want = deprecated(
        "window",
        lambda: batch.key_spans(0, 4, window=2),
        lambda: batch.key_spans(0, 4, sliding_window=2),
    )
    assert got == want


def test_window_keyword_of_the_attention_functions_is_sliding_window():
    import torch

    from seqpack.hf.masks import additive_mask
    from seqpack.nn import AttentionLayout, attention
    from seqpack.nn.varlen import varlen_attention
    from seqpack.verify.fixture import fixture_batch

    batch = fixture_batch()
    layout = AttentionLayout.from_batch(batch)
    q, k, v = torch.randn(
        3, 2, 2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    for backend in ("ranges", "dense", "varlen", "auto"):
        got, want = deprecated(
            "window",
            lambda backend=backend: attention(q, k, v, layout, backend, window=2),
            lambda backend=backend: attention(q, k, v, layout, backend, sliding_window=2),
        )
        assert torch.equal(got, want)
    assert not torch.allclose(want, attention(q, k, v, layout))  # the window acts
    got, want = deprecated(
        "window",
        lambda: varlen_attention(q, k, v, layout, 0.5, window=2),
        lambda: varlen_attention(q, k, v, layout, 0.5, sliding_window=2),
    )
    assert torch.equal(got, want)
    got, want = deprecated(
        "window",
        lambda: layout.dense_mask(window=2),
        lambda: layout.dense_mask(sliding_window=2),
    )
    assert torch.equal(got, want)
    got, want = deprecated(
        "window",
        lambda: additive_mask(batch, torch.float32, window=2),
        lambda: additive_mask(batch, torch.float32, sliding_window=2),
    )
    assert torch.equal(got, want)


def test_a_backend_written_for_0_2_is_called_with_window():
    """register_backend reads the callable's signature once: a 0.2 backend (``window=``)
    warns at registration and is called with ``window=`` for ``sliding_window=``."""
    import torch

    from seqpack.nn import BACKENDS, AttentionLayout, attention, register_backend
    from seqpack.nn.attention import dense_attention
    from seqpack.verify.fixture import fixture_batch

    seen = []

    def old_dense(q, k, v, layout, scale, window=None):
        seen.append(window)
        return dense_attention(q, k, v, layout, scale, sliding_window=window)

    def new_dense(q, k, v, layout, scale, sliding_window=None):
        return dense_attention(q, k, v, layout, scale, sliding_window=sliding_window)

    try:
        with pytest.warns(DeprecationWarning, match="window="):
            register_backend("old-dense", old_dense)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            register_backend("new-dense", new_dense)
            layout = AttentionLayout.from_batch(fixture_batch())
            q = k = v = torch.randn(2, 2, 6, 4, dtype=torch.float64)
            for w in (None, 2):
                got = attention(q, k, v, layout, "old-dense", sliding_window=w)
                want = attention(q, k, v, layout, "new-dense", sliding_window=w)
                assert torch.equal(got, want)
        assert seen == [None, 2]
    finally:
        BACKENDS.pop("old-dense", None)
        BACKENDS.pop("new-dense", None)

"""The packing budget, small scale: checked before allocating, and an upper bound of the truth.

``benchmarks/stress.py`` runs the same checks on 10 million examples and
100 million tokens; here random tables of a few thousand examples show that
:func:`exactpack.pipeline.budget.packing_bytes` bounds what :func:`pack_table`
allocates (tracemalloc sees NumPy's allocations) for every policy, and that a
budget one byte short raises :class:`~exactpack.BudgetExceeded` having
allocated nothing.
"""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack import Binding, BudgetExceeded, ExampleTable
from exactpack.core import config as budget
from exactpack.core.policies import POLICIES
from exactpack.pipeline.budget import packing_bytes
from exactpack.pipeline.local import pack_table

#: Allocations below this are Python bookkeeping, not packing arrays.
NOTHING = 64 << 10


def random_table(rng, n, max_len, masked):
    lengths = rng.integers(1, max_len + 1, size=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=offsets[1:])
    pairs = int(lengths.sum())
    ids = np.array([f"s{i}" for i in range(n)], dtype=object)
    return ExampleTable(
        windows=rng.integers(0, 1000, size=int(offsets[-1]), dtype=np.int32),
        offsets=offsets,
        loss_mask=rng.random(pairs) < 0.8 if masked else np.ones(pairs, dtype=bool),
        source_ids=ids,
        example_ids=ids,
        range_starts=np.zeros(n, dtype=np.int64),
        range_ends=lengths + 1,
        partition="train",
        binding=Binding(1000, "t", "s"),
    )


def traced_peak(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1, 2, 7, 300, 2500, 6000]),
    st.sampled_from([1, 3, 40, 300]),
    st.booleans(),
    st.sampled_from(sorted(POLICIES)),
)
def test_the_estimate_bounds_what_packing_allocates(seed, n, max_len, masked, policy):
    rng = np.random.default_rng(seed)
    table = random_table(rng, n, max_len, masked)
    capacity = int(rng.integers(max_len, 4 * max_len + 1))
    pack_table(table, capacity, policy)  # kernels loaded before measuring
    need = packing_bytes(table, capacity, policy)
    assert traced_peak(lambda: pack_table(table, capacity, policy)) <= need
    assert traced_peak(lambda: pack_table(table, capacity, policy, max_metadata_bytes=need)) <= need


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_budget_one_byte_short_refuses_before_allocating(rng, policy):
    table = random_table(rng, 20_000, 200, masked=True)
    need = packing_bytes(table, 256, policy)
    assert need > len(table) * budget.PLAN_BYTES  # the plan and rows are in it

    def refused():
        with pytest.raises(BudgetExceeded, match=f"needs {need:,} bytes but max_metadata_bytes"):
            pack_table(table, 256, policy, max_metadata_bytes=need - 1)

    assert traced_peak(refused) < NOTHING


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_gathering_policies_count_one_copy_of_the_tokens(rng, policy):
    """Same examples and capacity, more tokens: a policy that reorders (gathers the windows
    and non-uniform flags into storage order) needs exactly one more copy of what was added
    (int32 tokens, bool flags); next-fit and padded keep the table's arrays and need nothing."""
    short = random_table(rng, 1000, 10, masked=True)
    long = random_table(rng, 1000, 50, masked=True)
    extra = (long.windows.nbytes - short.windows.nbytes) + (
        long.loss_mask.nbytes - short.loss_mask.nbytes
    )
    grown = packing_bytes(long, 64, policy) - packing_bytes(short, 64, policy)
    assert grown == (0 if policy in ("next-fit", "padded") else extra)
    uniform = random_table(rng, 1000, 50, masked=False)
    flags = packing_bytes(long, 64, policy) - packing_bytes(uniform, 64, policy)
    reorders = policy not in ("next-fit", "padded")
    # uniform flags are shared, not gathered; the token counts differ between the two tables
    want = long.windows.nbytes - uniform.windows.nbytes + long.loss_mask.nbytes if reorders else 0
    assert flags == want


@pytest.mark.parametrize("window", [1, 300, 20_000, 150_000])
def test_the_stream_policy_budget_grows_with_its_window(rng, window):
    table = random_table(rng, 3000, 60, masked=False)
    options = {"lookahead": window, "max_open_rows": 16}
    pack_table(table, 64, "stream-best-fit", **options)  # kernels loaded before measuring
    need = packing_bytes(table, 64, "stream-best-fit", options)
    assert traced_peak(lambda: pack_table(table, 64, "stream-best-fit", **options)) <= need
    if window >= 20_000:  # the window's buffers dominate: the default window's estimate is short
        assert need > packing_bytes(table, 64, "stream-best-fit") + 100 * window


MEASURE = r"""
import json, sys, tracemalloc
import pyarrow as pa
from exactpack.pipeline.local import pack_path
from exactpack.pipeline.budget import StreamBudget
from exactpack.pipeline.options import PackOptions

opts = dict(max_length=64, vocab_size=1000, chunk_bytes=1 << 16, shard_tokens=20_000,
            policy=sys.argv[3], max_metadata_bytes=1 << 40)  # with a budget: spilled
pack_path(sys.argv[1], sys.argv[2] + "-warm", **opts)  # imports and kernels loaded first
pool = pa.default_memory_pool()
arrow_before = pool.max_memory()
tracemalloc.start()
stats = pack_path(sys.argv[1], sys.argv[2], **opts)
traced = tracemalloc.get_traced_memory()[1]
budget = StreamBudget.of(PackOptions.of(**opts), "jsonl")
print(json.dumps({"traced": traced, "arrow": pool.max_memory(), "arrow_before": arrow_before,
                  "need": budget.need(stats["sources"], stats["examples"], stats["examples"])}))
"""


@pytest.mark.parametrize("policy", ["next-fit", "best-fit-decreasing"])
def test_the_pipeline_budget_bounds_what_pack_path_allocates(tmp_path, policy):
    """NumPy and Python allocations (tracemalloc) plus Arrow's pool (its peak) stay within
    the budget the options and counts give, in a process that loaded everything first."""
    import json
    import subprocess
    import sys

    rng = np.random.default_rng(3)
    lines = []
    for i in range(6000):
        ids = rng.integers(0, 1000, size=int(rng.integers(2, 64))).tolist()
        lines.append(json.dumps({"id": f"d{i}", "input_ids": ids}))
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path / "d.jsonl"), str(tmp_path / "out"), policy],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["traced"] + got["arrow"] <= got["need"], got


def test_a_huge_window_is_refused_before_the_input_is_read(tmp_path, monkeypatch):
    import subprocess
    import sys

    from exactpack.io.readers import Input
    from exactpack.pipeline.local import pack_path

    path = tmp_path / "d.jsonl"
    path.write_text('{"input_ids": [0, 5, 1]}\n' * 10)
    args = ["pack", str(path), "--out", str(tmp_path / "out"), "--max-length", "4096",
            "--vocab-size", "10", "--max-metadata-bytes", "64M", "--policy", "stream-best-fit",
            "--option", "lookahead=50000000"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "exactpack", *args], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "but max_metadata_bytes is 67,108,864" in proc.stderr

    def never(*args, **kwargs):
        raise AssertionError("the input was read before the budget was checked")

    monkeypatch.setattr(Input, "chunks", never)
    with pytest.raises(BudgetExceeded, match="2 read chunks") as err:
        pack_path(path, tmp_path / "out", max_length=4096, vocab_size=10, policy="stream-best-fit",
                  policy_options={"lookahead": 50_000_000},
                  max_metadata_bytes=64 << 20)  # fmt: skip
    assert int(str(err.value).split(" needs ")[1].split(" bytes")[0].replace(",", "")) > 50e6 * 100
    table = random_table(np.random.default_rng(0), 10, 5, masked=False)
    with pytest.raises(BudgetExceeded):
        pack_table(table, 8, "stream-best-fit", lookahead=50_000_000, max_metadata_bytes=64 << 20)


def test_split_long_is_budgeted_before_any_source_is_split(tmp_path, monkeypatch):
    import dataclasses

    from exactpack.io.readers import read_documents
    from exactpack.pipeline import local, writer
    from exactpack.pipeline.budget import StreamBudget
    from exactpack.pipeline.options import PackOptions

    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join('{"input_ids": [' + ", ".join(["3"] * 2000) + "]}\n" for _ in range(50))
    )
    opts = PackOptions(max_length=16, vocab_size=10, cut_long=True, chunk_bytes=1 << 14,
                       shard_tokens=1000)  # fmt: skip
    limit = StreamBudget.of(opts, "jsonl").need(50, 50) + 1  # reading fits, the pieces do not

    def never(*args, **kwargs):
        raise AssertionError("a source was split before the budget was checked")

    monkeypatch.setattr(writer, "long_ranges", never)
    with pytest.raises(BudgetExceeded, match="6,250 pieces of 50 documents"):
        local.pack_path(path, tmp_path / "out", dataclasses.replace(opts, max_metadata_bytes=limit))
    monkeypatch.setattr(local, "cut_long", never)
    docs = read_documents(path)
    with pytest.raises(BudgetExceeded, match="splitting and packing the sources"):
        local.bind_examples(docs, dataclasses.replace(opts, max_metadata_bytes=1 << 20), None)

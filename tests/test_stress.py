"""The packing budget, small scale: checked before allocating, and an upper bound of the truth.

``benchmarks/stress.py`` runs the same checks on 10 million examples and
100 million tokens; here random tables of a few thousand examples show that
:func:`seqpack.pipeline.packing_bytes` bounds what :func:`pack_table`
allocates (tracemalloc sees NumPy's allocations) for every policy, and that a
budget one byte short raises :class:`~seqpack.BudgetExceeded` having
allocated nothing.
"""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack import Binding, BudgetExceeded, ExampleTable
from seqpack.core import budget
from seqpack.core.policies import POLICIES
from seqpack.pipeline.budget import packing_bytes
from seqpack.pipeline.local import pack_table

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

"""The C kernels and their Python twins take the same arguments and give the same answer.

The public doors into the kernels (``plan_rows`` with every policy, ``StreamPacker``)
with ``kernels="native"`` and ``kernels="python"``, over lengths in any integer dtype,
either byte order, strided or read-only, in or out of range: the same plan (equal to the
plan of the same values as a plain list) or the same one-line error. Settings that would
allocate gigabytes (``lookahead`` / ``max_open_rows`` of 2**31 - 1) are checked against
the input or a budget first, and a packer shared by two threads never crashes; both run
in a child process under a 3 GiB address-space limit, so a regression fails, never
swaps or kills the machine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactpack import ExactpackError, StreamPacker, plan_rows
from exactpack.core import engine
from exactpack.core.policies import POLICIES

pytestmark = pytest.mark.skipif(not engine.native_available(), reason="C kernels not built")

TWINS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = ["i1", "u1", "<i2", ">i2", "<u2", "<i4", ">i4", "<u4", "<i8", ">i8", "<u8", ">u8"]
HUGE = 2**31 - 1


LAYOUTS = ["plain", "strided", "reversed", "read-only"]


def laid_out(values, dtype, layout):
    """``values`` as an array of ``dtype`` (wrapping as NumPy casts) in ``layout``."""
    arr = np.array(values, dtype=np.int64).astype(np.dtype(dtype))
    if layout == "strided":  # a slice with a step: the C kernels refused it
        arr = np.repeat(arr, 3)[::3]
    elif layout == "reversed":
        arr = arr[::-1].copy()[::-1]
    elif layout == "read-only":
        arr.flags.writeable = False
    return arr


@st.composite
def length_arrays(draw, capacity):
    """Lengths (sometimes out of range) as a NumPy array of any integer dtype and layout."""
    values = draw(st.lists(st.integers(-1, capacity + 1), max_size=40))
    if draw(st.booleans()):  # mostly valid, so plans are compared, not only errors
        values = [min(max(v, 1), capacity) for v in values]
    return laid_out(values, draw(st.sampled_from(DTYPES)), draw(st.sampled_from(LAYOUTS)))


def _outcome(call):
    try:
        return call()
    except ExactpackError as err:
        assert "\n" not in str(err), str(err)
        return type(err).__name__, str(err)


def _plan(arr, capacity, policy, options):
    plan = plan_rows(arr, capacity, policy, **options)
    return plan.row_of.tolist(), plan.start_of.tolist(), plan.num_rows


@TWINS
@given(data=st.data(), capacity=st.integers(1, 48), policy=st.sampled_from(sorted(POLICIES)))
def test_plan_rows_gives_one_answer_for_any_integer_array(data, capacity, policy):
    arr = data.draw(length_arrays(capacity))
    options = {}
    if policy == "stream-best-fit":
        options = {
            "lookahead": data.draw(st.sampled_from([1, 2, 5, 64, 10_000])),
            "max_open_rows": data.draw(st.sampled_from([1, 3, 64, 10_000])),
            "seed": data.draw(st.integers(0, 3)),
        }
    plain = arr.astype(np.int64).tolist()
    want = _outcome(lambda: _plan(plain, capacity, policy, options))
    kernels = ["auto"] if policy == "padded" else ["native", "python"]
    for k in kernels:
        extra = {} if policy == "padded" else {"kernels": k}
        assert _outcome(lambda k=extra: _plan(arr, capacity, policy, options | k)) == want, k


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_layout_plans_as_a_plain_list(dtype, layout):
    values = [3, 2, 4, 1, 5, 6, 2, 2, 3, 1, 7, 4]
    arr = laid_out(values, dtype, layout)
    for policy in sorted(set(POLICIES) - {"padded"}):
        want = _plan(values, 8, policy, {"kernels": "python"})
        assert _plan(arr, 8, policy, {"kernels": "native"}) == want, policy
        assert _plan(arr, 8, policy, {"kernels": "python"}) == want, policy
    streams = []
    for k, lengths in (("python", values), ("native", arr), ("python", arr)):
        packer = StreamPacker(8, lookahead=3, max_open_rows=2, kernels=k)
        streams.append([packer.push(lengths).row.tolist(), packer.finish().row.tolist()])
    assert streams[0] == streams[1] == streams[2]


@TWINS
@given(
    data=st.data(),
    capacity=st.integers(1, 32),
    lookahead=st.integers(1, 12),
    max_open_rows=st.integers(1, 6),
    seed=st.integers(0, 2**64),
)
def test_a_stream_packer_gives_one_answer_for_any_integer_array(
    data, capacity, lookahead, max_open_rows, seed
):
    chunks = data.draw(st.lists(length_arrays(capacity), max_size=4))
    got = {}
    for k in ("native", "python"):
        packer = StreamPacker(
            capacity, lookahead=lookahead, max_open_rows=max_open_rows, seed=seed, kernels=k
        )
        steps = [
            _outcome(lambda c=c, p=packer: tuple(x.tolist() for x in p.push(c))) for c in chunks
        ]
        steps.append(tuple(x.tolist() for x in packer.finish()))
        got[k] = steps, packer.state_dict()
    assert got["native"] == got["python"]


def test_a_lookahead_beyond_the_input_plans_as_the_input_allows():
    lengths = np.array([5, 3, 8, 1, 2, 7, 4, 4], dtype=np.int64)
    want = plan_rows(lengths, 8, "stream-best-fit", lookahead=8, max_open_rows=8)
    packer = StreamPacker(8, lookahead=10_000, max_open_rows=10_000)  # not clamped
    parts = [packer.push(lengths), packer.finish()]
    rows = np.concatenate([p.row for p in parts])[np.argsort(np.concatenate(
        [p.example for p in parts]))]  # fmt: skip
    assert rows.tolist() == want.row_of.tolist()
    for k in ("native", "python"):
        got = plan_rows(lengths, 8, "stream-best-fit", lookahead=10_000, kernels=k)
        assert got.row_of.tolist() == want.row_of.tolist()
        assert got.start_of.tolist() == want.start_of.tolist()


def _child(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose address space is capped at 3 GiB."""
    cap = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
    return subprocess.run(
        [sys.executable, "-c", cap + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_huge_settings_are_checked_before_allocating():
    """``lookahead`` / ``max_open_rows`` of 2**31 - 1 allocated 16 GiB a buffer before
    any check: ``plan_rows`` now sizes them by its input, a ``StreamPacker`` by
    ``max_bytes`` (4 GiB unless told), refused in one line naming the settings."""
    proc = _child("""
        from exactpack import BudgetExceeded, StreamPacker, plan_rows
        for k in ("native", "python"):
            plan = plan_rows([3, 2, 4], 6, "stream-best-fit", lookahead=2**31 - 1,
                             max_open_rows=2**31 - 1, kernels=k)
            assert plan.num_rows == 2, plan
            for setting in ("lookahead", "max_open_rows"):
                try:
                    StreamPacker(4096, **{setting: 2**31 - 1}, kernels=k)
                except BudgetExceeded as err:
                    print(err)
                else:
                    raise AssertionError("a packer of gigabytes was built")
        assert StreamPacker(8, lookahead=1 << 20, max_bytes=None).lookahead == 1 << 20
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    messages = proc.stdout.splitlines()
    assert len(messages) == 4
    for setting, message in zip(["lookahead", "max_open_rows"] * 2, messages, strict=True):
        assert f"{setting}={HUGE:,}" in message
        assert "but max_bytes is 4,294,967,296 — lower lookahead or max_open_rows" in message


def test_a_stream_packer_shared_by_threads_never_crashes():
    """The C kernel releases the GIL: two threads in one packer corrupted its heap
    (``malloc(): invalid size``, a segfault). Calls take turns; every example comes out
    exactly once."""
    proc = _child("""
        import threading
        import numpy as np
        from exactpack import StreamPacker
        packer = StreamPacker(4096, lookahead=4096, max_open_rows=64, kernels="native")
        rng = np.random.default_rng(0)
        chunks = [rng.integers(1, 4096, size=20_000) for _ in range(8)]
        out = []
        def work(mine):
            for chunk in mine:
                out.append(packer.push(chunk))
                packer.state_dict()
        threads = [threading.Thread(target=work, args=(chunks[k::2],)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out.append(packer.finish())
        examples = np.concatenate([p.example for p in out])
        assert np.array_equal(np.sort(examples), np.arange(160_000)), "lost or doubled"
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout == "ok\n", (proc.returncode, proc.stderr[-2000:])


def test_a_stream_packer_still_pickles():
    import pickle

    packer = StreamPacker(8, lookahead=4)
    packer.push([3, 5, 2])
    clone = pickle.loads(pickle.dumps(packer))
    assert clone.state_dict() == packer.state_dict()
    assert clone.finish().example.tolist() == packer.finish().example.tolist()

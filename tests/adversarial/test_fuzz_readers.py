"""Fuzz the readers: whatever the bytes, only exactpack's own errors come out.

Four targets, each a hypothesis property: JSON Lines built from random
records and then damaged byte by byte; mostly valid records as JSON Lines,
a JSON array and Parquet; Arrow tables with random column types; and a valid
Parquet file with random bytes replaced. A read either raises a
:class:`~exactpack.ExactpackError` or returns a table that satisfies the
ExampleTable invariants. pyarrow's own JSON reader crashes the process on
some of these inputs (a ``null`` first line, deep nesting), so a regression
shows up here as a dead test process, not as a failure message.
"""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from exactpack import ExactpackError, ExampleTable, InvalidInput
from exactpack.io.readers import load_examples
from exactpack.io.tokenizers import ByteTokenizer

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))

ints = st.one_of(st.integers(-3, 300), st.integers(-(2**70), 2**70))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True), st.text(max_size=5))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.sampled_from(["a", "input_ids", "id"]), inner, max_size=3),
    ),
    max_leaves=20,
)
FIELDS = {
    "input_ids": st.one_of(st.lists(ints, max_size=8), values),
    "labels": st.one_of(st.lists(st.one_of(st.just(-100), ints), max_size=8), values),
    "loss_mask": st.one_of(st.lists(st.one_of(st.booleans(), st.integers(-1, 2))), values),
    "id": st.one_of(st.text(max_size=4), ints, values),
    "text": st.one_of(st.text(max_size=10), values),
    "partition": st.one_of(st.sampled_from(["train", "validation", "dev"]), values),
    "other": values,
}
records = st.fixed_dictionaries({}, optional=FIELDS)
lines = st.one_of(
    records.map(lambda r: json.dumps(r).encode()),
    values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=20),
)


@st.composite
def damaged_files(draw):
    """JSON Lines of random records, then bytes inserted/replaced, maybe a BOM."""
    sep = draw(st.sampled_from([b"\n", b"\r\n", b"\n\n"]))
    data = sep.join(draw(st.lists(lines, max_size=6))) + draw(st.sampled_from([b"", b"\n"]))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(max_size=4)) + data[at + draw(st.integers(0, 3)) :]
    if draw(st.booleans()) and draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    if draw(st.integers(0, 19)) == 0:
        depth = draw(st.integers(60, 30000))
        data = b'{"input_ids": ' + b"[" * depth + b"]" * depth + b"}\n" + data
    return data, draw(st.sampled_from([".jsonl", ".json"]))


binding_args = st.one_of(
    st.integers(1, 300).map(lambda v: {"vocab_size": v}),
    st.just({"tokenizer": ByteTokenizer()}),
)


def check_read(source, args, partition="train"):
    """Read ``source``: None on a ExactpackError, else the table (it keeps the ExampleTable
    invariants). Targets whose input is valid assert that a table came back."""
    try:
        table = load_examples(source, partition=partition, **args)
    except ExactpackError:
        return None
    assert isinstance(table, ExampleTable)
    vocab = table.binding.vocab_size
    assert table.windows.dtype == np.int32 and table.offsets.dtype == np.int64
    if table.windows.size:
        assert table.windows.min() >= 0 and table.windows.max() < vocab
    assert (table.lengths >= 1).all()
    assert table.loss_mask.dtype == bool and table.loss_mask.shape[0] == table.lengths.sum()
    assert table.partition.value == partition
    return table


@FUZZ
@given(damaged_files(), binding_args, st.sampled_from(["train", "validation"]))
def test_damaged_json_lines(tmp_path_factory, case, args, partition):
    data, suffix = case
    path = tmp_path_factory.mktemp("fuzz") / f"data{suffix}"
    path.write_bytes(data)
    check_read(path, args, partition)


good_ids = st.lists(st.integers(0, 265), max_size=8)
good_records = st.fixed_dictionaries(
    {},
    optional={
        "input_ids": st.one_of(good_ids, good_ids, st.lists(ints, max_size=8), st.none()),
        "labels": st.one_of(st.lists(st.sampled_from([-100, 0, 1, 5, 265])), st.none()),
        "loss_mask": st.one_of(st.lists(st.one_of(st.booleans(), st.integers(0, 1))), st.none()),
        "id": st.one_of(st.text(max_size=4), st.integers(0, 10), st.none()),
        "partition": st.sampled_from(["train", "validation"]),
        "text": st.text(max_size=10),
    },
)


def write_records(path, rows, suffix):
    """``rows`` as JSON Lines, one JSON array, or Parquet (None: not one Arrow table)."""
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowException, OverflowError):
            return None
        pq.write_table(table, path)
    return path


@FUZZ
@given(
    st.lists(good_records, max_size=6),
    binding_args,
    st.sampled_from([".jsonl", ".json", ".parquet"]),
)
def test_mostly_valid_records_in_every_format(tmp_path_factory, rows, args, suffix):
    path = tmp_path_factory.mktemp("fuzz") / f"data{suffix}"
    assume(write_records(path, rows, suffix))  # else not representable as one Arrow table
    table = check_read(path, args)
    vocab = args["vocab_size"] if "vocab_size" in args else args["tokenizer"].vocab_size
    plain = [r for r in rows if set(r) == {"input_ids"} and surely_valid_ids(r["input_ids"], vocab)]
    if rows and len(plain) == len(rows):  # every record is a plain valid document
        assert table is not None and len(table) == len(rows)
        assert table.windows.tolist() == [t for r in rows for t in r["input_ids"]]


def surely_valid_ids(ids, vocab):
    return (
        isinstance(ids, list)
        and len(ids) >= 2
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids)
    )


@st.composite
def valid_files(draw):
    """Records every reader must accept: ids in the vocabulary, aligned labels or masks."""
    vocab = draw(st.integers(2, 300))
    kind = draw(st.sampled_from(["plain", "labels", "loss_mask"]))
    # A file holds one partition (rows of another are an error, not filtered out).
    partition = draw(st.sampled_from([None, "train", "validation"]))
    rows = []
    for i in range(draw(st.integers(1, 6))):
        ids = draw(st.lists(st.integers(0, vocab - 1), min_size=2, max_size=8))
        row = {"id": f"r{i}", "input_ids": ids}
        if kind == "labels":
            row["labels"] = [t if draw(st.booleans()) else -100 for t in ids]
        elif kind == "loss_mask":
            row["loss_mask"] = [draw(st.booleans()) for _ in ids[1:]]
        if partition is not None:
            row["partition"] = partition
        rows.append(row)
    return rows, vocab, partition or "train"


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(valid_files(), st.sampled_from([".jsonl", ".json", ".parquet"]))
def test_valid_records_in_every_format_are_read_exactly(tmp_path_factory, case, suffix):
    rows, vocab, partition = case
    path = write_records(tmp_path_factory.mktemp("valid") / f"data{suffix}", rows, suffix)
    train = rows
    table = check_read(path, {"vocab_size": vocab}, partition)
    assert table is not None, "a reader refused valid records"
    assert len(table) == len(train)
    assert table.windows.tolist() == [t for r in train for t in r["input_ids"]]
    assert table.source_ids.tolist() == [r["id"] for r in train]
    flags = []
    for r in train:
        if "labels" in r:
            flags += [label != -100 for label in r["labels"][1:]]
        elif "loss_mask" in r:
            flags += r["loss_mask"]
        else:
            flags += [True] * (len(r["input_ids"]) - 1)
    assert table.loss_mask.tolist() == flags


ARROW_TYPES = [
    pa.int8(),
    pa.int32(),
    pa.int64(),
    pa.uint64(),
    pa.float32(),
    pa.float64(),
    pa.bool_(),
    pa.string(),
    pa.null(),
    pa.binary(),
]


@st.composite
def arrow_columns(draw, n):
    inner = draw(st.sampled_from(ARROW_TYPES))
    wrap = draw(st.sampled_from(["list", "large_list", "fixed", "plain", "nested", "dictionary"]))
    items = st.one_of(st.none(), st.integers(-2, 300), st.floats(), st.booleans(), st.text())
    rows = []
    for _ in range(n):
        k = 2 if wrap == "fixed" else draw(st.integers(0, 4))
        rows.append(
            None if draw(st.integers(0, 5)) == 0 else draw(st.lists(items, min_size=k, max_size=k))
        )
    try:
        if wrap == "dictionary":
            return pa.array([None if r is None else str(r) for r in rows]).dictionary_encode()
        kind = {
            "list": pa.list_(inner),
            "large_list": pa.large_list(inner),
            "fixed": pa.list_(inner, 2),
            "nested": pa.list_(pa.list_(inner)),
            "plain": inner,
        }[wrap]
        if wrap == "nested":
            rows = [None if r is None else [r] for r in rows]
        if wrap == "plain":
            rows = [r[0] if r else None for r in rows]
        return pa.array(rows, type=kind, from_pandas=True)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return pa.array([[0, 1]] * n)  # values that do not convert: a plain valid column


@FUZZ
@given(st.data(), binding_args)
def test_arrow_tables_with_any_column_types(data, args):
    names = data.draw(
        st.lists(
            st.sampled_from(["input_ids", "labels", "loss_mask", "id", "text", "partition"]),
            unique=True,
            max_size=4,
        )
    )
    n = data.draw(st.integers(0, 4))
    table = (
        pa.table({name: data.draw(arrow_columns(n)) for name in names}) if names else pa.table({})
    )
    check_read(table, args)


@pytest.mark.parametrize(
    "column",
    [
        pa.array([[[]]], type=pa.list_(pa.list_(pa.int8()))),  # found by the fuzz target
        pa.array([[[0, 1], [2]]], type=pa.list_(pa.list_(pa.int64()))),
        pa.array([["a", "b"]]),
    ],
)
def test_nested_or_non_integer_id_lists_are_a_clear_error(column):
    table = pa.table({"input_ids": column})
    with pytest.raises(InvalidInput, match=r"input_ids holds .* token ids must be integers"):
        load_examples(table, partition="train", vocab_size=266)
    assert check_read(table, {"vocab_size": 266}) is None


@pytest.fixture(scope="module")
def parquet_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "base.parquet"
    table = pa.table(
        {
            "input_ids": [[0, 5, 6, 1], [0, 7, 1]],
            "id": ["a", "b"],
            "labels": [[-100, 5, 6, 1], None],
        }
    )
    pq.write_table(table, path)
    return path.read_bytes()


@FUZZ
@given(
    st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=3), st.integers(0, 3)), max_size=4),
    st.booleans(),
)
def test_damaged_parquet(tmp_path_factory, parquet_bytes, edits, truncate):
    data = parquet_bytes
    for where, insert, remove in edits:
        at = int(where * len(data))
        data = data[:at] + insert + data[at + remove :]
    if truncate:
        data = data[: len(data) // 2]
    path = tmp_path_factory.mktemp("fuzz") / "data.parquet"
    path.write_bytes(data)
    check_read(path, {"vocab_size": 300})


def test_the_undamaged_inputs_read(parquet_bytes, tmp_path):
    (tmp_path / "d.parquet").write_bytes(parquet_bytes)
    table = check_read(tmp_path / "d.parquet", {"vocab_size": 300})
    assert table is not None and table.windows.tolist() == [0, 5, 6, 1, 0, 7, 1]
    assert table.loss_mask.tolist() == [True, True, True, True, True]  # labels [-100,5,6,1]
    (tmp_path / "d.jsonl").write_text('{"input_ids": [0, 5, 1]}\n')
    table = check_read(tmp_path / "d.jsonl", {"vocab_size": 300})
    assert table is not None and table.windows.tolist() == [0, 5, 1]


@pytest.mark.parametrize(
    "data",
    [
        b'\xef\xbb\xbf{"input_ids": [null, null]}',  # Arrow built an invalid list<null> array
        b'{"\x80input_ids": []}',  # invalid UTF-8 in a key: UnicodeDecodeError from Arrow
        b'{"input_ids": [0, 0], "loss_mask": []}',  # an empty mask: IndexError
        b"\n\nnull\n",  # a null first record: pyarrow segfault
        b'{"input_ids": ' + b"[" * 7000 + b"]" * 7000 + b"}",  # deep nesting: segfault
        b"[]",  # an empty JSON array
    ],
)
def test_inputs_that_crashed_earlier_versions(tmp_path, data):
    path = tmp_path / "data.jsonl"
    path.write_bytes(data)
    assert check_read(path, {"vocab_size": 300}) is None


def test_an_empty_partition_column_is_read():
    ids = pa.array([], pa.list_(pa.int64()))
    table = pa.table({"input_ids": ids, "partition": pa.array([], pa.string())})
    assert len(load_examples(table, vocab_size=10)) == 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A datasets folder ``ds`` beside a folder ``other`` holding another Arrow file."""
    import contextlib
    import io

    import datasets

    root = tmp_path_factory.mktemp("state")
    with contextlib.redirect_stderr(io.StringIO()):
        for name in ("ds", "other"):
            datasets.Dataset.from_list([{"input_ids": [0, 5, 1]}]).save_to_disk(str(root / name))
    (root / "ds" / "sub").mkdir()
    (root / "ds" / "sub" / "up").symlink_to(root / "other")  # a folder link leaving ds
    return root


NAME_PARTS = st.sampled_from(
    ["..", ".", "sub", "up", "other", "ds", "data-00000-of-00001.arrow", "", "/", "\\", "C:"]
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(NAME_PARTS, min_size=1, max_size=5).map("/".join))
def test_fuzz_state_json_names_never_reach_outside_the_folder(saved, name):
    """Whatever file name ``state.json`` holds, the read is refused unless the name resolves
    to a file inside the folder (then that file is the one read)."""
    import os

    from exactpack.io.readers import read_documents

    folder = saved / "ds"
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": name}]
    (folder / "state.json").write_text(json.dumps(state))
    target = os.path.realpath(folder / name) if name else ""
    inside = bool(name) and os.path.commonpath([target, str(folder.resolve())]) == str(
        folder.resolve()
    )
    try:
        docs = read_documents(folder)
    except ExactpackError:
        return
    assert inside and os.path.isfile(target), (name, target)
    assert docs.tokens.tolist() == [0, 5, 1]

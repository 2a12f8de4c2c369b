"""Round four's leftovers of round three (issue 37, class 8), each refused in one line or
handled: NUL bytes refused as they are read, a text longer than a tokenizer is given
refused before the Rust side aborts, tampered packed ``datasets`` rows refused by the
check loaded shards get."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pyarrow as pa
import pytest

from exactpack.core.errors import InvalidInput
from exactpack.io import columns, tokenizers
from exactpack.io.jsonl import line_blocks
from exactpack.io.readers import read_documents


class _Counted(io.BytesIO):
    """A file that counts the bytes read from it."""

    taken = 0

    def read(self, size=-1):
        data = super().read(size)
        self.taken += len(data)
        return data


def test_nul_bytes_are_refused_as_soon_as_read(tmp_path):
    """600 MB of NUL bytes was refused after ~2.5 GB of memory (one line, no newline);
    scaled down: 8 MiB read in 1 MiB blocks stops at the first block."""
    f = _Counted(b"\0" * (8 << 20))
    with pytest.raises(InvalidInput, match=r"x\.jsonl line 1: holds a NUL byte — not a text"):
        list(line_blocks(f, 1 << 20, tmp_path / "x.jsonl"))
    assert f.taken == 1 << 20
    # the line named is the NUL's, in a text file too
    (tmp_path / "d.txt").write_bytes(b"one\ntwo\nthr\0ee\n")
    with pytest.raises(InvalidInput, match=r"d\.txt line 3: holds a NUL byte") as err:
        read_documents(tmp_path / "d.txt", tokenizer=tokenizers.ByteTokenizer())
    assert "\n" not in str(err.value)


def test_a_text_longer_than_a_tokenizer_is_given_is_refused(tmp_path, monkeypatch):
    """One 60 MB line aborted the process in the Rust tokenizer (~45 bytes a character);
    scaled down: a bound of 1,000 characters, a 1,001-character text on line 2."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    rust = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.save(str(tmp_path / "tokenizer.json"))
    tok = tokenizers.load_tokenizer(tmp_path / "tokenizer.json")
    for module in (tokenizers, columns):
        monkeypatch.setattr(module, "MAX_TEXT_CHARS", 1000)
    rows = [{"text": "a a"}, {"text": "a" * 1001}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InvalidInput, match=r"d\.jsonl line 2: text holds 1,001 characters,"
                       r" more than the 1,000 .* split the document"):  # fmt: skip
        read_documents(tmp_path / "d.jsonl", tokenizer=tok)
    with pytest.raises(InvalidInput, match="text 1 of 2 given to the tokenizer holds 1,001"):
        tok.encode_batch(["a", "a" * 1001])  # the door every other caller goes through
    assert tok.encode_batch(["a" * 1000])[1].tolist() == [0, 1]  # at the bound: encoded


def _packed():
    datasets = pytest.importorskip("datasets")
    from exactpack.hf import pack_dataset

    ds = datasets.Dataset.from_list([{"input_ids": [0, 5 + i % 4, 6, 1]} for i in range(6)])
    return datasets, pack_dataset(ds, max_length=8, vocab_size=10)


@pytest.mark.parametrize(
    ("column", "edit", "needle"),
    [
        ("tokens", lambda v: [*v[:-1], 12], "token id 12 is outside [0, 10)"),
        ("seq_starts", lambda v: [0, 2], "two occurrences of a row overlap"),
        ("ordinals", lambda v: [v[1], v[1]], "two occurrences share an ordinal"),
        ("ordinals", lambda v: [v[0], 6], "an ordinal lies outside 0..5"),
    ],
)
def test_tampered_packed_dataset_rows_are_refused(column, edit, needle):
    from exactpack.hf import to_batches, unpack_dataset

    datasets, packed = _packed()
    table = packed.with_format("arrow")[:]
    values = table.column(column).to_pylist()
    values[0] = edit(values[0])
    at = table.column_names.index(column)
    table = table.set_column(at, column, pa.array(values, table.schema.field(column).type))
    damaged = datasets.Dataset(table, info=packed.info)
    for read in (lambda d: list(to_batches(d)), unpack_dataset):
        with pytest.raises(InvalidInput, match=f"packed dataset: {re.escape(needle)}"):
            read(damaged)
    assert np.array_equal(  # the untouched one still reads
        np.sort(np.asarray(unpack_dataset(packed)["range_end"])), np.full(6, 4)
    )

"""The hostile-input catalogue: each case through the CLI and through the Python API.

A case writes its input files into an empty folder (the working directory
while it runs, so messages show short relative paths), then runs

- the CLI in-process (``exactpack.cli.main``, the function the ``exactpack``
  script calls): expected exit code 2, one line on stderr naming the
  file/line/example and the fix, and no file written;
- the API call a library user would make: expected the typed exception,
  with the same words, and no file written.

``tests/adversarial/test_hostile.py`` asserts every case; ``tests/gen_reliability.py``
runs them and writes ``docs/reliability.md``. A few cases are accepted
inputs (``error=None``): duplicated ids are packed and reported, and an
oversized example packs with ``--cut-long``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack import (
    Binding,
    BindingMismatch,
    BudgetExceeded,
    ExactpackError,
    ExampleTable,
    InvalidInput,
    OversizedExample,
    PackConfig,
    SequenceExample,
    SplitMismatch,
    pack_examples,
)
from exactpack.cli import main
from exactpack.core.config import check_segment_namespace
from exactpack.io.readers import load_examples
from exactpack.io.templates import TemplateLimit
from exactpack.io.tokenizers import ByteTokenizer, load_tokenizer
from exactpack.pipeline.local import pack_path

DATA = "data.jsonl"
OUT = "out"


def lines(*records: Any) -> bytes:
    """JSON Lines: dicts are dumped, bytes and str are written as they are."""
    out = []
    for r in records:
        out.append(r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)))
    return b"\n".join(x.encode() if isinstance(x, str) else x for x in out) + b"\n"


def _pack(*, data: str = DATA, capacity: int = 8, vocab: int | None = 300, **kw: Any) -> Any:
    return pack_path(data, OUT, max_length=capacity, vocab_size=vocab, policy="next-fit", **kw)


@dataclass(frozen=True)
class Case:
    """One hostile input: files, CLI arguments, API call and what must happen."""

    name: str
    input: str  # what is wrong, for the report
    files: dict[str, bytes]
    argv: tuple[str, ...] | None  # None: no CLI form (a library-level check)
    api: Callable[[], Any]
    error: type[ExactpackError] | None  # None: accepted input
    needles: tuple[str, ...]  # words the message (or the warning) must contain
    setup: Callable[[Path], None] | None = None
    expect: str = ""  # for accepted inputs: what happens instead of an error
    keeps: tuple[str, ...] = field(default=())  # files the run may create (accepted inputs)


def _pack_argv(*extra: str, data: str = DATA, capacity: int = 8, vocab: int | None = 300):
    argv = ["pack", data, "--out", OUT, "--max-length", str(capacity), "--policy", "next-fit"]
    if vocab is not None:
        argv += ["--vocab-size", str(vocab)]
    return (*argv, *extra)


def _ok_docs(n: int = 2) -> list[dict]:
    return [{"id": f"d{i}", "input_ids": [0, 5 + i, 6, 1]} for i in range(n)]


def _existing_output(folder: Path) -> None:
    with contextlib.redirect_stderr(io.StringIO()):
        pack_path(folder / DATA, folder / OUT, max_length=8, vocab_size=300, policy="next-fit")


def _foreign_folder(folder: Path) -> None:
    (folder / OUT).mkdir()
    (folder / OUT / "notes.txt").write_text("not exactpack's")


def _truncated_parquet(folder: Path) -> None:
    pq.write_table(pa.table({"input_ids": [[0, 5, 1]] * 50}), folder / "data.parquet")
    data = (folder / "data.parquet").read_bytes()
    (folder / "data.parquet").write_bytes(data[: len(data) // 2])


def _broken_tokenizer_folder(folder: Path) -> None:
    (folder / "tok").mkdir()
    (folder / "tok" / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchOne"}')


def _broken_datasets_folder(folder: Path) -> None:
    (folder / "ds").mkdir()
    (folder / "ds" / "state.json").write_text('{"_data_files": 5}')
    (folder / "ds" / "dataset_info.json").write_text("{}")


def _extra_specials_tokenizer(folder: Path) -> None:
    """A tokenizer.json whose post-processor adds a second special token after each text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({"[BOS]": 0, "[EOS]": 1, "[X]": 2, "hi": 3}, "[X]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = [("[BOS]", 0), ("[EOS]", 1), ("[X]", 2)]
    tok.post_processor = processors.TemplateProcessing("[BOS] $A [EOS] [X]", None, specials)
    tok.save(str(folder / "tokenizer.json"))


def _chat_folder(folder: Path) -> None:
    from support.sft_helpers import chat_tokenizer

    chat_tokenizer(folder / "tok")


def _sparse_template_folder(folder: Path) -> None:
    _chat_folder(folder)
    with open(folder / "tok" / "chat_template.jinja", "r+b") as f:
        f.truncate((4 << 20) + 1)  # sparse, just over the 4 MiB a chat template may hold


#: A chat, and a template whose two loops take 10^10 iterations.
_CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _remote_code_tokenizer(folder: Path) -> None:
    """A tokenizer folder whose config maps the tokenizer to Python code beside it; that
    code would leave a marker file if anything ran it."""
    (folder / "tok").mkdir()
    (folder / "tok" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Evil", "auto_map": {"AutoTokenizer": ["evil.Evil", None]}})
    )
    (folder / "tok" / "evil.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('ran')\n"
    )


def _output_with_a_user_file(folder: Path) -> None:
    _existing_output(folder)
    (folder / OUT / "notes.txt").write_text("the user's")


def _hand_table(window: list) -> ExampleTable:
    n = len(window)
    ids = np.array(["h"], dtype=object)
    return ExampleTable(
        windows=np.asarray(window),
        offsets=np.array([0, n], dtype=np.int64),
        loss_mask=np.ones(n - 1, dtype=bool),
        source_ids=ids,
        example_ids=ids,
        range_starts=np.zeros(1, dtype=np.int64),
        range_ends=np.array([n], dtype=np.int64),
        partition="train",
        binding=Binding(300, "t", "s"),
    )


def _val_example() -> SequenceExample:
    return SequenceExample.from_document(
        [0, 9, 1], source_id="v", partition="validation", binding=Binding(300, "t", "s")
    )


def _train_example(binding: Binding) -> SequenceExample:
    return SequenceExample.from_document(
        [0, 8, 1], source_id="t", partition="train", binding=binding
    )


CASES: list[Case] = [
    Case(
        "malformed-json",
        'a JSON line cut short (`{"input_ids": [0, 1`)',
        {DATA: lines(_ok_docs(1)[0], '{"input_ids": [0, 1')},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 2", "not valid JSON", "write one JSON object per line"),
    ),
    Case(
        "null-line",
        "a line that is `null` (crashed pyarrow's JSON reader: segfault)",
        {DATA: lines("null", _ok_docs(1)[0])},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "is a null, not a JSON object", "write one JSON object per line"),
    ),
    Case(
        "not-utf8",
        "bytes that are not UTF-8",
        {DATA: lines(_ok_docs(1)[0], b'{"input_ids": [0, 1], "id": "\xff\xfe"}')},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 2", "not UTF-8 text (byte 0xff)", "UTF-8 encoded"),
    ),
    Case(
        "deep-nesting",
        "arrays nested 20,000 deep (crashed pyarrow's JSON reader: stack overflow)",
        {DATA: b'{"input_ids": ' + b"[" * 20000 + b"]" * 20000 + b"}\n"},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "nested more than 64 levels", "flatten the data"),
    ),
    Case(
        "duplicate-key",
        "a key twice in one line",
        {DATA: lines('{"input_ids": [0, 1], "input_ids": [0, 2]}')},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "key 'input_ids' appears twice", "keep one"),
    ),
    Case(
        "wrong-type-ids",
        "`input_ids` a string",
        {DATA: lines(_ok_docs(1)[0], {"input_ids": "0 5 1"})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 2", "input_ids must be a list of integers", "JSON integers"),
    ),
    Case(
        "wrong-type-id",
        "`id` a float",
        {DATA: lines({"id": 1.5, "input_ids": [0, 5, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "id must be a string or an integer, got 1.5", "use a string"),
    ),
    Case(
        "mixed-types",
        "`input_ids` integers in one line, floats in the next",
        {DATA: lines({"input_ids": [0, 5, 1]}, {"input_ids": [0, 5.0, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 2", "input_ids must be integers", "got [0, 5.0, 1]"),
    ),
    Case(
        "json-array-mixed",
        "a `.json` array whose rows disagree on a column's type",
        {"data.json": json.dumps([{"input_ids": [0, 1]}, {"input_ids": "x"}]).encode()},
        _pack_argv(data="data.json"),
        lambda: _pack(data="data.json"),
        InvalidInput,
        ("data.json row 1", "input_ids must be a list of integers", "JSON integers"),
    ),
    Case(
        "empty-json-array",
        "a `.json` file holding `[]`",
        {"data.json": b"[]"},
        _pack_argv(data="data.json"),
        lambda: _pack(data="data.json"),
        InvalidInput,
        ("data.json holds an empty list: no rows", "nothing to pack"),
    ),
    Case(
        "missing-column",
        "no `input_ids` (nor text) column",
        {DATA: lines({"tokens": [0, 5, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (DATA, "no 'input_ids' or 'text' column (found ['tokens'])", "give token ids as input_ids"),
    ),
    Case(
        "missing-value",
        "`input_ids` null in one row",
        {DATA: lines(_ok_docs(1)[0], {"input_ids": None})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 2", "input_ids is missing", "give every row input_ids"),
    ),
    Case(
        "text-without-tokenizer",
        "a `text` column but no `--tokenizer`",
        {DATA: lines({"text": "hello"})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (DATA, "no tokenizer was given", "pass --tokenizer bytes"),
    ),
    Case(
        "empty-file",
        "an empty file (blank lines only)",
        {DATA: b"\n  \n"},
        _pack_argv(),
        _pack,
        InvalidInput,
        (DATA, "is empty: it holds no rows", "nothing to pack"),
    ),
    Case(
        "empty-document",
        "a document with no tokens",
        {DATA: lines(_ok_docs(1)[0], {"id": "e", "input_ids": []})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 2", "input_ids has 0 token(s)", "drop the row"),
    ),
    Case(
        "one-token-document",
        "a document of one token (no input/target pair)",
        {DATA: lines({"id": "one", "input_ids": [7]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "input_ids has 1 token(s)", "at least 2", "drop the row"),
    ),
    Case(
        "negative-id",
        "a negative token id",
        {DATA: lines({"input_ids": [0, -3, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "token id -3 at position 1", "never negative"),
    ),
    Case(
        "id-beyond-vocabulary",
        "a token id >= the vocabulary size",
        {DATA: lines({"id": "ok", "input_ids": [0, 1]}, {"id": "x", "input_ids": [0, 9]})},
        _pack_argv(vocab=9),
        lambda: _pack(vocab=9),
        InvalidInput,
        (f"{DATA} line 2 (id 'x')", "token id 9 at position 1", "below the vocabulary size 9"),
    ),
    Case(
        "id-beyond-int32",
        "a token id beyond int32",
        {DATA: lines({"input_ids": [0, 2**40, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", f"token id {2**40}", "0 <= id <= 2147483647"),
    ),
    Case(
        "float-id",
        "a float in `input_ids`",
        {DATA: lines({"input_ids": [0, 1.5, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "input_ids must be integers", "got [0, 1.5, 1]"),
    ),
    Case(
        "nan-id",
        "NaN in `input_ids`",
        {DATA: lines('{"input_ids": [0, NaN, 1]}')},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "input_ids must be integers", "NaN"),
    ),
    Case(
        "nan-mask",
        "NaN in `loss_mask`",
        {DATA: lines('{"input_ids": [0, 5, 1], "loss_mask": [1, NaN, 1]}')},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "loss_mask must be booleans or 0/1", "one true/false"),
    ),
    Case(
        "float-mask",
        "a fraction in `loss_mask`",
        {DATA: lines({"input_ids": [0, 5, 1], "loss_mask": [1, 0.5, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "loss_mask must be booleans or 0/1", "got [1, 0.5, 1]"),
    ),
    Case(
        "mask-out-of-range",
        "a 2 in `loss_mask` (Parquet, int column)",
        {},
        _pack_argv(data="data.parquet"),
        lambda: _pack(data="data.parquet"),
        InvalidInput,
        ("data.parquet row 1", "loss_mask holds 2", "booleans or 0/1"),
        setup=lambda d: pq.write_table(
            pa.table({"input_ids": [[0, 5, 1], [0, 6, 1]], "loss_mask": [[1, 1], [1, 2]]}),
            d / "data.parquet",
        ),
    ),
    Case(
        "parquet-duplicate-column",
        "a Parquet file with two columns named `input_ids`",
        {},
        _pack_argv(data="data.parquet"),
        lambda: _pack(data="data.parquet"),
        InvalidInput,
        ("data.parquet", "column 'input_ids' appears more than once", "rename or drop"),
        setup=lambda d: pq.write_table(
            pa.Table.from_arrays(
                [pa.array([[0, 5, 1]]), pa.array([[0, 6, 1]])], names=["input_ids", "input_ids"]
            ),
            d / "data.parquet",
        ),
    ),
    Case(
        "table-id-beyond-vocabulary",
        "an `ExampleTable` built by hand with an id >= its vocabulary (API)",
        {},
        None,
        lambda: _hand_table(window=[0, 5, 300, 1]),
        InvalidInput,
        ("example 0 ('h'[0:4]): token id 300 is outside [0, 300)", "raise the vocabulary size"),
    ),
    Case(
        "table-float-windows",
        "an `ExampleTable` whose windows are floats (API)",
        {},
        None,
        lambda: _hand_table(window=[0.0, 5.5, 1.0]),
        InvalidInput,
        ("ExampleTable.windows must be a 1-D integer NumPy array, got float64", "— encode"),
    ),
    Case(
        "labels-disagree",
        "`labels` that differ from `input_ids`",
        {DATA: lines({"input_ids": [0, 2, 1], "labels": [-100, 3, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "labels[1] = 3 differs", "the token itself or -100"),
    ),
    Case(
        "labels-wrong-length",
        "`labels` shorter than `input_ids`",
        {DATA: lines({"input_ids": [0, 2, 1], "labels": [0, 2]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "labels has 2 entries but input_ids has 3", "align with input_ids"),
    ),
    Case(
        "mask-wrong-length",
        "`loss_mask` of the wrong length",
        {DATA: lines({"input_ids": [0, 2, 1], "loss_mask": [1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1", "loss_mask has 1 entries for 3 tokens", "one per token or one per"),
    ),
    Case(
        "labels-and-mask",
        "both `labels` and `loss_mask`",
        {DATA: lines({"input_ids": [0, 1], "labels": [0, 1], "loss_mask": [1, 1]})},
        _pack_argv(),
        _pack,
        InvalidInput,
        (DATA, "has both labels and loss_mask", "keep one of them"),
    ),
    Case(
        "oversized-example",
        "an example longer than the capacity",
        {DATA: lines({"id": "long", "input_ids": list(range(10))})},
        _pack_argv(capacity=4),
        lambda: _pack(capacity=4),
        OversizedExample,
        (
            f"{DATA} line 1",
            "1 of 1 examples are longer than 5 tokens (max_length 4",
            "example 0 ('long'[0:10]), 10 tokens",
            "raise max_length= (the longest, 10 tokens, needs 9), cut them with cut_long=True",
        ),
    ),
    Case(
        "oversized-split-long",
        "the same example with `--cut-long`",
        {DATA: lines({"id": "long", "input_ids": list(range(10))})},
        (*_pack_argv(capacity=4), "--cut-long"),
        lambda: _pack(capacity=4, cut_long=True),
        None,
        ("split_sources",),
        expect="packed: 3 pieces [0:5] [4:9] [8:10], split_sources 1",
        keeps=(OUT,),
    ),
    Case(
        "duplicate-ids",
        "two rows with the same id",
        {DATA: lines({"id": "a", "input_ids": [0, 5, 1]}, {"id": "a", "input_ids": [0, 6, 1]})},
        _pack_argv(),
        _pack,
        None,
        ("1 row(s) repeat an earlier id", f"'a' at {DATA} line 2", f"first seen at {DATA} line 1"),
        expect="packed as 2 occurrences; warning line and `duplicate_ids: 1` in the statistics",
        keeps=(OUT,),
    ),
    Case(
        "mixed-partitions",
        "a `partition: validation` row in a training pack",
        {
            DATA: lines(
                {"input_ids": [0, 5, 1], "partition": "train"},
                {"input_ids": [0, 6, 1], "partition": "validation"},
            )
        },
        _pack_argv(),
        _pack,
        SplitMismatch,
        (f"{DATA} line 2", "belongs to partition 'validation'", "--split validation"),
    ),
    Case(
        "mixed-partitions-api",
        "a validation example among training examples (API)",
        {},
        None,
        lambda: pack_examples(
            "train",
            [_train_example(Binding(300, "t", "s")), _val_example()],
            Binding(300, "t", "s"),
            PackConfig(8, 2),
        ),
        SplitMismatch,
        ("example 1 ('v[0:3]'[0:3])", "belongs to partition 'validation'", "pack it separately"),
    ),
    Case(
        "mixed-bindings",
        "`--vocab-size` below the tokenizer's vocabulary",
        {DATA: lines({"text": "hi"})},
        _pack_argv("--tokenizer", "bytes", vocab=100),
        lambda: load_examples(DATA, vocab_size=100, tokenizer=ByteTokenizer()),
        BindingMismatch,
        ("--vocab-size 100 is below the tokenizer's 266", "drop --vocab-size or raise it"),
    ),
    Case(
        "mixed-bindings-api",
        "an example encoded under another binding (API)",
        {},
        None,
        lambda: pack_examples(
            "train",
            [_train_example(Binding(300, "t", "s")), _train_example(Binding(300, "other", "s"))],
            Binding(300, "t", "s"),
            PackConfig(8, 2),
        ),
        BindingMismatch,
        ("example 1 ('t[0:3]'[0:3])", "tokenizer_id 'other' != expected 't'", "re-encode"),
    ),
    Case(
        "tokenizer-missing",
        "a tokenizer path that does not exist",
        {DATA: lines({"text": "hi"})},
        _pack_argv("--tokenizer", "no/such/tokenizer", vocab=None),
        lambda: load_tokenizer("no/such/tokenizer"),
        InvalidInput,
        ("tokenizer 'no/such/tokenizer' is not a local file or folder", "no downloads"),
    ),
    Case(
        "tokenizer-garbage",
        "a `tokenizer.json` that is not a tokenizer",
        {DATA: lines({"text": "hi"}), "tokenizer.json": b'{"not": "a tokenizer"}'},
        _pack_argv("--tokenizer", "tokenizer.json", vocab=None),
        lambda: load_tokenizer("tokenizer.json"),
        InvalidInput,
        ("cannot load tokenizer.json as a tokenizers tokenizer",),
    ),
    Case(
        "tokenizer-folder-broken",
        "a tokenizer folder with a config naming no real tokenizer and no tokenizer.json",
        {DATA: lines({"text": "hi"})},
        _pack_argv("--tokenizer", "tok", vocab=None),
        lambda: load_tokenizer("tok"),
        InvalidInput,
        ("tok has tokenizer_config.json but no tokenizer.json", "save the tokenizer into it"),
        setup=_broken_tokenizer_folder,
    ),
    Case(
        "datasets-folder-broken",
        "a `datasets` folder whose state.json is damaged",
        {},
        _pack_argv(data="ds"),
        lambda: _pack(data="ds"),
        InvalidInput,
        ("ds: cannot load as a datasets save_to_disk folder", "save it again"),
        setup=_broken_datasets_folder,
    ),
    Case(
        "capacity-zero",
        "`--max-length 0`",
        {DATA: lines(*_ok_docs())},
        _pack_argv(capacity=0),
        lambda: _pack(capacity=0),
        InvalidInput,
        ("max_length must be an integer in [1, 2,147,483,647], got 0",),
    ),
    Case(
        "capacity-absurd",
        "`--max-length 2**40`",
        {DATA: lines(*_ok_docs())},
        _pack_argv(capacity=2**40),
        lambda: _pack(capacity=2**40),
        InvalidInput,
        (f"max_length must be an integer in [1, 2,147,483,647], got {2**40}",),
    ),
    Case(
        "capacity-beyond-best-fit",
        "a capacity beyond best-fit-decreasing's index",
        {DATA: lines(*_ok_docs())},
        (*_pack_argv(capacity=2**23), "--policy", "best-fit-decreasing"),
        lambda: pack_path(
            DATA, OUT, max_length=2**23, vocab_size=300, policy="best-fit-decreasing"
        ),
        InvalidInput,
        ("capacity 8,388,608 exceeds 4,194,304", "use first-fit-decreasing or next-fit"),
    ),
    Case(
        "rows-per-call-zero",
        "`--max-rows-per-batch 0`",
        {DATA: lines(*_ok_docs())},
        _pack_argv("--max-rows-per-batch", "0"),
        lambda: _pack(max_rows_per_batch=0),
        InvalidInput,
        ("max_rows_per_batch must be an integer in [1, 2,147,483,647], got 0",),
    ),
    Case(
        "occurrences-beyond-int32",
        "2**31 + 1 occurrences in one packing (the check, not an allocation)",
        {},
        None,
        lambda: check_segment_namespace(2**31 + 1),
        InvalidInput,
        ("2,147,483,649 occurrences do not fit int32 segment ids", "pack the corpus in several"),
    ),
    Case(
        "budget-too-small",
        "`--max-metadata-bytes 1K`",
        {DATA: lines(*_ok_docs())},
        _pack_argv("--max-metadata-bytes", "1K"),
        lambda: _pack(max_metadata_bytes=1024),
        BudgetExceeded,
        (
            "with next-fit (plus one model call of 8 x 8 cells",
            "max_metadata_bytes is 1,024",
            "raise the budget",
        ),
    ),
    Case(
        "model-call-beyond-budget",
        "rows of 2**31 - 1 cells under `--max-metadata-bytes 8G`",
        {DATA: lines(*_ok_docs())},
        _pack_argv("--max-metadata-bytes", "8G", capacity=2**31 - 1),
        lambda: _pack(capacity=2**31 - 1, max_metadata_bytes=8 << 30),
        BudgetExceeded,
        ("one model call of 8 x 2,147,483,647 cells", "but max_metadata_bytes is 8,589,934,592"),
    ),
    Case(
        "budget-api",
        "`PackConfig(max_metadata_bytes=64)` (API)",
        {},
        None,
        lambda: pack_examples(
            "train",
            [_train_example(Binding(300, "t", "s"))],
            Binding(300, "t", "s"),
            PackConfig(8, 2, max_metadata_bytes=64),
        ),
        BudgetExceeded,
        ("but max_metadata_bytes is 64", "raise the budget"),
    ),
    Case(
        "unknown-partition",
        "`--split dev`",
        {DATA: lines(*_ok_docs())},
        _pack_argv("--split", "dev"),
        lambda: _pack(split="dev"),
        InvalidInput,
        ("unknown partition 'dev'", "train, validation, test"),
    ),
    Case(
        "input-missing",
        "an input path that does not exist",
        {},
        _pack_argv(data="nope.jsonl"),
        lambda: _pack(data="nope.jsonl"),
        InvalidInput,
        ("input 'nope.jsonl' does not exist",),
    ),
    Case(
        "input-unknown-type",
        "a `.csv` file",
        {"data.csv": b"a,b\n1,2\n"},
        _pack_argv(data="data.csv"),
        lambda: _pack(data="data.csv"),
        InvalidInput,
        ("unknown input type '.csv'", "use .jsonl, .json, .parquet"),
    ),
    Case(
        "parquet-truncated",
        "a truncated Parquet file",
        {},
        _pack_argv(data="data.parquet"),
        lambda: _pack(data="data.parquet"),
        InvalidInput,
        ("data.parquet: cannot read as Parquet",),
        setup=_truncated_parquet,
    ),
    Case(
        "out-exists",
        "`--out` names an existing output, no `--overwrite`",
        {DATA: lines(*_ok_docs())},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{OUT} already exists", "pass --overwrite"),
        setup=_existing_output,
    ),
    Case(
        "out-foreign",
        "`--overwrite` onto a folder that is not a exactpack output",
        {DATA: lines(*_ok_docs())},
        (*_pack_argv(), "--overwrite"),
        lambda: _pack(overwrite=True),
        InvalidInput,
        (f"{OUT} exists and is not a exactpack output; refusing", "choose another --out"),
        setup=_foreign_folder,
    ),
    Case(
        "out-dot",
        "`--out .` (the current folder, not a new one)",
        {DATA: lines(*_ok_docs())},
        ("pack", DATA, "--out", ".", "--max-length", "8", "--vocab-size", "300", "--overwrite"),
        lambda: pack_path(DATA, ".", max_length=8, vocab_size=300, overwrite=True),
        InvalidInput,
        ("--out '.' names an existing folder by '.', '..' or '/'", "e.g. --out ./packed"),
    ),
    Case(
        "out-empty",
        '`--out ""`',
        {DATA: lines(*_ok_docs())},
        ("pack", DATA, "--out", "", "--max-length", "8", "--vocab-size", "300"),
        lambda: pack_path(DATA, "", max_length=8, vocab_size=300),
        InvalidInput,
        ("--out is empty", "name the output folder, e.g. --out packed"),
    ),
    Case(
        "out-holds-a-user-file",
        "`--overwrite` onto an output folder the user added a file to",
        {DATA: lines(*_ok_docs())},
        (*_pack_argv(), "--overwrite"),
        lambda: _pack(overwrite=True),
        None,
        ("note: left 'notes.txt' in", "the manifest does not list it"),
        setup=_output_with_a_user_file,
        expect="packed; `notes.txt` is left as it is, with a note on stderr naming it",
    ),
    Case(
        "tokenizer-remote-code",
        "a tokenizer folder whose config names Python code to run (`auto_map`; the code would"
        " leave a marker file)",
        {DATA: lines({"text": "hi"})},
        _pack_argv("--tokenizer", "tok", vocab=None),
        lambda: load_tokenizer("tok"),
        InvalidInput,
        ("the tokenizer in tok needs the Python code", "exactpack never runs a tokenizer folder's"),
        setup=_remote_code_tokenizer,
    ),
    Case(
        "out-under-a-file",
        "`--out` inside a path that is a file",
        {DATA: lines(*_ok_docs())},
        ("pack", DATA, "--out", f"{DATA}/out", "--max-length", "8", "--vocab-size", "300"),
        lambda: pack_path(DATA, f"{DATA}/out", max_length=8, vocab_size=300),
        InvalidInput,
        ("cannot create the output folder", "choose a writable --out"),
    ),
    Case(
        "tokenizer-extra-specials",
        "a `tokenizer.json` whose post-processor adds a token besides BOS/EOS to every text",
        {DATA: lines({"text": "hi"})},
        _pack_argv("--tokenizer", "tokenizer.json", vocab=None),
        lambda: load_tokenizer("tokenizer.json"),
        InvalidInput,
        ("post-processor turns each text into '[BOS] $A [EOS] [X]'", "at most one special"),
        setup=_extra_specials_tokenizer,
    ),
    Case(
        "chat-template-kwargs-text",
        "a `chat_template_kwargs` that is a string, not a mapping",
        {DATA: lines({"messages": _CHAT, "chat_template_kwargs": "padding=max_length"})},
        _pack_argv("--tokenizer", "tok", vocab=None),
        lambda: _pack(vocab=None, tokenizer="tok"),
        InvalidInput,
        (f"{DATA} line 1: chat_template_kwargs is str, not a mapping",),
        setup=_chat_folder,
    ),
    Case(
        "chat-template-kwargs-padding",
        "`chat_template_kwargs` asking for padding to 60 tokens",
        {DATA: lines({"messages": _CHAT, "chat_template_kwargs": {"padding": "max_length"}})},
        _pack_argv("--tokenizer", "tok", vocab=None),
        lambda: _pack(vocab=None, tokenizer="tok"),
        InvalidInput,
        ("chat_template_kwargs names 'padding', a tokenizer", "drop the key"),
        setup=_chat_folder,
    ),
    Case(
        "chat-template-loop",
        "a chat template whose loops take 10^10 iterations",
        {DATA: lines({"messages": _CHAT}), "loop.jinja": _LOOP.encode()},
        _pack_argv("--tokenizer", "tok", "--chat-template", "loop.jinja", vocab=None),
        lambda: _pack(vocab=None, tokenizer="tok", chat_template="loop.jinja"),
        TemplateLimit,
        (f"{DATA} line 1: the chat template (--chat-template", "4,194,304 steps", "fix the"),
        setup=_chat_folder,
    ),
    Case(
        "chat-template-sparse",
        "a sparse `chat_template.jinja` over the size limit inside the tokenizer folder",
        {DATA: lines({"messages": _CHAT})},
        _pack_argv("--tokenizer", "tok", vocab=None),
        lambda: _pack(vocab=None, tokenizer="tok"),
        InvalidInput,
        ("chat_template.jinja holds 4,194,305 bytes", "pass the tokenizer's own files"),
        setup=_sparse_template_folder,
    ),
]


# --- the one input policy (issue 21): every door of the readers --------------------------


def _datasets_folder(folder: Path, name: str = "ds") -> None:
    import datasets

    with contextlib.redirect_stderr(io.StringIO()):
        datasets.Dataset.from_list(_ok_docs()).save_to_disk(str(folder / name))


def _state_names_outside(folder: Path) -> None:
    _datasets_folder(folder, "other")
    _datasets_folder(folder)
    state = json.loads((folder / "ds" / "state.json").read_text())
    state["_data_files"] = [{"filename": "../other/data-00000-of-00001.arrow"}]
    (folder / "ds" / "state.json").write_text(json.dumps(state))


def _fifo_in_datasets_folder(folder: Path) -> None:
    _datasets_folder(folder)
    (folder / "ds" / "data-00000-of-00001.arrow").unlink()
    os.mkfifo(folder / "ds" / "data-00000-of-00001.arrow")


def _symlink_leaving_folder(folder: Path) -> None:
    (folder / "shards").mkdir()
    (folder / "shards" / "a.jsonl").write_bytes(lines(*_ok_docs()))
    (folder / "shards" / "b.jsonl").symlink_to(folder / DATA)


def _stray_file(folder: Path) -> None:
    (folder / "shards").mkdir()
    (folder / "shards" / "a.jsonl").write_bytes(lines(*_ok_docs()))
    (folder / "shards" / "b.csv").write_text("input_ids\n0 5 1\n")


def _parquet_bomb(folder: Path) -> None:
    ids = pa.array(np.zeros(16_000_000, np.int64))
    rows = pa.ListArray.from_arrays(np.arange(0, 16_000_001, 1000, dtype=np.int32), ids)
    pq.write_table(pa.table({"input_ids": rows}), folder / "bomb.parquet", compression="zstd")


def _parquet_boolean_map(folder: Path) -> None:
    # the first page header starts with a field holding a Thrift map of 2**60 booleans
    pq.write_table(pa.table({"input_ids": [[0, 5, 1]] * 4}), folder / "ok.parquet")
    data = (folder / "ok.parquet").read_bytes()
    chunk = pq.ParquetFile(folder / "ok.parquet").metadata.row_group(0).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    huge = bytes([0xFB, *[0x80] * 8, 0x10, 0x11])  # field 15: map, size 2**60, (bool, bool)
    (folder / "m.parquet").write_bytes(data[:start] + huge + data[start + len(huge) :])
    (folder / "ok.parquet").unlink()


def _pack_file(name: str, **kw: Any) -> Callable[[], Any]:
    return lambda: _pack(data=name, **kw)


CASES += [
    Case(
        "datasets-state-outside",
        "a `datasets` folder whose `state.json` names `../other/data-00000-of-00001.arrow`"
        " (was read and packed: a file outside the input)",
        {},
        _pack_argv(data="ds"),
        _pack_file("ds"),
        InvalidInput,
        ("ds names a data file '../other/data-00000-of-00001.arrow' outside itself",),
        setup=_state_names_outside,
    ),
    Case(
        "datasets-fifo",
        "a FIFO among a `datasets` folder's Arrow files (hung forever)",
        {},
        _pack_argv(data="ds"),
        _pack_file("ds"),
        InvalidInput,
        ("data-00000-of-00001.arrow is a FIFO (named pipe), not a regular file",),
        setup=_fifo_in_datasets_folder,
    ),
    Case(
        "symlink-leaves-folder",
        "a shard that is a symlink to a file outside the input folder",
        {DATA: lines(*_ok_docs())},
        _pack_argv(data="shards"),
        _pack_file("shards"),
        InvalidInput,
        ("shards/b.jsonl resolves to", "outside the input shards"),
        setup=_symlink_leaving_folder,
    ),
    Case(
        "stray-data-file",
        "a folder of shards that also holds `b.csv` (was silently left out)",
        {},
        _pack_argv(data="shards"),
        _pack_file("shards"),
        InvalidInput,
        ("shards holds b.csv beside its shards, which exactpack does not read",),
        setup=_stray_file,
    ),
    Case(
        "parquet-bomb",
        "a Parquet file of a few KB whose run-length encoded pages decode to 144 MB"
        " (reached 3 GB RSS before an error)",
        {},
        _pack_argv(data="bomb.parquet"),
        _pack_file("bomb.parquet"),
        InvalidInput,
        ("bomb.parquet: row group 0 would decode to", "a decompression bomb?",
         "refused before decoding"),
        setup=_parquet_bomb,
    ),
    Case(
        "parquet-boolean-map",
        "a Parquet page header claiming a Thrift map of 2**60 booleans (the header walk"
        " spun for practically forever)",
        {},
        _pack_argv(data="m.parquet"),
        _pack_file("m.parquet"),
        InvalidInput,
        ("m.parquet: row group 0 cannot be read as Parquet", "the file is damaged"),
        setup=_parquet_boolean_map,
    ),
    Case(
        "gzip-bomb",
        "a `.jsonl.gz` of 100 KB inflating to 100 MB",
        {"b.jsonl.gz": gzip.compress(b"{" + b"x" * (100 << 20), 9)},
        _pack_argv(data="b.jsonl.gz"),
        _pack_file("b.jsonl.gz"),
        InvalidInput,
        ("b.jsonl.gz decompresses to more than 67,108,864 bytes", "a compression bomb?"),
    ),
    Case(
        "gzip-empty-lines",
        "a `.txt.gz` of 1 KB holding 400,000 empty lines (each became a document before"
        " the decompression limit tripped: 1 MB of them ran two minutes and reached 3.8 GB)",
        {"e.txt.gz": gzip.compress(b"\n" * 400_000, 9)},
        _pack_argv("--tokenizer", "bytes", data="e.txt.gz", vocab=None),
        _pack_file("e.txt.gz", vocab=None, tokenizer="bytes"),
        InvalidInput,
        ("e.txt.gz decompresses to more than 67,108,864 bytes counting 256 bytes for each of"
         " its 400,000+ lines", "a compression bomb?"),
    ),
    Case(
        "gzip-damaged",
        "a `.jsonl.gz` cut short",
        {"c.jsonl.gz": gzip.compress(lines(*_ok_docs(50)))[:-40]},
        _pack_argv(data="c.jsonl.gz"),
        _pack_file("c.jsonl.gz"),
        InvalidInput,
        ("c.jsonl.gz: cannot decompress it as gzip",),
    ),
    Case(
        "json-keys-explode",
        "15,000 JSON lines each with one new key (56 s and 3.6 GB: a column per key)",
        {DATA: lines(*({"input_ids": [0, 5, 1], f"k{i}": 1} for i in range(15_000)))},
        _pack_argv(),
        _pack,
        InvalidInput,
        (f"{DATA} line 1024: more than 1,024 distinct keys in one file",),
    ),
    Case(
        "json-array-duplicate-key",
        "a `.json` array whose object holds a key twice (the last value was kept)",
        {"a.json": b'[{"input_ids": [0, 5, 1]}, {"input_ids": [0, 5, 1], "input_ids": [0, 6]}]'},
        _pack_argv(data="a.json"),
        _pack_file("a.json"),
        InvalidInput,
        ("a.json row 1: key 'input_ids' appears twice in one object",),
    ),
    Case(
        "inputs-mix-formats",
        "two inputs of different formats (`data.jsonl` and a `.parquet`)",
        {DATA: lines(*_ok_docs())},
        ("pack", DATA, "x.parquet", "--out", OUT, "--max-length", "8", "--vocab-size", "300"),
        lambda: _pack(data=[DATA, "x.parquet"]),  # type: ignore[arg-type]
        InvalidInput,
        ("the inputs mix Parquet and JSON Lines files",),
        setup=lambda f: pq.write_table(pa.table({"input_ids": [[0, 1]]}), f / "x.parquet"),
    ),
    Case(
        "glob-matches-nothing",
        "a glob that matches no file",
        {},
        _pack_argv(data="part-*.jsonl"),
        _pack_file("part-*.jsonl"),
        InvalidInput,
        ("input 'part-*.jsonl' matches no file",),
    ),
]  # fmt: skip


# --- round four (issue 37): what round three left open ------------------------------------

#: A tokenizer.json holding one 2 MiB string (an added token of 30 MB aborted the process in
#: the Rust allocator; the check needs no valid tokenizer, it runs before one is built).
_HUGE_TOKEN = json.dumps({"added_tokens": [{"id": 9, "content": "a" * (2 << 20)}]}).encode()

CASES += [
    Case(
        "tokenizer-huge-string",
        "a `tokenizer.json` holding a 2 MiB string (a 30 MB added token aborted the process"
        " in the Rust allocator)",
        {DATA: lines({"text": "hi"}), "tokenizer.json": _HUGE_TOKEN},
        _pack_argv("--tokenizer", "tokenizer.json", vocab=None),
        lambda: load_tokenizer("tokenizer.json"),
        InvalidInput,
        ("tokenizer.json holds a string of 2,097,", "more than the 1,048,576 a tokenizer file"),
    ),
    Case(
        "nul-bytes",
        "a `.jsonl` of NUL bytes (600 MB were refused only after ~2.5 GB of memory)",
        {DATA: b"\0" * (1 << 16)},
        _pack_argv(),
        _pack,
        InvalidInput,
        ("data.jsonl line 1: holds a NUL byte — not a text or JSON file",),
    ),
    Case(
        "text-nul-byte",
        "a `.txt` whose third line holds a NUL byte",
        {"d.txt": b"one\ntwo\nthr\0ee\n"},
        _pack_argv("--tokenizer", "bytes", data="d.txt", vocab=None),
        lambda: _pack(data="d.txt", vocab=None, tokenizer="bytes"),
        InvalidInput,
        ("d.txt line 3: holds a NUL byte",),
    ),
]  # fmt: skip


@dataclass
class Outcome:
    """What one case did through the CLI and through the API."""

    cli_code: int | None = None
    cli_stdout: str = ""
    cli_stderr: str = ""
    cli_written: list[str] = field(default_factory=list)
    api_error: type[BaseException] | None = None
    api_message: str = ""
    api_result: Any = None
    api_written: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _inside(folder: Path):
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


def _changes(before: dict[str, bytes], folder: Path) -> list[str]:
    after = _snapshot(folder)
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def prepare(case: Case, folder: Path) -> None:
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    if case.setup is not None:
        case.setup(folder)


def run_case(case: Case, folder: Path) -> Outcome:
    """Run ``case`` in the empty ``folder``: CLI first (if it has a form), then the API."""
    prepare(case, folder)
    outcome = Outcome()
    with _inside(folder):
        if case.argv is not None:
            before = _snapshot(folder)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                outcome.cli_code = main(list(case.argv))
            outcome.cli_stdout, outcome.cli_stderr = out.getvalue(), err.getvalue()
            outcome.cli_written = _changes(before, folder)
            for name in case.keeps:  # an accepted run's output, removed before the API run
                shutil.rmtree(folder / name, ignore_errors=True)
        before = _snapshot(folder)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                outcome.api_result = case.api()
        except ExactpackError as err:
            outcome.api_error, outcome.api_message = type(err), str(err)
        outcome.api_written = _changes(before, folder)
    return outcome


@dataclass(frozen=True)
class Usage:
    """A command line refused before any input is read: one line, exit 2, nothing written."""

    name: str
    input: str
    argv: tuple[str, ...]
    needles: tuple[str, ...]


def _flag(flag: str, value: str, *extra: str) -> tuple[str, ...]:
    return (*_pack_argv(*extra), flag, value)


_STATS = ("stats", DATA, "--max-length", "8")

USAGE: list[Usage] = [
    Usage("capacity-inf", "`--max-length inf`", ("pack", DATA, "--out", OUT, "--max-length", "inf"),
          ("--max-length 'inf' is not a whole number", "write e.g. 4096")),
    Usage("capacity-nan", "`--max-length nan`", ("pack", DATA, "--out", OUT, "--max-length", "nan"),
          ("--max-length 'nan' is not a whole number",)),
    Usage("capacity-fraction", "`--max-length 4096.0`",
          ("pack", DATA, "--out", OUT, "--max-length", "4096.0"), ("'4096.0' is not a whole",)),
    Usage("capacity-exponent", "`--max-length 1e3`",
          ("pack", DATA, "--out", OUT, "--max-length", "1e3"), ("'1e3' is not a whole number",)),
    Usage("capacity-negative", "`--max-length -5`",
          ("pack", DATA, "--out", OUT, "--max-length", "-5"),
          ("max_length must be an integer in [1, 2,147,483,647], got -5",)),
    Usage("rows-per-call-absurd", "`--max-rows-per-batch` of 10**30",
          _flag("--max-rows-per-batch", "1" + "0" * 30),
          ("--max-rows-per-batch '1000000000000000000000000000000' is beyond any usable size",)),
    Usage("vocabulary-absurd", "`--vocab-size 3000000000`", _flag("--vocab-size", "3000000000"),
          ("vocab_size must be an integer in [1, 2,147,483,647], got 3000000000",)),
    Usage("budget-overflow", "`--max-metadata-bytes 1e999` (was an OverflowError traceback)",
          _flag("--max-metadata-bytes", "1e999"),
          ("--max-metadata-bytes '1e999' is not a byte size like 512M or 2G",)),
    Usage("budget-absurd", "`--max-metadata-bytes 99999999P`",
          _flag("--max-metadata-bytes", "99999999P"), ("is beyond any machine's memory",)),
    Usage("option-infinity", "`--option lookahead=Infinity`",
          _flag("--option", "lookahead=Infinity", "--policy", "stream-best-fit"),
          ("--option 'lookahead=Infinity': Infinity is not a usable value",)),
    Usage("option-overflow", "`--option lookahead=1e999` (JSON reads it as infinity)",
          _flag("--option", "lookahead=1e999", "--policy", "stream-best-fit"),
          ("--option 'lookahead=1e999': inf is not a usable value", "write a finite number")),
    Usage("option-absurd", "`--option lookahead=` of 10**30",
          _flag("--option", "lookahead=1" + "0" * 30, "--policy", "stream-best-fit"),
          ("is beyond any usable size (at most 2**62)",)),
    Usage("option-not-key-value", "`--option lookahead`", _flag("--option", "lookahead"),
          ("--option 'lookahead' is not KEY=VALUE", "write e.g. lookahead=4096")),
    Usage("ray-cpus-fraction", "`--ray-num-cpus 1.5`", _flag("--ray-num-cpus", "1.5"),
          ("--ray-num-cpus '1.5' is not a whole number",)),
    Usage("verify-seed-negative", "`exactpack verify --seed -1`", ("verify", "--seed", "-1"),
          ("--seed '-1' is outside [0, 9,223,372,036,854,775,807]",)),
    Usage("verify-seed-inf", "`exactpack verify --seed inf`", ("verify", "--seed", "inf"),
          ("--seed 'inf' is not a whole number",)),
    Usage("verify-tree-lengths-huge",
          "`exactpack verify --tree-lengths 10:1000000000` (drew 8 GB of ids before the"
          " positions check)",
          ("verify", "--hf-config", "c.json", "--tree-lengths", "10:1000000000"),
          ("--tree-lengths asks for 1,000,000,010 tokens; a verification runs at most"
           " 1,048,576", "give fewer or shorter examples")),
    Usage("verify-lengths-huge", "`exactpack verify --lengths 1000000000`",
          ("verify", "--hf-config", "c.json", "--lengths", "1000000000"),
          ("--lengths asks for 1,000,000,001 tokens",)),
    Usage("verify-model-bytes", "`exactpack verify --max-model-bytes lots`",
          ("verify", "--max-model-bytes", "lots"),
          ("--max-model-bytes 'lots' is not a byte size like 512M or 2G",)),
    Usage("missing-out", "`exactpack pack` without `--out`",
          ("pack", DATA, "--max-length", "8"), ("the following arguments are required: --out",)),
    Usage("unknown-flag", "a misspelt flag", (*_STATS, "--max-rows", "nan", "--polcy", "x"),
          ("unrecognized arguments: --max-rows nan --polcy x", "did you mean --policy?",
           "(see exactpack stats --help)")),
    Usage("flag-typo", "`--max-lenght 8`", ("pack", DATA, "--out", OUT, "--max-lenght", "8"),
          ("unrecognized arguments: --max-lenght 8 — did you mean --max-length?",)),
    Usage("stats-out", "`exactpack stats ... --out out` (pack's arguments)",
          (*_STATS, "--out", OUT),
          ("--out: stats writes nothing", "run exactpack pack with the same arguments")),
    Usage("bad-choice", "`--engine spark`", _flag("--engine", "spark"),
          ("argument --engine: invalid choice: 'spark'",)),
    Usage(
        "no-command", "`exactpack` alone", (), ("the following arguments are required: command",)
    ),
    Usage("plot-format", "`--plot stats.xyz` (was a matplotlib traceback after planning)",
          (*_STATS, "--plot", "stats.xyz"),
          ("--plot 'stats.xyz': .xyz is not an image format matplotlib writes", ".png")),
    Usage("plot-no-suffix", "`--plot stats`", (*_STATS, "--plot", "stats"),
          ("no suffix names an image format",)),
    Usage("plot-under-a-file", "`--plot` inside a path that is a file",
          (*_STATS, "--plot", f"{DATA}/stats.png"), (f"cannot write under '{DATA}'",)),
]  # fmt: skip


def run_usage(case: Usage, folder: Path) -> Outcome:
    """Run a refused command line in ``folder`` (holding a valid input) through ``main``."""
    (folder / DATA).write_bytes(lines(*_ok_docs()))
    outcome = Outcome()
    with _inside(folder):
        before = _snapshot(folder)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            outcome.cli_code = main(list(case.argv))
        outcome.cli_stdout, outcome.cli_stderr = out.getvalue(), err.getvalue()
        outcome.cli_written = _changes(before, folder)
    return outcome

"""A grammar-based fuzzer for JSON Lines: lines built token by token, then read.

Unlike ``test_fuzz_readers.py`` (records dumped by ``json`` and damaged byte
by byte), these lines come from a JSON grammar with its edges: numbers of
any size and form (``-0``, ``1e999``, ``NaN``), every escape including lone
surrogates, brackets and quotes inside strings, duplicate keys, two values on
one line, truncation, trailing garbage, odd whitespace, CRLF and a BOM. The
contract of the public reader :func:`exactpack.io.readers.read_documents`:

- any file: a :class:`~exactpack.ExactpackError` or documents that keep their
  invariants, never another exception (and never a crash of the process);
- a file of valid records, however laid out: read exactly (same ids, tokens
  and loss flags, in order).

Nesting stays shallow here (deep nesting is ``test_fuzz_readers.py``'s).
"""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactpack import ExactpackError
from exactpack.io.documents import Documents
from exactpack.io.readers import read_documents
from exactpack.io.tokenizers import ByteTokenizer

GRAMMAR = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
KEYS = ["id", "input_ids", "labels", "loss_mask", "text", "partition", "other"]

ws = st.sampled_from(["", " ", "  ", "\t", " \t "])
number = st.one_of(
    st.tuples(
        st.sampled_from(["", "-"]),
        st.integers(0, 10**25).map(str),
        st.sampled_from(["", ".5", ".0", ".25"]),
        st.sampled_from(["", "e3", "E-2", "e+400", "e-400"]),
    ).map("".join),
    st.integers(-300, 300).map(str),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "-0", "1e999", "01", "+1", ".5", "0x10"]),
)
escape = st.one_of(
    st.sampled_from(['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\x", "\\"]),
    st.integers(0, 0xFFFF).map(lambda c: f"\\u{c:04x}"),
    st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\ud83d"]),
)
chunk = st.one_of(
    st.sampled_from(["a", "doc 1", "0", "☃", "😀", "é", "\u2028", "[", "]", "{", "}", "]]]]"]),
    st.sampled_from(["[[[[", ",", ":", '"', "\x00", "\x1f", "\x7f", " "]),
    escape,
)
string = st.lists(chunk, max_size=4).map(lambda parts: '"' + "".join(parts) + '"')
scalar = st.one_of(string, number, st.sampled_from(["null", "true", "false", "nul", "tru"]))


def _array(inner):
    return st.tuples(ws, st.lists(inner, max_size=4), ws).map(
        lambda t: "[" + t[0] + ",".join(t[1]) + t[2] + "]"
    )


def _object(inner):
    key = st.one_of(st.sampled_from(KEYS).map(json.dumps), string)
    pair = st.tuples(key, ws, inner).map(lambda t: f"{t[0]}{t[1]}:{t[1]}{t[2]}")
    return st.lists(pair, max_size=3).map(lambda pairs: "{" + ", ".join(pairs) + "}")


value = st.recursive(scalar, lambda inner: st.one_of(_array(inner), _object(inner)), max_leaves=12)
token_ids = st.lists(st.integers(-3, 300).map(str), max_size=6).map(
    lambda x: "[" + ",".join(x) + "]"
)
record = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(token_ids, value)), min_size=1, max_size=4
).map(lambda pairs: "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}")
line = st.one_of(
    record,
    record,
    value,
    st.tuples(record, record).map(" ".join),  # two objects on a line
    st.tuples(record, st.integers(1, 30)).map(lambda t: t[0][: t[1]]),  # cut short
    st.tuples(record, st.sampled_from([",", "]", "}", "x", "\x00", "//c"])).map("".join),
    st.just(""),
)


@st.composite
def files(draw, lines_of=line) -> bytes:
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    text = sep.join(draw(st.lists(lines_of, min_size=1, max_size=4)))
    text = draw(st.sampled_from(["", "\ufeff"])) + text + draw(st.sampled_from(["", sep]))
    return text.encode("utf-8", errors="surrogatepass")


def _check_documents(docs: Documents) -> None:
    assert isinstance(docs, Documents)
    k = len(docs)
    assert docs.offsets.dtype == np.int64 and docs.offsets.shape == (k + 1,)
    assert docs.offsets[0] == 0 and np.all(np.diff(docs.offsets) >= 2)
    assert docs.tokens.dtype == np.int32 and docs.tokens.shape == (int(docs.offsets[-1]),)
    assert docs.tokens.size == 0 or docs.tokens.min() >= 0
    assert docs.loss_mask.dtype == bool and docs.loss_mask.shape == (int(docs.lengths.sum()),)
    assert docs.ids.shape == (k,) and all(isinstance(i, str) for i in docs.ids)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tmp_path_factory.mktemp("grammar") / "data.jsonl"  # rewritten by every example


@GRAMMAR
@given(files(), st.booleans())
def test_any_line_of_the_grammar_is_a_exactpack_error_or_valid_documents(
    path, data, with_tokenizer
):
    path.write_bytes(data)
    try:
        docs = read_documents(path, tokenizer=ByteTokenizer() if with_tokenizer else None)
    except ExactpackError as err:
        assert "\n" not in str(err).strip(), "one line"
        return
    _check_documents(docs)


# ---------------------------------------------------------------- valid records, any layout

safe_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters="\x7f"),
    max_size=6,
)


@st.composite
def valid_files(draw) -> tuple[bytes, list[dict]]:
    """Valid records written with random spacing, key order, escapes, CRLF, blank lines, BOM."""
    int_ids = draw(st.booleans())
    # one type per column and file: Arrow gives a column one type (see the report)
    other = draw(
        st.sampled_from([safe_text, st.integers(-(2**62), 2**62), st.lists(st.integers())])
    )
    records = []
    for i in range(draw(st.integers(1, 6))):
        tokens = draw(st.lists(st.integers(0, 265), min_size=2, max_size=8))
        rec = {"id": i if int_ids else f"{draw(safe_text)}-{i}", "input_ids": tokens}
        if draw(st.booleans()):
            rec["loss_mask"] = draw(st.lists(st.booleans(), min_size=len(tokens) - 1,
                                             max_size=len(tokens) - 1))  # fmt: skip
        if draw(st.booleans()):
            rec["other"] = draw(other)
        records.append(rec)
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    lines = []
    for rec in records:
        items = list(rec.items())
        if draw(st.booleans()):
            items.reverse()
        space = draw(ws)
        parts = [
            f"{json.dumps(k)}{space}:{space}{json.dumps(v, ensure_ascii=draw(st.booleans()))}"
            for k, v in items
        ]
        lines.append(draw(ws) + "{" + f",{space}".join(parts) + "}" + draw(ws))
        if draw(st.integers(0, 4)) == 0:
            lines.append(draw(ws))  # a blank line
    text = (
        draw(st.sampled_from(["", "\ufeff"])) + sep.join(lines) + draw(st.sampled_from(["", sep]))
    )
    return text.encode(), records


@GRAMMAR
@given(valid_files())
def test_valid_records_in_any_layout_are_read_exactly(path, case):
    data, records = case
    path.write_bytes(data)
    docs = read_documents(path)
    _check_documents(docs)
    assert docs.ids.tolist() == [str(r["id"]) for r in records]
    for i, rec in enumerate(records):
        a, b = docs.offsets[i], docs.offsets[i + 1]
        assert docs.tokens[a:b].tolist() == rec["input_ids"]
        flags = docs.loss_mask[a - i : b - i - 1].tolist()
        assert flags == rec.get("loss_mask", [True] * (len(rec["input_ids"]) - 1))

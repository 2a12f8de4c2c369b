"""Grammar fuzzers for the doors other than data files: tokenizer settings, chat templates,
``state.json`` and the public API's arguments.

Each door's contract: a :class:`~exactpack.ExactpackError` of one line, or a result that
keeps the door's promise, never another exception type:

- a ``tokenizer.json`` with any truncation, padding and post-processor: the ids are those
  of the same tokenizer with truncation and padding removed, or a post-processor adding
  more than BOS/EOS is refused at load;
- a chat template built from a grammar of hostile pieces (huge ranges, string products,
  joins, filters, macros, recursion, ``raise_exception``, undefined names): rendered, or
  refused within seconds;
- a ``state.json`` with any content: only files inside the folder are read (a sentinel
  folder beside it never leaks);
- one argument of ``pack_path``, ``pack_dataset``, ``load_packed``, ``RowSampler`` or
  ``StreamDataset`` replaced by a wrong type or an out-of-range value.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import time
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactpack import ExactpackError

DOORS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def one_line(err: BaseException) -> None:
    assert isinstance(err, ExactpackError), f"{type(err).__name__}: {err}"
    assert "\n" not in str(err).strip(), str(err)


# --- 1. tokenizer.json settings ----------------------------------------------------------

SPECIALS = ["<unk>", "<pad>", "<s>", "</s>", "<x>", "<y>"]
WORDS = ["alpha", "beta", "gamma", "delta", "pack", "rows", "tokens", "the", "a", "of"]
#: (single template, refused): more than one special token on a side is refused at load.
PROCESSORS = [
    (None, False),
    ("<s> $A </s>", False),
    ("<s> $A", False),
    ("$A </s>", False),
    ("<s> <x> $A </s>", True),
    ("$A </s> <y>", True),
    ("<x> <s> $A <y> </s>", True),
]


@pytest.fixture(scope="module")
def word_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator([" ".join(WORDS)] * 3, trainer)
    return tok.to_str()


texts = st.lists(
    st.lists(st.sampled_from([*WORDS, "unknown", "<s>", "é", "  "]), max_size=12).map(" ".join),
    min_size=1,
    max_size=4,
)


@DOORS
@given(
    truncate=st.one_of(st.none(), st.integers(1, 6)),
    pad=st.one_of(
        st.none(), st.tuples(st.one_of(st.none(), st.integers(1, 16)), st.integers(0, 5))
    ),
    processor=st.sampled_from(PROCESSORS),
    texts=texts,
)
def test_tokenizer_settings_never_cut_or_pad(
    word_tokenizer, tmp_path_factory, truncate, pad, processor, texts
):
    from tokenizers import Tokenizer, processors

    from exactpack.io.tokenizers import load_tokenizer

    tok = Tokenizer.from_str(word_tokenizer)
    single, refused = processor
    if single is not None:
        names = [p for p in single.split() if p != "$A"]
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(n, tok.token_to_id(n)) for n in dict.fromkeys(names)]
        )
    if truncate is not None:
        tok.enable_truncation(max_length=truncate)
    if pad is not None:
        tok.enable_padding(length=pad[0], pad_id=pad[1], pad_token=SPECIALS[pad[1]])
    reference = Tokenizer.from_str(tok.to_str())
    reference.no_truncation()
    reference.no_padding()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            loaded = load_tokenizer(path)
        except Exception as err:  # the property: its type
            one_line(err)
            assert refused, err
            return
    assert not refused, single
    ids, offsets = loaded.encode_batch(texts)
    got = [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)]
    assert got == [reference.encode(t).ids for t in texts]
    assert loaded.pad_token_id == (None if pad is None else pad[1])


# --- 2. chat templates -------------------------------------------------------------------

SIZES = st.sampled_from([0, 1, 3, 1000, 10**9, 10**12])
PIECES = st.one_of(
    st.just("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"),
    st.tuples(SIZES, st.sampled_from(["i", "'ab'", "messages[0]['content']", "messages"])).map(
        lambda t: f"{{% for i in range({t[0]}) %}}{{{{ {t[1]} }}}}{{% endfor %}}"
    ),
    SIZES.map(lambda n: f"{{{{ 'ab' * {n} }}}}"),
    SIZES.map(lambda n: f"{{{{ messages | map(attribute='content') | join('x' * {n}) }}}}"),
    st.tuples(st.sampled_from(["center", "indent", "truncate", "wordwrap", "batch"]), SIZES).map(
        lambda t: f"{{{{ messages[0]['content'] | upper | {t[0]}({t[1]}) }}}}"
    ),
    st.sampled_from([1, 4, 40]).map(
        lambda n: (
            "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}"
            f"{{{{ f({n}) }}}}"
        )
    ),
    st.just("{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}"),
    st.just("{% macro g() %}{{ g() }}{% endmacro %}{{ g() }}"),
    st.just("{{ raise_exception('no such role') }}"),
    st.sampled_from(["{{ nothing }}", "{{ nothing.attr }}", "{{ nothing() }}", "{{ x[3] }}"]),
    SIZES.map(lambda n: f"{{{{ messages[{n}]['content'] }}}}"),
    SIZES.map(lambda n: f"{{{{ '{{:>{n}}}'.format('a') }}}}"),
    st.just("{{ messages[0]['content'].replace('', 'ab') }}"),
    st.just(
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}"
    ),
    st.just("{% if add_generation_prompt %}assistant:{% endif %}"),
    st.just("{% generation %}{{ messages[-1]['content'] }}{% endgeneration %}"),
    st.sampled_from(
        ["{% for %}", "{{ ", "{% endfor %}", "{{ 1 / 0 }}", "{{ messages.__class__ }}"]
    ),
    st.just("{{ messages | tojson }}"),
)
CHATS = [
    [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why"}],
]


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    from support.sft_helpers import chat_tokenizer

    return chat_tokenizer(tmp_path_factory.mktemp("chat"), template=None)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(pieces=st.lists(PIECES, min_size=1, max_size=3), chats=st.sampled_from([1, 2]))
@example(pieces=["{% for %}"], chats=1)  # a syntax error escaped as a TemplateSyntaxError
def test_any_template_of_the_grammar_renders_or_fails_in_one_line(chat_folder, pieces, chats):
    from exactpack.io.readers import read_documents
    from exactpack.pipeline.options import PackOptions

    template = "".join(pieces)
    table = pa.Table.from_pylist([{"messages": c} for c in CHATS[:chats]])
    start = time.perf_counter()
    try:
        opts = PackOptions(max_length=8, tokenizer=str(chat_folder), chat_template=template)
        docs = read_documents(table, tokenizer=opts.load_tokenizer())
    except Exception as err:  # the property: its type
        one_line(err)
    else:
        assert len(docs) <= chats
    assert time.perf_counter() - start < 8, template


# --- 3. state.json -----------------------------------------------------------------------

SENTINEL = [250, 251, 252]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A datasets folder ``ds`` (ids 0 5 1) beside ``other`` (the sentinel ids)."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("state")
    with contextlib.redirect_stderr(io.StringIO()):
        datasets.Dataset.from_list([{"input_ids": [0, 5, 1]}]).save_to_disk(str(root / "ds"))
        datasets.Dataset.from_list([{"input_ids": SENTINEL}]).save_to_disk(str(root / "other"))
    (root / "ds" / "up").symlink_to(root / "other")
    return root


ARROW = "data-00000-of-00001.arrow"
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", ARROW, "../other/" + ARROW, "up/" + ARROW, "/etc/passwd", "x" * 5000]),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
data_files = st.one_of(
    json_value,
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"filename": json_scalar}),
            st.fixed_dictionaries({"filename": json_scalar}, optional={"extra": json_value}),
            json_value,
        ),
        max_size=3,
    ),
)
RAW = st.sampled_from(
    ["", "{", "[]", "null", "1e999", "NaN", '{"_data_files": 1e999}', "\ufeff{}", "\x00\xff"]
)


@DOORS
@given(
    files=data_files,
    extra=st.dictionaries(
        st.sampled_from(["_split", "_fingerprint", "_format_type", "_format_columns", "x"]),
        json_value,
        max_size=3,
    ),
    raw=st.one_of(st.none(), RAW),
)
def test_any_state_json_reads_only_inside_the_folder(saved, files, extra, raw):
    from exactpack.io.readers import read_documents

    folder = saved / "ds"
    text = raw if raw is not None else json.dumps({**extra, "_data_files": files})
    (folder / "state.json").write_text(text, errors="surrogatepass")
    try:
        docs = read_documents(folder)
    except Exception as err:  # the property: its type
        one_line(err)
        return
    tokens = docs.tokens.tolist()
    assert not set(tokens) & set(SENTINEL), (text, tokens)
    assert tokens and len(tokens) % 3 == 0 and set(tokens) <= {0, 1, 5}, (text, tokens)


# --- 4. public API arguments -------------------------------------------------------------

HOSTILE = st.sampled_from(
    [None, "x", "", "4", 1.5, math.nan, math.inf, -1, 0, 2**62, -(2**62), 2**64, [1], True, {}]
)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from exactpack.pipeline.local import pack_path

    root = tmp_path_factory.mktemp("api")
    src = root / "in.jsonl"
    rows = [{"id": str(i), "input_ids": list(range(1, 3 + i % 5))} for i in range(12)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack_path(src, root / "out", max_length=8, vocab_size=20)
    return root


PACK_ARGS = {
    "max_length": 8,
    "policy": "best-fit",
    "vocab_size": 20,
    "max_rows_per_batch": 4,
    "shard_tokens": 1 << 16,
    "chunk_bytes": 1 << 16,
    "pad_token_id": 0,
    "cut_long": False,
    "truncation_mode": None,
    "max_metadata_bytes": 1 << 24,
    "partition": "train",
    "text_field": "text",
}


def _outcome(call) -> None:
    try:
        call()
    except Exception as err:  # the property: its type
        one_line(err)


@DOORS
@given(name=st.sampled_from(sorted(PACK_ARGS)), value=HOSTILE)
def test_pack_path_arguments(packed, tmp_path_factory, name, value):
    from exactpack.pipeline.local import pack_path

    out = tmp_path_factory.mktemp("p") / "out"
    _outcome(lambda: pack_path(packed / "in.jsonl", out, **(PACK_ARGS | {name: value})))


@DOORS
@given(
    name=st.sampled_from(["capacity", "policy", "vocab_size", "pad_token_id", "format"]),
    value=HOSTILE,
)
@example(name="capacity", value=None)  # PackOptions' TypeError escaped
def test_pack_dataset_arguments(name, value):
    datasets = pytest.importorskip("datasets")
    from exactpack.hf.datasets_io import pack_dataset

    ds = datasets.Dataset.from_list([{"input_ids": [1, 2, 3, 4][: 2 + i % 3]} for i in range(6)])
    args = {"max_length": 8, "policy": "best-fit", "vocab_size": 20, "pad_token_id": 0}
    args |= {"format": "rows"} if name == "format" else {}
    args[name] = value
    with contextlib.redirect_stderr(io.StringIO()):
        _outcome(lambda: pack_dataset(ds, **args))


@DOORS
@given(
    name=st.sampled_from(["path", "expected_binding", "integrity", "expected_split"]),
    value=HOSTILE,
)
def test_load_packed_arguments(packed, name, value):
    from exactpack.io.store import load_packed

    args = {"path": packed / "out", "integrity": True} | {name: value}
    _outcome(lambda: load_packed(args.pop("path"), **args))


SAMPLER_ARGS = [
    "rows_per_micro_batch",
    "micro_batches",
    "world_size",
    "rank",
    "seed",
    "balance",
    "shuffle",
]


@DOORS
@given(name=st.sampled_from(SAMPLER_ARGS), value=HOSTILE)
def test_row_sampler_arguments(name, value):
    from exactpack.training import RowSampler, RowStats

    tokens = np.array([5.0, 3.0, 8.0, 2.0, 7.0])
    args = {"rows_per_micro_batch": 2, "micro_batches": 1, "world_size": 1, "rank": 0}
    args[name] = value

    def call():
        slots = list(iter(RowSampler(RowStats(tokens, tokens, tokens**2.0), **args)))
        assert len(slots) >= 1

    _outcome(call)


STREAM_ARGS = [
    "max_length",
    "rows_per_micro_batch",
    "micro_batches",
    "world_size",
    "rank",
    "split",
    "cut_long",
    "lookahead",
    "max_open_rows",
    "seed",
    "balance",
    "read_chunk",
    "text_field",
    "binding",
    "tokenizer",
]


@DOORS
@given(name=st.sampled_from(STREAM_ARGS), value=HOSTILE)
def test_stream_dataset_arguments(name, value):
    from itertools import islice

    from exactpack.training.stream import StreamDataset

    from support.strategies import BINDING

    docs = [np.arange(1, 2 + i % 6, dtype=np.int32) for i in range(20)]
    args = {"binding": BINDING, "max_length": 10, "rows_per_micro_batch": 3, "lookahead": 8}
    args[name] = value
    _outcome(lambda: list(islice(iter(StreamDataset(docs, **args)), 4)))

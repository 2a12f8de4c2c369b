"""Tokenizer doors: the cache of tokenizers transformers built (class 4 of issue 37) and
tokenizer files whose values would exhaust the Rust side (class 8).

The cache decides the tokens of every later run, so it is trusted only when it is this
user's private folder and a file's bytes hash to its name; what the tokenizer's facts are
(vocabulary size, EOS, PAD) is read from the tokenizer and its folder, never a cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack.core.errors import InvalidInput
from exactpack.io.tokenizers import (
    MAX_TOKENIZER_STRING,
    cache_folder,
    load_tokenizer,
    longest_string,
)

from support.sft_helpers import chat_tokenizer

pytest.importorskip("transformers")
TEXTS = ["Hello World, what color is the sky?", "HELLO there <s>x</s>"]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A folder of a model-specific class (loaded through transformers, so cached) and
    transformers' own ids, vocabulary size, EOS and PAD id for it."""
    from transformers import AutoTokenizer

    folder = chat_tokenizer(tmp_path_factory.mktemp("qwen"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "Qwen2TokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    real = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    facts = (real(TEXTS)["input_ids"], len(real), real.eos_token, real.pad_token_id)
    return folder, facts


def _facts(tok):
    ids = [tok.encode_batch([t])[0].tolist() for t in TEXTS]
    return ids, tok.vocab_size, tok.backend.eos_token, tok.pad_token_id


def _lowercasing(data: bytes) -> bytes:
    """Another valid tokenizer: the same one lowercasing first (other ids for 'Hello')."""
    tok = json.loads(data)
    tok["normalizer"] = {"type": "Lowercase"}
    return json.dumps(tok).encode()


def _plant(folder, rename: bool) -> int:
    """Replace every cached tokenizer by a lowercasing one; ``rename``: under a name its
    new bytes hash to, as a writer who knows the scheme would. Returns the files planted."""
    planted = 0
    for file in sorted(folder.iterdir()):
        if file.suffix != ".json":
            continue
        data = _lowercasing(file.read_bytes())
        file.write_bytes(data)
        if rename and "-" in file.stem:
            file.rename(file.with_name(f"{file.stem.split('-')[0]}-"
                                       f"{hashlib.sha256(data).hexdigest()}.json"))  # fmt: skip
        planted += 1
    return planted


def test_an_edited_cache_file_is_not_trusted(model_folder, tmp_path, monkeypatch):
    folder, want = model_folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _facts(load_tokenizer(folder)) == want  # through transformers, then kept
    cache = cache_folder()
    assert cache == tmp_path / "exactpack" / "tokenizers"
    assert os.stat(cache).st_mode & 0o077 == 0  # made for this user only
    assert _facts(load_tokenizer(folder)) == want  # from the cache
    assert _plant(cache, rename=False) == 1
    for meta in cache.glob("*.meta"):  # a format that kept facts beside it: lie in them
        meta.write_text(json.dumps({"vocab_size": 7, "eos_token": "x", "pad_token_id": 3}))
    assert _facts(load_tokenizer(folder)) == want  # its bytes do not hash to its name
    assert _facts(load_tokenizer(folder)) == want  # and the file written again is whole


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_cache_folder_others_can_write_is_not_used(model_folder, tmp_path, monkeypatch,
                                                     mode):  # fmt: skip
    folder, want = model_folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    load_tokenizer(folder)  # fills the cache
    cache = cache_folder()
    assert _plant(cache, rename=True) == 1  # another user's file, well formed
    os.chmod(cache, mode)
    with pytest.warns(UserWarning, match=r"not a folder only you can write .*chmod go-w"):
        assert _facts(load_tokenizer(folder)) == want
    os.chmod(cache, 0o700)
    if os.getuid() == 0:  # root can give it away: another user's folder is not used
        os.chown(cache, 65534, 65534)
        with pytest.warns(UserWarning, match="not a folder only you can write"):
            assert _facts(load_tokenizer(folder)) == want
        os.chown(cache, 0, 0)
    # a link in place of the folder is not this user's private folder either
    shutil.move(cache, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", cache)
    with pytest.warns(UserWarning, match="not a folder only you can write"):
        assert _facts(load_tokenizer(folder)) == want


def _with_huge_token(data: bytes, size: int, quoted: bool) -> bytes:
    """The tokenizer with an added token of ``size`` bytes (``quoted``: of escaped quotes,
    so no run between two quote bytes is long)."""
    tok = json.loads(data)
    content = '"' * (size // 2) if quoted else "a" * size
    tok["added_tokens"].append({"id": len(tok["model"]["vocab"]) + 50, "content": content,
                                "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": True})  # fmt: skip
    return json.dumps(tok).encode()


@pytest.mark.parametrize("quoted", [False, True])
def test_a_huge_string_in_tokenizer_files_is_refused_before_the_rust_side(
    model_folder, tmp_path, quoted
):
    """A 30 MB added token aborts the process in the Rust allocator under a 2 GB limit
    (it builds ~40 bytes a byte); any string over MAX_TOKENIZER_STRING is refused first.
    Scaled down: 2 MiB, which the Rust side would take."""
    folder, _ = model_folder
    size = 2 * MAX_TOKENIZER_STRING
    data = _with_huge_token((folder / "tokenizer.json").read_bytes(), size, quoted)
    (tmp_path / "tokenizer.json").write_bytes(data)
    with pytest.raises(InvalidInput, match=r"tokenizer\.json holds a string of 2,0\d\d,\d\d\d"
                       " bytes, more than the 1,048,576") as err:  # fmt: skip
        load_tokenizer(tmp_path / "tokenizer.json")
    assert "\n" not in str(err.value)
    copy = tmp_path / "folder"  # a folder: its tokenizer_config.json's added tokens too
    shutil.copytree(folder, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.setdefault("added_tokens_decoder", {})["999"] = {"content": "b" * size, "special": True}
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInput, match=r"tokenizer_config\.json holds a string of 2,"):
        load_tokenizer(copy)
    # the longest real string passes: a charsmap-sized one
    data = _with_huge_token((folder / "tokenizer.json").read_bytes(), 300_000, quoted)
    (tmp_path / "tokenizer.json").write_bytes(data)
    assert load_tokenizer(tmp_path / "tokenizer.json").vocab_size > 300


def test_a_prompt_rendered_differently_alone_is_warned_as_trl_warns(tmp_path):
    """A template whose generation prompt opens an empty thought block the whole
    conversation drops (Gemma 4's): the prompt is not a prefix of prompt + completion, so
    the completion is trained from where they diverge — said, never silent (TRL warns)."""
    import pyarrow as pa

    from exactpack.io.readers import read_documents

    from support.sft_helpers import TEMPLATE

    thinking = TEMPLATE.replace("<|assistant|>\n{% endif %}", "<|assistant|>\n<think></think>"
                                "{% endif %}")  # fmt: skip
    assert thinking != TEMPLATE
    rows = [{"prompt": [{"role": "user", "content": f"What color is the sky {i}?"}],
             "completion": [{"role": "assistant", "content": "It is blue."}]}
            for i in range(3)]  # fmt: skip
    table = pa.Table.from_pylist(rows)
    plain = load_tokenizer(chat_tokenizer(tmp_path / "plain"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the template's own rendering: a prefix, no warning
        read_documents(table, tokenizer=plain)
    tok = load_tokenizer(chat_tokenizer(tmp_path / "thinking", thinking))
    with pytest.warns(UserWarning, match=r"row 0: the tokenized prompt is not a prefix of the"
                      r" tokenized prompt \+ completion \(3 of 3 rows") as said:  # fmt: skip
        docs = read_documents(table, tokenizer=tok)
    assert "'<think></think>'" in str(said[0].message)
    assert "\n" not in str(said[0].message)
    # trained from where they diverge: the answer and what follows it, no prompt token
    first = docs.tokens[docs.offsets[0] : docs.offsets[1]]
    mask = docs.loss_mask[: first.shape[0] - 1]  # one flag per target (first[1:])
    assert tok.decode(first[1:][mask]).startswith("It is blue.")


def _strings_by_hand(data: bytes) -> int:
    """The longest string of JSON text ``data`` by a lexer a byte at a time (the reference
    of the vectorised block scan): from its opening quote to its closing one."""
    best, i = 0, 0
    while i < len(data):
        if data[i] == ord('"'):
            j = i + 1
            while j < len(data) and data[j] != ord('"'):
                j += 2 if data[j] == ord("\\") else 1
            best, i = max(best, min(j, len(data)) - i), j + 1
        else:
            i += 1
    return best


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(
        st.sampled_from(["a", "\\", '"', "\\\\", "xyz", '\\"', " ", "\\u0022"]), max_size=40
    ),
    cut=st.integers(0, 400),
    block=st.integers(1, 9),
)
def test_the_block_scan_finds_the_longest_string_as_a_lexer_does(pieces, cut, block):
    """Escaped quotes and backslash runs across block borders, valid JSON or cut short."""
    data = json.dumps(["".join(pieces), *pieces]).encode()[: cut or None]
    assert longest_string(data, block) == _strings_by_hand(data)

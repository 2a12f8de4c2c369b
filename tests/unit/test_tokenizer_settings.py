"""Tokenizer settings that would change the data, and tokenizer folders as fast as files.

A ``tokenizer.json`` with truncation or padding enabled is tokenized
without them (and says so); a post-processor adding more than BOS/EOS is
refused; ``chat_template_kwargs`` are template variables only; tokenizer
files are size-checked before they are read; a ``save_pretrained`` folder
whose ``tokenizer.json`` transformers uses as it is loads without
importing transformers, to the same tokens.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import warnings

import pyarrow as pa
import pytest

from exactpack.core.errors import InvalidInput
from exactpack.io.readers import read_documents
from exactpack.io.tokenizers import (
    MAX_TEMPLATE_FILE,
    load_tokenizer,
    loaded_tokenizer,
    read_chat_template,
)

from support.sft_helpers import CHATS, chat_tokenizer

pytest.importorskip("tokenizers")
TEXTS = ["hello world packed", "packed packed hello world world hello"]


def _word_tokenizer(single: str = "[BOS] $A [EOS]"):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[BOS]": 0, "[EOS]": 1, "[UNK]": 2, "[PAD]": 3, "hello": 4, "world": 5, "packed": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = [("[BOS]", 0), ("[EOS]", 1), ("[PAD]", 3)]
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
    return tok


def _tokens(tok, texts=TEXTS) -> list[list[int]]:
    flat, offsets = tok.encode_batch(texts)
    return [flat[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def test_truncation_and_padding_in_tokenizer_json_are_turned_off_with_a_note(tmp_path):
    plain = _word_tokenizer()
    want = [plain.encode(t).ids for t in TEXTS]
    hostile = _word_tokenizer()
    hostile.enable_truncation(4)
    hostile.enable_padding(pad_id=3, pad_token="[PAD]", length=60)
    hostile.save(str(tmp_path / "tokenizer.json"))
    with pytest.warns(UserWarning, match="truncation to 4 tokens and padding is turned off"):
        tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert _tokens(tok) == want and len(want[1]) > 4  # whole documents, no pad tokens
    assert tok.pad_token_id == 3  # the padding setting's pad id is still the pad token
    # an object the user holds is never changed: exactpack tokenizes with a copy
    with pytest.warns(UserWarning, match="turned off"):
        wrapped = loaded_tokenizer(hostile)
    assert _tokens(wrapped) == want and hostile.truncation is not None
    # the copy shipped to a Ray worker (pickled) is the sanitised one, and stays quiet
    import pickle

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shipped = pickle.loads(pickle.dumps(tok))
    assert _tokens(shipped) == want


def test_a_fast_transformers_tokenizer_with_truncation_is_tokenized_whole(tmp_path):
    from transformers import PreTrainedTokenizerFast

    inner = _word_tokenizer()
    inner.enable_truncation(3)
    fast = PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="[BOS]", eos_token="[EOS]")
    with pytest.warns(UserWarning, match="truncation to 3 tokens"):
        tok = loaded_tokenizer(fast)
    assert _tokens(tok) == [_word_tokenizer().encode(t).ids for t in TEXTS]


@pytest.mark.parametrize(
    "single", ["[BOS] [PAD] $A [EOS]", "[BOS] $A [EOS] [PAD]", "[BOS] [BOS] $A"]
)
def test_post_processing_beyond_bos_and_eos_is_refused(tmp_path, single):
    _word_tokenizer(single).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InvalidInput, match=r"post-processor turns each text into .*\$A") as err:
        load_tokenizer(tmp_path)
    assert "tokenizer.json" in str(err.value) and "\n" not in str(err.value)
    for fine in ("$A", "[BOS] $A", "[BOS] $A [EOS]"):
        _word_tokenizer(fine).save(str(tmp_path / "tokenizer.json"))
        load_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("chat"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ("greeting=hi", "chat_template_kwargs is str, not a mapping"),
        ({"padding": "max_length", "max_length": 60}, "names 'padding', a tokenizer"),
        ({"truncation": True}, "names 'truncation'"),
        ({"return_tensors": "np"}, "names 'return_tensors'"),
        ({"tokenizer_kwargs": {"padding": True}}, "names 'tokenizer_kwargs'"),
    ],
)
def test_chat_template_kwargs_cannot_change_padding_or_length(folder, kwargs, message):
    table = pa.Table.from_pylist([{"messages": CHATS[0]}])
    table = table.append_column("chat_template_kwargs", pa.array([kwargs]))
    with pytest.raises(InvalidInput, match=message) as err:
        read_documents(table, tokenizer=load_tokenizer(folder))
    assert "row 0" in str(err.value) and "\n" not in str(err.value)
    # a template variable passes, and reaches the template
    table = pa.Table.from_pylist(
        [{"messages": CHATS[0], "chat_template_kwargs": {"greeting": "x"}}]
    )
    longer = read_documents(table, tokenizer=load_tokenizer(folder))
    plain = read_documents(
        pa.Table.from_pylist([{"messages": CHATS[0]}]), tokenizer=load_tokenizer(folder)
    )
    assert longer.tokens.shape[0] > plain.tokens.shape[0]


def test_huge_or_special_tokenizer_files_are_refused_before_reading(folder, tmp_path):
    import shutil

    copy = tmp_path / "tok"
    shutil.copytree(folder, copy)
    with open(copy / "chat_template.jinja", "r+b") as f:  # sparse: no disk, huge size
        f.truncate(MAX_TEMPLATE_FILE + 1)
    with pytest.raises(InvalidInput, match=r"chat_template\.jinja holds 4,194,305 bytes"):
        load_tokenizer(copy)
    with pytest.raises(InvalidInput, match="holds 4,194,305 bytes"):
        read_chat_template(copy / "chat_template.jinja")
    (copy / "chat_template.jinja").unlink()
    os.mkfifo(copy / "chat_template.jinja")  # a reader would block forever
    with pytest.raises(InvalidInput, match="is not a regular file"):
        load_tokenizer(copy)


def test_a_folder_without_tokenizer_json_says_what_is_missing(folder, tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "LlamaTokenizer"})
    )
    with pytest.raises(InvalidInput, match=r"has tokenizer_config\.json but no tokenizer\.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(InvalidInput, match=r"has no tokenizer\.json, and transformers cannot"):
        load_tokenizer(tmp_path)


def test_a_folder_loads_as_its_tokenizer_json_without_transformers(folder):
    from transformers import AutoTokenizer

    tok = load_tokenizer(folder)
    real = AutoTokenizer.from_pretrained(str(folder))
    texts = ["What color is the sky?", "Hello there, how are you today?"]
    assert _tokens(tok, texts) == real(texts)["input_ids"]
    assert (tok.vocab_size, tok.pad_token_id) == (len(real), real.pad_token_id)
    assert tok.backend.eos_token == real.eos_token
    code = (
        "import sys, time; t = time.perf_counter();"
        "from exactpack.io.tokenizers import load_tokenizer;"
        f"tok = load_tokenizer({str(folder)!r}); tok.encode_batch(['hi']);"
        "print('transformers' in sys.modules, 'torch' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


LOAD = (
    "import json, sys; from exactpack.io.tokenizers import load_tokenizer;"
    "tok = load_tokenizer(sys.argv[1]); texts = json.loads(sys.argv[2]);"
    "print(json.dumps({'ids': [tok.encode_batch([t])[0].tolist() for t in texts],"
    " 'vocab': tok.vocab_size, 'pad': tok.pad_token_id,"
    " 'imported': ['transformers' in sys.modules, 'torch' in sys.modules]}))"
)


@pytest.mark.parametrize("cls", ["Qwen2TokenizerFast", "GPT2TokenizerFast", "LlamaTokenizerFast"])
def test_a_model_specific_folder_loads_without_transformers_from_its_second_load(
    folder, tmp_path, monkeypatch, cls
):
    """A folder of a model's own tokenizer class (transformers rebuilds its pipeline: Qwen2
    normalizes to NFC, so a decomposed accent tokenizes unlike its tokenizer.json): the first
    load goes through transformers and keeps the tokenizer it built; later processes read
    that without importing transformers or torch, to transformers' own ids."""
    import shutil

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    saved = tmp_path / cls
    shutil.copytree(folder, saved)
    config = json.loads((saved / "tokenizer_config.json").read_text())
    (saved / "tokenizer_config.json").write_text(json.dumps(config | {"tokenizer_class": cls}))
    texts = ["What color is the sky?", "cafe\u0301 <s>x</s>", "  Hello there,\n how are you?"]
    real = AutoTokenizer.from_pretrained(str(saved), local_files_only=True)
    want = real(texts)["input_ids"]
    as_is = [e.ids for e in Tokenizer.from_file(str(saved / "tokenizer.json")).encode_batch(texts)]
    if cls == "Qwen2TokenizerFast":
        assert as_is != want  # the rebuilt pipeline differs, and it is transformers' that counts
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), XDG_CACHE_HOME=str(tmp_path))
    argv = [sys.executable, "-c", LOAD, str(saved), json.dumps(texts)]
    runs = []
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    for run in runs:
        assert run["ids"] == want
        assert (run["vocab"], run["pad"]) == (len(real), real.pad_token_id)
    assert runs[1]["imported"] == [False, False]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_tokenizer(saved).backend.eos_token == real.eos_token


def test_text_mistakes_name_the_flag_that_fixes_them(tmp_path, capsys):
    from exactpack.cli import main
    from exactpack.core.binding import Binding
    from exactpack.training.stream import StreamDataset

    path = tmp_path / "d.jsonl"
    path.write_text('{"id": "a", "text": "hello"}\n{"id": "b", "text": "world"}\n')
    args = ["pack", str(path), "--max-length", "16", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    first = capsys.readouterr().err.split("error: ")[1]
    assert first.startswith("no --tokenizer given: text input needs --tokenizer")
    assert main([*args, "--tokenizer", "bytes", "--text-field", "body"]) == 2
    err = capsys.readouterr().err
    assert "found ['id', 'text']" in err and "--text-field NAME" in err
    assert "(e.g. --text-field text)" in err
    assert not (tmp_path / "o").exists()
    # {"id", "text"} mappings in a stream are tokenized, never a bare KeyError
    binding = Binding(266, "exactpack/bytes-266", "s")
    items = [{"id": "a", "text": "hello"}, {"id": "b", "text": "hi"}]
    stream = StreamDataset(items, binding=binding, max_length=16, rows_per_micro_batch=1,
                           tokenizer=load_tokenizer("bytes"))  # fmt: skip
    assert next(iter(stream)).batch.loss_mask.sum() == 6 + 3
    with pytest.raises(InvalidInput, match=r"document row 0 has neither input_ids nor 'text'"):
        next(iter(StreamDataset([{"id": "a"}], binding=binding, max_length=16,
                                rows_per_micro_batch=1)))  # fmt: skip


def test_ray_tasks_tokenize_with_the_sanitised_tokenizer(tmp_path):
    """The tokenizer travels inside the Ray task settings: the copy a worker uses has the
    truncation and padding turned off, as the local engine's has."""
    ray = pytest.importorskip("ray")
    import logging

    import pyarrow.parquet as pq

    from exactpack.io.store import load_packed
    from exactpack.pipeline import pack_path
    from exactpack.ray import pack

    from support.ray_helpers import private_loopback_ray

    hostile = _word_tokenizer()
    hostile.enable_truncation(3)
    hostile.enable_padding(pad_id=3, pad_token="[PAD]", length=40)
    hostile.save(str(tmp_path / "tokenizer.json"))
    rows = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS * 3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    spec = str(tmp_path / "tokenizer.json")
    with pytest.warns(UserWarning, match="turned off"):
        pack_path(tmp_path / "d.parquet", tmp_path / "local", max_length=16, tokenizer=spec)
    with private_loopback_ray() as session:
        ray.init(address="local", num_cpus=1, include_dashboard=False, _temp_dir=session,
                 logging_level=logging.ERROR)  # fmt: skip
        try:
            with pytest.warns(UserWarning, match="turned off"):
                pack(tmp_path / "d.parquet", tmp_path / "ray", max_length=16, tokenizer=spec)
        finally:
            ray.shutdown()
    want = sum(len(_word_tokenizer().encode(t).ids) - 1 for t in TEXTS * 3)
    for out in ("local", "ray"):
        load_packed(tmp_path / out)  # a complete, verified output
        manifest = json.loads((tmp_path / out / "manifest.json").read_text())
        assert manifest["statistics"]["eligible_targets"] == want, out


def test_the_cli_says_a_setting_was_turned_off_in_one_warning_line(tmp_path, capsys):
    from exactpack.cli import main

    hostile = _word_tokenizer()
    hostile.enable_truncation(2)
    hostile.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "d.jsonl").write_text('{"text": "hello world packed"}\n')
    args = ["pack", str(tmp_path / "d.jsonl"), "--tokenizer", str(tmp_path / "tokenizer.json")]
    assert main([*args, "--max-length", "8", "--out", str(tmp_path / "o")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 1 and err[0].startswith("exactpack pack: warning: ")
    assert "truncation to 2 tokens is turned off" in err[0]

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack.core.errors import InvalidInput
from exactpack.io.tokenizers import (
    BOS_ID,
    BYTE_OFFSET,
    EOS_ID,
    ByteTokenizer,
    HFTokenizer,
    load_tokenizer,
)
from exactpack.verify.fixture import FIXTURE_VOCAB, fixture_binding


def test_byte_layout_matches_the_fixture_vocabulary():
    tok = ByteTokenizer()
    assert tok.vocab_size == FIXTURE_VOCAB == BYTE_OFFSET + 256
    assert tok.identity == fixture_binding().tokenizer_id
    assert (BOS_ID, EOS_ID) == (0, 1)
    text = "hé!"
    raw = list(text.encode("utf-8"))
    assert tok.encode(text).tolist() == [BOS_ID, *(b + BYTE_OFFSET for b in raw), EOS_ID]
    assert tok.encode(text).dtype == np.int32
    assert tok.encode("").tolist() == [BOS_ID, EOS_ID]


@given(st.lists(st.text(max_size=20), max_size=8))
def test_batch_encoding_equals_one_by_one_and_decodes_back(texts):
    tok = ByteTokenizer()
    flat, offsets = tok.encode_batch(texts)
    assert offsets.dtype == np.int64 and offsets[0] == 0
    for i, text in enumerate(texts):
        one = flat[offsets[i] : offsets[i + 1]]
        assert one.tolist() == tok.encode(text).tolist()
        assert tok.decode(one) == text
    assert flat.size == 0 or (flat.min() >= 0 and flat.max() < tok.vocab_size)


def test_utf8_core_honours_offsets_that_do_not_start_at_zero():
    data = np.frombuffer(b"xxabcde", dtype=np.uint8)
    flat, offsets = ByteTokenizer().encode_utf8(data, np.array([2, 4, 7]))
    want_ab = [0, *(c + BYTE_OFFSET for c in b"ab"), 1]
    want_cde = [0, *(c + BYTE_OFFSET for c in b"cde"), 1]
    assert flat.tolist() == want_ab + want_cde
    assert offsets.tolist() == [0, 4, 9]


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[BOS]": 0, "[EOS]": 1, "[UNK]": 2, "hello": 3, "world": 4, "packed": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 0), ("[EOS]", 1)]
    )
    return tok


TEXTS = ["hello world", "packed hello packed", "unknown"]


def test_tokenizers_json_loads_from_a_file_or_folder(tmp_path):
    backend = _word_tokenizer()
    backend.save(str(tmp_path / "tokenizer.json"))
    want = [backend.encode(t).ids for t in TEXTS]
    for spec in (tmp_path / "tokenizer.json", tmp_path, str(tmp_path)):
        tok = load_tokenizer(spec)
        assert isinstance(tok, HFTokenizer) and tok.kind == "tokenizers"
        assert tok.vocab_size == backend.get_vocab_size(with_added_tokens=True)
        flat, offsets = tok.encode_batch(TEXTS)
        got = [flat[offsets[i] : offsets[i + 1]].tolist() for i in range(len(TEXTS))]
        assert got == want and want[0][0] == 0 and want[0][-1] == 1
        assert "@sha256:" in tok.identity


def test_identity_changes_with_the_tokenizer_file(tmp_path):
    backend = _word_tokenizer()
    backend.save(str(tmp_path / "tokenizer.json"))
    first = load_tokenizer(tmp_path).identity
    assert load_tokenizer(tmp_path).identity == first
    backend.add_tokens(["extra"])
    backend.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).identity != first


def test_transformers_folder_loads_locally(tmp_path):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=_word_tokenizer(),
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token="[UNK]",
    )
    fast.save_pretrained(str(tmp_path))
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.kind == "transformers"
    assert tok.vocab_size == len(fast)
    flat, offsets = tok.encode_batch(TEXTS)
    want = fast(TEXTS)["input_ids"]
    got = [flat[offsets[i] : offsets[i + 1]].tolist() for i in range(len(TEXTS))]
    assert got == want
    assert tok.identity.startswith("hf:")


def test_missing_or_unusable_paths_fail_with_the_fix(tmp_path):
    with pytest.raises(InvalidInput, match="no downloads"):
        load_tokenizer("gpt2")
    with pytest.raises(InvalidInput, match=r"neither tokenizer_config\.json nor tokenizer\.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InvalidInput, match="cannot load"):
        load_tokenizer(tmp_path / "bad.json")
    assert isinstance(load_tokenizer("bytes"), ByteTokenizer)

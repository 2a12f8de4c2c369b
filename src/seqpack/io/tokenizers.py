"""Tokenizers for text input: the built-in byte tokenizer and local Hugging Face ones.

The built-in tokenizer is the fixture's 266-entry vocabulary::

    id      0      1      2      3..9            10..265
    meaning BOS    EOS    PAD    reserved        byte b -> id 10 + b

    encode("hi") = [0, 114, 115, 1]      ('h' = 104, 'i' = 105)

Every document is ``[BOS, bytes..., EOS]``, so a text of ``b`` UTF-8 bytes
gives ``b + 2`` tokens and ``b + 1`` prediction pairs. PAD is reserved and
never emitted: packed rows mark empty cells with ``PAD_CELL = -1``.

Any ``tokenizers`` (``tokenizer.json``) or ``transformers`` tokenizer saved on
disk loads with :func:`load_tokenizer`; nothing is downloaded. Such a
tokenizer adds BOS/EOS exactly as its own post-processor does
(``add_special_tokens=True``).

Every tokenizer exposes ``identity`` (the Binding's ``tokenizer_id``),
``vocab_size`` and ``encode_batch(texts) -> (tokens int32 [Σn], offsets int64 [k+1])``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from seqpack.core.errors import InvalidInput, NotAvailable

BOS_ID = 0
EOS_ID = 1
PAD_ID = 2
NUM_SPECIAL = 10
BYTE_OFFSET = NUM_SPECIAL
BYTE_VOCAB_SIZE = NUM_SPECIAL + 256
BYTES_IDENTITY = "seqpack/bytes-266"


class Tokenizer(Protocol):
    identity: str
    vocab_size: int

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]: ...


class ByteTokenizer:
    """UTF-8 bytes shifted by 10, wrapped in BOS 0 / EOS 1 (see the module docstring)."""

    identity = BYTES_IDENTITY
    vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> np.ndarray:
        """``[BOS, 10 + byte..., EOS]`` as int32 [len(utf8) + 2].

        >>> ByteTokenizer().encode("hi").tolist()
        [0, 114, 115, 1]
        """
        tokens, _ = self.encode_batch([text])
        return tokens

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode many texts: flat tokens int32 [Σ(b_i + 2)] and offsets int64 [k+1]."""
        raw = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter((len(b) for b in raw), dtype=np.int64, count=len(raw))
        offsets = np.zeros(len(raw) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.frombuffer(b"".join(raw), dtype=np.uint8)
        return self.encode_utf8(data, offsets)

    def encode_utf8(self, data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised core: UTF-8 ``data`` uint8 [B] split by ``offsets`` int64 [k+1].

        Text ``i`` is ``data[offsets[i]:offsets[i+1]]``; its tokens are
        ``out[out_offsets[i]:out_offsets[i+1]]``. No Python loop per text or byte.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        k = offsets.shape[0] - 1
        base = offsets[0]
        out_offsets = offsets - base + 2 * np.arange(k + 1, dtype=np.int64)
        out = np.empty(int(out_offsets[-1]), dtype=np.int32)
        is_byte = np.ones(out.shape[0], dtype=bool)
        is_byte[out_offsets[:-1]] = False
        is_byte[out_offsets[1:] - 1] = False
        out[out_offsets[:-1]] = BOS_ID
        out[out_offsets[1:] - 1] = EOS_ID
        out[is_byte] = data[base : offsets[-1]].astype(np.int32) + BYTE_OFFSET
        return out, out_offsets

    def decode(self, tokens: Any) -> str:
        """Bytes back to text; special ids are dropped."""
        ids = np.asarray(tokens, dtype=np.int64)
        data = (ids[ids >= BYTE_OFFSET] - BYTE_OFFSET).astype(np.uint8)
        return data.tobytes().decode("utf-8", errors="replace")


#: Files whose bytes define a saved tokenizer; they make up its identity digest.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
)


def _identity(kind: str, path: Path, files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return f"{kind}:{path.name}@sha256:{h.hexdigest()[:16]}"


def _flatten(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((t for x in ids for t in x), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` or ``transformers`` tokenizer loaded from a local path.

    Token ids come back from the Rust/Python tokenizer as lists; converting
    them is one C-level pass (``np.fromiter``), small next to tokenizing.
    """

    def __init__(self, backend: Any, kind: str, identity: str, vocab_size: int) -> None:
        self.backend = backend
        self.kind = kind
        self.identity = identity
        self.vocab_size = int(vocab_size)

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        if self.kind == "tokenizers":
            ids = [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=True)]
        else:
            ids = self.backend(texts, add_special_tokens=True)["input_ids"]
        return _flatten(ids)


def load_tokenizer(spec: str | os.PathLike[str]) -> ByteTokenizer | HFTokenizer:
    """``"bytes"`` (built-in) or a local path; never downloads.

    - a ``*.json`` file: a ``tokenizers`` tokenizer (``tokenizer.json``);
    - a folder with ``tokenizer_config.json``: ``transformers.AutoTokenizer``, with
      ``trust_remote_code=False`` (a folder whose tokenizer is Python code of its
      own is refused, never run, never asked about);
    - a folder with only ``tokenizer.json``: a ``tokenizers`` tokenizer.
    """
    if str(spec) == "bytes":
        return ByteTokenizer()
    path = Path(spec)
    if not path.exists():
        raise InvalidInput(
            f"tokenizer {str(spec)!r} is not a local file or folder — seqpack loads tokenizers"
            " from disk only (no downloads); pass --tokenizer bytes or a saved tokenizer folder"
        )
    folder = path if path.is_dir() else path.parent
    if path.is_dir() and (path / "tokenizer_config.json").is_file():
        try:
            from transformers import AutoTokenizer
        except ImportError as err:
            raise NotAvailable(
                "loading a transformers tokenizer needs `pip install seqpack[hf]`"
            ) from err
        try:
            # trust_remote_code=False: never run the folder's Python code (an ``auto_map``)
            # and never ask about it on stdin, which transformers does when it is unset.
            backend = AutoTokenizer.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=False
            )
        except Exception as err:  # transformers raises many kinds on a damaged folder
            if "auto_map" in (path / "tokenizer_config.json").read_text(errors="replace"):
                raise InvalidInput(
                    f"the tokenizer in {path} needs the Python code its tokenizer_config.json"
                    " names (auto_map); seqpack never runs a tokenizer folder's code — save it"
                    " with a built-in tokenizer class, or pass its tokenizer.json"
                ) from None
            why = " ".join(str(err).split())
            raise InvalidInput(
                f"cannot load the tokenizer in {path} ({type(err).__name__}: {why}) — save it"
                " again with save_pretrained()"
            ) from None
        files = [folder / f for f in TOKENIZER_FILES if (folder / f).is_file()]
        return HFTokenizer(backend, "transformers", _identity("hf", path, files), len(backend))
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise InvalidInput(
            f"{path} holds neither tokenizer_config.json nor tokenizer.json"
            " — save the tokenizer with save_pretrained() or Tokenizer.save()"
        )
    try:
        from tokenizers import Tokenizer as RustTokenizer
    except ImportError as err:
        raise NotAvailable("loading tokenizer.json needs `pip install seqpack[hf]`") from err
    try:
        backend = RustTokenizer.from_file(str(file))
    except Exception as err:  # the Rust side raises a plain Exception
        raise InvalidInput(
            f"cannot load {file} as a tokenizers tokenizer ({err}) — pass --tokenizer bytes or"
            " a tokenizer saved with save_pretrained() or Tokenizer.save()"
        ) from None
    size = backend.get_vocab_size(with_added_tokens=True)
    name = path if path.is_dir() else file
    return HFTokenizer(backend, "tokenizers", _identity("tokenizers", name, [file]), size)


def as_tokenizer(spec: str | os.PathLike[str] | Tokenizer | None) -> Tokenizer | None:
    """A tokenizer from a spec (``"bytes"`` or a local path, see :func:`load_tokenizer`);
    a loaded tokenizer or None is returned as it is."""
    return load_tokenizer(spec) if isinstance(spec, (str, os.PathLike)) else spec

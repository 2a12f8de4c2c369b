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
A Rust-backed tokenizer encodes with ``encode_batch_fast`` where the installed
``tokenizers`` has it (no offsets computed, all cores); only the ids are kept.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from seqpack.core.errors import InvalidInput, NotAvailable
from seqpack.io.tokenizer_folder import open_folder
from seqpack.io.tokenizer_settings import (
    MAX_TEMPLATE_FILE,
    checked_file,
    file_identity,
    read_checked,
    sanitized,
)

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


#: Where a tokenizer's identity names a chat template other than its own.
CHAT_MARK = "+chat-template@sha256:"


def _flatten(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def _encodings(encodings: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Ids of Rust ``Encoding`` objects, flat; each id list lives only while it is copied."""
    lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
    offsets = np.zeros(len(encodings) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = itertools.chain.from_iterable(e.ids for e in encodings)
    return np.fromiter(ids, dtype=np.int32, count=int(offsets[-1])), offsets


def rust_backend(backend: Any, kind: str, where: str = "the tokenizer") -> Any:
    """The ``tokenizers.Tokenizer`` that does the work (a ``tokenizers`` backend as it is —
    :class:`HFTokenizer` sanitized it — or a fast transformers tokenizer's own backend,
    copied, with truncation and padding off), or None."""
    if kind == "tokenizers":
        return backend
    rust = (
        getattr(backend, "backend_tokenizer", None) if getattr(backend, "is_fast", False) else None
    )
    if rust is None or getattr(backend, "split_special_tokens", False):
        return None
    rust, _ = sanitized(rust, where, owned=False)
    if rust is backend.backend_tokenizer:  # nothing to turn off: still never share it
        rust = copy.deepcopy(rust)
    return rust


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` or ``transformers`` tokenizer loaded from a local path.

    A Rust tokenizer (a ``tokenizer.json``, or a fast transformers
    tokenizer's backend) encodes a batch with ``encode_batch_fast`` where it
    exists (no character offsets computed) and parallel across all cores;
    the ids are copied out in one C-level pass (``np.fromiter``).
    """

    #: The chat template to render conversations with (``--chat-template``); None: the
    #: transformers tokenizer's own.
    chat_template: str | None = None

    def __init__(
        self,
        backend: Any,
        kind: str,
        identity: str,
        vocab_size: int,
        *,
        where: str | None = None,
        owned: bool = False,
        rust: Any = None,
    ) -> None:
        where = where or identity
        self._pad: int | None = None
        if kind == "tokenizers":  # truncation and padding off (a copy unless ``owned``)
            backend, self._pad = sanitized(backend, where, owned)
        self.backend = backend
        self.kind = kind
        self.identity = identity
        self.vocab_size = int(vocab_size)
        if rust is not None:  # a folder's tokenizer.json read directly (tokenizer_folder)
            self._rust = sanitized(rust, where, owned=True)[0]
        else:
            self._rust = rust_backend(backend, kind, where)

    def with_chat_template(self, template: str) -> HFTokenizer:
        """This tokenizer rendering chats with ``template``; its identity says so (the
        template decides the tokens), unless it is the tokenizer's own."""
        if self.kind != "transformers":
            raise InvalidInput(
                "--chat-template needs a transformers tokenizer: pass --tokenizer with a"
                " save_pretrained folder (tokenizer_config.json), not a tokenizer.json"
            )
        if template == self.chat_template:  # already applied (a Ray task's shipped copy)
            return self
        out = copy.copy(self)
        out.chat_template = template
        out.identity = self.identity.split(CHAT_MARK)[0]
        if template != getattr(self.backend, "chat_template", None):
            digest = hashlib.sha256(template.encode()).hexdigest()[:16]
            out.identity += f"{CHAT_MARK}{digest}"
        return out

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_rust": None}

    @property
    def pad_token_id(self) -> int | None:
        """The pad id the tokenizer defines (a transformers pad token, or a ``tokenizers``
        padding setting), None without one."""
        if self.kind == "transformers":
            return getattr(self.backend, "pad_token_id", None)
        return self.__dict__.get("_pad")

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        with warnings.catch_warnings():  # warned where it was loaded; a worker stays quiet
            warnings.simplefilter("ignore")
            self._rust = rust_backend(self.backend, self.kind)

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids int32 [Σn] and offsets int64 [k+1]; texts are encoded in batches of
        about :data:`ENCODE_BATCH` characters, so the tokenizer's own per-token records
        (ids, masks, type ids) live for one batch at a time."""
        texts = list(texts)
        parts = [self._encode(texts[a:b]) for a, b in _batches(texts, ENCODE_BATCH)]
        if len(parts) == 1:
            return parts[0]
        counts = np.concatenate([np.diff(offsets) for _, offsets in parts])
        offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return np.concatenate([ids for ids, _ in parts]), offsets

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self._rust is not None:
            encode = getattr(self._rust, "encode_batch_fast", None) or self._rust.encode_batch
            return _encodings(encode(texts, add_special_tokens=True))
        return _flatten(self.backend(texts, add_special_tokens=True)["input_ids"])


#: Characters of text encoded per tokenizer call: all cores share one call's documents,
#: and the Rust tokenizer holds about 45 bytes a character of its records until the call
#: returns (measured for a byte-level BPE), so a call is bounded.
ENCODE_BATCH = 1 << 22


def _batches(texts: list[str], size: int) -> list[tuple[int, int]]:
    """``[a, b)`` spans of ``texts`` holding about ``size`` characters each (at least one)."""
    spans, start, total = [], 0, 0
    for i, text in enumerate(texts):
        total += len(text)
        if total >= size:
            spans.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(texts) or not spans:
        spans.append((start, len(texts)))
    return spans


def load_tokenizer(spec: str | os.PathLike[str]) -> ByteTokenizer | HFTokenizer:
    """``"bytes"`` (built-in) or a local path; never downloads.

    - a ``*.json`` file: a ``tokenizers`` tokenizer (``tokenizer.json``);
    - a folder with ``tokenizer_config.json``: a transformers tokenizer
      (:func:`seqpack.io.tokenizer_folder.open_folder`: its ``tokenizer.json``
      read directly when transformers would use it as it is, else
      ``transformers.AutoTokenizer`` with ``trust_remote_code=False``);
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
    if path.is_dir() and (path / "tokenizer_config.json").is_file():
        backend, identity, size, rust = open_folder(path)
        return HFTokenizer(backend, "transformers", identity, size, where=str(path), rust=rust)
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
    checked_file(file)
    try:
        backend = RustTokenizer.from_file(str(file))
    except Exception as err:  # the Rust side raises a plain Exception
        raise InvalidInput(
            f"cannot load {file} as a tokenizers tokenizer ({err}) — pass --tokenizer bytes or"
            " a tokenizer saved with save_pretrained() or Tokenizer.save()"
        ) from None
    size = backend.get_vocab_size(with_added_tokens=True)
    name = path if path.is_dir() else file
    identity = file_identity("tokenizers", name, [file])
    return HFTokenizer(backend, "tokenizers", identity, size, where=str(file), owned=True)


def read_chat_template(spec: str | os.PathLike[str]) -> str:
    """A chat template: the text itself (it holds ``{%`` or ``{{``), a Jinja file, or a
    ``tokenizer_config.json`` whose ``chat_template`` it is."""
    if isinstance(spec, str) and ("{%" in spec or "{{" in spec):
        return spec
    path = Path(spec)
    if not path.is_file():
        raise InvalidInput(
            f"chat template {str(spec)!r} is not a file — pass a Jinja file (e.g. the"
            " tokenizer folder's chat_template.jinja) or the template text"
        )
    limit = MAX_TEMPLATE_FILE if path.suffix != ".json" else None
    text = read_checked(path, *([limit] if limit else [])).decode("utf-8", errors="replace")
    if path.suffix == ".json":
        try:
            text = json.loads(text)["chat_template"]
        except (ValueError, KeyError, TypeError):
            raise InvalidInput(f"{path} holds no chat_template — pass a Jinja file") from None
        if not isinstance(text, str):
            raise InvalidInput(f"{path}: chat_template is not one template — pass a Jinja file")
    return text


def with_chat_template(tokenizer: Tokenizer | None, template: str | None) -> Tokenizer | None:
    """``tokenizer`` rendering chats with ``template`` (None: as it is)."""
    if template is None:
        return tokenizer
    if not isinstance(tokenizer, HFTokenizer):
        raise InvalidInput(
            "--chat-template needs --tokenizer with a transformers tokenizer folder"
            " (save_pretrained) to tokenize the rendered chats"
        )
    return tokenizer.with_chat_template(template)


def loaded_tokenizer(backend: Any) -> HFTokenizer | None:
    """A ``transformers`` tokenizer or ``tokenizers.Tokenizer`` object already in memory
    as an :class:`HFTokenizer` (vocabulary with added tokens; identity: a digest of its
    serialized form), None for any other object."""
    rust = getattr(backend, "backend_tokenizer", None)
    if rust is not None and callable(backend):  # a fast transformers tokenizer
        name = Path(str(getattr(backend, "name_or_path", "") or "tokenizer")).name
        digest = hashlib.sha256(rust.to_str().encode()).hexdigest()[:16]
        return HFTokenizer(backend, "transformers", f"hf:{name}@sha256:{digest}", len(backend))
    if hasattr(backend, "get_vocab_size") and hasattr(backend, "to_str"):
        digest = hashlib.sha256(backend.to_str().encode()).hexdigest()[:16]
        size = backend.get_vocab_size(with_added_tokens=True)
        return HFTokenizer(backend, "tokenizers", f"tokenizers:@sha256:{digest}", size)
    return None


def as_tokenizer(spec: str | os.PathLike[str] | Tokenizer | Any | None) -> Tokenizer | None:
    """A tokenizer from a spec (``"bytes"`` or a local path, see :func:`load_tokenizer`);
    a ``transformers`` / ``tokenizers`` object is wrapped (:func:`loaded_tokenizer`); a
    seqpack tokenizer or None is returned as it is."""
    if isinstance(spec, (str, os.PathLike)):
        return load_tokenizer(spec)
    if spec is None or isinstance(spec, (ByteTokenizer, HFTokenizer)):
        return spec
    return loaded_tokenizer(spec) or spec

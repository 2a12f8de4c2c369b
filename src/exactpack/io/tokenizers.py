"""Tokenizers for text input: the built-in byte tokenizer and local Hugging Face ones.

The built-in tokenizer is the fixture's 266-entry vocabulary::

    id      0      1      2      3..9            10..265
    meaning BOS    EOS    PAD    reserved        byte b -> id 10 + b

    encode("hi") = [0, 114, 115, 1]      ('h' = 104, 'i' = 105)

Every document is ``[BOS, bytes..., EOS]``: ``b`` UTF-8 bytes give ``b + 2``
tokens and ``b + 1`` prediction pairs. PAD is reserved and never emitted.

:func:`load_tokenizer` loads a ``tokenizers`` or ``transformers`` tokenizer saved on disk
(nothing downloaded, no folder's code run, every file regular and bounded); truncation
and padding are turned off (with a warning), a post-processor adding more than BOS/EOS
is refused. Every tokenizer has ``identity`` (the Binding's ``tokenizer_id``),
``vocab_size`` and ``encode_batch(texts) -> (tokens int32 [Σn], offsets int64 [k+1])``.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import stat
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from exactpack.core import meter
from exactpack.core.errors import FOREIGN, InvalidInput, NotAvailable, foreign
from exactpack.core.examples import offsets_of
from exactpack.io.files import read_limited

BOS_ID = 0
EOS_ID = 1
BYTE_OFFSET = 10  # ids 2 (PAD) to 9 are reserved
BYTE_VOCAB_SIZE = BYTE_OFFSET + 256
BYTES_IDENTITY = "exactpack/bytes-266"
#: Where a tokenizer's identity names a chat template other than its own.
CHAT_MARK = "+chat-template@sha256:"
#: Characters of text encoded per tokenizer call (its records take ~45 bytes a character).
ENCODE_BATCH = 1 << 22
#: The longest text a tokenizer is given (~4M tokens, longer than any context): the Rust
#: side takes ~45 bytes a character and aborts the process when an allocation fails (a
#: 60 MB line did under a 4 GB limit).
MAX_TEXT_CHARS = 1 << 24
#: Files whose bytes define a saved tokenizer; they make up its identity digest.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                   "tokenizer.model", "chat_template.jinja")  # fmt: skip
#: Files besides ``tokenizer.json`` from which transformers could build a (slow) tokenizer.
SLOW_FILES = ("tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "spiece.model")
#: The largest tokenizer file read (the largest hub ``tokenizer.json`` files are ~35 MB).
MAX_TOKENIZER_FILE = 1 << 27
#: The longest string a tokenizer's JSON file may hold, in bytes (hub files' longest is a
#: normalizer's ``precompiled_charsmap``, ~0.3 MB): the Rust side builds ~40 bytes a byte
#: of an added token and aborts the process when its allocation fails.
MAX_TOKENIZER_STRING = 1 << 20
#: The largest chat template read (hub templates are at most tens of kilobytes).
MAX_TEMPLATE_FILE = 1 << 22
#: Tokenizer classes that use ``tokenizer.json`` as it is.
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
#: ``tokenizer_config.json`` keys with which transformers rebuilds part of the tokenizer.
REBUILDING_KEYS = ("add_bos_token", "add_eos_token", "add_prefix_space", "do_lower_case",
                   "strip_accents", "tokenize_chinese_chars", "split_special_tokens", "legacy",
                   "auto_map", "from_slow")  # fmt: skip


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
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode many texts: flat tokens int32 [Σ(b_i + 2)] and offsets int64 [k+1]."""
        raw = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter((len(b) for b in raw), dtype=np.int64, count=len(raw))
        return self.encode_utf8(np.frombuffer(b"".join(raw), dtype=np.uint8), offsets_of(lengths))

    def encode_utf8(self, data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """UTF-8 ``data`` uint8 [B] split by ``offsets`` int64 [k+1] -> tokens int32 and
        their offsets int64 [k+1], with no Python loop per text or byte."""
        offsets = np.asarray(offsets, dtype=np.int64)
        base = offsets[0]
        out_offsets = offsets - base + 2 * np.arange(offsets.shape[0], dtype=np.int64)
        out = np.empty(int(out_offsets[-1]), dtype=np.int32)
        is_byte = np.ones(out.shape[0], dtype=bool)
        is_byte[out_offsets[:-1]] = is_byte[out_offsets[1:] - 1] = False
        out[out_offsets[:-1]] = BOS_ID
        out[out_offsets[1:] - 1] = EOS_ID
        out[is_byte] = data[base : offsets[-1]].astype(np.int32) + BYTE_OFFSET
        return out, out_offsets

    def decode(self, tokens: Any) -> str:
        """Bytes back to text; special ids are dropped."""
        ids = np.asarray(tokens, dtype=np.int64)
        data = (ids[ids >= BYTE_OFFSET] - BYTE_OFFSET).astype(np.uint8)
        return data.tobytes().decode("utf-8", errors="replace")


# -- the files of a saved tokenizer, and the settings inside them that would change data


def checked_file(path: Path, limit: int = MAX_TOKENIZER_FILE) -> None:
    """Refuse ``path`` unless a regular file of at most ``limit`` bytes (before opening it)."""
    with foreign(f"cannot read {path}"):
        info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"{path} is not a regular file — exactpack reads tokenizer files only")
    if info.st_size > limit:
        raise InvalidInput(
            f"{path} holds {info.st_size:,} bytes, more than the {limit:,} a tokenizer file or"
            " chat template may hold — it is not one; pass the tokenizer's own files"
        )


def read_checked(path: Path, limit: int = MAX_TOKENIZER_FILE) -> bytes:
    """The bytes of ``path`` after :func:`checked_file` (never more than ``limit``); a
    ``.json`` file's strings at most :data:`MAX_TOKENIZER_STRING` bytes each."""
    checked_file(path, limit)
    data = read_limited(path, limit)
    if path.suffix == ".json" and (longest := longest_string(data)) > MAX_TOKENIZER_STRING:
        raise InvalidInput(
            f"{path} holds a string of {longest:,} bytes, more than the"
            f" {MAX_TOKENIZER_STRING:,} a tokenizer file's string may hold — it is not a"
            " tokenizer's; pass the tokenizer's own files"
        )
    return data


def longest_string(data: bytes, block: int = 1 << 20) -> int:
    """The most bytes between the quotes of one string of JSON text ``data`` (escapes
    counted as written), scanned ``block`` bytes at a time: a quote after an odd run of
    backslashes is inside a string."""
    raw = np.frombuffer(data, dtype=np.uint8)
    longest, opened, run = 0, -1, 0  # opened: where the open string began; run: backslashes
    for start in range(0, raw.shape[0], block):
        part = raw[start : start + block]
        slash = part == 92
        index = np.arange(part.shape[0], dtype=np.int64)
        last = np.maximum.accumulate(np.where(slash, -1, index))  # last non-backslash
        quotes = np.flatnonzero(part == 34)
        prev = last[np.maximum(quotes - 1, 0)]  # backslashes before each quote: in this
        before = np.where(quotes > 0, quotes - 1 - prev, 0)  # block, and the last block's
        before += np.where((quotes == 0) | (prev < 0), run, 0)  # when they reach its start
        ends = quotes[before % 2 == 0] + start
        if opened >= 0 and ends.shape[0]:  # a string open from an earlier block
            longest, opened, ends = max(longest, int(ends[0] - opened)), -1, ends[1:]
        pairs = ends.shape[0] // 2
        if pairs:
            longest = max(longest, int((ends[1 : 2 * pairs : 2] - ends[: 2 * pairs : 2]).max()))
        if ends.shape[0] % 2:
            opened = int(ends[-1])
        tail = part.shape[0] - 1 - int(last[-1])
        run = run + tail if tail == part.shape[0] else tail
    if opened >= 0:  # never closed: it runs to the end
        longest = max(longest, raw.shape[0] - opened)
    return longest


def file_identity(kind: str, path: Path, files: Iterable[Path]) -> str:
    """``kind:name@sha256:...``: a digest of ``files`` (names and bytes, each checked)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + read_checked(f) + b"\0")
    return f"{kind}:{path.name}@sha256:{h.hexdigest()[:16]}"


def sanitized(rust: Any, where: str, owned: bool) -> tuple[Any, int | None]:
    """``rust`` without truncation or padding (a copy unless ``owned``; a warning names
    them) and the pad id its padding named; :func:`check_post_processor` first."""
    check_post_processor(rust, where)
    truncation, padding = rust.truncation, rust.padding
    if truncation is None and padding is None:
        return rust, None
    rust = rust if owned else copy.deepcopy(rust)
    turned = []
    if truncation is not None:
        rust.no_truncation()
        turned.append(f"truncation to {truncation.get('max_length')} tokens")
    if padding is not None:
        rust.no_padding()
        turned.append("padding")
    warnings.warn(
        f"{where}: the tokenizer's {' and '.join(turned)} is turned off — exactpack tokenizes"
        " whole documents and marks padding itself (cut or padded documents would be"
        " trained as they are)",
        UserWarning,
        stacklevel=3,
    )
    return rust, None if padding is None else int(padding["pad_id"])


def check_post_processor(rust: Any, where: str) -> None:
    """Refuse a post-processor that adds more than one special token before or after a
    single text (``[CLS] $A [SEP] [X]``); BOS/EOS-shaped ones, Bert's and Roberta's pass."""
    try:
        processor = json.loads(rust.to_str()).get("post_processor")
    except (ValueError, AttributeError):  # not serializable: nothing to inspect
        return
    before, after = _added(processor)
    if len(before) > 1 or len(after) > 1:
        shown = " ".join([*before, "$A", *after])
        raise InvalidInput(
            f"{where}: the tokenizer's post-processor turns each text into {shown!r} — exactpack"
            " keeps at most a BOS before and an EOS after each document (other added tokens"
            " would enter every example); save the tokenizer with a TemplateProcessing of at"
            " most one special token on each side of $A, or pass pre-tokenized input_ids"
        )


def _added(processor: Any) -> tuple[list[str], list[str]]:
    """The special tokens a post-processor puts before and after a single sequence."""
    if not isinstance(processor, dict):
        return [], []
    kind = processor.get("type")
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [str(processor["cls"][0])], [str(processor["sep"][0])]
    before, after = [], []
    if kind == "Sequence":
        for inner in processor.get("processors", []):
            b, a = _added(inner)
            before, after = b + before, after + a
    elif kind == "TemplateProcessing":  # ByteLevel and the like add no token
        specials, seen = processor.get("special_tokens", {}), False
        for piece in processor.get("single", []):
            if "Sequence" in piece:
                seen = True
                continue
            name = piece.get("SpecialToken", {}).get("id", "?")
            ids = specials.get(name, {}).get("ids", [None])
            (after if seen else before).extend([str(name)] * max(1, len(ids)))
    return before, after


# -- a save_pretrained folder: its tokenizer.json directly, or through AutoTokenizer


def open_folder(path: Path) -> tuple[Any, str, int, Any]:
    """The tokenizer saved in folder ``path``: its transformers backend (lazy when its
    ``tokenizer.json`` is read directly, :func:`_direct`, or remembered,
    :func:`remembered_file`), identity, vocabulary size and the direct Rust tokenizer."""
    for name in (*TOKENIZER_FILES, *SLOW_FILES):
        if (path / name).exists():
            checked_file(path / name, MAX_TEMPLATE_FILE if name.endswith(".jinja") else
                         MAX_TOKENIZER_FILE)  # fmt: skip
    if (path / "additional_chat_templates").is_dir():
        for file in sorted((path / "additional_chat_templates").iterdir()):
            checked_file(file, MAX_TEMPLATE_FILE)
    if "auto_map" in read_checked(path / "tokenizer_config.json").decode(errors="replace"):
        raise InvalidInput(  # never run, never even tried
            f"the tokenizer in {path} needs the Python code its tokenizer_config.json names"
            " (auto_map); exactpack never runs a tokenizer folder's code — save it with a"
            " built-in tokenizer class, or pass its tokenizer.json"
        )
    files = [path / f for f in TOKENIZER_FILES if (path / f).is_file()]
    identity = file_identity("hf", path, files)
    has_json = (path / "tokenizer.json").is_file()
    if not has_json and not any((path / f).is_file() for f in SLOW_FILES):
        raise InvalidInput(
            f"{path} has tokenizer_config.json but no tokenizer.json (nor tokenizer.model or"
            " vocab files) — save the tokenizer into it with save_pretrained(), or pass the"
            " folder that holds its tokenizer.json"
        )
    direct = _direct(path) if has_json else None
    cache = remembered_file(identity) if has_json and direct is None else None
    if direct is None and (rust := _recall(cache)) is not None:
        # the tokenizer transformers built from this folder, kept
        direct = rust, json.loads(read_checked(path / "tokenizer_config.json"))
    if direct is not None:
        rust, config = direct
        return _lazy(path, rust, config), identity, rust.get_vocab_size(True), rust
    backend = auto_tokenizer(path, has_json)
    if cache is not None:
        _remember(cache, backend, path)
    return backend, identity, len(backend), None


def _lazy(path: Path, rust: Any, config: dict[str, Any]) -> LazyTransformers:
    """The folder's transformers tokenizer, unloaded: EOS and PAD from its own
    ``tokenizer_config.json``, the PAD id from ``rust`` (never from a cache)."""
    pad = _content(config.get("pad_token"))
    eos = _content(config.get("eos_token"))
    return LazyTransformers(path, eos, None if pad is None else rust.token_to_id(pad))


#: Texts on which a remembered tokenizer must give transformers' own ids.
PROBES = ["Hello world!", "  two  spaces\n\ttab", "caf\u00e9 \u00fc\u00df \u4e2d\u6587 \U0001f600",
          "x<s>y</s> <pad><unk>", "1234567 + 89 = ?", "'s 're don't"]  # fmt: skip


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/exactpack/tokenizers`` (``~/.cache`` without it)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "exactpack" / "tokenizers"


def remembered_file(identity: str) -> Path | None:
    """The name under which the tokenizer transformers builds from folder ``identity`` is
    kept: ``KEY-`` + the SHA-256 of its bytes + ``.json`` (:func:`_recall` checks it), KEY
    a digest of ``identity`` and the transformers and tokenizers versions; None without
    both installed or without a cache folder only this user can write."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = f"{version('transformers')}\0{version('tokenizers')}"
    except PackageNotFoundError:
        return None
    folder = cache_folder()
    try:  # each created for this user only (a parent's mode would follow the umask)
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None  # no cache: transformers loads the folder every time
    if not all(_private(p) for p in (folder.parent, folder)):
        warnings.warn(
            f"{folder} is not a folder only you can write (owned by another user, or group-"
            " or world-writable), so exactpack does not use it as its tokenizer cache — a"
            " file put there would decide the tokens; remove it or run `chmod go-w` on it",
            UserWarning,
            stacklevel=4,
        )
        return None
    return folder / hashlib.sha256(f"{identity}\0{versions}".encode()).hexdigest()[:32]


def _private(path: Path) -> bool:
    """Whether ``path`` (not followed) is this user's and no one else may write to it."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    owner = info.st_uid == os.getuid() if hasattr(os, "getuid") else True
    return owner and not stat.S_ISLNK(info.st_mode) and not info.st_mode & 0o022


def _recall(key: Path | None) -> Any:
    """The Rust tokenizer :func:`_remember` kept under ``key``, or None when there is none,
    or the file is not this user's private one, or its bytes do not hash to its name."""
    if key is None:
        return None
    for file in key.parent.glob(f"{key.name}-*.json"):
        try:
            from tokenizers import Tokenizer

            if not _private(file):
                continue
            data = read_checked(file)
            if hashlib.sha256(data).hexdigest() != file.stem.split("-", 1)[1]:
                continue  # damaged or edited: transformers loads the folder again
            return Tokenizer.from_str(data.decode())
        except Exception:  # unreadable or not a tokenizer: likewise
            continue
    return None


def _remember(key: Path, backend: Any, path: Path) -> None:
    """Keep ``backend``'s Rust tokenizer under ``key`` when encoding with it is all
    transformers does (no Python encoding or split special tokens, the same ids on
    :data:`PROBES`) and what :func:`open_folder` derives from it and the folder's config
    (vocabulary size, EOS, PAD id) is transformers' own."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    rust = getattr(backend, "backend_tokenizer", None)
    if not isinstance(backend, TokenizersBackend) or rust is None or backend.split_special_tokens:
        return
    if any(getattr(type(backend), name) is not getattr(TokenizersBackend, name)
           for name in ("__call__", "_encode_plus", "tokenize")):  # fmt: skip
        return
    if [e.ids for e in rust.encode_batch(PROBES)] != backend(PROBES)["input_ids"]:
        return
    try:
        lazy = _lazy(path, rust, json.loads(read_checked(path / "tokenizer_config.json")))
    except ValueError:
        return
    if (rust.get_vocab_size(True), lazy.eos_token, lazy.pad_token_id) != (
        len(backend), backend.eos_token, backend.pad_token_id):  # fmt: skip
        return
    from exactpack.io.atomic import write_file

    data = rust.to_str().encode()
    try:  # the name holds the digest of the bytes, so a whole file is one that hashes to it
        write_file(key.with_name(f"{key.name}-{hashlib.sha256(data).hexdigest()}.json"),
                   lambda f: f.write(data))  # fmt: skip
    except OSError:
        return  # no writable cache: the next process loads through transformers again


def _direct(path: Path) -> tuple[Any, dict[str, Any]] | None:
    """The folder's Rust tokenizer and config when transformers would use its
    ``tokenizer.json`` as it is, else None (transformers then loads it, or names the damage)."""
    if any((path / f).is_file() for f in ("special_tokens_map.json", "added_tokens.json")):
        return None
    try:
        config = json.loads(read_checked(path / "tokenizer_config.json"))
    except ValueError:
        return None  # transformers names the damage
    generic = isinstance(config, dict) and config.get("tokenizer_class") in GENERIC_CLASSES
    if not generic or any(key in config for key in REBUILDING_KEYS):
        return None
    try:
        from tokenizers import Tokenizer

        rust = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # no tokenizers, or the Rust side's plain Exception
        return None
    for key, value in config.items():
        if key.endswith("_token") and value is not None:
            token = _content(value)
            if token is None or rust.token_to_id(token) is None:
                return None  # transformers would add it to the vocabulary
    for index, added in (config.get("added_tokens_decoder") or {}).items():
        if not isinstance(added, dict) or rust.token_to_id(added.get("content")) != int(index):
            return None
    return rust, config


def _content(value: Any) -> str | None:
    """A special token's text: the string, or an ``AddedToken`` dict's ``content``."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _same(value: Any) -> Any:
    return value


class LazyTransformers:
    """A folder's transformers tokenizer, loaded on first use of anything but
    ``pad_token_id``, ``eos_token`` and ``is_fast``; pickled loaded."""

    is_fast = True
    split_special_tokens = False

    def __init__(self, path: Path, eos_token: str | None, pad_token_id: int | None) -> None:
        self._path, self._real = path, None
        self.eos_token, self.pad_token_id = eos_token, pad_token_id

    def load(self) -> Any:
        """The transformers tokenizer (imported and loaded once)."""
        if self._real is None:
            self._real = auto_tokenizer(self._path, True)
        return self._real

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_real", "_path"):
            raise AttributeError(name)
        return getattr(self.load(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.load())

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _same, (self.load(),)


def auto_tokenizer(path: Path, has_json: bool) -> Any:
    """``transformers.AutoTokenizer`` on ``path``, local files only, no remote code."""
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise NotAvailable(
            "loading a transformers tokenizer needs `pip install exactpack[hf]`"
        ) from err
    what, fix = f"cannot load the tokenizer in {path}", "save it again with save_pretrained()"
    if not has_json:
        what = f"{path} has no tokenizer.json, and transformers cannot build the tokenizer from"
        what += " its other files"
        fix = "save the tokenizer with save_pretrained() from a fast tokenizer (it writes"
        fix += " tokenizer.json)"
    # transformers raises many kinds on a damaged folder; trust_remote_code=False: no folder
    # code, and no question on stdin (asked if unset)
    with foreign(what, fix, (Exception,)):
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                             trust_remote_code=False)  # fmt: skip


def _flat(items: Sequence[Any], ids: Iterable[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` (one id list per item, each alive only while copied) flat, and offsets."""
    offsets = offsets_of(np.fromiter(map(len, items), dtype=np.int64, count=len(items)))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(offsets[-1]))
    return flat, offsets


def rust_backend(backend: Any, kind: str, where: str = "the tokenizer") -> Any:
    """The ``tokenizers.Tokenizer`` that does the work (a transformers one's copied), or None."""
    if kind == "tokenizers":
        return backend
    fast = getattr(backend, "is_fast", False)
    rust = getattr(backend, "backend_tokenizer", None) if fast else None
    if rust is None or getattr(backend, "split_special_tokens", False):
        return None
    return sanitized(copy.deepcopy(rust), where, owned=True)[0]  # never shared


def text_spans(texts: list[str], size: int) -> list[tuple[int, int]]:
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


class HFTokenizer:
    """A ``tokenizers`` or ``transformers`` tokenizer (its Rust backend encodes if it has one)."""

    #: The chat template to render conversations with (``--chat-template``); None: its own.
    chat_template: str | None = None

    def __init__(
        self, backend: Any, kind: str, identity: str, vocab_size: int, *, where: str | None = None,
        owned: bool = False, rust: Any = None
    ) -> None:  # fmt: skip
        where = where or identity
        self._pad: int | None = None
        if kind == "tokenizers":  # truncation and padding off (a copy unless ``owned``)
            backend, self._pad = sanitized(backend, where, owned)
        self.backend, self.kind, self.identity = backend, kind, identity
        self.vocab_size = int(vocab_size)
        if rust is not None:  # a folder's tokenizer.json read directly
            self._rust = sanitized(rust, where, owned=True)[0]
        else:
            self._rust = rust_backend(backend, kind, where)

    @property
    def pad_token_id(self) -> int | None:
        """The tokenizer's pad id (a transformers pad token or a padding setting), or None."""
        if self.kind == "transformers":
            return getattr(self.backend, "pad_token_id", None)
        return self.__dict__.get("_pad")

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_rust": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        with warnings.catch_warnings():  # warned where it was loaded; a worker stays quiet
            warnings.simplefilter("ignore")
            self._rust = rust_backend(self.backend, self.kind)

    def decode(self, tokens: Any) -> str:
        """Ids back to text, special tokens kept (what a row holds, for display)."""
        ids = [int(t) for t in np.asarray(tokens).reshape(-1)]
        if self._rust is not None:
            return str(self._rust.decode(ids, skip_special_tokens=False))
        return str(self.backend.decode(ids, skip_special_tokens=False))

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids int32 [Σn] and offsets int64 [k+1], :data:`ENCODE_BATCH` characters a call."""
        texts = list(texts)
        if max(map(len, texts), default=0) > MAX_TEXT_CHARS:
            i = next(i for i, text in enumerate(texts) if len(text) > MAX_TEXT_CHARS)
            raise too_long(f"text {i} of {len(texts)} given to the tokenizer", len(texts[i]))
        spans = text_spans(texts, ENCODE_BATCH)
        parts = []
        for i, (a, b) in enumerate(spans):
            parts.append(self._encode(texts[a:b]))
            meter.report((i + 1) / len(spans))  # a progress bar moves within a chunk
        if len(parts) == 1:
            return parts[0]
        counts = np.concatenate([np.diff(offsets) for _, offsets in parts])
        return np.concatenate([ids for ids, _ in parts]), offsets_of(counts)

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self._rust is not None:
            encode = getattr(self._rust, "encode_batch_fast", None) or self._rust.encode_batch
            encodings = encode(texts, add_special_tokens=True)
            return _flat(encodings, (e.ids for e in encodings))
        ids = self.backend(texts, add_special_tokens=True)["input_ids"]
        return _flat(ids, ids)


def too_long(where: str, chars: int) -> InvalidInput:
    """The refusal of a text over :data:`MAX_TEXT_CHARS` characters at ``where``."""
    return InvalidInput(
        f"{where} holds {chars:,} characters, more than the {MAX_TEXT_CHARS:,} exactpack gives"
        " a tokenizer at once (it would take ~45 bytes a character) — split the document"
    )


def load_tokenizer(spec: str | os.PathLike[str]) -> ByteTokenizer | HFTokenizer:
    """``"bytes"`` (built-in) or a local path, never downloaded: a folder with
    ``tokenizer_config.json`` is a transformers tokenizer (:func:`open_folder`), a
    ``tokenizer.json`` (or a folder holding only one) a ``tokenizers`` tokenizer."""
    if str(spec) == "bytes":
        return ByteTokenizer()
    path = Path(spec)
    if not path.exists():
        raise InvalidInput(
            f"tokenizer {str(spec)!r} is not a local file or folder — exactpack loads tokenizers"
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
        raise NotAvailable("loading tokenizer.json needs `pip install exactpack[hf]`") from err
    # read and checked (sizes, strings) before the Rust side sees it
    identity = file_identity("tokenizers", path if path.is_dir() else file, [file])
    fix = "pass --tokenizer bytes or a tokenizer saved with save_pretrained() or Tokenizer.save()"
    with foreign(f"cannot load {file} as a tokenizers tokenizer", fix, (Exception,)):
        backend = RustTokenizer.from_file(str(file))  # the Rust side raises a plain Exception
    return HFTokenizer(backend, "tokenizers", identity, backend.get_vocab_size(True),
                       where=str(file), owned=True)  # fmt: skip


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
    if path.suffix != ".json":
        return read_checked(path, MAX_TEMPLATE_FILE).decode("utf-8", errors="replace")
    missing = (*FOREIGN, LookupError, TypeError)  # not JSON, not an object, no such key
    with foreign(f"{path} holds no chat_template", "pass a Jinja file", missing):
        text = json.loads(read_checked(path).decode("utf-8", errors="replace"))["chat_template"]
    if not isinstance(text, str):
        raise InvalidInput(f"{path}: chat_template is not one template — pass a Jinja file")
    return text


def with_chat_template(tokenizer: Tokenizer | None, template: str | None) -> Tokenizer | None:
    """``tokenizer`` rendering chats with ``template`` (None: as it is); its identity says so
    (the template decides the tokens), unless it is the tokenizer's own."""
    if template is None or template == getattr(tokenizer, "chat_template", None):
        return tokenizer  # nothing, or already applied (a Ray task's shipped copy)
    if not isinstance(tokenizer, HFTokenizer) or tokenizer.kind != "transformers":
        raise InvalidInput(
            "--chat-template needs a transformers tokenizer: pass --tokenizer with a"
            " save_pretrained folder (tokenizer_config.json), not a tokenizer.json"
        )
    out = copy.copy(tokenizer)
    out.chat_template = template
    out.identity = tokenizer.identity.split(CHAT_MARK)[0]
    if template != getattr(tokenizer.backend, "chat_template", None):
        out.identity += f"{CHAT_MARK}{hashlib.sha256(template.encode()).hexdigest()[:16]}"
    return out


def loaded_tokenizer(backend: Any) -> HFTokenizer | None:
    """A ``transformers`` tokenizer or ``tokenizers.Tokenizer`` object already in memory as
    an :class:`HFTokenizer` (identity: a digest of its serialized form), else None."""
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
    """A tokenizer from a spec (:func:`load_tokenizer`) or an object in memory
    (:func:`loaded_tokenizer`); a exactpack tokenizer or None is returned as it is."""
    if isinstance(spec, (str, os.PathLike)):
        return load_tokenizer(spec)
    if spec is None or isinstance(spec, (ByteTokenizer, HFTokenizer)):
        return spec
    return loaded_tokenizer(spec) or spec

"""Settings inside a saved tokenizer that would change the data, made explicit.

A ``tokenizer.json`` carries more than a vocabulary: ``truncation`` (cut
every text to ``max_length`` tokens), ``padding`` (pad every text with pad
tokens, which would then be trained) and a ``post_processor`` (the special
tokens added around each text). seqpack tokenizes whole documents with
their BOS/EOS only, so:

- truncation and padding are turned off on seqpack's own copy of the
  tokenizer (``no_truncation()`` / ``no_padding()``), with a
  :class:`UserWarning` naming the setting; the pad id a padding setting
  names is kept as the tokenizer's pad token;
- a post-processor that adds more than one special token before a text or
  more than one after it (e.g. ``[CLS] $A [SEP] [X]``) is refused: those
  tokens would enter every example; BOS/EOS-shaped ones (``<s> $A``,
  ``<s> $A </s>``, Bert's and Roberta's CLS/SEP) pass.

Files of a tokenizer folder are read only when they are regular files of
at most :data:`MAX_TOKENIZER_FILE` bytes (checked with ``os.stat`` before
anything is read: a sparse or device "file" is never read whole).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput

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
    "chat_template.jinja",
)


#: The largest tokenizer file read (the largest hub ``tokenizer.json`` files are ~35 MB).
MAX_TOKENIZER_FILE = 1 << 29
#: The largest chat template read (hub templates are at most tens of kilobytes).
MAX_TEMPLATE_FILE = 1 << 22


def checked_file(path: Path, limit: int = MAX_TOKENIZER_FILE) -> int:
    """``path``'s size, after checking it is a regular file of at most ``limit`` bytes (a
    FIFO, a device or a huge or sparse file is refused before it is opened)."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise InvalidInput(f"cannot read {path} ({err.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"{path} is not a regular file — seqpack reads tokenizer files only")
    if info.st_size > limit:
        raise InvalidInput(
            f"{path} holds {info.st_size:,} bytes, more than the {limit:,} a tokenizer file or"
            " chat template may hold — it is not one; pass the tokenizer's own files"
        )
    return info.st_size


def read_checked(path: Path, limit: int = MAX_TOKENIZER_FILE) -> bytes:
    """The bytes of ``path`` (:func:`checked_file` first; at most ``limit`` are read even
    if the file grows meanwhile)."""
    checked_file(path, limit)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InvalidInput(f"{path} grew past {limit:,} bytes while it was read — pass it again")
    return data


def sanitized(rust: Any, where: str, owned: bool) -> tuple[Any, int | None]:
    """``rust`` (a ``tokenizers.Tokenizer``) without truncation or padding, and the pad id
    its padding setting named (None without one); a copy unless ``owned``. A setting
    turned off is a :class:`UserWarning`; a post-processor adding more than BOS/EOS is an
    :class:`~seqpack.core.errors.InvalidInput` (see the module docstring)."""
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
        f"{where}: the tokenizer's {' and '.join(turned)} is turned off — seqpack tokenizes"
        " whole documents and marks padding itself (cut or padded documents would be"
        " trained as they are)",
        UserWarning,
        stacklevel=3,
    )
    return rust, None if padding is None else int(padding["pad_id"])


def check_post_processor(rust: Any, where: str) -> None:
    """Refuse a post-processor that adds more than one special token before or after a
    single text (see the module docstring)."""
    try:
        processor = json.loads(rust.to_str()).get("post_processor")
    except (ValueError, AttributeError):  # not serializable: nothing to inspect
        return
    before, after = _added(processor)
    if len(before) > 1 or len(after) > 1:
        shown = " ".join([*before, "$A", *after])
        raise InvalidInput(
            f"{where}: the tokenizer's post-processor turns each text into {shown!r} — seqpack"
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
    if kind == "Sequence":
        before: list[str] = []
        after: list[str] = []
        for inner in processor.get("processors", []):
            b, a = _added(inner)
            before, after = b + before, after + a
        return before, after
    if kind != "TemplateProcessing":
        return [], []  # ByteLevel and the like add no token
    specials = processor.get("special_tokens", {})
    before, after, seen = [], [], False
    for piece in processor.get("single", []):
        if "Sequence" in piece:
            seen = True
            continue
        name = piece.get("SpecialToken", {}).get("id", "?")
        ids = specials.get(name, {}).get("ids", [None])
        (after if seen else before).extend([str(name)] * max(1, len(ids)))
    return before, after


def file_identity(kind: str, path: Path, files: Sequence[Path]) -> str:
    """``kind:name@sha256:...``: a digest of ``files`` (names and bytes, each checked)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + read_checked(f) + b"\0")
    return f"{kind}:{path.name}@sha256:{h.hexdigest()[:16]}"

"""A ``save_pretrained`` tokenizer folder, opened for :class:`~seqpack.io.tokenizers.HFTokenizer`.

Two ways in, the same tokens:

- **direct** — when transformers would use the folder's ``tokenizer.json``
  exactly as it is (the generic ``TokenizersBackend`` /
  ``PreTrainedTokenizerFast`` class, no setting that rebuilds a part of it
  such as ``add_bos_token`` or ``add_prefix_space``, every special token
  already in the vocabulary), the Rust tokenizer is read from that file and
  ``transformers`` (and torch, which it imports) is not imported at all:
  the folder loads as fast as its ``tokenizer.json``. The pad and EOS tokens
  come from ``tokenizer_config.json``; transformers is loaded on first use
  only where it is needed (rendering a chat template);
- **transformers** — any other folder goes through
  ``transformers.AutoTokenizer`` with ``trust_remote_code=False`` (a folder
  whose tokenizer is Python code of its own is refused, never run, never
  asked about).

Every file is size-checked before anything reads it
(:mod:`seqpack.io.tokenizer_settings`), and a folder without
``tokenizer.json`` is named as such rather than through transformers'
error about the slow tokenizer it then tries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput, NotAvailable
from seqpack.io.tokenizer_settings import (
    MAX_TEMPLATE_FILE,
    MAX_TOKENIZER_FILE,
    TOKENIZER_FILES,
    checked_file,
    file_identity,
    read_checked,
)

#: Tokenizer classes that use ``tokenizer.json`` as it is.
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
#: ``tokenizer_config.json`` keys with which transformers rebuilds part of the tokenizer.
REBUILDING_KEYS = (
    "add_bos_token",
    "add_eos_token",
    "add_prefix_space",
    "do_lower_case",
    "strip_accents",
    "tokenize_chinese_chars",
    "split_special_tokens",
    "legacy",
    "auto_map",
    "from_slow",
)
REMOTE_CODE = (
    "the tokenizer in {path} needs the Python code its tokenizer_config.json names"
    " (auto_map); seqpack never runs a tokenizer folder's code — save it with a built-in"
    " tokenizer class, or pass its tokenizer.json"
)
#: Files besides ``tokenizer.json`` from which transformers could build a (slow) tokenizer.
SLOW_FILES = ("tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "spiece.model")


def open_folder(path: Path) -> tuple[Any, str, int, Any]:
    """The tokenizer saved in ``path`` (a folder with ``tokenizer_config.json``): its
    transformers backend (:class:`LazyTransformers` when read directly), identity,
    vocabulary size and the Rust tokenizer read directly (None otherwise)."""
    _check_files(path)
    if "auto_map" in read_checked(path / "tokenizer_config.json").decode(errors="replace"):
        raise InvalidInput(REMOTE_CODE.format(path=path))  # never run, never even tried
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
    if direct is not None:
        rust, config = direct
        size = rust.get_vocab_size(with_added_tokens=True)
        return LazyTransformers(path, config, rust), identity, size, rust
    backend = auto_tokenizer(path, has_json)
    return backend, identity, len(backend), None


def _check_files(path: Path) -> None:
    """Every file transformers may read from the folder: regular and of a sane size."""
    for name in (*TOKENIZER_FILES, *SLOW_FILES):
        if (path / name).exists():
            limit = MAX_TEMPLATE_FILE if name.endswith(".jinja") else MAX_TOKENIZER_FILE
            checked_file(path / name, limit)
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.iterdir()):
            checked_file(file, MAX_TEMPLATE_FILE)


def _direct(path: Path) -> tuple[Any, dict[str, Any]] | None:
    """The folder's Rust tokenizer and config when transformers would use its
    ``tokenizer.json`` as it is (see the module docstring), else None."""
    if any((path / f).is_file() for f in ("special_tokens_map.json", "added_tokens.json")):
        return None
    try:
        config = json.loads(read_checked(path / "tokenizer_config.json"))
    except ValueError:
        return None  # transformers names the damage
    if not isinstance(config, dict) or config.get("tokenizer_class") not in GENERIC_CLASSES:
        return None
    if any(key in config for key in REBUILDING_KEYS):
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        rust = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # the Rust side raises a plain Exception; transformers names it
        return None
    for key, value in config.items():
        token = _content(value)
        if (
            key.endswith("_token")
            and value is not None
            and (token is None or rust.token_to_id(token) is None)
        ):
            return None  # transformers would add it to the vocabulary
    for index, added in (config.get("added_tokens_decoder") or {}).items():
        if not isinstance(added, dict) or rust.token_to_id(added.get("content")) != int(index):
            return None
    return rust, config


def _content(value: Any) -> str | None:
    """A special token's text: the string, or an ``AddedToken`` dict's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _same(value: Any) -> Any:
    return value


class LazyTransformers:
    """A folder's transformers tokenizer, loaded on first use of anything but what packing
    text needs (``pad_token_id``, ``eos_token``, ``is_fast``); pickled loaded (a Ray
    worker gets the tokenizer, not a path it may not see)."""

    is_fast = True
    split_special_tokens = False

    def __init__(self, path: Path, config: dict[str, Any], rust: Any) -> None:
        self._path = path
        self._real: Any = None
        self.eos_token = _content(config.get("eos_token"))
        pad = _content(config.get("pad_token"))
        self.pad_token_id = None if pad is None else rust.token_to_id(pad)

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
            "loading a transformers tokenizer needs `pip install seqpack[hf]`"
        ) from err
    try:
        # trust_remote_code=False: never run the folder's Python code (an ``auto_map``)
        # and never ask about it on stdin, which transformers does when it is unset.
        return AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # transformers raises many kinds on a damaged folder
        why = " ".join(str(err).split())
        if not has_json:
            raise InvalidInput(
                f"{path} has no tokenizer.json, and transformers cannot build the tokenizer"
                f" from its other files ({type(err).__name__}: {why[:200]}) — save the"
                " tokenizer with save_pretrained() from a fast tokenizer (it writes"
                " tokenizer.json)"
            ) from None
        raise InvalidInput(
            f"cannot load the tokenizer in {path} ({type(err).__name__}: {why}) — save it"
            " again with save_pretrained()"
        ) from None

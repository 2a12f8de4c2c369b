"""Checks of :class:`~seqpack.pipeline.options.PackOptions` values that need no options
class: field types at the public boundary, the pad id, other tools' policy names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from seqpack.core.arguments import type_argument
from seqpack.core.errors import InvalidInput
from seqpack.io.tokenizers import Tokenizer

#: Other tools' names of seqpack's policies (TRL's ``pack_dataset(strategy="bfd")``).
POLICY_ALIASES = {"bfd": "best-fit-decreasing"}

_PATH = (str, os.PathLike)
_NONE = type(None)
#: Fields whose type the checks in ``PackOptions.__post_init__`` do not already pin down.
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "policy": ((str,), "a policy name"),
    "policy_options": ((Mapping,), "a mapping of option names to values, e.g. {'window': 4096}"),
    "split_long": ((bool,), "True or False"),
    "overwrite": ((bool,), "True or False"),
    "progress": ((bool, _NONE), "True, False or None (draw when stderr is a terminal)"),
    "tokenizer_id": ((str, _NONE), "a string or None"),
    "split_id": ((str, _NONE), "a string or None"),
    "chat_template": ((*_PATH, _NONE), "a template file, the template text or None"),
    "spill_dir": ((*_PATH, _NONE), "a folder path or None"),
}


def check_types(opts: Any) -> None:
    """Refuse a field of the wrong type in one line naming it (``overwrite="no"`` would
    otherwise replace an output, ``policy_options=[1]`` fail deep inside)."""
    for name, (kinds, expected) in _TYPES.items():
        type_argument(name, getattr(opts, name), kinds, expected)
    tok = opts.tokenizer
    if isinstance(tok, (bool, int, float, bytes, list, tuple, dict, set)):
        type_argument(
            "tokenizer", tok, (str, os.PathLike), "'bytes', a local path or a loaded tokenizer"
        )


def policy_name(name: Any) -> Any:
    """``name``, or the policy another tool's name (``bfd``) stands for."""
    return POLICY_ALIASES.get(name, name) if isinstance(name, str) else name


def parse_pad(value: Any) -> int:
    """A pad id: a non-negative integer (its bound is the vocabulary, :func:`check_pad_id`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"pad_token_id must be a non-negative token id, got {value!r}")
    return int(value)


def check_pad_id(opts: Any, vocab_size: int, tokenizer: Tokenizer | None) -> int | None:
    """The pad id of a run, checked against the binding's ``vocab_size`` before anything is
    written: ``opts.pad_token_id``, else the tokenizer's pad token (None when neither has
    one). A pad id outside the vocabulary, or one that disagrees with the tokenizer's, is
    an :class:`~seqpack.core.errors.InvalidInput`."""
    own = getattr(tokenizer, "pad_token_id", None)
    pad = opts.pad_token_id if opts.pad_token_id is not None else own
    if pad is None:
        return None
    if own is not None and pad != own:
        raise InvalidInput(
            f"pad_token_id {pad} is not the tokenizer's pad token ({own}) — drop"
            " --pad-token-id or pass the tokenizer's"
        )
    if not 0 <= pad < vocab_size:
        raise InvalidInput(
            f"pad_token_id {pad} is outside the vocabulary (vocab_size {vocab_size}): a collator"
            " would feed the model an id it has no embedding for — pass a pad id below"
            f" {vocab_size} or the right --vocab-size"
        )
    return int(pad)

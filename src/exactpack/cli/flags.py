"""The ``argparse`` flags of the option classes' fields (:func:`add_arguments`, back into
options: :func:`from_arguments`) and text to values (:func:`parse_int`,
:func:`parse_byte_size`, :func:`parse_option`): a bad value is one line naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from collections.abc import Callable
from typing import Any

from exactpack.core.errors import MAX_OPTION_VALUE, InvalidInput, positive_int
from exactpack.pipeline.options import PackOptions

_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50}
_BYTE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)
_INTEGER = re.compile(r"^[+-]?\d+(?:_\d+)*$")


def parse_int(text: str, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number in decimal (``4096``, ``10_000``, ``-3``) within ``±2**62`` and, when
    given, ``[minimum, maximum]``; ``inf``, ``nan``, ``1e3``, ``4096.0`` are refused."""
    body = str(text).strip()
    if not _INTEGER.match(body):
        raise InvalidInput(f"{name} {text!r} is not a whole number — write e.g. 4096")
    if len(body) > 100 or abs(int(body)) > MAX_OPTION_VALUE:  # int() of 100 digits is cheap
        raise InvalidInput(f"{name} {text!r} is beyond any usable size (at most 2**62)")
    value = int(body)
    low = -MAX_OPTION_VALUE if minimum is None else minimum
    high = MAX_OPTION_VALUE if maximum is None else maximum
    if not low <= value <= high:
        raise InvalidInput(
            f"{name} {text!r} is outside [{low:,}, {high:,}] — pass a value in that range"
        )
    return value


def parse_count(text: str, name: str) -> int:
    """A positive integer written in decimal (``4096``, ``10_000``), at most 2**62."""
    return parse_int(text, name, 1, MAX_OPTION_VALUE)


def parse_byte_size(text: str, name: str) -> int:
    """``123``, ``512K``, ``1.5G``, ``2GiB`` (powers of 1024) as a byte count in [1, 2**62]."""
    match = _BYTE_SIZE.match(str(text)) if len(str(text)) <= 40 else None
    if match is None:
        raise InvalidInput(f"{name} {text!r} is not a byte size like 512M or 2G")
    value = float(match[1]) * (1 << _UNITS[match[2].upper()])
    if not math.isfinite(value) or value >= MAX_OPTION_VALUE:
        raise InvalidInput(f"{name} {text!r} is beyond any machine's memory — write e.g. 2G")
    return positive_int(name, int(value), MAX_OPTION_VALUE)


def parse_switch(text: str, flag: str) -> bool:
    """``true`` / ``false`` (any case; also 1/0, yes/no) as a bool, else one line naming it."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    try:
        return value[text.strip().lower()]
    except KeyError:
        raise InvalidInput(f"{flag} takes true or false, not {text!r}") from None


def parse_option(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(key, value)``: dashes in the key become underscores; the value
    is JSON when it parses (numbers, booleans, lists), else the text itself. Non-finite
    numbers (``Infinity``, ``NaN``, ``1e999``) and numbers beyond ``±2**62`` are refused."""
    key, sep, value = str(item).partition("=")
    if not sep or not key.strip():
        raise InvalidInput(f"--option {item!r} is not KEY=VALUE — write e.g. lookahead=4096")
    where = f"--option {item!r}"

    def refuse(constant: Any) -> Any:
        raise InvalidInput(f"{where}: {constant} is not a usable value — write a finite number")

    def number(parsed: float) -> float:  # every number, at any depth, as it is parsed
        if not math.isfinite(parsed):
            refuse(parsed)
        if abs(parsed) > MAX_OPTION_VALUE:
            raise InvalidInput(
                f"{where}: {parsed:.3g} is beyond any usable size (at most 2**62) — write a"
                " smaller number"
            )
        return parsed

    try:
        parsed: Any = json.loads(
            value,
            parse_constant=refuse,
            parse_int=lambda text: number(int(text)),
            parse_float=lambda text: number(float(text)),
        )
    except InvalidInput:
        raise
    except (ValueError, RecursionError):  # JSONDecodeError; ints past Python's digit limit
        parsed = value
    return key.strip().replace("-", "_"), parsed


#: How a field's text becomes its value (other ``int`` fields: :func:`parse_int`).
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "max_metadata_bytes": parse_byte_size,
    "chunk_bytes": parse_byte_size,
    "shard_tokens": parse_count,
    "completion_only_loss": parse_switch,
}


def argparse_type(parse: Callable[[str, str], Any], flag: str) -> Callable[[str], Any]:
    """``parse(text, flag)`` as an argparse ``type=``: its one-line message on refusal."""

    def convert(text: str) -> Any:
        try:
            return parse(text, flag)
        except InvalidInput as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def flag_of(f: dataclasses.Field) -> str:
    """A field's flag: its own, or ``--`` and its name with hyphens (``cut_long``:
    ``--cut-long``)."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _flagged(cls: type, command: str) -> list[dataclasses.Field]:
    return [
        f
        for f in dataclasses.fields(cls)
        if f.metadata.get("flag") is not None and command in f.metadata["commands"]
    ]


def add_arguments(parser: argparse.ArgumentParser, command: str, cls: type = PackOptions) -> None:
    """Add every flag of ``cls`` (default :class:`PackOptions`) that ``command`` takes."""
    for f in _flagged(cls, command):
        kwargs = dict(f.metadata["argparse"])
        parse = _PARSERS.get(f.name, parse_int if str(f.type).startswith("int") else None)
        if parse is not None:
            kwargs["type"] = argparse_type(parse, flag_of(f))
        parser.add_argument(flag_of(f), dest=f.name, help=f.metadata["help"], **kwargs)


def from_arguments(args: argparse.Namespace, command: str, cls: type = PackOptions) -> Any:
    """The ``cls`` options (default :class:`PackOptions`) of parsed ``args``."""
    values = {f.name: getattr(args, f.name) for f in _flagged(cls, command)}
    if "policy_options" in values:
        values["policy_options"] = dict(map(parse_option, values["policy_options"]))
    if cls is PackOptions and args.max_length is None:
        raise InvalidInput(
            "the following arguments are required: --max-length (tokens per row, the width"
            f" of input_ids; see exactpack {command} --help)"
        )
    return cls(**{k: v for k, v in values.items() if v is not None})


#: A keyword as a library message names it: ``cut_long=True``, ``max_length=`` (no value).
_KEYWORD = re.compile(r"\b([a-z][a-z0-9_]*)=(True\b)?(?![\w.'\"(\[{-])")


def in_flags(message: str) -> str:
    """A library message in the command line's words: each option keyword it names with no
    value (``max_length=``) or ``=True`` (``cut_long=True``) as its flag."""
    flags = {
        f.name: flag_of(f)
        for f in dataclasses.fields(PackOptions)
        if f.metadata.get("flag") is not None
    }
    return _KEYWORD.sub(lambda m: flags.get(m[1], m[0]), message)


def cli_flags(command: str) -> list[str]:
    """The flags :func:`add_arguments` adds for ``command`` (for docs and tests)."""
    return [flag_of(f) for f in _flagged(PackOptions, command)]

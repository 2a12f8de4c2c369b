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
import sys
from collections.abc import Callable
from typing import Any

from seqpack._renames import OLD_FLAGS, OLD_OPTIONS
from seqpack.core.errors import MAX_OPTION_VALUE, InvalidInput, positive_int
from seqpack.pipeline.options import PackOptions

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


#: How a field's text becomes its value (``type=int`` flags: :func:`parse_int`).
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
        parse = _PARSERS.get(f.name, parse_int if kwargs.get("type") is int else None)
        if parse is not None:
            kwargs["type"] = argparse_type(parse, f.metadata["flag"])
        target: Any = parser
        olds = [o for o, n in OLD_FLAGS.items() if n == f.metadata["flag"]]
        if olds:  # and its old name, never both
            target = parser.add_mutually_exclusive_group()
            for old in olds:
                old_flag(target, old, f.name, kwargs, parse)
        target.add_argument(f.metadata["flag"], dest=f.name, help=f.metadata["help"], **kwargs)


def from_arguments(args: argparse.Namespace, command: str, cls: type = PackOptions) -> Any:
    """The ``cls`` options (default :class:`PackOptions`) of parsed ``args``."""
    values = {f.name: getattr(args, f.name) for f in _flagged(cls, command)}
    if "policy_options" in values:
        values["policy_options"] = dict(map(parse_option, values["policy_options"]))
        for old in set(values["policy_options"]) & set(OLD_OPTIONS):
            print(
                f"seqpack {command}: warning: --option {old}= is deprecated; pass --option"
                f" {OLD_OPTIONS[old]}= (the same number)",
                file=sys.stderr,
            )
    if cls is PackOptions and args.max_length is None:
        raise InvalidInput(
            "the following arguments are required: --max-length (tokens per row, the width"
            f" of input_ids; see seqpack {command} --help)"
        )
    return cls(**{k: v for k, v in values.items() if v is not None})


class OldName(argparse.Action):
    """A flag's old name (``--capacity`` of ``--max-length``): stores into the new one's
    ``dest`` and prints one deprecation line on stderr."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if self.nargs == 0:  # a switch: --cut-long
            values, instead = self.const, self.new
        elif self.new == "--max-length":
            instead = f"{self.new} {values} (the same number: tokens per row)"
        else:
            instead = f"{self.new} {values}"
        if not getattr(namespace, "old_name_warned", False):
            print(
                f"{parser.prog}: warning: {option} is deprecated; pass {instead}", file=sys.stderr
            )
            namespace.old_name_warned = True
        setattr(namespace, self.dest, values)


def old_flag(
    parser: Any, old: str, dest: str, kwargs: dict[str, Any], parse: Callable | None = None
) -> None:
    """``old``, the 0.2 name of a flag (:data:`seqpack._renames.OLD_FLAGS`), hidden from
    ``--help``: the new flag's argparse ``kwargs``, its text read by ``parse``."""
    kind = {"new": OLD_FLAGS[old], "dest": dest, "action": OldName, "help": argparse.SUPPRESS}
    if kwargs.get("action") == "store_true":
        parser.add_argument(old, nargs=0, const=True, **kind)
    else:
        convert = kwargs.get("type") if parse is None else argparse_type(parse, old)
        parser.add_argument(old, type=convert, choices=kwargs.get("choices"), **kind)


def old_capacity(parser: Any, dest: str) -> None:
    """``--capacity N``, the 0.x name of ``--max-length``, kept one release (not in --help)."""
    old_flag(parser, "--capacity", dest, {}, parse_int)


def cli_flags(command: str) -> list[str]:
    """The flags :func:`add_arguments` adds for ``command`` (for docs and tests)."""
    return [f.metadata["flag"] for f in _flagged(PackOptions, command)]

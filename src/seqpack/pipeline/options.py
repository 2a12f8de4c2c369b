"""Every option of a packing run, declared once: :class:`PackOptions`.

The command line (``seqpack pack`` / ``seqpack stats``), the local pipeline
(:func:`seqpack.pipeline.local.pack_path`), the Ray engine
(:func:`seqpack.ray.pack`) and :func:`seqpack.hf.pack_dataset` all take the
same frozen object, so a default, a check or a help text exists in one
place. Each field's ``metadata`` carries its command-line flag and help;
:func:`add_arguments` builds the ``argparse`` options from them::

    options = PackOptions(capacity=4096, policy="best-fit-decreasing", vocab_size=32000)
    pack_path("shards/", "packed/", options)
    pack_path("shards/", "packed/", capacity=4096, vocab_size=32000)   # the same run

Values are checked on construction (a bad one is an
:class:`~seqpack.core.errors.InvalidInput` naming the option and the fix).
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from seqpack.core import arith as budget
from seqpack.core.binding import INT32_MAX, Partition
from seqpack.core.checks import parse_byte_size, parse_count, parse_int, parse_option, positive_int
from seqpack.core.errors import InvalidInput
from seqpack.core.policies import POLICIES, check_policy_options
from seqpack.core.supervision import Objective
from seqpack.io.tokenizers import Tokenizer, as_tokenizer, read_chat_template, with_chat_template
from seqpack.pipeline.objective_options import objective_field, parse_switch
from seqpack.pipeline.option_checks import (
    POLICY_ALIASES,
    check_pad_id,
    check_types,
    parse_pad,
    policy_name,
)

__all__ = ["POLICY_ALIASES", "PackOptions", "check_pad_id", "parse_pad", "policy_name"]

DEFAULT_POLICY = "best-fit-decreasing"
DEFAULT_ROWS_PER_BATCH = 8
#: Target tokens per output shard; shards always end on a model-call boundary.
DEFAULT_SHARD_TOKENS = 1 << 25
#: Input bytes read, parsed and tokenized at a time.
DEFAULT_CHUNK_BYTES = 1 << 25
#: The largest chunk (a read of that many bytes is allocated whole).
MAX_CHUNK_BYTES = 1 << 30

#: What ``--format`` writes: seqpack's own packed columns, or TRL 1.16's packed schema.
OUTPUT_FORMATS = ("seqpack", "trl")

#: Commands whose parser gets a field's flag: ``pack``, ``stats`` or both.
PACK, STATS, BOTH = ("pack",), ("stats",), ("pack", "stats")


def flag(
    flag: str | None,
    help: str,
    commands: tuple[str, ...] = PACK,
    **argparse_kwargs: Any,
) -> dict[str, Any]:
    """Field metadata: the flag (None: not on the command line), help and argparse keywords."""
    return {"flag": flag, "help": help, "commands": commands, "argparse": argparse_kwargs}


@dataclass(frozen=True)
class PackOptions:
    """One packing run's options (see the module docstring); frozen and validated.

    ``capacity`` is in prediction pairs per row. ``policy_options`` go to
    the policy (e.g. ``{"window": 4096}`` for ``stream-best-fit``).
    ``tokenizer`` is ``"bytes"``, a local tokenizer path or a loaded
    tokenizer; ``vocab_size`` is required for pre-tokenized input without one.
    ``chat_template`` is a Jinja file (or the template text), read on construction.
    """

    capacity: int = field(
        metadata=flag(
            "--capacity",
            "prediction pairs per row (with --format trl: tokens per row, TRL's max_length)",
            BOTH,
            required=True,
            type=int,
        )
    )
    policy: str = field(
        default=DEFAULT_POLICY,
        metadata=flag("--policy", f"packing policy (default: {DEFAULT_POLICY}; or TRL's bfd)"),
    )
    policy_options: Mapping[str, Any] = field(
        default_factory=dict,
        metadata=flag(
            "--option",
            "a policy option, KEY=VALUE (repeatable; e.g. window=4096)",
            action="append",
            default=[],
            metavar="KEY=VALUE",
        ),
    )
    max_rows_per_batch: int = field(
        default=DEFAULT_ROWS_PER_BATCH,
        metadata=flag("--max-rows-per-batch", "rows per model call", type=int),
    )
    max_metadata_bytes: int | None = field(
        default=None,
        metadata=flag(
            "--max-metadata-bytes",
            "refuse (before planning) to pack when the plan, rows and one model call need"
            " more memory than this (e.g. 2G; with --engine ray, per block)",
            metavar="BYTES",
        ),
    )
    partition: Partition = field(
        default=Partition.TRAIN,
        metadata=flag("--partition", "train, validation or test", BOTH),
    )
    split_long: bool = field(
        default=False,
        metadata=flag("--split-long", "split sources longer than a row", BOTH, action="store_true"),
    )
    vocab_size: int | None = field(
        default=None,
        metadata=flag("--vocab-size", "vocabulary size of pre-tokenized input", type=int),
    )
    tokenizer: str | Tokenizer | None = field(
        default=None,
        metadata=flag("--tokenizer", "'bytes' (built-in, 266 ids) or a local tokenizer path", BOTH),
    )
    tokenizer_id: str | None = field(
        default=None,
        metadata=flag("--tokenizer-id", "tokenizer identity recorded in the binding"),
    )
    split_id: str | None = field(
        default=None,
        metadata=flag("--split-id", "split-receipt identity (default: digest of the data)"),
    )
    text_field: str = field(
        default="text",
        metadata=flag("--text-field", "text column when there is no input_ids", BOTH),
    )
    chat_template: str | None = field(
        default=None,
        metadata=flag(
            "--chat-template",
            "Jinja chat template for messages / conversational prompt-completion rows (a file;"
            " default: the --tokenizer folder's own)",
            BOTH,
            metavar="FILE",
        ),
    )
    assistant_only_loss: bool = objective_field("assistant_only_loss")
    completion_only_loss: bool | None = objective_field("completion_only_loss")
    overwrite: bool = field(
        default=False,
        metadata=flag("--overwrite", "replace an existing output", action="store_true"),
    )
    progress: bool | None = field(
        default=None,
        metadata=flag(
            "--progress",
            "progress bars on stderr (default: when stderr is a terminal)",
            action=argparse.BooleanOptionalAction,
        ),
    )
    shard_tokens: int = field(
        default=DEFAULT_SHARD_TOKENS,
        metadata=flag(
            "--shard-tokens",
            "target tokens per output shard (two shards are built at a time; default 2**25)",
            metavar="N",
        ),
    )
    chunk_bytes: int = field(
        default=DEFAULT_CHUNK_BYTES,
        metadata=flag(
            "--chunk-bytes",
            "input read, parsed and tokenized this many bytes at a time (default 32M)",
            BOTH,
            metavar="BYTES",
        ),
    )
    format: str = field(
        default="seqpack",
        metadata=flag(
            "--format",
            "output columns: seqpack (tokens, pair_counts, ...) or trl (TRL's packed schema:"
            " input_ids, labels, seq_lengths in tokens, position_ids; capacity in tokens)",
            BOTH,
            choices=OUTPUT_FORMATS,
        ),
    )
    pad_token_id: int | None = field(
        default=None,
        metadata=flag(
            "--pad-token-id",
            "the id collators pad with, checked against the vocabulary before packing and"
            " recorded (default: the tokenizer's pad token)",
            type=int,
        ),
    )
    spill_dir: str | None = field(
        default=None,
        metadata=flag(
            "--spill-dir",
            "folder for the temporary token spill of a corpus read chunk by chunk (default:"
            " beside --out; it needs room for 4 bytes a token)",
        ),
    )

    def __post_init__(self) -> None:
        put = object.__setattr__
        check_types(self)
        put(self, "capacity", positive_int("capacity", self.capacity, INT32_MAX))
        put(self, "policy", policy_name(self.policy))
        if self.policy not in POLICIES:
            raise InvalidInput(
                f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}"
            )
        options = MappingProxyType(dict(self.policy_options))
        check_policy_options(self.policy, options, self.capacity)
        put(self, "policy_options", options)
        put(
            self,
            "max_rows_per_batch",
            positive_int("max_rows_per_batch", self.max_rows_per_batch, INT32_MAX),
        )
        if self.max_metadata_bytes is not None:
            limit = positive_int("max_metadata_bytes", self.max_metadata_bytes, budget.MAX_BYTES)
            put(self, "max_metadata_bytes", limit)
        put(self, "partition", Partition.parse(self.partition))
        Objective.of(self)  # checks assistant_only_loss and completion_only_loss
        if self.vocab_size is not None:
            put(self, "vocab_size", positive_int("vocab_size", self.vocab_size, INT32_MAX))
        if self.chat_template is not None:
            put(self, "chat_template", read_chat_template(self.chat_template))
        if not isinstance(self.text_field, str) or not self.text_field:
            raise InvalidInput(f"text_field must be a column name, got {self.text_field!r}")
        if self.format not in OUTPUT_FORMATS:
            raise InvalidInput(
                f"unknown format {self.format!r}; choose one of {', '.join(OUTPUT_FORMATS)}"
            )
        if self.format == "trl" and self.capacity < 2:
            raise InvalidInput(
                "with format trl the capacity counts tokens; a row needs at least 2 (one pair)"
            )
        if self.pad_token_id is not None:
            put(self, "pad_token_id", parse_pad(self.pad_token_id))
        put(self, "shard_tokens", positive_int("shard_tokens", self.shard_tokens, INT32_MAX))
        put(self, "chunk_bytes", positive_int("chunk_bytes", self.chunk_bytes, MAX_CHUNK_BYTES))

    @classmethod
    def of(cls, options: PackOptions | None = None, **overrides: Any) -> PackOptions:
        """``options`` with ``overrides`` applied (keywords are field names), checked.

        ``split_long_sources`` (the 0.1 name of ``split_long``) still works,
        with a :class:`DeprecationWarning`.
        """
        if "split_long_sources" in overrides:
            warnings.warn(
                "split_long_sources= is now split_long= (PackOptions.split_long)",
                DeprecationWarning,
                stacklevel=3,
            )
            overrides["split_long"] = overrides.pop("split_long_sources")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise InvalidInput(
                f"unknown packing option(s) {', '.join(unknown)}; PackOptions has"
                f" {', '.join(sorted(names))}"
            )
        if options is None:
            if "capacity" not in overrides:  # else a TypeError from the dataclass
                raise InvalidInput("capacity is required: pass capacity=N (tokens a row holds)")
            return cls(**overrides)
        if not isinstance(options, cls):
            raise InvalidInput(
                f"options must be a {cls.__name__} (or its fields as keywords), got"
                f" {type(options).__name__} — pass {cls.__name__}(**options) or **options"
            )
        return dataclasses.replace(options, **overrides) if overrides else options

    def load_tokenizer(self) -> Tokenizer | None:
        """The tokenizer these options name, loaded (None for pre-tokenized input), with
        ``chat_template`` when one is given."""
        return with_chat_template(as_tokenizer(self.tokenizer), self.chat_template)

    def show_progress(self, stream: Any) -> bool:
        """Whether to draw progress: ``progress``, or by default when ``stream`` is a terminal."""
        return stream.isatty() if self.progress is None else bool(self.progress)

    @property
    def pair_capacity(self) -> int:
        """The most prediction pairs one example may have: ``capacity``, or ``capacity - 1``
        with format trl (an example of ``n`` tokens has ``n - 1`` pairs and fills ``n``)."""
        return self.capacity - 1 if self.format == "trl" else self.capacity

    def manifest_fields(self, pad_token_id: int | None = None) -> dict[str, Any]:
        """What a packed directory records of these options (``config`` and ``policy``);
        ``pad_token_id`` is the checked pad id (:func:`check_pad_id`), when there is one."""
        config = {"capacity": self.capacity, "max_rows_per_batch": self.max_rows_per_batch}
        if self.format == "trl":
            config["capacity_unit"] = "tokens"
        if pad_token_id is not None:
            config["pad_token_id"] = pad_token_id
        return {
            "config": config,
            "policy": {"name": self.policy, "options": dict(self.policy_options)},
        }


#: How command-line text becomes a field's value. A field whose flag says ``type=int``
#: is read by :func:`~seqpack.core.checks.parse_int` (whole numbers only: no ``inf``,
#: ``nan``, ``1e3``); its range is checked by the options class, as for any caller.
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "max_metadata_bytes": parse_byte_size,
    "chunk_bytes": parse_byte_size,
    "shard_tokens": parse_count,
    "completion_only_loss": parse_switch,
}


def add_arguments(parser: argparse.ArgumentParser, command: str, cls: type = PackOptions) -> None:
    """Add every flag of ``cls`` (default :class:`PackOptions`) that ``command`` takes."""
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if meta.get("flag") is None or command not in meta["commands"]:
            continue
        kwargs = dict(meta["argparse"])
        parse = _PARSERS.get(f.name, parse_int if kwargs.get("type") is int else None)
        if parse is not None:
            kwargs["type"] = argparse_type(parse, meta["flag"])
        parser.add_argument(meta["flag"], dest=f.name, help=meta["help"], **kwargs)


def argparse_type(parse: Callable[[str, str], Any], flag: str) -> Callable[[str], Any]:
    """``parse(text, flag)`` as an argparse ``type=``: its one-line message on refusal."""

    def convert(text: str) -> Any:
        try:
            return parse(text, flag)
        except InvalidInput as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def from_arguments(
    args: argparse.Namespace, command: str, cls: type = PackOptions, **extra: Any
) -> Any:
    """The ``cls`` options (default :class:`PackOptions`) of parsed ``args`` plus ``extra``."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("flag") is None or command not in f.metadata["commands"]:
            continue
        value = getattr(args, f.name)
        if f.name == "policy_options":
            value = policy_options(value)
        if value is not None:
            values[f.name] = value
    return cls(**(values | extra))


def policy_options(items: Iterable[str]) -> dict[str, Any]:
    """``["window=4096", "seed=1"]`` -> ``{"window": 4096, "seed": 1}`` (JSON values or text)."""
    out: dict[str, Any] = {}
    for item in items:
        key, value = parse_option(item)
        out[key] = value
    return out


def cli_flags(command: str) -> list[str]:
    """The flags :func:`add_arguments` adds for ``command`` (for docs and tests)."""
    return [
        f.metadata["flag"]
        for f in dataclasses.fields(PackOptions)
        if f.metadata.get("flag") is not None and command in f.metadata["commands"]
    ]

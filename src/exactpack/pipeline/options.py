"""Every option of a packing run, declared once: :class:`PackOptions`.

``exactpack pack`` / ``stats``, :func:`exactpack.pipeline.local.pack_path`,
:func:`exactpack.ray.pack` and :func:`exactpack.hf.pack_dataset` all take this frozen object;
each field's ``metadata`` carries its help and commands, its flag is its name with hyphens
(``cut_long``: ``--cut-long``; ``policy_options`` is ``--option``) and
:mod:`exactpack.cli.flags` builds the parser from them::

    options = PackOptions(max_length=4096, policy="best-fit-decreasing", vocab_size=32000)
    pack_path("shards/", "packed/", options)
    pack_path("shards/", "packed/", max_length=4096, vocab_size=32000)   # the same run

``max_length`` is the row width in tokens (TRL's ``SFTConfig.max_length``) and the packer's
``capacity``: with ``format="exactpack"`` an example of ``n`` tokens fills ``n - 1`` cells
(one per prediction pair), with ``format="trl"`` ``n`` (:attr:`PackOptions.pair_capacity`).
A bad value is an :class:`~exactpack.core.errors.InvalidInput`
naming the option and the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exactpack.core import config as budget
from exactpack.core.binding import INT32_MAX, Split
from exactpack.core.errors import InvalidInput, did_you_mean, positive_int, type_argument
from exactpack.core.policies import check_policy_options
from exactpack.core.supervision import Objective
from exactpack.io.tokenizers import Tokenizer, as_tokenizer, read_chat_template, with_chat_template

DEFAULT_POLICY = "best-fit-decreasing"
DEFAULT_ROWS_PER_BATCH = 8
#: Target tokens per output shard; shards always end on a model-call boundary.
DEFAULT_SHARD_TOKENS = 1 << 25
#: Input bytes read, parsed and tokenized at a time.
DEFAULT_CHUNK_BYTES = 1 << 25
#: The largest chunk (a read of that many bytes is allocated whole).
MAX_CHUNK_BYTES = 1 << 30
#: What ``--format`` writes: exactpack's own packed columns, or TRL 1.16's packed schema.
OUTPUT_FORMATS = ("exactpack", "trl")
#: ``tree`` values: ``on`` (groups from the columns) or ``auto`` (rows grouped by prefix).
TREE_MODES = ("on", "auto")
#: ``tree="auto"``: rows whose first this many tokens agree share a trie.
DEFAULT_TREE_PREFIX = 16
#: ``tree="auto"``: rows are grouped within windows of this many rows (bounded memory).
DEFAULT_TREE_WINDOW = 4096
#: Other tools' names of exactpack's policies (TRL's ``pack_dataset(strategy="bfd")``).
POLICY_ALIASES = {"bfd": "best-fit-decreasing"}

#: ``truncation_mode``: which end of a longer example is kept (TRL's ``truncation_mode``).
TRUNCATION_MODES = ("keep_start", "keep_end")

#: Commands whose parser gets a field's flag: ``pack`` or both ``pack`` and ``stats``.
PACK, BOTH = ("pack",), ("pack", "stats")


def flag(
    flag: str | None, help: str, commands: tuple[str, ...] = PACK, **argparse_kwargs: Any
) -> dict[str, Any]:
    """Field metadata: the flag (None: not on the command line; ``""``: ``--`` and the
    field's name with hyphens, :func:`exactpack.cli.flags.flag_of`), help and argparse
    keywords."""
    return {"flag": flag, "help": help, "commands": commands, "argparse": argparse_kwargs}


def _field(default: Any, *args: Any, **kwargs: Any) -> Any:
    return field(default=default, metadata=flag("", *args, **kwargs))


_PATH = (str, os.PathLike)
_NONE = type(None)
#: Fields whose type ``__post_init__`` does not otherwise pin down: (types, what to pass).
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "policy": ((str,), "a policy name"),
    "policy_options": ((Mapping,), "a mapping of option names to values, e.g. {'lookahead': 4096}"),
    "cut_long": ((bool,), "True or False"),
    "overwrite": ((bool,), "True or False"),
    "progress": ((bool, _NONE), "True, False or None (draw when stderr is a terminal)"),
    "tokenizer_id": ((str, _NONE), "a string or None"),
    "split_id": ((str, _NONE), "a string or None"),
    "chat_template": ((*_PATH, _NONE), "a template file, the template text or None"),
    "spill_dir": ((*_PATH, _NONE), "a folder path or None"),
    "pad_token_id": ((int, _NONE), "a non-negative token id or None"),
}

#: Count fields and their largest value (``max_length`` is checked first, by its own name).
_COUNTS = {"max_rows_per_batch": INT32_MAX, "max_metadata_bytes": budget.MAX_BYTES}
_COUNTS |= {"vocab_size": INT32_MAX, "shard_tokens": INT32_MAX, "chunk_bytes": MAX_CHUNK_BYTES}
_COUNTS |= {"tree_prefix": INT32_MAX, "tree_block": INT32_MAX}
#: Fields that take one of a few values (None among them: optional).
_CHOICES = {"format": OUTPUT_FORMATS, "truncation_mode": (*TRUNCATION_MODES, None)}
_CHOICES |= {"tree": (*TREE_MODES, None)}
_REQUIRED = ("max_rows_per_batch", "shard_tokens", "chunk_bytes", "tree_prefix", "tree_block")


@dataclass(frozen=True)
class PackOptions:
    """One packing run's options (see the module docstring); frozen and validated.

    ``tokenizer`` is ``"bytes"``, a local tokenizer path or a loaded tokenizer;
    ``vocab_size`` is required for pre-tokenized input without one; ``chat_template``
    (a Jinja file or the template text) is read on construction.
    """

    max_length: int = _field(
        None,
        "tokens per row: the width of the input_ids a model sees, for every --format"
        " (TRL's max_length)",
        BOTH,
        metavar="N",
    )
    policy: str = _field(
        DEFAULT_POLICY, f"packing policy (default: {DEFAULT_POLICY}; or TRL's bfd)"
    )
    policy_options: Mapping[str, Any] = field(
        default_factory=dict,
        metadata=flag(
            "--option",
            "a policy option, KEY=VALUE (repeatable; e.g. lookahead=4096)",
            action="append",
            default=[],
            metavar="KEY=VALUE",
        ),
    )
    max_rows_per_batch: int = _field(DEFAULT_ROWS_PER_BATCH, "rows per model call")
    max_metadata_bytes: int | None = _field(
        None,
        "refuse (before planning) to pack when the plan, rows and one model call need more"
        " memory than this (e.g. 2G; with --engine ray, per block)",
        metavar="BYTES",
    )
    split: Split = _field(  # noqa: RUF009
        Split.TRAIN, "the split the data is: train, validation or test", BOTH
    )
    cut_long: bool = _field(
        False,
        "cut documents longer than a row into consecutive spans, every pair kept once",
        BOTH,
        action="store_true",
    )
    truncation_mode: str | None = _field(
        None,
        "keep only the first (keep_start, TRL's truncation) or the last (keep_end) tokens a"
        " row holds of each longer example, counted in the report (default: refuse them)",
        choices=TRUNCATION_MODES,
    )
    vocab_size: int | None = _field(None, "vocabulary size of pre-tokenized input")
    tokenizer: str | Tokenizer | None = _field(  # noqa: RUF009
        None, "'bytes' (built-in, 266 ids) or a local tokenizer path", BOTH
    )
    tokenizer_id: str | None = _field(None, "tokenizer identity recorded in the binding")
    split_id: str | None = _field(None, "split-receipt identity (default: digest of the data)")
    text_field: str = _field("text", "text column when there is no input_ids", BOTH)
    chat_template: str | None = _field(
        None,
        "Jinja chat template for messages / conversational prompt-completion rows (a file;"
        " default: the --tokenizer folder's own)",
        BOTH,
        metavar="FILE",
    )
    # TRL 1.16 SFTConfig's two switches, same names and defaults (core.supervision.Objective)
    assistant_only_loss: bool = _field(
        False,
        "train only the assistant turns of chat rows (TRL SFTConfig's assistant_only_loss;"
        " default: the whole conversation, as TRL; needs generation markers in the template)",
        BOTH,
        action="store_true",
    )
    completion_only_loss: bool | None = _field(
        None,
        "true: train only the completion of prompt-completion rows (and completion_mask);"
        " false: the whole sequence (TRL SFTConfig's completion_only_loss; default: true"
        " for prompt-completion rows only, as TRL)",
        BOTH,
        metavar="{true,false}",
    )
    overwrite: bool = _field(False, "replace an existing output", action="store_true")
    progress: bool | None = _field(
        None,
        "progress bars on stderr (default: when stderr is a terminal)",
        action=argparse.BooleanOptionalAction,
    )
    shard_tokens: int = _field(
        DEFAULT_SHARD_TOKENS,
        "target tokens per output shard (two shards are built at a time; default 2**25)",
        metavar="N",
    )
    chunk_bytes: int = _field(
        DEFAULT_CHUNK_BYTES,
        "input read, parsed and tokenized this many bytes at a time (default 32M)",
        BOTH,
        metavar="BYTES",
    )
    format: str = _field(
        "exactpack",
        "output columns: exactpack (tokens, pair_counts, ...) or trl (TRL's packed schema:"
        " input_ids, seq_lengths in tokens, labels where the input masks some)",
        BOTH,
        choices=OUTPUT_FORMATS,
    )
    pad_token_id: int | None = _field(
        None,
        "the id collators pad with, checked against the vocabulary before packing and"
        " recorded (default: the tokenizer's pad token)",
    )
    # tree packing (docs/tree.md): None packs flat; pipeline.pack_tree reads the rest
    tree: str | None = _field(
        None,
        "tree packing (docs/tree.md): shared prefixes stored once; --tree auto groups plain"
        " SFT rows whose first --tree-prefix tokens agree (give it after the input)",
        BOTH,
        nargs="?",
        const="on",
        choices=TREE_MODES,
    )
    tree_prefix: int = _field(
        DEFAULT_TREE_PREFIX,
        f"--tree auto: tokens that must agree to share a trie (default {DEFAULT_TREE_PREFIX})",
        BOTH,
        metavar="K",
    )
    tree_block: int = _field(
        DEFAULT_TREE_WINDOW,
        "rows read and planned together (memory), a group never split: --tree ends a block"
        " at the first group change after this many rows, --tree auto groups documents only"
        " within consecutive blocks of this many; chunk-bytes may end a block sooner"
        f" (default {DEFAULT_TREE_WINDOW})",
        BOTH,
        metavar="DOCUMENTS",
    )
    spill_dir: str | None = _field(
        None,
        "folder for the temporary token spill of a corpus read chunk by chunk (default:"
        " beside --out; it needs room for 4 bytes a token)",
    )

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name, (kinds, expected) in _TYPES.items():
            type_argument(name, getattr(self, name), kinds, expected)
        if isinstance(self.tokenizer, (bool, int, float, bytes, list, tuple, dict, set)):
            type_argument(
                "tokenizer", self.tokenizer, _PATH, "'bytes', a local path or a loaded tokenizer"
            )
        if self.max_length is None:
            raise InvalidInput("max_length is required: pass max_length=N (tokens a row holds)")
        put(self, "max_length", positive_int("max_length", self.max_length, INT32_MAX))
        put(self, "policy", policy_name(self.policy))
        options = MappingProxyType(dict(self.policy_options))
        check_policy_options(self.policy, options, self.capacity)
        put(self, "policy_options", options)
        for field_name, top in _COUNTS.items():  # optional ones may be None
            if (value := getattr(self, field_name)) is not None or field_name in _REQUIRED:
                put(self, field_name, positive_int(field_name, value, top))
        put(self, "split", Split.parse(self.split))
        Objective.of(self)  # checks assistant_only_loss and completion_only_loss
        if self.chat_template is not None:
            put(self, "chat_template", read_chat_template(self.chat_template))
        if not isinstance(self.text_field, str) or not self.text_field:
            raise InvalidInput(f"text_field must be a column name, got {self.text_field!r}")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if not isinstance(value, (str, _NONE)) or value not in choices:
                shown = ", ".join(c for c in choices if c) + (" or None" if None in choices else "")
                raise InvalidInput(f"{name} must be one of {shown}, got {value!r}")
        if self.format == "trl" and self.max_length < 2:
            raise InvalidInput(
                "with format trl a row needs at least 2 tokens (one pair): raise max_length"
            )
        if self.pad_token_id is not None and self.pad_token_id < 0:  # its bound: check_pad_id
            raise InvalidInput(
                f"pad_token_id must be a non-negative token id, got {self.pad_token_id}"
            )
        if self.truncation_mode is not None and self.cut_long:
            raise InvalidInput(
                "cut_long=True and truncation_mode= both say what to do with a longer example"
                " — pass one of them"
            )

    @classmethod
    def of(cls, options: PackOptions | None = None, **overrides: Any) -> PackOptions:
        """``options`` with ``overrides`` (its fields) applied, checked."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise InvalidInput(
                f"unknown packing option(s) {', '.join(unknown)}"
                + (
                    did_you_mean(unknown[0], names)
                    or f"; PackOptions has {', '.join(sorted(names))}"
                )
            )
        if options is None:
            return cls(**overrides)
        if not isinstance(options, cls):
            raise InvalidInput(
                f"options must be a {cls.__name__} (or its fields as keywords), got"
                f" {type(options).__name__} — pass {cls.__name__}(**options) or **options"
            )
        return dataclasses.replace(options, **overrides) if overrides else options

    @property
    def capacity(self) -> int:
        """The packer's cells per row: ``max_length`` (see the module docstring)."""
        return self.max_length

    @property
    def pair_capacity(self) -> int:
        """The most prediction pairs one example may have: ``max_length``, or
        ``max_length - 1`` with format trl (``n`` tokens hold ``n - 1`` pairs)."""
        return self.max_length - 1 if self.format == "trl" else self.max_length

    def load_tokenizer(self) -> Tokenizer | None:
        """The tokenizer named, with ``chat_template``, loaded (None: pre-tokenized input)."""
        return with_chat_template(as_tokenizer(self.tokenizer), self.chat_template)

    def binding_keywords(self, tokenizer: Tokenizer | None) -> dict[str, Any]:
        """:func:`exactpack.io.documents.make_binding`'s keywords for these options."""
        ids = {"tokenizer_id": self.tokenizer_id, "split_id": self.split_id}
        return {"vocab_size": self.vocab_size, "tokenizer": tokenizer} | ids

    def show_progress(self, stream: Any) -> bool:
        """Whether to draw progress: ``progress``, or by default when ``stream`` is a terminal."""
        return stream.isatty() if self.progress is None else bool(self.progress)

    def manifest_fields(self, pad_token_id: int | None = None) -> dict[str, Any]:
        """What a packed directory records of these options (``config`` and ``policy``);
        ``pad_token_id`` is the checked pad id (:func:`check_pad_id`), when there is one."""
        config = {"capacity": self.capacity, "max_rows_per_batch": self.max_rows_per_batch}
        if self.format == "trl":
            config["capacity_unit"] = "tokens"
        if pad_token_id is not None:
            config["pad_token_id"] = pad_token_id
        # policy options as a manifest records them (``lookahead`` under its 0.2 key ``window``)
        stored = {"window" if k == "lookahead" else k: v for k, v in self.policy_options.items()}
        return {
            "config": config,
            "policy": {"name": self.policy, "options": stored},
        }


def policy_name(name: Any) -> Any:
    """``name``, or the policy another tool's name (``bfd``) stands for."""
    return POLICY_ALIASES.get(name, name) if isinstance(name, str) else name


def check_pad_id(opts: Any, vocab_size: int, tokenizer: Tokenizer | None) -> int | None:
    """The pad id of a run, checked against ``vocab_size`` before anything is written:
    ``opts.pad_token_id``, else the tokenizer's pad token (None when neither has one).
    One outside the vocabulary, or disagreeing with the tokenizer's, is InvalidInput."""
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

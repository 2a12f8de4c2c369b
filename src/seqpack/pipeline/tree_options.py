"""Tree packing's own options, declared once: :class:`TreeOptions`.

What is packed and how rows are planned stays a
:class:`~seqpack.pipeline.options.PackOptions` field; these say whether the
rows are tries (``--tree``) and, for ``--tree auto``, how plain rows are
grouped. ``seqpack pack`` and ``seqpack stats`` take the flags from this
class's field metadata, as their other flags come from ``PackOptions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seqpack.core.checks import positive_int
from seqpack.core.errors import InvalidInput
from seqpack.pipeline.options import BOTH, flag

#: ``--tree`` values: ``on`` (groups from the columns) or ``auto`` (rows grouped by prefix).
TREE_MODES = ("on", "auto")
#: ``--tree auto``: rows whose first this many tokens agree share a trie.
DEFAULT_TREE_PREFIX = 16
#: ``--tree auto``: rows are grouped within windows of this many rows (bounded memory).
DEFAULT_TREE_WINDOW = 4096


@dataclass(frozen=True)
class TreeOptions:
    """``tree``: None (flat packing), ``"on"`` (groups from the tree columns: prompt_ids +
    completion_ids, TRL's DPO columns, input_ids + group, or prompt / chosen / rejected
    text through the tokenizer) or ``"auto"`` (plain SFT rows grouped by their first
    ``tree_prefix`` tokens, within windows of ``tree_window`` rows)."""

    tree: str | None = field(
        default=None,
        metadata=flag(
            "--tree",
            "tree packing (docs/tree.md): shared prefixes stored once; --tree auto groups plain"
            " SFT rows whose first --tree-prefix tokens agree (give it after the input)",
            BOTH,
            nargs="?",
            const="on",
            choices=TREE_MODES,
        ),
    )
    tree_prefix: int = field(
        default=DEFAULT_TREE_PREFIX,
        metadata=flag(
            "--tree-prefix",
            f"--tree auto: tokens that must agree to share a trie (default {DEFAULT_TREE_PREFIX})",
            BOTH,
            metavar="K",
            type=int,
        ),
    )
    tree_window: int = field(
        default=DEFAULT_TREE_WINDOW,
        metadata=flag(
            "--tree-window",
            f"--tree auto: rows grouped together at most (default {DEFAULT_TREE_WINDOW})",
            BOTH,
            metavar="ROWS",
            type=int,
        ),
    )

    def __post_init__(self) -> None:
        if self.tree is not None and self.tree not in TREE_MODES:
            raise InvalidInput(f"tree must be one of {', '.join(TREE_MODES)} or None")
        object.__setattr__(self, "tree_prefix", positive_int("tree_prefix", self.tree_prefix))
        object.__setattr__(self, "tree_window", positive_int("tree_window", self.tree_window))


__all__ = ["DEFAULT_TREE_PREFIX", "DEFAULT_TREE_WINDOW", "TREE_MODES", "TreeOptions"]

"""One exception hierarchy for every failure seqpack reports.

Messages name what was wrong, which example (index and id) and what to do,
e.g. ``example 17 ('doc-42'[0:9001]) has 9000 prediction pairs; capacity is
8192 — raise --max-length or pre-split with --split-long``.
"""

from __future__ import annotations


class SeqpackError(Exception):
    """Root of every error seqpack raises on purpose."""


class InvalidInput(SeqpackError, ValueError):
    """Input data or arguments that cannot be used as given."""


class OversizedExample(InvalidInput):
    """An example has more prediction pairs than a row holds."""


class BindingMismatch(InvalidInput):
    """Vocabulary, tokenizer or split receipt differ from the expected binding."""


class SplitMismatch(InvalidInput):
    """An example of one partition was offered to a batch of another."""


class BudgetExceeded(SeqpackError):
    """A memory or cell budget would be exceeded; nothing was allocated."""


class EmptyObjective(SeqpackError):
    """A loss was requested over zero eligible targets (no denominator)."""


class NotAvailable(SeqpackError, RuntimeError):
    """A backend or optional dependency is missing on this machine."""


# vocab codemod: the 0.2 names, kept for one release
from seqpack._renames import renamed_names  # noqa: E402

__getattr__ = renamed_names(
    __name__,
    {
        "PartitionMismatch": "SplitMismatch",
    },
)

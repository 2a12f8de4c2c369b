"""Supervision columns of Arrow tables: the AND of every one present; look-alikes refused.

The rule (which columns, what they mean, what is refused) is
:mod:`seqpack.core.supervision`; here it is applied to whole Arrow columns
at once (NumPy over the flat values, no Python loop per row or token), with
errors naming the file, line or row and the fix.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pyarrow as pa

from seqpack.core.batch import IGNORE_INDEX
from seqpack.core.errors import InvalidInput
from seqpack.core.supervision import (
    CHECKED,
    SUPERVISION_COLUMNS,
    UNKNOWN,
    Objective,
    plain_violation,
    refusal,
    wrong_labels,
)
from seqpack.io.cells import first, flag_values, ints, lists, row_of, target_flags
from seqpack.io.documents import Origin


def check_columns(table: pa.Table, origin: Origin, read: Collection[str], tokens: bool) -> None:
    """Refuse a column that looks like supervision seqpack does not read (see the module).

    ``read``: the columns this table is read from; ``tokens``: whether they
    are ``input_ids`` (else text, which no per-token column can align with).
    """
    where = origin.parts[0][0]
    names = table.column_names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # Arrow allows it; which of the two is the data is anyone's guess
        raise InvalidInput(
            f"{where}: column {twice[0]!r} appears more than once — rename or drop the duplicates"
        )
    for index, name in enumerate(names):
        kind = table.schema.field(index).type
        if name in read or pa.types.is_null(kind):
            continue
        if name in SUPERVISION_COLUMNS:
            raise InvalidInput(
                f"{where}: column {name!r} aligns with input_ids, but the rows are read from"
                f" text ({', '.join(sorted(read))}) — tokenize them yourself and give input_ids"
                f" with {name}, or drop the column"
            )
        if name in CHECKED and tokens:
            _check_plain(table, name, origin)
            continue
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        fix = UNKNOWN if name in CHECKED else refusal(name, listed)
        if fix is not None:
            raise InvalidInput(
                f"{where}: column {name!r} looks like supervision, which seqpack does not read"
                f" — {fix}"
            )


def _check_plain(table: pa.Table, name: str, origin: Origin) -> None:
    """``attention_mask`` all 1, ``token_type_ids`` all 0, ``position_ids`` 0..n-1 per row,
    each as long as ``input_ids``; anything else would change what is trained."""
    values, offsets, present = lists(table, name, origin, optional=True)
    values = ints(values, offsets, name, origin) if values.dtype != np.bool_ else values
    _, token_offsets, _ = lists(table, "input_ids", origin)
    short = present & (np.diff(offsets) != np.diff(token_offsets))
    if short.any():
        row = first(short)
        raise InvalidInput(
            f"{origin.locate(row)}: {name} has {int(np.diff(offsets)[row])} entries but"
            f" input_ids has {int(np.diff(token_offsets)[row])} — drop the column"
        )
    local = np.arange(values.shape[0]) - np.repeat(offsets[:-1], np.diff(offsets))
    bad, fix = plain_violation(name, values, local)
    if bad.any():
        pos = first(bad)
        row = row_of(offsets, pos)
        raise InvalidInput(
            f"{origin.locate(row)}: {name}[{pos - int(offsets[row])}] = {int(values[pos])} — {fix}"
        )


def supervised_targets(
    table: pa.Table,
    tokens: np.ndarray,
    offsets: np.ndarray,
    origin: Origin,
    objective: Objective | None = None,
) -> np.ndarray | None:
    """One flag per target (bool [T - k]), the AND of the supervision columns present that
    ``objective`` (default TRL's) applies, or None when every target is supervised."""
    names = [n for n in table.column_names if not pa.types.is_null(table.schema.field(n).type)]
    names = (objective or Objective()).applied(names, origin.parts[0][0])
    if "labels" in names and "loss_mask" in names:
        raise InvalidInput(
            f"{origin.parts[0][0]}: has both labels and loss_mask — keep one of them"
        )
    counts = np.diff(offsets)
    flags = np.ones(tokens.shape[0] - counts.shape[0], dtype=bool)
    for name in names:
        if name == "labels":
            part, present = _label_flags(table, tokens, counts, origin)
        else:
            part, present = _mask_flags(table, name, counts, origin)
        flags[np.repeat(present, counts - 1)] &= part
    return None if flags.all() else flags


def _label_flags(
    table: pa.Table, tokens: np.ndarray, counts: np.ndarray, origin: Origin
) -> tuple[np.ndarray, np.ndarray]:
    labels, loffsets, present = lists(table, "labels", origin, optional=True)
    labels = ints(labels, loffsets, "labels", origin)
    bad = present & (np.diff(loffsets) != counts)
    if bad.any():
        row = first(bad)
        raise InvalidInput(
            f"{origin.locate(row)}: labels has {int(np.diff(loffsets)[row])} entries but"
            f" input_ids has {int(counts[row])} — labels align with input_ids"
        )
    supervised = labels != IGNORE_INDEX
    wrong = wrong_labels(labels, tokens[np.repeat(present, counts)])
    if wrong.any():
        pos = first(wrong)
        row = row_of(loffsets, pos)
        raise InvalidInput(
            f"{origin.locate(row)}: labels[{pos - int(loffsets[row])}] = {int(labels[pos])}"
            f" differs from its input_ids token — a label must be the token itself"
            f" or {IGNORE_INDEX} (unshifted; seqpack forms the pairs)"
        )
    return target_flags(supervised, loffsets[:-1][present]), present


def _mask_flags(
    table: pa.Table, name: str, counts: np.ndarray, origin: Origin
) -> tuple[np.ndarray, np.ndarray]:
    """``loss_mask`` (per token or per target) or a TRL mask (per token) as target flags."""
    per_target = name == "loss_mask"
    how = "one per token or one per target" if per_target else "one 0/1 per input_ids token"
    mask, moffsets, present = lists(table, name, origin, optional=True)
    mask = flag_values(mask, moffsets, name, origin, how)
    mcounts = np.diff(moffsets)
    aligned = present & (mcounts == counts)
    bad = present & ~aligned & ((mcounts != counts - 1) | (not per_target))
    if bad.any():
        row = first(bad)
        raise InvalidInput(
            f"{origin.locate(row)}: {name} has {int(mcounts[row])} entries for"
            f" {int(counts[row])} tokens — give {how}"
        )
    return target_flags(mask, moffsets[:-1][aligned]), present

"""Which targets a row supervises, from every supervision column it has; the rest refused.

Per-token columns, aligned with ``input_ids`` (one entry per token):

- ``labels``: Hugging Face convention, ``-100`` = not supervised, otherwise
  the token itself (unshifted);
- ``loss_mask``: bools or 0/1, per token (first entry unused) or per target
  (one shorter);
- ``completion_mask``: 0/1, TRL's prompt-completion mask (1 = completion);
- ``assistant_masks``: 0/1, TRL's assistant-token mask (1 = an assistant turn).

A token is supervised iff **every** column present says so (TRL's
``build_labels``: ``token if all(masks) else -100``). Target ``j`` of a
document predicts token ``j + 1``, so its flag is token ``j + 1``'s: for
``input_ids [BOS p q EOS]`` with ``completion_mask [0 0 1 1]`` the targets
``p->q``, ``q->EOS`` are supervised and ``BOS->p`` is not, exactly the
positions a model trained on TRL's ``labels`` (shifted inside the model)
learns. A row whose column is null has no such mask.

A column that looks like supervision but is none of these is refused, never
ignored (:func:`check_columns`): see :data:`REFUSED` and the rules there.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pyarrow as pa

from seqpack.core.batch import IGNORE_INDEX
from seqpack.core.errors import InvalidInput
from seqpack.io.cells import first, flag_values, ints, lists, row_of, target_flags
from seqpack.io.documents import Origin

#: TRL's per-token masks (0/1 per ``input_ids`` token).
MASK_COLUMNS = ("completion_mask", "assistant_masks")
#: Every supervision column seqpack reads, in the order they are applied.
SUPERVISION_COLUMNS = ("labels", "loss_mask", *MASK_COLUMNS)

_PACKED = (
    "these rows are already packed (TRL pack_dataset or seqpack output): packing them again"
    " would join their examples' contexts — pack the unpacked examples"
)
_MASK = (
    "give it as loss_mask (1 = supervised, one per token), completion_mask or assistant_masks,"
    " or drop the column"
)
_WEIGHTS = (
    "seqpack supervises each target fully or not at all (the loss is token-weighted);"
    " per-token weights are not supported — give a 0/1 loss_mask, or drop the column"
)
_TARGETS = (
    "seqpack forms the targets itself (target j is token j+1) — give unshifted labels (the"
    " token or -100) aligned with input_ids, or drop the column"
)
_PAIRS = (
    "preference pairs (DPO) are not SFT rows — to train on the chosen answers rename chosen"
    " to completion and drop rejected"
)

#: Column names that are refused whatever they hold, with the fix.
REFUSED = {
    "label": "seqpack reads per-token labels (plural: the token or -100) — rename it to labels"
    " if it holds one label per token; drop it if it is a class or preference label (every"
    " row is trained)",
    "labels_mask": _MASK,
    "label_mask": _MASK,
    "mask": _MASK,
    "masks": _MASK,
    "loss_masks": "did you mean loss_mask?",
    "target_mask": _MASK,
    "prompt_mask": _MASK,
    "response_mask": _MASK,
    "train_mask": _MASK,
    "completion_masks": "did you mean completion_mask (TRL's name)?",
    "assistant_mask": "did you mean assistant_masks (TRL's name)?",
    "assistant_tokens_mask": "did you mean assistant_masks (TRL's name)?",
    "assistant_token_mask": "did you mean assistant_masks (TRL's name)?",
    "loss_weights": _WEIGHTS,
    "loss_weight": _WEIGHTS,
    "token_weights": _WEIGHTS,
    "weights": _WEIGHTS,
    "targets": _TARGETS,
    "target_ids": _TARGETS,
    "label_ids": _TARGETS,
    "shift_labels": _TARGETS,
    "chosen": _PAIRS,
    "rejected": _PAIRS,
    "seq_lengths": _PACKED,
    "cu_seq_lens_q": _PACKED,
    "cu_seq_lens_k": _PACKED,
    "cu_seqlens": _PACKED,
    "seq_idx": _PACKED,
    "pair_counts": _PACKED,
    "seq_starts": _PACKED,
    "loss_bits": _PACKED,
}
#: Columns accepted only when they carry no supervision: all 1, all 0, 0..n-1 per row.
CHECKED = ("attention_mask", "token_type_ids", "position_ids")
#: Any other list column whose name holds one of these is refused as unknown supervision.
SUSPECT_WORDS = ("mask", "label", "weight")


def suspect(name: str) -> bool:
    """Whether a column name may be supervision seqpack must see (so readers keep it)."""
    low = name.lower()
    return name in REFUSED or name in CHECKED or any(w in low for w in SUSPECT_WORDS)


def check_columns(table: pa.Table, origin: Origin, read: Collection[str], tokens: bool) -> None:
    """Refuse a column that looks like supervision seqpack does not read (see the module).

    ``read``: the columns this table is read from; ``tokens``: whether they
    are ``input_ids`` (else text, which no per-token column can align with).
    """
    where = origin.parts[0][0]
    for name in table.column_names:
        kind = table.schema.field(name).type
        if name in read or pa.types.is_null(kind):
            continue
        if name in SUPERVISION_COLUMNS:
            raise InvalidInput(
                f"{where}: column {name!r} aligns with input_ids, but the rows are read from"
                f" text ({', '.join(sorted(read))}) — tokenize them yourself and give input_ids"
                f" with {name}, or drop the column"
            )
        if name in REFUSED:
            raise InvalidInput(
                f"{where}: column {name!r} looks like supervision, which seqpack does not read"
                f" — {REFUSED[name]}"
            )
        if name in CHECKED and tokens:
            _check_plain(table, name, origin)
            continue
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if name in CHECKED or (listed and any(w in name.lower() for w in SUSPECT_WORDS)):
            raise InvalidInput(
                f"{where}: column {name!r} looks like supervision, which seqpack does not read"
                f" — seqpack reads {', '.join(SUPERVISION_COLUMNS)} (aligned with input_ids);"
                " rename it to the one it means, or drop the column"
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
    if name == "attention_mask":
        bad, fix = (
            values != 1,
            (
                "padded or masked tokens inside input_ids would be trained and attended; keep only"
                " the attended tokens in input_ids, then drop the column"
            ),
        )
    elif name == "token_type_ids":
        bad, fix = (
            values != 0,
            (
                "seqpack does not read token types; if they mark prompt and completion give"
                " completion_mask instead, otherwise drop the column"
            ),
        )
    else:
        local = np.arange(values.shape[0]) - np.repeat(offsets[:-1], np.diff(offsets))
        bad, fix = (
            values != local,
            (
                "positions that do not count 0, 1, ... mean the row holds several examples"
                " already packed; pack the unpacked examples"
            ),
        )
    if bad.any():
        pos = first(bad)
        row = row_of(offsets, pos)
        raise InvalidInput(
            f"{origin.locate(row)}: {name}[{pos - int(offsets[row])}] = {int(values[pos])} — {fix}"
        )


def supervised_targets(
    table: pa.Table, tokens: np.ndarray, offsets: np.ndarray, origin: Origin
) -> np.ndarray | None:
    """One flag per target (bool [T - k]), the AND of every supervision column present,
    or None when every target is supervised."""
    names = [n for n in SUPERVISION_COLUMNS if n in table.column_names]
    names = [n for n in names if not pa.types.is_null(table.schema.field(n).type)]
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
    wrong = supervised & (labels != tokens[np.repeat(present, counts)])
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

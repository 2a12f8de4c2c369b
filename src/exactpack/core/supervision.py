"""The supervision rule, NumPy only: which targets a row trains, and the columns refused.

Per-token columns aligned with ``input_ids``: ``labels`` (``-100`` or the token itself,
unshifted), ``loss_mask`` (0/1 per token, or per target), TRL's ``completion_mask`` and
``assistant_masks``. A token is supervised iff **every** column applied says so (TRL's
``build_labels``); target ``j``'s flag is token ``j + 1``'s. B with only its EOS trained::

    input_ids        [BOS  101  EOS]       labels [-100 -100 1]
    completion_mask  [  0    0    1]   ->  targets  BOS->101: no, 101->EOS: yes

A look-alike column is refused, never ignored: by name (:data:`REFUSED`), by value
(:data:`CHECKED`), or a list column whose name holds ``mask``, ``label`` or ``weight``.
Which masks apply is TRL 1.16's :class:`Objective`.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactpack.core.batch import IGNORE_INDEX
from exactpack.core.errors import InvalidInput, type_argument

#: Every supervision column exactpack reads, in the order they are applied (the last two:
#: TRL's per-token masks, 0/1 per ``input_ids`` token).
SUPERVISION_COLUMNS = ("labels", "loss_mask", "completion_mask", "assistant_masks")

_PACKED = (
    "these rows are already packed (TRL pack_dataset or exactpack output): packing them again"
    " would join their examples' contexts — pack the unpacked examples"
)
_MASK = (
    "give it as loss_mask (1 = supervised, one per token), completion_mask or assistant_masks,"
    " or drop the column"
)
_WEIGHTS = (
    "exactpack supervises each target fully or not at all (the loss is token-weighted);"
    " per-token weights are not supported — give a 0/1 loss_mask, or drop the column"
)
_TARGETS = (
    "exactpack forms the targets itself (target j is token j+1) — give unshifted labels (the"
    " token or -100) aligned with input_ids, or drop the column"
)
_PAIRS = (
    "preference pairs (DPO) are not SFT rows — to train on the chosen answers rename chosen"
    " to completion and drop rejected"
)
_TYPO = "did you mean {} (TRL's name)?"

#: TRL's reason for refusing ``assistant_only_loss=True`` on rows that are not chats.
NOT_CONVERSATIONAL = (
    "assistant_only_loss=True needs conversational rows (messages, or prompt/completion as"
    " lists of {role, content} messages), as TRL's SFTTrainer says: 'the dataset is not"
    " conversational' — drop --assistant-only-loss (assistant_masks columns are applied"
    " without it)"
)


@dataclass(frozen=True)
class Objective:
    """TRL 1.16 ``SFTConfig``'s switches: ``assistant_only_loss`` (only assistant turns of
    chats), ``completion_only_loss`` (only the completion; None: True for prompt-completion
    rows, with a warning for a ``completion_mask`` elsewhere)."""

    assistant_only_loss: bool = False
    completion_only_loss: bool | None = None

    def __post_init__(self) -> None:
        type_argument("assistant_only_loss", self.assistant_only_loss, (bool,), "True or False")
        type_argument(
            "completion_only_loss", self.completion_only_loss, (bool, type(None)),
            "True, False or None (TRL's default)",
        )  # fmt: skip

    @classmethod
    def of(cls, options: Any) -> Objective:
        """The objective of ``options`` (anything with the two switches, e.g. ``PackOptions``)."""
        return cls(options.assistant_only_loss, options.completion_only_loss)

    def completion_only(self, prompt_completion: bool) -> bool:
        """``completion_only_loss`` resolved as TRL does for (non-)prompt-completion rows."""
        return prompt_completion if self.completion_only_loss is None else self.completion_only_loss

    def applied(self, names: Collection[str], what: str) -> list[str]:
        """The supervision columns among ``names`` this objective applies, in order."""
        if self.assistant_only_loss and "messages" not in names:
            raise InvalidInput(f"{what}: {NOT_CONVERSATIONAL}")
        prompt_completion = "prompt" in names and "completion" in names
        out = [n for n in SUPERVISION_COLUMNS if n in names]
        if "completion_mask" in out and not self.completion_only(prompt_completion):
            out.remove("completion_mask")
            if self.completion_only_loss is None:
                warnings.warn(
                    "completion_mask is not applied — with TRL's default"
                    " completion_only_loss=None, rows without prompt and completion train"
                    " the whole sequence; pass completion_only_loss=True"
                    " (--completion-only-loss true) to train the completion only",
                    UserWarning,
                    stacklevel=3,
                )
        return out


#: Column names that are refused whatever they hold, with the fix.
REFUSED = {
    "label": "exactpack reads per-token labels (plural: the token or -100) — rename it to labels"
    " if it holds one label per token; drop it if it is a class or preference label (every"
    " row is trained)",
    "loss_masks": "did you mean loss_mask?",
    "completion_masks": _TYPO.format("completion_mask"),
    "chosen": _PAIRS,
    "rejected": _PAIRS,
    **dict.fromkeys(("mask", "masks", "label_mask", "labels_mask", "target_mask", "prompt_mask",
                     "response_mask", "train_mask"), _MASK),
    **dict.fromkeys(("assistant_mask", "assistant_tokens_mask", "assistant_token_mask"),
                    _TYPO.format("assistant_masks")),
    **dict.fromkeys(("loss_weights", "loss_weight", "token_weights", "weights"), _WEIGHTS),
    **dict.fromkeys(("targets", "target_ids", "label_ids", "shift_labels"), _TARGETS),
    **dict.fromkeys(("seq_lengths", "cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens", "seq_idx",
                     "pair_counts", "seq_starts", "loss_bits"), _PACKED),
}  # fmt: skip
#: Columns accepted only when they carry no supervision: all 1, all 0, 0..n-1 per row.
CHECKED = ("attention_mask", "token_type_ids", "position_ids")
#: Any other list column whose name holds one of these is refused as unknown supervision.
SUSPECT_WORDS = ("mask", "label", "weight")
UNKNOWN = (
    f"exactpack reads {', '.join(SUPERVISION_COLUMNS)} (aligned with input_ids); rename it to"
    " the one it means, or drop the column"
)


def suspect(name: str) -> bool:
    """Whether a column may be supervision exactpack must see (so readers keep it)."""
    low = name.lower()
    return name in REFUSED or name in CHECKED or any(w in low for w in SUSPECT_WORDS)


def refusal(name: str, listed: bool) -> str | None:
    """The fix for column ``name`` (``listed``: holds lists) if refused by name alone."""
    if name in REFUSED:
        return REFUSED[name]
    if name in CHECKED or not listed:
        return None
    return UNKNOWN if any(w in name.lower() for w in SUSPECT_WORDS) else None


#: What a :data:`CHECKED` column must hold (``None``: each entry's position), and the fix.
_PLAIN = {
    "attention_mask": (1, "padded or masked tokens inside input_ids would be trained and"
                       " attended; keep only the attended tokens in input_ids, then drop the"
                       " column"),
    "token_type_ids": (0, "exactpack does not read token types; if they mark prompt and"
                       " completion give completion_mask instead, otherwise drop the column"),
    "position_ids": (None, "positions that do not count 0, 1, ... mean the row holds several"
                     " examples already packed; pack the unpacked examples"),
}  # fmt: skip


def plain_violation(name: str, values: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, str]:
    """Entries of a :data:`CHECKED` column (``values`` [T], ``local`` [T] positions in the
    row) that would change what is trained, and the fix."""
    want, fix = _PLAIN[name]
    return values != (local if want is None else want), fix


def wrong_labels(labels: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Where a label is neither its token nor -100 (bool, like ``labels``)."""
    return (labels != IGNORE_INDEX) & (labels != tokens)


def mapping_flags(
    item: Mapping[str, Any], tokens: np.ndarray, what: str, objective: Objective | None = None
) -> np.ndarray | None:
    """Flags bool [n-1]: the AND of the columns ``objective`` applies to one mapping (None:
    all supervised); look-alikes refused."""
    n = tokens.shape[0]
    for name, value in item.items():
        if name in SUPERVISION_COLUMNS or name == "input_ids":
            continue
        listed = isinstance(value, (list, tuple, np.ndarray))
        if (fix := refusal(name, listed)) is not None:
            raise InvalidInput(f"{what}: {name!r} looks like supervision — {fix}")
        if name in CHECKED and value is not None:
            values = np.asarray(value)
            bad, fix = plain_violation(name, values, np.arange(values.shape[0]))
            if values.shape != (n,) or bad.any():
                raise InvalidInput(f"{what}: {name} is not plain tokenizer output — {fix}")
    present = (objective or Objective()).applied(
        [k for k, v in item.items() if v is not None], what
    )
    if "labels" in present and "loss_mask" in present:
        raise InvalidInput(f"{what}: has both labels and loss_mask — keep one of them")
    flags = np.ones(n - 1, dtype=bool)
    for name in present:
        values = np.asarray(item[name])
        if name == "labels":
            if values.shape != (n,) or wrong_labels(values, tokens).any():
                raise InvalidInput(
                    f"{what}: labels must be the token itself or {IGNORE_INDEX}, one per token"
                )
            flags &= values[1:] != IGNORE_INDEX
            continue
        if not np.isin(values, (0, 1)).all() or values.dtype.kind not in "biu":
            raise InvalidInput(f"{what}: {name} must hold booleans or 0/1")
        if values.shape == (n,):
            values = values[1:]  # one flag per token: the first is no pair's target
        elif values.shape != (n - 1,) or name != "loss_mask":
            raise InvalidInput(
                f"{what}: {values.shape[0]} {name} flags for {n} tokens — give one per token"
                + (" (or one per target)" if name == "loss_mask" else "")
            )
        flags &= values.astype(bool)
    return None if flags.all() else flags

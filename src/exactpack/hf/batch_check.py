"""The first-batch check: a collated batch keeps the packed rows' examples apart.

Rows of ``format="trl"`` hold several examples each (``seq_lengths``, in tokens). A
collator that ignores ``seq_lengths`` trains such a row as one sequence — TRL's
``DataCollatorForLanguageModeling`` without ``padding_free=True`` (its ``attention_mask``
makes every row one sequence), ``DataCollatorWithFlattening`` without
:class:`~exactpack.hf.per_example` (its positions restart per row, not per example).
:func:`check_batch` compares what the batch makes the model see with the rows'
``seq_lengths`` and refuses a mismatch in one line naming the missing flag. For the
fixture row ``input_ids [0, 99, 100, 1, 0, 101, 1]``, ``seq_lengths [4, 3]``::

    padding_free=True            position_ids [[0, 1, 2, 3, 0, 1, 2]]     kept apart
    padding_free=False           attention_mask [[1, 1, 1, 1, 1, 1, 1]]   joined: refused
    DataCollatorWithFlattening   position_ids [[0, 1, 2, 3, 4, 5, 6]]     joined: refused

:class:`CheckBatches` runs it on every batch a ``transformers.Trainer`` (or TRL's
``SFTTrainer``) collates; ``import exactpack.hf`` adds it to ``Trainer``'s default
callbacks (it does nothing for features without ``seq_lengths``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from transformers import TrainerCallback

from exactpack.core.errors import InvalidInput

#: The fix for each way a batch joins a row's examples.
_FIX_MASK = (
    "its collator ignores seq_lengths and pads each row as one sequence — pass"
    " padding_free=True (SFTConfig or DataCollatorForLanguageModeling), or wrap the"
    " collator in exactpack.hf.per_example(...)"
)
_FIX_FLAT = (
    "its positions restart per row, not per example — wrap the collator in"
    " exactpack.hf.per_example(...) (DataCollatorWithFlattening takes each feature for one"
    " sequence), or use DataCollatorForLanguageModeling(padding_free=True)"
)


def _array(value: Any) -> np.ndarray:
    """A batch value (tensor, array or lists) as a 2-D NumPy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    out = np.asarray(value)
    return out.reshape(1, -1) if out.ndim == 1 else out


def _examples(features: Sequence[Any]) -> list[list[int]] | None:
    """Each feature's example lengths in tokens; None when no feature is a packed row."""
    if not features or not all(isinstance(f, Mapping) for f in features):
        return None
    if not any("seq_lengths" in f for f in features):
        return None
    return [
        [int(n) for n in f["seq_lengths"]] if "seq_lengths" in f else [len(f["input_ids"])]
        for f in features
    ]


def check_batch(batch: Mapping[str, Any], features: Sequence[Any]) -> None:
    """Refuse ``batch`` (a collator's output) when it does not keep the examples of
    ``features`` (packed rows with ``seq_lengths``) apart; nothing to check without them.

    A row the model sees as one sequence (a 2-D ``attention_mask``, or no restarting
    ``position_ids``) must hold one example; flattened rows (no ``attention_mask``) must
    restart ``position_ids`` at each example's first token, and ``cu_seq_lens_q``, when
    present, must end each example; no example's first token may be a supervised label
    (the pair from the example before it). For a custom loop:
    ``batch = collator(rows); exactpack.hf.check_batch(batch, rows)``.
    """
    per_feature = _examples(features)
    if per_feature is None:
        return
    flat = [n for lens in per_feature for n in lens]
    ids = _array(batch["input_ids"])
    mask, pos, labels = (
        None if batch.get(k) is None else _array(batch[k])
        for k in ("attention_mask", "position_ids", "labels")
    )
    mask = None if mask is None or mask.ndim != 2 else mask  # only a 2-D padding mask
    if len(ids) == 1:
        rows = [flat]
    elif len(ids) == len(per_feature):
        rows = per_feature
    elif len(ids) == len(flat):
        rows = [[n] for n in flat]
    else:
        raise InvalidInput(
            f"the batch has {len(ids)} rows for {len(features)} packed rows of {len(flat)}"
            " examples: no row-to-example order to check — pass the features the collator got"
        )
    for r, lens in enumerate(rows):
        total = sum(lens)
        starts = np.cumsum([0, *lens[:-1]])
        if mask is not None:
            if int(mask[r].sum()) != total:
                raise InvalidInput(
                    f"batch row {r} has {int(mask[r].sum())} real tokens but its examples"
                    f" (seq_lengths {lens[:8]}) have {total} — pass the features the collator got"
                )
            if len(lens) > 1:
                raise InvalidInput(
                    f"batch row {r} joins {len(lens)} examples (seq_lengths {lens[:8]}) into one"
                    f" sequence: {_FIX_MASK}"
                )
            continue
        if total > ids.shape[1]:
            raise InvalidInput(
                f"batch row {r} has {ids.shape[1]} tokens but its examples (seq_lengths"
                f" {lens[:8]}) have {total} — pass the features the collator got"
            )
        want = np.arange(total) - np.repeat(starts, lens)
        if pos is None or (pos[r, :total] != want).any():
            # the examples that do not start a sequence of their own (position 0 at their start)
            joined = len(lens) - 1 if pos is None else int((pos[r, starts[1:]] != 0).sum())
            if joined or pos is not None:
                raise InvalidInput(
                    f"batch row {r} joins {max(joined, 1)} of its {len(lens)} examples"
                    f" (seq_lengths {lens[:8]}) to the example before: {_FIX_FLAT}"
                )
        if labels is not None and (labels[r, starts[1:]] != -100).any():
            raise InvalidInput(
                f"batch row {r} supervises an example's first token (the pair from the example"
                " before it) — its labels must be -100 on each example's first token, as"
                " format='trl' stores them"
            )
    cu = batch.get("cu_seq_lens_q")
    if cu is not None and len(rows) == 1:
        ends = np.cumsum([0, *flat])
        got = _array(cu).ravel()
        if len(got) < len(ends) or (got[: len(ends)] != ends).any():
            raise InvalidInput(
                f"the batch's cu_seq_lens_q {got[:8].tolist()} does not end each example"
                f" (seq_lengths {flat[:8]}) — build it from seq_lengths: {_FIX_FLAT}"
            )


class _Checked:
    """``collate`` followed by :func:`check_batch` on its features (picklable for workers)."""

    def __init__(self, collate: Callable[..., Any]) -> None:
        self.collate = collate

    def __call__(self, features: Sequence[Any]) -> Any:
        batch = self.collate(features)
        if isinstance(batch, Mapping) and "input_ids" in batch:
            check_batch(batch, features)
        return batch


def _lost_lengths(dataset: Any) -> None:
    """Refuse a ``format="trl"`` dataset whose ``seq_lengths`` the Trainer removed."""
    names = getattr(dataset, "column_names", None)
    info = getattr(getattr(dataset, "info", None), "description", None)
    if not isinstance(names, list) or "seq_lengths" in names or not info:
        return
    try:
        meta = json.loads(info)["exactpack"]
    except (ValueError, KeyError, TypeError):
        return
    if isinstance(meta, Mapping) and meta.get("format") == "exactpack.trl-packed":
        raise InvalidInput(
            "the Trainer removed the packed rows' seq_lengths column (the model's forward has"
            " no such argument), so no collator can tell their examples apart — pass"
            " TrainingArguments(remove_unused_columns=False)"
        )


class CheckBatches(TrainerCallback):
    """A ``TrainerCallback`` that runs :func:`check_batch` on every training batch.

    At ``on_train_begin`` (before step 1) it refuses a ``format="trl"`` dataset whose
    ``seq_lengths`` the Trainer removed, and wraps the training dataloader's
    ``collate_fn`` so that the first batch that joins examples is refused before the
    model sees it. ``import exactpack.hf`` adds it to ``Trainer``'s default callbacks.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        if loader is None:
            return
        _lost_lengths(getattr(loader, "dataset", None))
        while getattr(loader, "base_dataloader", None) is not None:  # accelerate's adapter
            loader = loader.base_dataloader  # whose iterator reads the wrapped loader's
        collate = getattr(loader, "collate_fn", None)
        if collate is not None and not isinstance(collate, _Checked):
            loader.collate_fn = _Checked(collate)


def add_to_trainer_defaults() -> None:
    """Every ``transformers.Trainer`` made from now on runs :class:`CheckBatches`."""
    import transformers.trainer

    if CheckBatches not in transformers.trainer.DEFAULT_CALLBACKS:
        transformers.trainer.DEFAULT_CALLBACKS.append(CheckBatches)

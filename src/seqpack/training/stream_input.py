"""A stream's documents as token arrays and loss flags, for :class:`StreamDataset`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput, OversizedExample
from seqpack.core.examples import as_token_array
from seqpack.core.supervision import mapping_flags


@dataclass(frozen=True, eq=False)
class Example:
    window: np.ndarray  # int32 [len + 1]
    loss_mask: np.ndarray  # bool [len]
    source_id: str
    start: int
    doc: int
    doc_first_example: int


def text_of(ds: Any, item: Any, index: int) -> str | None:
    """The text of a text document (a ``str``, or a mapping with ``text_field`` and no
    ``input_ids``); None for a tokenized one."""
    if isinstance(item, Mapping) and "input_ids" not in item:
        if ds.text_field not in item:
            raise InvalidInput(
                f"document {index} has neither input_ids nor {ds.text_field!r} (columns"
                f" {sorted(map(str, item))}) — pass text_field= naming its text column"
            )
        item = item[ds.text_field]
        if not isinstance(item, str):
            raise InvalidInput(
                f"document {index}: {ds.text_field!r} is a {type(item).__name__}, not text"
            )
    if not isinstance(item, str):
        return None
    if ds.tokenizer is None:
        raise InvalidInput(f"document {index} is text; pass a tokenizer")
    return item


def stream_documents(
    ds: Any, items: list[Any], first: int
) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """``(tokens int32, loss flags bool [n-1], source id)`` per item; a mapping's
    ``labels`` / ``loss_mask`` / ``completion_mask`` / ``assistant_masks`` are ANDed."""
    found = ((i, text_of(ds, item, first + i)) for i, item in enumerate(items))
    texts = {i: text for i, text in found if text is not None}
    encoded: dict[int, np.ndarray] = {}
    if texts:
        tokens, offsets = ds.tokenizer.encode_batch(list(texts.values()))
        encoded = {i: tokens[offsets[j] : offsets[j + 1]] for j, i in enumerate(texts)}
    out = []
    for i, item in enumerate(items):
        index = first + i
        mapping = isinstance(item, Mapping)
        source_id = str(item.get("id", index)) if mapping else str(index)
        raw = encoded[i] if i in encoded else item["input_ids"] if mapping else item
        what = f"document {index} ({source_id!r})"
        tokens = as_token_array(raw, ds.binding.vocab_size, what)
        if tokens.shape[0] < 2:
            raise InvalidInput(f"{what} has {tokens.shape[0]} token(s); drop it (needs 2)")
        pairs = tokens.shape[0] - 1
        # every supervision column of a mapping, ANDed (seqpack.core.supervision)
        flags = mapping_flags(item, tokens, what) if mapping and i not in encoded else None
        mask = np.ones(pairs, dtype=bool) if flags is None else flags
        if pairs > ds.capacity and not ds.split_long:
            raise OversizedExample(
                f"{what} has {pairs} prediction pairs; capacity is {ds.capacity}"
                " — raise the capacity or pass split_long=True"
            )
        out.append((tokens, mask, source_id))
    return out

"""Groups for tree packing from a file's rows: id columns, text through a tokenizer, or auto.

:func:`file_groups` reads one ``.jsonl`` / ``.json`` or ``.parquet`` file
(:func:`seqpack.io.tree_files.read_table`) and returns its
:class:`~seqpack.core.tree_input.SequenceGroups` plus, per sequence, its
index in the input (sequences numbered row by row: a row's completions,
or chosen then rejected, in order):

* the id column sets of :data:`~seqpack.core.tree_input.TREE_COLUMNS`;
* TRL's DPO text columns ``prompt`` / ``chosen`` / ``rejected`` (strings, or
  lists of ``{role, content}`` messages), tokenized as SFT prompt-completion
  rows are (:func:`seqpack.io.sft.encode_sft`: prompt + chosen and prompt +
  rejected, each supervised from where it stops agreeing with the prompt's
  tokens; chats through the chat template);
* ``mode="auto"``: plain SFT rows (``input_ids``, or the text columns
  :func:`seqpack.io.sft.sft_columns` reads) grouped by their first ``prefix``
  tokens (a shorter row: all its tokens), rows at most ``window`` apart in
  the input (windows of ``window`` rows, so the grouping's memory is bounded).
  Any grouping is exact — it only decides which sequences may share a trie.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from seqpack.core.binding import Binding, Partition
from seqpack.core.errors import InvalidInput
from seqpack.core.tree_input import TREE_COLUMNS, SequenceGroups, groups_from_columns
from seqpack.io.documents import Origin, make_binding
from seqpack.io.sft import TEMPLATE_COLUMNS, encode_sft, sft_columns
from seqpack.io.tokenizers import Tokenizer

#: TRL's DPO text columns.
DPO_TEXT = ("prompt", "chosen", "rejected")


def file_groups(
    table: pa.Table,
    where: str,
    *,
    binding: Binding,
    tokenizer: Tokenizer | None = None,
    mode: str = "on",
    prefix: int = 16,
    window: int = 4096,
) -> tuple[SequenceGroups, np.ndarray]:
    """``table``'s groups under ``binding`` and each sequence's input index (int64 [S])."""
    names = table.column_names
    origin = Origin(((where, 0, "row"),))
    if mode == "auto":
        seqs, masks = _plain_rows(table, origin, tokenizer, binding)
        return _auto_groups(seqs, masks, binding, prefix, window)
    if any(set(cols) <= set(names) for cols in TREE_COLUMNS):
        wanted = {n for cols in TREE_COLUMNS for n in cols}
        columns = {n: table.column(n).to_pylist() if n in wanted else [] for n in names}
        groups = groups_from_columns(columns, binding)
        return groups, np.arange(len(groups), dtype=np.int64)
    if set(DPO_TEXT) <= set(names):
        return _dpo_text(table, origin, tokenizer, binding)
    if "chosen" in names and "rejected" in names:
        raise InvalidInput(
            f"{where}: chosen / rejected rows without a prompt column (TRL's implicit prompt) —"
            " split the shared prompt into a prompt column"
        )
    if "input_ids" in names or sft_columns(names) is not None:
        raise InvalidInput(
            f"{where}: rows with columns {', '.join(names)} have no groups — pass --tree auto"
            " to group plain SFT rows by their first tokens, or add a group column"
        )
    groups_from_columns({n: [] for n in names}, binding)  # raises, naming the columns
    raise AssertionError("unreachable")


def _encoded(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, names: tuple[str, ...]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Sequences and their per-pair supervision (a target is supervised when its token is)."""
    tokens, offsets, flags = encode_sft(table, origin, tokenizer, names)
    seqs, masks = [], []
    for i in range(offsets.shape[0] - 1):
        a, b = int(offsets[i]), int(offsets[i + 1])
        if b - a < 2:
            raise InvalidInput(
                f"{origin.locate(i)}: tokenizes to {b - a} token(s); a sequence needs at least"
                " 2 (one prediction pair) — drop the row"
            )
        seqs.append(tokens[a:b])
        masks.append(flags[a + 1 : b])
    return seqs, masks


def _dpo_text(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, binding: Binding
) -> tuple[SequenceGroups, np.ndarray]:
    if tokenizer is None:
        raise InvalidInput(
            f"{origin.parts[0][0]}: rows hold prompt / chosen / rejected text but no tokenizer"
            " was given — pass --tokenizer with a local tokenizer folder, or tokenize them"
            " (prompt_input_ids / chosen_input_ids / rejected_input_ids)"
        )
    extras = {n: table.column(n) for n in TEMPLATE_COLUMNS if n in table.column_names}
    both = []
    for answer in ("chosen", "rejected"):
        pc = pa.table({"prompt": table.column("prompt"), "completion": table.column(answer)})
        for name, col in extras.items():
            pc = pc.append_column(name, col)
        both.append(_encoded(pc, origin, tokenizer, ("prompt", "completion")))
    (chosen, cmask), (rejected, rmask) = both
    seqs = [s for pair in zip(chosen, rejected, strict=True) for s in pair]
    masks = [m for pair in zip(cmask, rmask, strict=True) for m in pair]
    group = np.repeat(np.arange(len(chosen), dtype=np.int64), 2)
    return _of(seqs, masks, group, binding), np.arange(len(seqs), dtype=np.int64)


def _plain_rows(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, binding: Binding
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    names = table.column_names
    if "input_ids" in names:
        seqs = [
            np.asarray(ids if ids is not None else [], dtype=np.int64)
            for ids in table.column("input_ids").to_pylist()
        ]
        for i, s in enumerate(seqs):
            if s.size < 2:
                raise InvalidInput(
                    f"{origin.locate(i)}: {s.size} token(s); a sequence needs at least 2"
                    " (one prediction pair) — drop the row"
                )
            if int(s.min()) < 0 or int(s.max()) >= binding.vocab_size:
                raise InvalidInput(
                    f"{origin.locate(i)}: a token id outside [0, {binding.vocab_size}) — pass"
                    " the model's --vocab-size"
                )
        return [s.astype(np.int32) for s in seqs], [np.ones(s.size - 1, bool) for s in seqs]
    cols = sft_columns(names)
    if cols is None:
        raise InvalidInput(
            f"{origin.parts[0][0]}: --tree auto groups plain SFT rows: input_ids, prompt /"
            f" completion or messages; this input has columns {', '.join(names) or 'none'}"
        )
    return _encoded(table, origin, tokenizer, cols)


def _auto_groups(
    seqs: list[np.ndarray], masks: list[np.ndarray], binding: Binding, prefix: int, window: int
) -> tuple[SequenceGroups, np.ndarray]:
    """Rows whose first ``prefix`` tokens agree, within each window of rows, as one group
    (groups in first-seen order; sequences reordered so groups are contiguous)."""
    order: list[int] = []
    group: list[int] = []
    for start in range(0, len(seqs), window):
        keys: dict[bytes, list[int]] = {}
        for i in range(start, min(start + window, len(seqs))):
            keys.setdefault(seqs[i][:prefix].tobytes(), []).append(i)
        for members in keys.values():
            group.extend([group[-1] + 1 if group else 0] * len(members))
            order.extend(members)
    idx = np.asarray(order, dtype=np.int64)
    picked = [seqs[i] for i in order]
    return _of(picked, [masks[i] for i in order], np.asarray(group, np.int64), binding), idx


def _of(
    seqs: list[np.ndarray], masks: list[np.ndarray], group: np.ndarray, binding: Binding
) -> SequenceGroups:
    for i, s in enumerate(seqs):
        if s.size and int(s.max()) >= binding.vocab_size:
            raise InvalidInput(
                f"sequence {i}: token id {int(s.max())} is outside the vocabulary"
                f" ({binding.vocab_size}) — pass the tokenizer's or the model's --vocab-size"
            )
    lens = np.array([s.size for s in seqs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    tokens = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32)
    mask = np.concatenate(masks).astype(bool) if masks else np.zeros(0, bool)
    return SequenceGroups(tokens, offsets, group, mask, binding)


def file_binding(
    path: str | Path,
    partition: Partition,
    *,
    vocab_size: int | None,
    tokenizer: Tokenizer | None,
    tokenizer_id: str | None = None,
    split_id: str | None = None,
) -> Binding:
    """The binding of a tree packing of ``path`` (receipt: the file's sha256 and partition)."""

    def receipt() -> str:
        h = hashlib.sha256(f"tree:{partition.value}:".encode())
        with Path(path).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    return make_binding(
        receipt,
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        tokenizer_id=tokenizer_id,
        split_id=split_id,
    )


__all__ = ["DPO_TEXT", "file_binding", "file_groups"]

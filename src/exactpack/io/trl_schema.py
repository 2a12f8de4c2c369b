"""TRL's data: its packed schema (``--format trl``), rows that TRL and transformers consume
unchanged; its DPO tokenization (:func:`dpo_text_groups`); the per-pair columns tree rows
carry (:func:`carried_columns`).

One table row per packed row (``K`` examples in it, ``n_i`` tokens each)::

    input_ids     list<int32>   the examples' tokens back to back (Σ n_i <= capacity)
    labels        list<int64>   always: the token where its pair is supervised (every
                                pair, unless the input masks some: its labels,
                                loss_mask, completion_mask, assistant_masks or a chat
                                objective), -100 elsewhere and on each example's first
                                token (no pair of the example predicts it)
    seq_lengths   list<int32>   [K] tokens per example (TRL 1.16's meaning)

This is TRL 1.16's own stored form (``trl.pack_dataset``; ``SFTTrainer`` folds its masks
into ``labels``) with ``labels`` always: TRL's padding-free collator derives
``position_ids`` from ``seq_lengths``, and any collator that reads ``labels`` (even one
used without ``padding_free=True``) never trains the pair from one example's last token
to the next one's first (rationale: docs/design-notes.md).
Capacity counts tokens (TRL's ``max_length``), not exactpack's prediction pairs. For
the fixture A=[0,99,100,1], B=[0,101,1], C=[0,102,103,104,1] at capacity 7,
next-fit::

    input_ids     [[0, 99, 100, 1, 0, 101, 1], [0, 102, 103, 104, 1]]
    labels        [[-100, 99, 100, 1, -100, 101, 1], [-100, 102, 103, 104, 1]]
    seq_lengths   [[4, 3], [5]]
    (positions    [[0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 3, 4]]  derived by the collator)

Version 1 (still read) also stored ``labels`` always and ``position_ids`` (``0..n_i-1``
per example). A directory holds these Parquet shards and a ``manifest.json`` of format
:data:`TRL_FORMAT` (published, sized and hashed as exactpack's own format).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack.core.binding import Binding
from exactpack.core.compact import CompactRows, span_labels
from exactpack.core.errors import InvalidInput, foreign
from exactpack.core.tree import TREE_COLUMNS, SequenceGroups
from exactpack.io.documents import Origin
from exactpack.io.sft import TEMPLATE_COLUMNS, encode_sft
from exactpack.io.shards import TREE_CELL_COLUMNS, TREE_SEQUENCE_COLUMNS, list_array, token_offsets
from exactpack.io.tokenizers import Tokenizer

TRL_FORMAT = "exactpack.trl-packed"
TRL_VERSION = 2
_IDS = ("input_ids", pa.list_(pa.int32()))
_LABELS = ("labels", pa.list_(pa.int64()))
_LENGTHS = ("seq_lengths", pa.list_(pa.int32()))
#: Every row, supervised or masked: ``labels`` always (-100 on each example's first token).
TRL_SCHEMA = pa.schema([_IDS, _LABELS, _LENGTHS])


def trl_table(cols: CompactRows) -> pa.Table:
    """``cols`` (one shard's rows) in TRL's packed schema."""
    _, row_tok = token_offsets(cols)
    mask = cols.loss_mask
    if mask is None:  # every pair supervised
        mask = np.ones(int(cols.lengths.sum()), dtype=np.bool_)
    labels = span_labels(cols.tokens, mask, cols.lengths).astype(np.int64)
    arrays = [
        list_array(row_tok, cols.tokens, pa.int32()),  # the gathered tokens, no copy
        list_array(row_tok, labels, pa.int64()),
        list_array(cols.row_offsets, cols.lengths + 1, pa.int32()),
    ]
    return pa.Table.from_arrays(arrays, schema=TRL_SCHEMA)


def is_trl(manifest: object) -> bool:
    """Whether ``manifest`` (a packed output's metadata) is a TRL-format output's."""
    return (
        isinstance(manifest, dict)
        and manifest.get("format") == TRL_FORMAT
        and manifest.get("version") == TRL_VERSION
    )


def refuse_trl(manifest: object, where: str) -> None:
    """Raise a clear :class:`InvalidInput` when ``manifest`` is a TRL-format output, which
    exactpack's own loaders (``load_packed``, ``PackedBatches``, ``to_batches``) do not read."""
    if isinstance(manifest, dict) and manifest.get("format") == TRL_FORMAT:
        raise InvalidInput(
            f"{where} holds TRL-format rows (packed with --format trl), which exactpack's own"
            " loaders do not read — load it with exactpack.hf.load_trl(path) or"
            " datasets.load_dataset('parquet', data_files=...), and train it with TRL's"
            " padding-free collator; pack without --format trl for PackedBatches"
        )


def check_trl_contents(manifest: Mapping, folder: Path) -> None:
    """Decode every shard of a TRL-format directory against the manifest: one schema of its
    version, the entry's rows, examples, tokens and supervised labels, rows of whole examples
    within ``capacity``, ids below ``vocab_size``, labels -100 or their token (-100 on each
    example's first)."""
    capacity = int(manifest["config"]["capacity"])
    vocab = int(manifest["binding"]["vocab_size"])
    for entry in manifest["shards"]:
        file = folder / entry["file"]
        with foreign(f"{file}: cannot read the shard", _DAMAGED):
            table = pq.read_table(file)
        if not table.schema.equals(TRL_SCHEMA):
            raise _damaged(file, f"schema {table.schema} is not TRL's {TRL_SCHEMA}")
        if any(_nulls(table.column(n)) for n in table.column_names):
            raise _damaged(file, "a value is missing (null)")
        ids, labels, lens = (table.column(n).combine_chunks() for n in TRL_SCHEMA.names)
        tokens, targets = ids.flatten().to_numpy(), labels.flatten().to_numpy()
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise _damaged(file, f"a token id is outside [0, {vocab}) (binding.vocab_size)")
        row_len = np.diff(ids.offsets.to_numpy())
        seq = lens.flatten().to_numpy().astype(np.int64)
        per_row = np.add.reduceat(seq, lens.offsets.to_numpy()[:-1]) if seq.size else seq
        ignored = targets == -100
        if not (
            table.num_rows == entry["rows"]
            and len(seq) == entry["occurrences"]
            and int(row_len.sum()) == entry["tokens"]
            and np.array_equal(per_row, row_len)
            and not (seq.size and (int(seq.min()) < 2 or int(row_len.max()) > capacity))
            and np.array_equal(np.diff(labels.offsets.to_numpy()), row_len)
            and np.all(ignored | (targets == tokens))
            and np.all(ignored[np.cumsum(seq) - seq])  # each example's first token
            and entry.get("eligible", int((~ignored).sum())) == int((~ignored).sum())
        ):
            raise _damaged(
                file,
                "rows, seq_lengths or labels disagree with each other, the"
                f" manifest entry or capacity {capacity:,}",
            )


#: TRL's DPO text columns: strings, or lists of ``{role, content}`` messages.
DPO_TEXT = ("prompt", "chosen", "rejected")


def dpo_text_groups(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, binding: Binding
) -> tuple[SequenceGroups, np.ndarray]:
    """TRL 1.16 ``DPOTrainer``'s tokenization of ``prompt`` / ``chosen`` / ``rejected`` rows:
    one group ``[chosen, rejected]`` per row (sequences ``2r``, ``2r + 1``; index int64 [2R]).

    As ``DPOTrainer._prepare_dataset``: text answers get the tokenizer's EOS unless they
    end with it; ``prompt``, ``prompt + chosen`` and ``prompt + rejected`` are tokenized
    whole (special tokens added; conversations through the chat template, the prompt with
    ``add_generation_prompt=True``, each row's ``tools`` / ``chat_template_kwargs``); both
    answers start at ``p = min`` of the two common prefixes with the prompt alone
    (``prompt_ids = prompt[:p]``, ``chosen_ids = (prompt + chosen)[p:]``). Where a BPE
    token merges across one answer's boundary, the other answer is supervised from ``p``
    too (the test tokenizer, prompt ``"What col"``)::

        prompt alone       <s> What Ġcol
        prompt + chosen    <s> What Ġcolor Ġis ...      diverges at 2
        prompt + rejected  <s> What Ġcol ĠIt ...        diverges at 3
        p = 2              chosen from Ġcolor, rejected from Ġcol (supervised)
    """
    if tokenizer is None:
        raise InvalidInput(
            f"{origin.parts[0][0]}: rows hold prompt / chosen / rejected text but no tokenizer"
            " was given — pass --tokenizer (tokenizer=) with a local tokenizer folder, or"
            " tokenize them (prompt_ids / chosen_ids / rejected_ids)"
        )
    if "prompt" not in table.column_names:
        table = _extract_prompt(table, origin)
    extras = {n: table.column(n) for n in TEMPLATE_COLUMNS if n in table.column_names}
    answers = []
    for answer in DPO_TEXT[1:]:
        cols = {"prompt": table.column("prompt"), "completion": table.column(answer), **extras}
        answers.append(encode_sft(pa.table(cols), origin, tokenizer, ("prompt", "completion")))
    seqs, masks = [], []
    for row in range(table.num_rows):
        pair = [tokens[offsets[row] : offsets[row + 1]] for tokens, offsets, _ in answers]
        # each answer's supervision starts at its first flagged token; TRL's p is the min
        cut = min(int(np.argmax(f[o[row] : o[row + 1]])) for _, o, f in answers)
        seqs += pair
        masks += [np.arange(1, s.shape[0]) >= cut for s in pair]
    group = np.repeat(np.arange(table.num_rows, dtype=np.int64), 2)
    return SequenceGroups.of(seqs, masks, group, binding), np.arange(len(seqs), dtype=np.int64)


def _extract_prompt(table: pa.Table, origin: Origin) -> pa.Table:
    """Rows without a ``prompt`` column (TRL's implicit prompt) as ``DPOTrainer`` reads
    them: TRL 1.16's ``extract_prompt`` takes ``chosen``'s leading part before its first
    difference from ``rejected`` (characters of a text, messages of a conversation) as the
    prompt, a space just before the difference staying with the answers (and, where one
    answer is a prefix of the other, the prompt stops one short of the shorter)::

        chosen "Sky? It is blue."   rejected "Sky? It is green."
        prompt "Sky? It is"         chosen " blue."   rejected " green."
    """
    columns = {n: table.column(n) for n in table.column_names}
    prompts, chosen, rejected = [], [], []
    for row, (c, r) in enumerate(
        zip(columns["chosen"].to_pylist(), columns["rejected"].to_pylist(), strict=True)
    ):
        size = min(len(c or ()), len(r or ()))
        if size == 0:
            raise InvalidInput(
                f"{origin.locate(row)}: chosen or rejected is empty, so no prompt can be"
                " extracted from them — give a prompt column, or non-empty answers"
            )
        cut = next((i for i in range(size) if c[i] != r[i]), None)
        cut = size - 1 if cut is None else cut - (c[cut - 1] == " ")  # as TRL's loop ends
        prompts.append(c[:cut])
        chosen.append(c[cut:])
        rejected.append(r[cut:])
    columns.update(prompt=prompts, chosen=chosen, rejected=rejected)
    return pa.table(columns)


#: Columns sequences are read from (never carried).
_READ = {n for cols in TREE_COLUMNS for n in cols} | {*DPO_TEXT, *TEMPLATE_COLUMNS}


def carried_columns(table: pa.Table, groups: SequenceGroups) -> pa.Table:
    """``table``'s scalar columns other than those its sequences are read from (``id``,
    TRL's ``ref_chosen_logps`` / ``ref_rejected_logps``, ...), one row per sequence
    (``[S]``, in the order of the sequences' indexes among ``table``'s): the value of the
    input row the sequence came from (a DPO pair's on both its answers, a GRPO row's on each
    completion). Refused where a name is a tree record's column."""
    names = [f.name for f in table.schema if f.name not in _READ and not pa.types.is_nested(f.type)]
    clash = sorted(set(names) & {"row", *TREE_CELL_COLUMNS, *TREE_SEQUENCE_COLUMNS})
    if clash:
        raise InvalidInput(
            f"the input's column {clash[0]!r} is carried onto the tree rows, which have a column"
            " of that name — rename it"
        )
    # the input row of each sequence: its group's (a pair, a GRPO row), but `input_ids` +
    # `group` rows are sequences themselves (their index is their row)
    used = next((c for c in TREE_COLUMNS if set(c) <= set(table.column_names)), None)
    rows = np.arange(len(groups)) if used == TREE_COLUMNS[-1] else groups.group
    return table.select(names).take(pa.array(rows, pa.int64()))


def _nulls(column: pa.ChunkedArray) -> int:
    return sum(c.null_count + c.flatten().null_count for c in column.chunks)


_DAMAGED = "the packed directory was changed or damaged; pack again"


def _damaged(where: Path, what: str) -> InvalidInput:
    return InvalidInput(f"{where}: {what} — {_DAMAGED}")

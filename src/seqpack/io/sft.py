"""SFT text rows tokenized as TRL 1.16's ``SFTTrainer`` does: prompt-completion and chats.

What is trained follows TRL's two ``SFTConfig`` switches, with TRL's names
and defaults (:class:`~seqpack.core.supervision.Objective`;
``assistant_only_loss`` / ``completion_only_loss`` in ``pack_dataset``,
``pack_path`` and :class:`~seqpack.pipeline.options.PackOptions`,
``--assistant-only-loss`` / ``--completion-only-loss {true,false}`` on the
command line). Rows without ``input_ids`` may hold, instead of ``text``:

- ``prompt`` / ``completion`` strings (TRL's prompt-completion format):
  the tokens of ``prompt + completion`` (the completion ends with the
  tokenizer's EOS token, appended as text when it does not, and the
  tokenizer's own BOS/EOS post-processing applies), supervised from where
  they stop agreeing with the tokens of ``prompt`` alone when
  ``completion_only_loss`` is None (the default) or True, every token when
  it is False; ``assistant_only_loss=True`` is refused (not conversational);
- ``prompt`` / ``completion`` lists of ``{role, content}`` messages
  (conversational prompt-completion): the chat template renders the prompt
  with the generation prompt and the whole conversation; the completion is
  supervised (all tokens with ``completion_only_loss=False``), and with
  ``assistant_only_loss=True`` only the tokens inside the template's
  ``{% generation %}`` blocks too;
- ``messages`` (or ShareGPT's ``conversations`` with ``from`` / ``value``,
  converted as TRL does): the chat template renders the conversation; every
  token is supervised by default (TRL's ``assistant_only_loss=False``), only
  the assistant tokens — those inside ``{% generation %}`` … ``{%
  endgeneration %}`` — with ``assistant_only_loss=True``.

A template without generation markers is accepted wherever the objective
does not need them, and refused, with TRL's reason, where
``assistant_only_loss=True`` does. A row left with nothing to train (a chat
without an assistant turn under ``assistant_only_loss``, an empty
completion) is refused naming the row, as TRL refuses the first.

Chat templates are applied by the tokenizer's own
``transformers.PreTrainedTokenizerBase.apply_chat_template`` (its Jinja
renderer, ``add_special_tokens=False``, assistant masks from the character
spans of the generation blocks), under the limits of
:mod:`seqpack.io.templates` (a sandbox with a step and an output bound), so
the tokens are exactly TRL's; a ``tools`` column (a list or JSON text) and a
``chat_template_kwargs`` column (a mapping of template variables, never
tokenizer settings) go to the template row by row, as in TRL. The template
is the tokenizer folder's (``chat_template.jinja`` or
``tokenizer_config.json``) unless ``--chat-template`` names another
(:attr:`HFTokenizer.chat_template`).

:func:`encode_sft` returns tokens ``int32 [Σn]``, offsets ``int64 [k+1]``
and one supervision flag per token ``bool [Σn]``: for the prompt ``"2+2="``
and completion ``"4"`` with the byte tokenizer, ``[BOS 2 + 2 = 4 EOS]`` is
flagged ``[0 0 0 0 0 1 1]``, so the targets ``=->4`` and ``4->EOS`` are
trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seqpack.core.errors import InvalidInput
from seqpack.core.supervision import NOT_CONVERSATIONAL, Objective
from seqpack.io.cells import column, first
from seqpack.io.chat import (
    TEMPLATE_COLUMNS,
    chat_tokenizer,
    render,
    require_markers,
    template_extras,
)
from seqpack.io.documents import Origin
from seqpack.io.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = ["SFT_COLUMNS", "TEMPLATE_COLUMNS", "encode_sft", "sft_columns"]

#: Columns a row's text SFT data is read from (with the optional :data:`TEMPLATE_COLUMNS`).
SFT_COLUMNS = ("prompt", "completion", "messages", "conversations")


def sft_columns(names: Sequence[str]) -> tuple[str, ...] | None:
    """The text SFT columns rows are read from (TRL's order: prompt-completion, then
    messages), or None when there are none."""
    if "prompt" in names or "completion" in names:
        return ("prompt", "completion")
    for name in ("messages", "conversations"):
        if name in names:
            return (name,)
    return None


def encode_sft(
    table: pa.Table,
    origin: Origin,
    tokenizer: Tokenizer | None,
    names: tuple[str, ...],
    objective: Objective | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens int32 [Σn], offsets int64 [k+1] and per-token supervision bool [Σn] of the
    rows, trained as ``objective`` (default TRL's) says."""
    objective = objective or Objective()
    where = origin.parts[0][0]
    if tokenizer is None:
        raise InvalidInput(
            f"{where}: rows hold {' / '.join(names)} but no tokenizer was given — pass"
            " --tokenizer with a local tokenizer folder"
        )
    if names == ("prompt", "completion"):
        missing = [n for n in names if n not in table.column_names]
        if missing:
            raise InvalidInput(
                f"{where}: rows hold {' '.join(n for n in names if n not in missing)} without"
                f" {missing[0]} — prompt-completion rows need both (a prompt alone has nothing"
                " to train on)"
            )
        if _is_chat(table, "prompt") or _is_chat(table, "completion"):
            ids, masks = _chat_prompt_completion(table, origin, tokenizer, objective)
        else:
            if objective.assistant_only_loss:
                raise InvalidInput(f"{where}: {NOT_CONVERSATIONAL}")
            ids, masks = _text_prompt_completion(table, origin, tokenizer, objective)
    else:
        ids, masks = _messages(table, origin, tokenizer, names[0], objective)
    _check_trained(masks, origin, names, objective)
    lengths = np.fromiter((x.shape[0] for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not ids:
        return np.zeros(0, np.int32), offsets, np.zeros(0, bool)
    return np.concatenate(ids).astype(np.int32, copy=False), offsets, np.concatenate(masks)


def _is_chat(table: pa.Table, name: str) -> bool:
    kind = table.schema.field(name).type
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _strings(table: pa.Table, name: str, origin: Origin) -> list[str]:
    col = column(table, name)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise origin.type_error(
            f"{name} has type {col.type}; give text, or a list of {{role, content}} messages"
            " for both prompt and completion",
        )
    if col.null_count:
        row = first(pc.is_null(col).to_numpy(zero_copy_only=False))
        raise InvalidInput(f"{origin.locate(row)}: {name} is missing — give every row {name}")
    return col.to_pylist()


def _chats(table: pa.Table, name: str, origin: Origin) -> list[list[dict[str, Any]]]:
    """A column of conversations: non-empty lists of messages with a role each."""
    col = column(table, name)
    if not _is_chat(table, name):
        raise origin.type_error(f"{name} has type {col.type}; give a list of messages per row")
    rows = col.to_pylist()
    for row, chat in enumerate(rows):
        if not chat or not all(isinstance(m, dict) for m in chat):
            raise InvalidInput(
                f"{origin.locate(row)}: {name} is {'empty' if not chat else 'not messages'} —"
                " give a list of {role, content} messages"
            )
        if name == "conversations":  # ShareGPT's keys, renamed as TRL's maybe_convert_to_chatml
            rows[row] = chat = [
                {{"from": "role", "value": "content"}.get(k, k): v for k, v in m.items()}
                for m in chat
            ]
        if any(not isinstance(m.get("role"), str) for m in chat):
            raise InvalidInput(
                f"{origin.locate(row)}: a message in {name} has no role — give every message a"
                " role (system, user, assistant, ...) and content"
            )
    return rows


def _messages(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer, name: str, objective: Objective
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    backend, template = chat_tokenizer(tokenizer, origin, f"{name} rows")
    assistant = objective.assistant_only_loss
    if assistant:
        require_markers(template, origin, f"{name} rows")
    chats = _chats(table, name, origin)
    extras = template_extras(table, origin)
    encoded = render(
        backend, template, chats, extras, origin, return_assistant_tokens_mask=assistant
    )
    ids = [e["input_ids"] for e in encoded]
    if assistant:
        return ids, [e["assistant_masks"] for e in encoded]
    return ids, [np.ones(x.shape[0], dtype=bool) for x in ids]


def _check_trained(
    masks: list[np.ndarray], origin: Origin, names: tuple[str, ...], objective: Objective
) -> None:
    """Refuse a row with no supervised target (a token after the first), naming it."""
    for row, mask in enumerate(masks):
        if mask[1:].any():
            continue
        if names[0] in ("messages", "conversations"):
            why = "the conversation has no assistant tokens"
        else:
            why = "the completion is empty (no completion tokens)"
        raise InvalidInput(
            f"{origin.locate(row)}: {why}, so nothing would be trained"
            f"{' with assistant_only_loss=True' if objective.assistant_only_loss else ''}"
            " — give it one, or drop the row"
        )


def _chat_prompt_completion(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer, objective: Objective
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    what = "conversational prompt-completion rows"
    backend, template = chat_tokenizer(tokenizer, origin, what)
    assistant = objective.assistant_only_loss
    if assistant:
        require_markers(template, origin, what)
    prompts, completions = _chats(table, "prompt", origin), _chats(table, "completion", origin)
    extras = template_extras(table, origin)
    heads = render(backend, template, prompts, extras, origin, add_generation_prompt=True)
    whole = render(
        backend,
        template,
        [p + c for p, c in zip(prompts, completions, strict=True)],
        extras,
        origin,
        return_assistant_tokens_mask=assistant,
    )
    completion_only = objective.completion_only(True)
    ids, masks = [], []
    for head, full in zip(heads, whole, strict=True):
        mask = _after_prefix(head["input_ids"], full["input_ids"], completion_only)
        if assistant:
            mask &= full["assistant_masks"]
        ids.append(full["input_ids"])
        masks.append(mask)
    return ids, masks


def _text_prompt_completion(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer, objective: Objective
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    prompts = _strings(table, "prompt", origin)
    completions = _strings(table, "completion", origin)
    if isinstance(tokenizer, HFTokenizer):
        eos = None if tokenizer.kind == "tokenizers" else tokenizer.backend.eos_token
        if not isinstance(eos, str):
            raise InvalidInput(
                f"{origin.parts[0][0]}: prompt-completion rows end with the tokenizer's EOS"
                " token, and this tokenizer names none — pass a save_pretrained folder whose"
                " tokenizer_config.json sets eos_token"
            )
        completions = [c if c.endswith(eos) else c + eos for c in completions]
    elif not isinstance(tokenizer, ByteTokenizer):
        raise InvalidInput(f"{origin.parts[0][0]}: prompt-completion rows need --tokenizer")
    head_ids, head_offsets = tokenizer.encode_batch(prompts)
    full_ids, full_offsets = tokenizer.encode_batch(
        [p + c for p, c in zip(prompts, completions, strict=True)]
    )
    completion_only = objective.completion_only(True)
    ids, masks = [], []
    for i in range(len(prompts)):
        full = full_ids[full_offsets[i] : full_offsets[i + 1]]
        head = head_ids[head_offsets[i] : head_offsets[i + 1]]
        ids.append(full)
        masks.append(_after_prefix(head, full, completion_only))
    return ids, masks


def _after_prefix(head: Sequence[int], full: Sequence[int], completion_only: bool) -> np.ndarray:
    """True from where ``full`` stops agreeing with ``head`` (TRL's ``common_prefix_length``:
    the completion starts there even when the prompt's last tokens merged with it); True
    everywhere unless ``completion_only``."""
    head, full = np.asarray(head), np.asarray(full)
    if not completion_only:
        return np.ones(full.shape[0], dtype=bool)
    n = min(head.shape[0], full.shape[0])
    differ = np.flatnonzero(head[:n] != full[:n])
    start = int(differ[0]) if differ.size else n
    mask = np.zeros(full.shape[0], dtype=bool)
    mask[start:] = True
    return mask

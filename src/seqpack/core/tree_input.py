"""Groups of token sequences, the input of tree packing (struct-of-arrays).

A group holds the sequences that may share prefixes: a prompt's
completions (GRPO), a DPO pair (prompt + chosen, prompt + rejected), an SFT
question's answers, or rows that share a ``group`` column. Sequence ``i``
is ``tokens[offsets[i]:offsets[i+1]]`` (at least 2 tokens: ``L = n - 1``
prediction pairs), ``group[i]`` its group (contiguous), and
``loss_mask[pair_offsets[i]:][:L]`` which of its targets are supervised::

    prompt [5, 6, 7], completions [8, 9] and [8, 4]
    sequence 0: 5 6 7 8 9   pairs 4, supervised [F, F, T, T]   (targets 8, 9)
    sequence 1: 5 6 7 8 4   pairs 4, supervised [F, F, T, T]   (targets 8, 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqpack.core.binding import Binding
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import as_token_array


@dataclass(frozen=True, eq=False)
class SequenceGroups:
    """``tokens`` int32 [Σ n], ``offsets`` int64 [S+1], ``group`` int64 [S] (contiguous),
    ``loss_mask`` bool [Σ L] (per pair, sequence after sequence), ``binding``."""

    tokens: np.ndarray
    offsets: np.ndarray
    group: np.ndarray
    loss_mask: np.ndarray
    binding: Binding

    def __post_init__(self) -> None:
        n = np.diff(self.offsets)
        if n.size and int(n.min()) < 2:
            i = int(np.argmin(n))
            raise InvalidInput(
                f"sequence {i} (group {int(self.group[i])}) has {int(n[i])} tokens; a sequence"
                " needs at least 2 (one prediction pair) — drop it"
            )
        if self.group.shape[0] != n.shape[0] or self.loss_mask.shape[0] != int((n - 1).sum()):
            raise InvalidInput("group / loss_mask do not match the sequences' offsets")

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Prediction pairs per sequence, int64 [S]."""
        return np.diff(self.offsets) - 1

    @property
    def pair_offsets(self) -> np.ndarray:
        """Start of each sequence's pairs in ``loss_mask``, int64 [S+1]."""
        return self.offsets - np.arange(self.offsets.shape[0], dtype=np.int64)

    def pair_mask(self, seqs: np.ndarray) -> np.ndarray:
        """``loss_mask`` of sequences ``seqs``, concatenated in that order, bool [Σ L]."""
        lens = self.lengths[seqs]
        firsts = np.zeros(lens.shape[0], dtype=np.int64)
        np.cumsum(lens[:-1], out=firsts[1:])
        owner = np.repeat(np.arange(lens.shape[0]), lens)
        local = np.arange(int(lens.sum()), dtype=np.int64) - firsts[owner]
        return self.loss_mask[self.pair_offsets[seqs][owner] + local]

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def from_lists(
        cls,
        groups: Sequence[Sequence[Any]],
        binding: Binding,
        loss_masks: Sequence[Sequence[Any]] | None = None,
    ) -> SequenceGroups:
        """From nested lists: ``groups[g][j]`` a token sequence; ``loss_masks[g][j]`` its
        per-pair supervision (default: every target supervised)."""
        seqs, masks, group = [], [], []
        for g, members in enumerate(groups):
            for j, seq in enumerate(members):
                arr = as_token_array(seq, binding.vocab_size, f"group {g} sequence {j}")
                seqs.append(arr)
                group.append(g)
                if loss_masks is None:
                    masks.append(np.ones(max(arr.size - 1, 0), dtype=bool))
                else:
                    m = np.asarray(loss_masks[g][j], dtype=bool)
                    if m.shape != (max(arr.size - 1, 0),):
                        raise InvalidInput(
                            f"group {g} sequence {j}: loss mask has {m.size} entries for"
                            f" {arr.size - 1} prediction pairs — give one per pair"
                        )
                    masks.append(m)
        return cls._of(seqs, masks, group, binding)

    @classmethod
    def from_prompt_completions(
        cls,
        prompts: Sequence[Any],
        completions: Sequence[Sequence[Any]],
        binding: Binding,
    ) -> SequenceGroups:
        """Group ``g`` = ``prompts[g] + c`` for each ``c`` in ``completions[g]``; only the
        completion's tokens are supervised (targets from the prompt's last token on)."""
        if len(prompts) != len(completions):
            raise InvalidInput(
                f"{len(prompts)} prompts but {len(completions)} completion lists — one list per"
                " prompt"
            )
        seqs, masks, group = [], [], []
        for g, (prompt, members) in enumerate(zip(prompts, completions, strict=True)):
            p = as_token_array(prompt, binding.vocab_size, f"prompt {g}")
            if p.size == 0:
                raise InvalidInput(f"prompt {g} is empty — a completion needs a context token")
            for j, c in enumerate(members):
                comp = as_token_array(c, binding.vocab_size, f"group {g} completion {j}")
                if comp.size == 0:
                    raise InvalidInput(f"group {g} completion {j} is empty — drop it")
                seqs.append(np.concatenate([p, comp]))
                masks.append(np.arange(p.size + comp.size - 1) >= p.size - 1)
                group.append(g)
        return cls._of(seqs, masks, group, binding)

    @classmethod
    def _of(
        cls, seqs: list[np.ndarray], masks: list[np.ndarray], group: list[int], binding: Binding
    ) -> SequenceGroups:
        lens = np.array([s.size for s in seqs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        tokens = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32)
        mask = np.concatenate(masks) if masks else np.zeros(0, bool)
        return cls(tokens, offsets, np.asarray(group, dtype=np.int64), mask, binding)


#: Column sets tree packing reads, in the order they are looked for.
TREE_COLUMNS = (
    ("prompt_ids", "completion_ids"),
    ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids"),
    ("input_ids", "group"),
)
_TEXT = ("prompt", "chosen", "rejected", "completion", "text", "messages")


def groups_from_columns(columns: dict[str, Any], binding: Binding) -> SequenceGroups:
    """Groups from record columns (lists per row), by the first column set present:

    * ``prompt_ids`` + ``completion_ids``: a row's completions (a list of id
      lists, GRPO) are one group; a single id list is a group of one;
    * ``prompt_input_ids`` + ``chosen_input_ids`` + ``rejected_input_ids`` (TRL's
      DPO columns): each row is a group ``[chosen, rejected]``;
    * ``input_ids`` + ``group``: rows of equal ``group`` (in first-seen order)
      form a group; every target supervised.

    Text columns (``prompt`` / ``chosen`` / ...) are refused: tokenize first.
    """
    names = set(columns)
    if {"prompt_ids", "completion_ids"} <= names:
        comps = [
            c if c and isinstance(c[0], (list, tuple, np.ndarray)) else [c]
            for c in columns["completion_ids"]
        ]
        return SequenceGroups.from_prompt_completions(columns["prompt_ids"], comps, binding)
    if {"prompt_input_ids", "chosen_input_ids", "rejected_input_ids"} <= names:
        pairs = list(zip(columns["chosen_input_ids"], columns["rejected_input_ids"], strict=True))
        return SequenceGroups.from_prompt_completions(columns["prompt_input_ids"], pairs, binding)
    if {"input_ids", "group"} <= names:
        keys = list(dict.fromkeys(columns["group"]))
        index = {k: i for i, k in enumerate(keys)}
        members: list[list[Any]] = [[] for _ in keys]
        for ids, g in zip(columns["input_ids"], columns["group"], strict=True):
            members[index[g]].append(ids)
        return SequenceGroups.from_lists(members, binding)
    text = sorted(names & set(_TEXT))
    found = ", ".join(sorted(names)) or "none"
    hint = f"; {', '.join(text)} hold text — tokenize them first" if text else ""
    raise InvalidInput(
        "tree packing reads prompt_ids + completion_ids, prompt_input_ids + chosen_input_ids +"
        f" rejected_input_ids, or input_ids + group; this input has columns {found}{hint}"
    )


__all__ = ["TREE_COLUMNS", "SequenceGroups", "groups_from_columns"]

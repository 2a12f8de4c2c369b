"""Per-sequence log-probabilities of packed rows, flat or tree, from logits or from
hidden states through the LM head in chunks.

A sequence is a flat example (one occurrence of a :class:`~exactpack.core.batch.PackedBatch`,
storage order) or an original sequence of forest rows (layout order, ``batch.seq_index``);
:meth:`PackedBatch.sequences` lists each one's cells in order. On the fixture's first row
``[A A A B B .]`` (A: 3 pairs, B: 2)::

    sequence   cells (row * T + column)   supervised
    A          0, 1, 2                    T, T, T
    B          3, 4                       T, T

:func:`token_logprobs` gives each sequence's target log-probs (L,), the GRPO quantity;
:func:`sequence_logprobs` the sum over its supervised targets (S,), the DPO / KTO /
reward-model quantity, or their mean (``mean=True``), SimPO's and ORPO's. Either takes
logits ``(R, T, V)``, or hidden states ``(R, T, H)`` with an :class:`LMHead`: then only
the sequences' cells pass the head, ``chunk`` cells at a time, each chunk's ``(chunk, V)``
logits recomputed in the backward instead of kept (activation checkpointing), so a 150k
vocabulary never materialises ``(cells, V)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from exactpack.core.batch import PackedBatch
from exactpack.core.errors import InvalidInput, positive_int
from exactpack.core.loss import check_logits


def sequence_cells(batch: PackedBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(cells, bounds, supervised)`` of :meth:`PackedBatch.sequences` (flat or forest)."""
    if not isinstance(batch, PackedBatch):
        raise InvalidInput(f"batch must be a PackedBatch, got {type(batch).__name__}")
    return batch.sequences()


@dataclass(frozen=True, eq=False)
class LMHead:
    """The output projection: ``weight`` (V, H), optional ``bias`` (V,), ``scale``
    (multiplies the logits, e.g. Cohere's ``logit_scale``) and ``softcap`` (Gemma's
    ``final_logit_softcapping``: ``c·tanh(x / c)``); ``chunk`` cells per pass."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    scale: float = 1.0
    softcap: float | None = None
    chunk: int = 4096

    def __post_init__(self) -> None:
        positive_int("chunk", self.chunk)
        if self.weight.ndim != 2:
            raise InvalidInput(f"LMHead.weight must be (V, H), got {tuple(self.weight.shape)}")

    @classmethod
    def of(cls, model: Any, chunk: int = 4096) -> LMHead:
        """A transformers model's head: its output embeddings and the config's
        ``logit_scale`` / ``final_logit_softcapping``."""
        head = model.get_output_embeddings()
        if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
            raise InvalidInput(
                f"{type(model).__name__} has no output embeddings (a linear LM head):"
                " pass LMHead(weight, ...) yourself, or logits"
            )
        config = model.config
        scale = getattr(config, "logit_scale", None) or 1.0
        softcap = getattr(config, "final_logit_softcapping", None)
        return cls(head.weight, getattr(head, "bias", None), float(scale), softcap, chunk)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(N, H)`` -> ``(N, V)``, as the model's head computes them."""
        out = F.linear(hidden, self.weight, self.bias)
        if self.scale != 1.0:
            out = out * self.scale
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    def target_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``log p(target)`` of each row of ``hidden`` (N, H), (N,), ``chunk`` rows at a time."""
        parts = []
        for start in range(0, hidden.shape[0], self.chunk):
            h, t = hidden[start : start + self.chunk], targets[start : start + self.chunk]
            if torch.is_grad_enabled() and (h.requires_grad or self.weight.requires_grad):
                parts.append(checkpoint(self._chunk, h, t, use_reentrant=False))
            else:
                parts.append(self._chunk(h, t))
        return torch.cat(parts) if parts else hidden.new_zeros(0)

    def _chunk(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _gathered(self.logits(hidden), targets)


def _gathered(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]


def _cell_logprobs(
    values: torch.Tensor, batch: PackedBatch, cells: np.ndarray, head: LMHead | None
) -> torch.Tensor:
    """``log p(target)`` of the flat ``cells`` [N] (N,), from logits or hidden states."""
    shape = batch.shape
    targets = np.asarray(batch.targets).reshape(-1)[cells].astype(np.int64)
    if head is not None and (values.ndim != 3 or tuple(values.shape[:2]) != shape):
        raise InvalidInput(
            f"hidden states have shape {tuple(values.shape)}; expected {(*shape, 'H')}"
        )
    vocab = batch.binding.vocab_size
    width = check_logits(values, shape, vocab) if head is None else int(head.weight.shape[0])
    if targets.size and (int(targets.min()) < 0 or int(targets.max()) >= width):
        raise InvalidInput(
            f"a sequence's target {int(targets.min())}..{int(targets.max())} is outside the"
            f" vocabulary [0, {width}) — the batch does not belong to this model"
        )
    index = torch.as_tensor(cells, device=values.device)
    rows = values.reshape(-1, values.shape[-1]).index_select(0, index)
    gold = torch.as_tensor(targets, device=values.device)
    return _gathered(rows, gold) if head is None else head.target_logprobs(rows, gold)


def token_logprobs(
    values: torch.Tensor, batch: PackedBatch, head: LMHead | None = None
) -> list[torch.Tensor]:
    """Per sequence (:func:`sequence_cells` order): its targets' log-probs, (L,) each."""
    cells, bounds, _ = sequence_cells(batch)
    return list(_cell_logprobs(values, batch, cells, head).split(np.diff(bounds).tolist()))


def sequence_logprobs(
    values: torch.Tensor,
    batch: PackedBatch,
    head: LMHead | None = None,
    *,
    mean: bool = False,
) -> torch.Tensor:
    """Per sequence (S,): the sum of its supervised target log-probs (its own loss mask) —
    DPO, reward models, KTO (unpaired rows: flat examples or groups of one) — or, with
    ``mean=True``, their mean over its supervised targets: the length-normalised
    log-prob of SimPO and ORPO (TRL's ``average_log_prob``)."""
    cells, bounds, supervised = sequence_cells(batch)
    flat = _cell_logprobs(values, batch, cells, head)
    flat = flat * torch.as_tensor(supervised, device=flat.device, dtype=flat.dtype)
    owner = np.repeat(np.arange(bounds.shape[0] - 1), np.diff(bounds))
    sums = flat.new_zeros(bounds.shape[0] - 1).index_add(
        0, torch.as_tensor(owner, device=flat.device), flat
    )
    if not mean:
        return sums
    counts = np.bincount(owner, weights=supervised, minlength=bounds.shape[0] - 1)
    if (counts == 0).any():
        i = int(np.argmin(counts))
        raise InvalidInput(
            f"sequence {i} of the batch has no supervised target, so it has no mean log-prob —"
            " supervise a token of it, or drop mean=True"
        )
    return sums / torch.as_tensor(counts, device=sums.device, dtype=sums.dtype)


__all__ = ["LMHead", "sequence_cells", "sequence_logprobs", "token_logprobs"]

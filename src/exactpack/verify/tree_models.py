"""Prove that tree-packed rows compute what each sequence computes alone, or show the leak.

:func:`verify_tree` runs each sequence alone and every trie packed into rows (one call),
and compares in the model's dtype (:mod:`exactpack.verify.tolerances`) every logit of every
sequence, each sequence's supervised log-probability sum, the token-weighted loss and
every parameter-gradient coordinate. ``mode``: ``adapter``
(:func:`exactpack.hf.hf_inputs` of the tree batch) or ``naive`` (each trie one causal sequence
with column positions: siblings see each other; it must fail). :func:`tree_groups` draws
groups from a spec such as ``"30:5,8,12;10:4,4"`` (prompt : completion lengths).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

from exactpack.core.batch import Occurrences, PackedBatch
from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput
from exactpack.core.loss import token_weighted_loss
from exactpack.core.tree import SequenceGroups, pack_tree
from exactpack.hf.adapter import build_inputs
from exactpack.hf.attention_impl import register
from exactpack.hf.capabilities import architecture_of
from exactpack.hf.kinds import TREE as NAME
from exactpack.hf.kinds import tree_kind
from exactpack.hf.mixers import restart_mixers
from exactpack.nn.logprobs import sequence_logprobs
from exactpack.verify.diagnose import guarded
from exactpack.verify.models import check_verify_tokens, model_facts, observed, running, tally
from exactpack.verify.tolerances import compare, grad_vector, tolerance

MODES = ("adapter", "naive")
LOW = (torch.float32, torch.float16, torch.bfloat16)
WIDE = torch.float64
#: Config fields that bound a row's positions (mpt's ALiBi table, big_bird's embeddings).
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def parse_tree_lengths(text: str) -> list[tuple[int, tuple[int, ...]]]:
    """``"30:5,8,12;10:4,4"`` -> ``[(30, (5, 8, 12)), (10, (4, 4))]`` (positive ints)."""
    groups = []
    for part in text.split(";"):
        prompt, sep, rest = part.partition(":")
        try:
            p = int(prompt)
            comps = tuple(int(c) for c in rest.split(","))
        except ValueError:
            comps, p = (), 0
        if not sep or p < 1 or not comps or min(comps) < 1:
            raise InvalidInput(
                f"--tree-lengths {text!r}: each group is PROMPT:COMPLETION,COMPLETION,... with"
                ' positive token counts, groups separated by ";" (e.g. "30:5,8,12;10:4,4")'
            )
        groups.append((p, comps))
    return groups


def check_tree_lengths(
    spec: list[tuple[int, tuple[int, ...]]], max_positions: int | None = None
) -> None:
    """Refuse ``spec`` before any id is drawn: a sequence (prompt + completion) longer
    than ``max_positions``, or more than :data:`MAX_VERIFY_TOKENS` ids in all."""
    total = sum(p + sum(comps) for p, comps in spec)
    check_verify_tokens(total, "--tree-lengths")
    longest = max(p + max(comps) - 1 for p, comps in spec)  # pairs: tokens - 1
    if max_positions is not None and longest > max_positions:
        raise InvalidInput(
            f"a sequence of {longest:,} pairs is longer than the model's"
            f" max_position_embeddings {max_positions:,} — shorten --tree-lengths"
        )


def tree_groups(
    spec: list[tuple[int, tuple[int, ...]]],
    vocab_size: int,
    seed: int,
    max_positions: int | None = None,
) -> SequenceGroups:
    """Random-id groups of ``spec`` (:func:`check_tree_lengths` first); each completion
    after the first repeats 0-2 of the previous one's first tokens (the second always
    one)."""
    check_tree_lengths(spec, max_positions)
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for prompt_len, lens in spec:
        prompts.append(rng.integers(0, vocab_size, prompt_len))
        comps = [rng.integers(0, vocab_size, n) for n in lens]
        for j in range(1, len(comps)):
            share = 1 if j == 1 else int(rng.integers(0, 3))
            share = min(share, len(comps[j]) - 1, len(comps[j - 1]))
            comps[j][:share] = comps[j - 1][:share]
        completions.append(comps)
    binding = Binding(vocab_size, "exactpack/verify-random-ids", f"verify-tree-seed-{seed}")
    return SequenceGroups.from_prompt_completions(prompts, completions, binding)


def naive_batch(batch: PackedBatch) -> PackedBatch:
    """Each root's subtree as one flat causal sequence: positions count columns (the control)."""
    occ = batch.occurrences
    roots = np.flatnonzero(batch.node_parent < 0)  # type: ignore[operator]
    root_of = roots[np.searchsorted(roots, np.arange(len(occ)), side="right") - 1]
    nodes = batch.segments.astype(np.int64)
    cell_root = np.where(batch.input_valid, root_of[np.maximum(nodes, 0)], -1)
    rank = np.searchsorted(roots, np.maximum(cell_root, 0))
    cols = np.arange(batch.shape[1])[None, :]
    positions = np.where(batch.input_valid, cols - occ.col_start[np.maximum(cell_root, 0)], 0)
    ends = np.zeros(roots.shape[0], dtype=np.int64)
    np.add.at(ends, np.searchsorted(roots, root_of), occ.lengths)
    picked = {f.name: getattr(occ, f.name)[roots] for f in dataclasses.fields(occ)}
    picked |= {
        "col_end": occ.col_start[roots] + ends,
        "segment": np.arange(roots.shape[0], dtype=np.int32),
    }
    return dataclasses.replace(
        batch,
        segments=np.where(batch.input_valid, rank, -1).astype(np.int32),
        node_ends=np.where(batch.input_valid, rank + 1, -1).astype(np.int32),
        positions=positions.astype(np.int32),
        occurrences=Occurrences(**picked),
        node_parent=np.full(roots.shape[0], -1, dtype=np.int64),
    )


class Float64Islands(TorchFunctionMode):
    """Inside: float64 data the model casts to a lower float precision stays float64.

    Casts (``.to``, ``.float()``, ``.type_as``, ``dtype=`` keywords) of float64 data keep
    float64, and a lower-precision tensor meeting float64 data in an op is widened, so
    the model's float32 islands run in float64 for the check. In-place ops and tensors
    made without float64 inputs are left as they are.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        name = getattr(func, "__name__", "")
        if name.endswith("_") or "out" in kwargs or not any(x.dtype == WIDE for x in leaves):
            return func(*args, **kwargs)
        first = args[0]
        casts = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.type_as)
        if func in casts and first.dtype == WIDE:
            return first
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], torch.Tensor):
            args = (first, args[1].device, *args[2:])  # .to(other): its device, not its dtype
        args, kwargs = tree_map(_widen, (args, kwargs))
        return func(*args, **kwargs)


def _widen(x: Any) -> Any:
    if isinstance(x, torch.dtype):
        return WIDE if x in LOW else x
    if isinstance(x, torch.Tensor) and x.dtype in LOW:
        return x.to(WIDE)
    return x


def _separate(model: torch.nn.Module, groups: SequenceGroups, order: np.ndarray, device: Any):
    """Per sequence of ``order``: logits (L, V) alone, its supervised log-prob sum, NLL sum."""
    logits, sums, total = [], [], 0
    for i in order.tolist():
        seq = groups.sequence(i)
        ids = torch.as_tensor(seq[:-1].astype(np.int64), device=device)[None]
        out = model(input_ids=ids, use_cache=False).logits[0]  # (L, V)
        gold = torch.as_tensor(seq[1:].astype(np.int64), device=device)
        lp = out.log_softmax(-1).gather(1, gold[:, None])[:, 0]
        mask = torch.as_tensor(groups.pair_mask(np.array([i])), device=device)
        logits.append(out)
        sums.append((lp * mask).sum())
        total = total - (lp * mask).sum()
    return torch.cat(logits), torch.stack(sums), total


def verify_tree(
    model: torch.nn.Module,
    groups: SequenceGroups,
    *,
    mode: str = "adapter",
    max_length: int | None = None,
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """Separate vs tree-packed for a ``transformers`` causal LM; a report dict with ``pass``.

    The separate runs use ``attn`` when it is ``sdpa`` or ``eager``, else the model's sdpa;
    all runs are inside :class:`Float64Islands` (the report's ``widened``: what it kept).
    """
    if mode not in MODES:
        raise InvalidInput(f"--mode {mode!r} with --tree-lengths: choose one of {', '.join(MODES)}")
    attn = model.config._attn_implementation
    arch = architecture_of(model).check(tree_kind(attn), tree=True)
    if arch.mixers:  # each node starts from its parent's state (the naive rows: a sibling's)
        restart_mixers(model)
    param = next(model.parameters())
    dtype, device = param.dtype, param.device
    if max_length is None:  # all tries in one row plus padding, within the model's positions
        text = model.config.get_text_config()
        limit = next((getattr(text, f) for f in POSITION_FIELDS if hasattr(text, f)), None)
        max_length = int(groups.lengths.sum()) + 2
        max_length = max(min(max_length, limit or max_length), int(groups.lengths.max()))
    epoch = pack_tree(groups, max_length)  # build_inputs holds the batch to arch's conditions
    (batch,) = epoch.batches
    fed = naive_batch(batch) if mode == "naive" else batch
    params = [p for p in model.parameters() if p.requires_grad]
    own = "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"
    reference = attn if attn in ("eager", "sdpa") else own
    with running(model, reference):
        _, widened = guarded(model, "forward", lambda: observed(model, groups.sequence(0)[:-1]))
    with Float64Islands():
        with running(model, reference):
            islands, _ = observed(model, groups.sequence(0)[:-1])
            sep_logits, sep_sums, sep_total = guarded(
                model, "forward", lambda: _separate(model, groups, batch.seq_index, device)
            )
        tol = tolerance(dtype, islands)
        sep_mean = sep_total / batch.eligible_count
        kwargs = build_inputs(
            fed, attn, arch, dtype=dtype, device=device, pad_token_id=pad_token_id
        )
        out = guarded(model, "forward", lambda: model(**kwargs)).logits  # (R, T, V)
        cells = torch.as_tensor(batch.sequences()[0], device=device)
        tree_logits = out.reshape(-1, out.shape[-1]).index_select(0, cells)
        tree_mean = token_weighted_loss(out, batch).mean
        grads = [
            guarded(model, "backward", lambda m=m: grad_vector(m, params))
            for m in (sep_mean, tree_mean)
        ]
    compared = {
        "logits": compare(sep_logits, tree_logits, tol),
        "sequence_logprobs": compare(sep_sums, sequence_logprobs(out, batch), tol),
        "loss": compare(sep_mean, tree_mean, tol),
        "gradients": compare(*grads, tol),
    }
    report = _report(model, arch, groups, epoch, mode, max_length, tol, compared)
    report["reference"] = reference
    report["widened"] = widened
    report["loss"] = {"separate": float(sep_mean.detach()), "tree": float(tree_mean.detach())}
    report["pass"] = not any(report["failures"].values())
    if not report["pass"]:
        report["hint"] = (
            "the naive layout lets siblings see each other and restarts no branch positions"
            if mode == "naive"
            else f"{attn} mixed the branches of a trie: report this architecture"
        )
    return report


def _report(
    model: torch.nn.Module,
    arch: Any,
    groups: SequenceGroups,
    epoch: Any,
    mode: str,
    capacity: int,
    tol: dict[str, Any],
    compared: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    stats, (batch,) = epoch.stats(), epoch.batches
    return {
        "target": "transformers",
        "layout": "tree",
        "model": model_facts(model),
        "architecture": {"windows": {k or "all": v for k, v in arch.windows.items()}},
        "mode": mode,
        "groups": int(np.unique(groups.group).shape[0]),
        "sequences": len(groups),
        "lengths": groups.lengths.tolist(),
        "rows": batch.shape[0],
        "capacity": capacity,
        "nodes": len(batch.occurrences),
        "tokens_stored": stats["tokens_stored"],
        "tokens_flat": stats["tokens_flat"],
        "eligible_targets": batch.eligible_count,
        "tolerance": dict(tol),
        **tally(compared),
    }


def use_tree_attention(model: torch.nn.Module, name: str = NAME) -> None:
    """Switch ``model`` to ``name`` (:data:`exactpack.hf.kinds.TREE_NAMES`), registered."""
    register()
    architecture_of(model).check(tree_kind(name), tree=True)
    model.set_attn_implementation(name)

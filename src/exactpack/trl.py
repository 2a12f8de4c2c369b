"""TRL's preference and RL trainers on tree-packed rows: one call, exact.

.. code-block:: python

    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    exactpack.trl.pack(trainer)          # the one added line (and its import)
    trainer.train()

TRL 1.16 computes every per-token log-probability (policy and reference; DPO,
GRPO, RLOO) with one call per model, ``model(input_ids, attention_mask, labels=...,
fused_lm_head=True)``, over a padded batch: DPO's chosen rows then its rejected
rows, GRPO's prompt + completion rows. :func:`pack` makes the backbone inside that
call run the batch as tree rows: each row's real tokens are a sequence, sequences
that share a prefix (a DPO pair's prompt, a GRPO group's prompt) store and compute
it once, and the backbone's hidden state at every real token comes back in the
padded layout TRL expects — what each sequence computes alone. Two pairs of one
batch, prompts ``P``/``Q``, answers ``a b`` / ``c`` and ``d`` / ``e f``::

    TRL's rows (right-padded)     tree row (one model call)
    P P a b                       P P a b . c . Q d . e f .
    Q d . .                       node 0: P P ; node 1: a b ; node 2: c (under 0)
    P P c .                       node 3: Q ; node 4: d ; node 5: e f (under 3)
    Q e f .

TRL's head (scoring the labelled positions only), loss types, metrics, reference
model or PEFT adapter, accumulation, DDP and logging run unchanged on those hidden
states. The tree rows run on ``exactpack_tree`` (one row, each node against its
path); the model is switched to it for the packed call and its backward, and back
at its next other call (generation, a plain forward), which runs on its own
attention. ``RewardTrainer``'s sequence-classification model packs every forward
(a pair's chosen and rejected share the prompt; the score at each last token).
GRPO / RLOO micro-batches hold whole groups (TRL's shuffle moves groups, not rows),
split by compute (``a·Σl + b·Σ`` attention pairs, from the model's config), after the
ranks exchange their generated groups so that each rank's compute is balanced; DPO and
reward steps' pairs (TRL's own draw) are dealt to ranks and micro-batches the same way.
Refused up front, with the reason: a model the
capability check refuses on tree rows, a TRL other than the version checked, MoE
router logits (their load-balancing loss reads TRL's padded ``attention_mask``),
and at call time inputs other than token ids (images, ``inputs_embeds``).
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import numpy as np
import torch

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput, NotAvailable
from exactpack.core.tree import SequenceGroups, build_layout, pack_tree
from exactpack.hf.adapter import build_inputs
from exactpack.hf.capabilities import capability
from exactpack.hf.kinds import TREE, TREE_NAMES, tree_kind
from exactpack.hf.mixers import packed_call, restart_mixers
from exactpack.training.balance import CostModel, balanced_groups, causal_pairs

#: The TRL releases whose trainers :func:`pack` was checked against (tests/integration).
CHECKED_TRL = ("1.16",)
#: Trainer attributes holding a model to pack (the policy or reward model, the reference).
_MODELS = ("model", "ref_model")
_PACKED = "_exactpack_packed"


def pack(trainer: Any, *, attn_implementation: str = TREE) -> Any:
    """Make ``trainer``'s log-probability forwards run on tree rows (in place); returns it.

    ``attn_implementation``: how the tree rows are attended — ``exactpack_tree`` (each node
    against its path, one row without padding), ``exactpack_tree_varlen``, or ``sdpa`` /
    ``eager`` / ``flex_attention`` fed the tree's masks. The model is switched to it for
    the packed call (and its backward) only; every other call runs on its own attention."""
    import trl

    if not trl.__version__.startswith(CHECKED_TRL):
        raise NotAvailable(
            f"exactpack.trl.pack was checked against TRL {', '.join(CHECKED_TRL)}, not"
            f" {trl.__version__}: its log-probability call may differ — install trl=="
            f"{CHECKED_TRL[-1]}.0"
        )
    models = [m for m in (getattr(trainer, name, None) for name in _MODELS) if m is not None]
    if not models:
        raise InvalidInput(f"{type(trainer).__name__} has no model to pack")
    for model in models:
        _patch(*_packed_module(model), attn_implementation)
    if hasattr(trainer, "_generate_and_score_completions"):  # GRPO, RLOO
        _keep_groups_whole(trainer)
    else:  # DPO, reward
        _deal_pairs(trainer)
    return trainer


def _deal_pairs(trainer: Any) -> None:
    """DPO / reward: each step's pairs (TRL's own draw, ``ranks × micro-batches ×
    per_device_train_batch_size`` of them) dealt by compute instead of in drawn order —
    to the ranks, then to each rank's micro-batches (:func:`_deal`), each keeping its
    number of pairs, so the step's objective is TRL's. A pair costs its trie: the prompt
    once, each answer under it (``CostModel`` of the model's config)."""
    ds = getattr(trainer, "train_dataset", None)
    names = set(getattr(ds, "column_names", None) or ())
    if not {"chosen_ids", "rejected_ids"} <= names:
        return
    n = {k: np.array([len(x) for x in ds[k]]) for k in ("prompt_ids", "chosen_ids", "rejected_ids")
         if k in names}  # fmt: skip
    p, c, r = n.get("prompt_ids", 0), n["chosen_ids"], n["rejected_ids"]
    pairs = causal_pairs(p) + causal_pairs(c, p) + causal_pairs(r, p)
    loads = CostModel.from_config(trainer.model.config).costs(p + c + r, pairs)
    loader_of = trainer.get_train_dataloader

    @functools.wraps(loader_of)
    def get_train_dataloader(*args: Any, **kwargs: Any) -> Any:
        loader = loader_of(*args, **kwargs)
        batches = loader.batch_sampler  # accelerate's shard of TRL's batches, or them
        batches = getattr(batches, "batch_sampler", batches)
        if isinstance(getattr(batches, "batch_size", None), int):
            ranks, micro = (
                trainer.accelerator.num_processes,
                trainer.args.gradient_accumulation_steps,
            )
            batches.sampler = _Dealt(batches.sampler, loads, ranks, micro, batches.batch_size)
        return loader

    trainer.get_train_dataloader = get_train_dataloader


class _Dealt(torch.utils.data.Sampler):
    """``inner``'s indices, each full step of ``ranks·micro·rows`` reordered so that
    accelerate's shards (batch ``k`` to rank ``k % ranks``) give rank ``r`` its dealt
    micro-batches in turn; a short last step as drawn. Anything else is ``inner``'s."""

    def __init__(self, inner: Any, loads: np.ndarray, ranks: int, micro: int, rows: int):
        self.inner, self.loads, self.shape = inner, loads, (ranks, micro, rows)

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:  # set_epoch, epoch, generator, ...
        return getattr(self.__dict__["inner"], name)

    def __iter__(self) -> Any:
        step, chunk = int(np.prod(self.shape)), []
        for i in self.inner:
            chunk.append(int(i))
            if len(chunk) == step:
                yield from _deal(np.asarray(chunk), self.loads, *self.shape)
                chunk = []
        yield from chunk


def _deal(chunk: np.ndarray, loads: np.ndarray, ranks: int, micro: int, rows: int) -> list:
    """``chunk`` (int [ranks·micro·rows]) in the order micro-batch 0 of each rank, then
    micro-batch 1, ...: the ranks' shares balanced first (a step waits for its slowest
    rank), then each rank's micro-batches; each micro-batch in drawn order."""
    slots = [[] for _ in range(micro * ranks)]
    for r, share in enumerate(balanced_groups(loads[chunk], ranks, micro * rows)):
        share = np.asarray(share)
        for m, part in enumerate(balanced_groups(loads[chunk[share]], micro, rows)):
            slots[m * ranks + r] = chunk[np.sort(share[part])].tolist()
    return [i for slot in slots for i in slot]


#: The TRL modules whose ``_prepare_inputs`` shuffles a generation batch before splitting it.
_SHUFFLING = ("trl.trainer.grpo_trainer", "trl.trainer.rloo_trainer")
_grouping = threading.local()
#: How each per-row column of a GRPO / RLOO generation batch is padded (``(rows, ...)``):
#: prompts on the left, completion-aligned columns on the right, per-row values not at all.
_LAYOUT = (
    dict.fromkeys(("prompt_ids", "prompt_mask"), "left")
    | dict.fromkeys(("advantages", "old_logps"), "row")
    | dict.fromkeys(("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                     "ref_per_token_logps", "sampling_per_token_logps"), "right")
)  # fmt: skip


def _keep_groups_whole(trainer: Any) -> None:
    """GRPO / RLOO shuffle a generation batch's rows before cutting it into micro-batches,
    so a micro-batch holds parts of many groups and shares only their prompts. While the
    packed trainer prepares inputs, the shuffle moves groups (runs of rows with one prompt)
    whole: a micro-batch of ``k × num_generations`` rows holds ``k`` groups, each prompt
    stored once, every column (ids, rewards, reference log-probabilities) moved with its
    row — and the groups are split into the ``steps_per_generation`` micro-batches by
    their compute (:func:`_balanced_order`), not at random. On several ranks the ranks'
    groups are first exchanged so that each rank's compute is balanced (:func:`_exchange`)."""
    import importlib

    for name in _SHUFFLING:
        module = importlib.import_module(name)
        if not getattr(module.shuffle_sequence_dict, _PACKED, False):
            module.shuffle_sequence_dict = _group_shuffle(module.shuffle_sequence_dict)
    prepare = trainer._prepare_inputs

    @functools.wraps(prepare)
    def prepare_inputs(*args: Any, **kwargs: Any) -> Any:
        _grouping.trainer = trainer
        try:
            return prepare(*args, **kwargs)
        finally:
            _grouping.trainer = None

    trainer._prepare_inputs = prepare_inputs


def _group_shuffle(shuffle: Any) -> Any:
    """``shuffle`` (TRL's ``shuffle_sequence_dict``), groups whole inside a packed trainer."""

    @functools.wraps(shuffle)
    def grouped(seqs: dict[str, Any]) -> dict[str, Any]:
        trainer = getattr(_grouping, "trainer", None)
        if trainer is None or not isinstance(seqs.get("prompt_ids"), torch.Tensor):
            return shuffle(seqs)
        cost = CostModel.from_config(trainer.model.config)
        if trainer.accelerator.num_processes > 1:
            seqs = _exchange(seqs, trainer, cost)
        bounds = _group_bounds(seqs, trainer.num_generations)
        perm = _balanced_order(seqs, bounds, cost, trainer.args.steps_per_generation)

        def permute(v: Any) -> Any:
            if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
                return v
            if isinstance(v, torch.Tensor):
                return v[torch.as_tensor(perm, device=v.device)]
            return [v[i] for i in perm]

        return {key: permute(value) for key, value in seqs.items()}

    setattr(grouped, _PACKED, True)
    return grouped


def _group_bounds(seqs: dict[str, Any], size: int) -> np.ndarray:
    """The groups' row bounds (int [groups + 1]): runs of rows with one prompt (its real
    tokens), each cut every ``size`` rows (two groups of one prompt drawn side by side)."""
    mask = seqs["prompt_mask"]
    key = torch.cat([seqs["prompt_ids"] * mask, mask], -1)  # (rows, 2P), padding ignored
    new = np.r_[True, ~(key[1:] == key[:-1]).all(-1).cpu().numpy()]  # a run's first row
    at = np.arange(len(new))
    cut = (at - np.maximum.accumulate(np.where(new, at, 0))) % size == 0
    return np.r_[np.flatnonzero(cut), len(new)]


def _group_loads(seqs: dict[str, Any], bounds: np.ndarray, cost: CostModel) -> np.ndarray:
    """Each group's compute (float [groups]) as its trie runs: the prompt once, each
    completion under it (:class:`~exactpack.training.balance.CostModel`)."""
    p = seqs["prompt_mask"].sum(-1).cpu().numpy()  # (rows,) real tokens
    c = seqs["completion_mask"].sum(-1).cpu().numpy()
    group = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    pairs = causal_pairs(p[bounds[:-1]]) + np.bincount(group, causal_pairs(c, p))
    return cost.costs(p[bounds[:-1]] + np.bincount(group, c), pairs)


def _balanced_order(seqs: dict[str, Any], bounds: np.ndarray, cost: CostModel, parts: int):
    """The rows' order (int [rows]): groups ``bounds[g]:bounds[g+1]`` in random order
    (TRL's generator) — and, where the groups are of one size and fill the ``parts``
    micro-batches evenly, placed so that each micro-batch's compute (:func:`_group_loads`)
    is balanced (:func:`~exactpack.training.balance.balanced_groups`)."""
    sizes = np.diff(bounds)
    order = torch.randperm(len(sizes)).numpy()
    even = parts > 1 and len(sizes) % parts == 0 and (sizes == sizes[0]).all()
    if even and "completion_mask" in seqs:
        loads = _group_loads(seqs, bounds, cost)[order]
        slots = balanced_groups(loads, parts, len(sizes) // parts)
        order = np.concatenate([order[slots[k]] for k in torch.randperm(parts).tolist()])
    return np.concatenate([np.arange(bounds[g], bounds[g + 1]) for g in order])


def _exchange(seqs: dict[str, Any], trainer: Any, cost: CostModel) -> dict[str, Any]:
    """This rank's share of every rank's generation batch (each rank generated and scored
    its own rows, so a step would wait for its slowest rank): every per-row column padded
    to the ranks' common width and gathered, the groups dealt to the ranks by compute
    (:func:`_rank_rows`, the same on every rank), this rank's rows kept and trimmed to its
    widest; scalars (``num_items_in_batch``) as they were. Every rank keeps as many rows
    as it generated, and TRL splits them into equal micro-batches, so the step's objective
    is TRL's exactly for every ``loss_type`` that averages over sequences or micro-batches
    of equal rows (``grpo``, ``sapo``, ``luspo``, ``dr_grpo``, RLOO) or divides by the whole
    batch's tokens (``dapo``, ``cispo``, ``vespo``); what a micro-batch normalises by its
    own tokens (``bnpo``) or its own statistics (``top_entropy_quantile`` < 1) follows the
    micro-batch's rows, as under TRL's random shuffle. Columns of unknown layout (images,
    lists), ranks of unequal rows, or groups that cannot fill the ranks evenly: each rank
    keeps its own rows, with a warning."""
    acc, ids = trainer.accelerator, seqs["prompt_ids"]
    mode = str(getattr(trainer.args, "vllm_importance_sampling_mode", ""))
    layout = _LAYOUT | {"importance_sampling_ratio": "right" if mode[:5] == "token" else "row"}
    rows = {k: v for k, v in seqs.items() if v is not None and getattr(v, "ndim", 1) > 0}
    unknown = sorted(k for k, v in rows.items() if k not in layout or not torch.is_tensor(v))
    agree = acc.gather(torch.tensor([[len(unknown), len(ids)]], device=ids.device)).cpu()
    share = None
    if not agree[:, 0].any() and (agree[:, 1] == len(ids)).all():  # every rank decides alike
        every = {
            k: acc.gather(acc.pad_across_processes(v, dim=1, pad_first=layout[k] == "left"))
            for k, v in rows.items()
        }  # (ranks·rows, width)
        share = _rank_rows(every, acc.num_processes, trainer.num_generations, cost)
    if share is None:
        if acc.process_index == 0:  # said once, by the first rank
            why = f"columns of unknown layout: {', '.join(unknown)}" if unknown else (
                "another rank's columns, unequal rows, or groups that cannot fill the ranks evenly"
            )  # fmt: skip
            warnings.warn(
                f"exactpack.trl: the ranks keep their own generated rows ({why}); each rank's"
                " micro-batches are balanced, the ranks are not",
                stacklevel=2,
            )
        return seqs
    mine = torch.as_tensor(share[acc.process_index], device=ids.device)
    p, c = (max(int(every[f"{n}_mask"][mine].sum(-1).max()), 1) for n in ("prompt", "completion"))
    cut = {"left": slice(-p, None), "right": slice(c), "row": slice(None)}  # its widest row
    return seqs | {
        k: v[mine][:, cut[layout[k]]] if v.ndim > 1 else v[mine] for k, v in every.items()
    }


def _rank_rows(seqs: dict[str, Any], ranks: int, size: int, cost: CostModel):
    """Each rank's rows of the gathered batch (int [ranks, rows / ranks], ascending): whole
    groups (:func:`_group_bounds`) dealt so that the largest rank's compute is minimal
    (:func:`~exactpack.training.balance.balanced_groups`) — or in drawn order (the groups'
    contiguous split) where that is no worse; ``None`` where the groups differ in size or
    do not fill the ranks evenly."""
    bounds = _group_bounds(seqs, size)
    sizes, loads = np.diff(bounds), _group_loads(seqs, bounds, cost)
    if (sizes != sizes[0]).any() or len(sizes) % ranks:
        return None
    shares = balanced_groups(loads, ranks, len(sizes) // ranks)
    drawn = np.arange(len(sizes)).reshape(ranks, -1)
    if max(loads[s].sum() for s in shares) >= loads[drawn].sum(1).max():
        shares = drawn
    rows = [np.concatenate([np.arange(bounds[g], bounds[g + 1]) for g in s]) for s in shares]
    return np.stack(rows)


def _packed_module(model: Any) -> tuple[Any, bool]:
    """The module whose forward is packed (PEFT: the base model), and whether every call is
    packed (a sequence-classification reward model) or only TRL's fused-head calls."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base).__name__.endswith("ForSequenceClassification"):
        return base, True
    if not _has_fused_head(vars(base).get("forward")) and not getattr(base, _PACKED, False):
        raise InvalidInput(
            f"{type(base).__name__} has no fused LM head: build the TRL trainer first, then"
            " call exactpack.trl.pack(trainer)"
        )
    return base, False


def _has_fused_head(forward: Any) -> bool:
    """Whether the instance's ``forward`` is TRL's fused one, through the wrappers
    accelerate adds (autocast, outputs to float32)."""
    for _ in range(8):
        func = getattr(forward, "__func__", forward)
        code = getattr(func, "__code__", None)
        if code is not None and "fused_lm_head" in code.co_varnames:
            return True
        forward = getattr(func, "__wrapped__", None)
        if forward is None:
            return False
    return False


def _patch(lm: Any, every_call: bool, impl: str) -> None:
    if getattr(lm, _PACKED, False):
        return
    config = lm.config.get_text_config()
    if getattr(config, "output_router_logits", False):
        raise NotAvailable(
            f"{config.model_type} returns router logits for a load-balancing loss that reads"
            " TRL's padded attention_mask; set model.config.output_router_logits=False to pack"
        )
    arch = capability(lm).check(tree_kind(impl), tree=True)
    if arch.mixers:  # hybrids: each tree node's mixer state forks its parent's
        restart_mixers(lm)
    backbone = getattr(lm, lm.base_model_prefix)
    fused, plain = lm.forward, backbone.forward
    own = [lm.config._attn_implementation or "sdpa"]  # what the model attends with itself

    def attend_with(name: str) -> None:
        if lm.config._attn_implementation != name:
            lm.config._attn_implementation = name

    @functools.wraps(fused)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not (every_call or kwargs.get("fused_lm_head")):
            attend_with(own[0])
            return fused(*args, **kwargs)
        if lm.config._attn_implementation != impl:
            own[0] = lm.config._attn_implementation or "sdpa"
        # the model stays on the tree kernel until its next other call: a checkpointed
        # layer recomputes its forward in the backward, after this call has returned
        attend_with(impl)
        _inside.on = True
        try:
            return fused(*args, **kwargs)
        finally:
            _inside.on = False

    @functools.wraps(plain)
    def backbone_forward(*args: Any, **kwargs: Any) -> Any:
        if not getattr(_inside, "on", False):
            attend_with(own[0])
            return plain(*args, **kwargs)
        return _tree_forward(plain, lm, arch, impl, *args, **kwargs)

    lm.forward = forward
    backbone.forward = backbone_forward
    setattr(lm, _PACKED, True)
    if not every_call:
        _score_real_tokens_only()


#: Set while a packed call runs (its backbone forward goes to the tree rows).
_inside = threading.local()


def _score_real_tokens_only() -> None:
    """TRL's fused head scores only the positions with a label where Triton runs, and every
    padded position elsewhere (fixed tile shapes for compilers): in a packed call it scores
    the labelled positions only, everywhere — the padded ones are not computed at all."""
    import trl.trainer.utils as utils

    if getattr(utils._use_triton, _PACKED, False):
        return
    triton = utils._use_triton

    @functools.wraps(triton)
    def compact(device: torch.device) -> bool:
        return getattr(_inside, "on", False) or triton(device)

    setattr(compact, _PACKED, True)
    utils._use_triton = compact


#: Keywords TRL's fused call may pass the backbone that change nothing on tree rows.
_HARMLESS = {"use_cache": False, "return_dict": True, "output_router_logits": False}


def _tree_forward(
    plain: Any,
    lm: Any,
    arch: Any,
    impl: str,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """The padded batch's hidden states ``(B, L, H)``, computed on tree rows."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    extra = sorted(k for k, v in kwargs.items() if v is not None and _HARMLESS.get(k, ...) != v)
    if input_ids is None or extra:
        what = ", ".join(extra) or "inputs_embeds instead of input_ids"
        raise NotAvailable(
            f"exactpack.trl packs token ids only, not {what}: leave this trainer unpacked"
        )
    batch, length = input_ids.shape
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    keep = mask.to(torch.bool).cpu().numpy()
    first = keep.argmax(axis=1)
    counts = keep.sum(axis=1)
    contiguous = np.array([keep[b, first[b] : first[b] + counts[b]].all() for b in range(batch)])
    if not contiguous.all() or (counts == 0).any():
        b = int(np.flatnonzero(~contiguous | (counts == 0))[0])
        raise InvalidInput(
            f"row {b} of the batch has {'no' if counts[b] == 0 else 'a hole in its'} real"
            " tokens (attention_mask): tree rows need each row's tokens in one run"
        )
    if position_ids is not None:
        want = np.arange(length)[None, :] - first[:, None]
        if not np.array_equal(position_ids.cpu().numpy()[keep], want[keep]):
            raise InvalidInput(
                "position_ids do not count each row from its first real token: the rows are"
                " already packed (padding_free) — leave padding_free off with exactpack.trl"
            )
    ids = input_ids.cpu().numpy()
    seqs = [ids[b, first[b] : first[b] + counts[b]] for b in range(batch)]
    vocab = int(lm.get_input_embeddings().weight.shape[0])
    pad = 0
    # a closing token makes each sequence's last real token an input cell; its target is unused
    order = sorted(range(batch), key=lambda b: seqs[b].tolist())
    group = np.cumsum([i == 0 or seqs[order[i]][0] != seqs[order[i - 1]][0] for i in range(batch)])
    groups = SequenceGroups.of(
        [np.append(seqs[b], pad) for b in order],
        [np.ones(int(counts[b]), dtype=bool) for b in order],
        group - 1,
        Binding(vocab_size=vocab, tokenizer_id="trl-batch", split_id="trl-batch"),
    )
    sizes = build_layout(groups, int(counts.sum()) + batch).sizes
    # the tree kernel attends node by node: one row, no padding; a mask kind, the widest trie
    width = int(sizes.sum() if impl in TREE_NAMES else sizes.max())
    tree = pack_tree(groups, width, policy="best-fit-decreasing").batches[0]
    dtype = next(lm.parameters()).dtype
    inputs = build_inputs(tree, impl, arch, dtype=dtype, device=input_ids.device)
    with packed_call(lm, inputs):  # plain runs without the model's hooks
        hidden = plain(**inputs).last_hidden_state  # (R, T, H)
    cells, bounds, _ = tree.sequences()
    rows = np.asarray(order, dtype=np.int64)[np.asarray(tree.seq_index, dtype=np.int64)]
    # sequence i's cells go to its row's real tokens, from its first one on (bounds[0] = 0)
    dest = np.repeat(rows * length + first[rows] - bounds[:-1], np.diff(bounds))
    dest += np.arange(bounds[-1])
    src = torch.as_tensor(cells, device=hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, src)
    out = flat.new_zeros(batch * length, flat.shape[-1])
    out = out.index_copy(0, torch.as_tensor(dest, device=flat.device), flat)
    return BaseModelOutputWithPast(last_hidden_state=out.reshape(batch, length, -1))


__all__ = ["CHECKED_TRL", "pack"]

"""Mixers that restart at every example: short convolutions, Mamba scans, gated delta rules.

Attention keeps packed examples apart through its mask. A layer that carries state along
the row instead (a short causal convolution's last ``k - 1`` inputs, a Mamba / Mamba-2
selective scan's state, a gated delta rule's memory) has no mask to read: it must start
every example from zero, as the example run alone does. Fixture row 0 (A = columns 0-2,
B = 3-4, padding at 5), a width-3 convolution and a scan::

    column         0          1          2       |     3          4      |    5
    seq_idx        0          0          0       |     1          1      |   -1
    conv window  [. . A0]  [. A0 A1]  [A0 A1 A2]  |  [. . B0]  [. B0 B1]  |  [. . pad]
    scan state   0 -> s(A0) -> s(A0..1) -> s(A0..2)
                                       0 -> s(B0) -> s(B0..1)    (not s(A0..2))
                                       ^ the boundary: conv history and state reset

:func:`restart_mixers` makes a model's mixers do that whenever the call carries ``seq_idx``
(the per-cell example index :func:`exactpack.hf.hf_inputs` gives: ``(R, T)`` padded, ``(1, N)``
flattened), and run as before without one. Every mixer below calls its kernels by name from
its module (transformers' hub-kernel functions: ``causal_conv1d_fn``, ``mamba_selective_scan``,
``torch_chunk_gated_delta_rule``, the names the CUDA packages' ``seq_idx`` / ``cu_seqlens``
routes fill); a :data:`WHOLE_CALL` mixer runs its own forward once for the whole call with
path-aware stand-ins for them (:data:`STAND_INS`: :func:`path_conv1d`, :func:`selective_scan`,
:func:`chunk_gated_delta_rule`). The rest (Mamba-2 scans, and gated delta rules on tree rows)
run their own forward on each example's columns alone, ``(1, L, H)`` with no cache: the same
code on the same columns from the same zero state. A mixer module's forward is
``forward(hidden_states, cache=None, attention_mask=None, **kwargs) -> (B, T, H)`` in every
family below (transformers 5).

On tree rows (the keyword :data:`PARENTS`, :func:`cell_parents`) a node starts from its
parent's final state instead of zero, forked at the branch point: the stand-ins follow each
cell's parent cell; a mixer run per node starts from a :class:`ForkCache` (transformers'
linear-attention cache interface) holding the parent's last conv inputs and scan state.
A flat row is a tree of one-node paths (:func:`seq_idx_parents`), so both run one loop
(:func:`runs`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from exactpack.core.errors import InvalidInput

#: Mixer classes that restart exactly per example (each verified by ``exactpack verify``):
#: short convolutions, Mamba and Mamba-2 selective scans, gated delta rules.
RESTARTABLE = {
    "Lfm2ShortConv": "short convolution",
    "Lfm2MoeShortConv": "short convolution",
    "MambaMixer": "Mamba selective scan",
    "FalconMambaMixer": "Mamba selective scan",
    "JambaMambaMixer": "Mamba selective scan",
    "Mamba2Mixer": "Mamba-2 selective scan",
    "BambaMixer": "Mamba-2 selective scan",
    "NemotronHMamba2Mixer": "Mamba-2 selective scan",
    "FalconH1Mixer": "Mamba-2 selective scan",
    "GraniteMoeHybridMambaLayer": "Mamba-2 selective scan",
    "Qwen3NextGatedDeltaNet": "gated delta rule",
    "Qwen3_5GatedDeltaNet": "gated delta rule",
    "Qwen3_5MoeGatedDeltaNet": "gated delta rule",
    "OlmoHybridGatedDeltaNet": "gated delta rule",
}
#: The model-call keyword of tree rows: each cell's parent cell (:func:`cell_parents`).
PARENTS = "cell_parent"
#: The attribute a restarted mixer (and its model) carries.
_MARK = "_exactpack_restarts"
#: ``id(config)`` -> config of every model whose mixers restart (hf_inputs checks it).
_PREPARED: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def mixer_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of every module of ``model`` whose class is in :data:`RESTARTABLE`."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ in RESTARTABLE]


def cell_seq_idx(
    lengths: np.ndarray, valid_index: np.ndarray, shape: tuple[int, int]
) -> np.ndarray:
    """Each cell's example index (occurrence order), ``-1`` at padding: int32 ``shape``.

    >>> cell_seq_idx(np.array([3, 2, 4]), np.array([0, 1, 2, 3, 4, 6, 7, 8, 9]), (2, 6))
    array([[ 0,  0,  0,  1,  1, -1],
           [ 2,  2,  2,  2, -1, -1]], dtype=int32)
    """
    out = np.full(shape[0] * shape[1], -1, dtype=np.int32)
    out[valid_index] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    return out.reshape(shape)


def cell_parents(
    nodes: np.ndarray, node_parent: np.ndarray, node_col: np.ndarray, node_len: np.ndarray
) -> np.ndarray:
    """Each cell's parent cell: the column of the token before it on its sequence's path,
    ``-1`` where a path starts (a root node's first cell) and at the first padding cell of a
    run, int64 ``nodes.shape``. ``nodes`` ``(R, T)``: each cell's node (``-1`` padding);
    ``node_parent``, ``node_col``, ``node_len``: per node (a trie lies in one row, its nodes
    depth-first). A flat row is the one-node trie per example.

    A trie with a 2-cell prompt and two 1-cell completions, then padding::

        column        0   1   2   3   4
        node          0   0   1   2  -1
        cell_parent  -1   0   1   1  -1     (column 3 continues column 1, not its sibling 2)

    >>> cell_parents(np.array([[0, 0, 1, 2, -1]]), np.array([-1, 0, 0]),
    ...              np.array([0, 2, 3]), np.array([2, 1, 1]))
    array([[-1,  0,  1,  1, -1]])
    """
    cols = np.arange(nodes.shape[1])[None, :]
    node = np.maximum(nodes, 0)
    first = cols == node_col[node]
    parent = node_parent[node]
    parent_last = node_col[np.maximum(parent, 0)] + node_len[np.maximum(parent, 0)] - 1
    out = np.where(first, np.where(parent >= 0, parent_last, -1), cols - 1)
    pad = nodes < 0  # padding: one run from its first cell (its outputs are never read)
    pad_first = pad & ~np.pad(pad, ((0, 0), (1, 0)))[:, :-1]
    return np.where(pad, np.where(pad_first, -1, cols - 1), out).astype(np.int64)


def seq_idx_parents(seq_idx: torch.Tensor) -> torch.Tensor:
    """:func:`cell_parents` of a flat row from its ``seq_idx`` ``(B, T)``: the column before,
    inside one example; ``-1`` at each example's first cell (and padding's)."""
    cols = torch.arange(seq_idx.shape[-1], device=seq_idx.device).expand_as(seq_idx)
    same = F.pad(seq_idx[..., 1:] == seq_idx[..., :-1], (1, 0), value=False)
    return torch.where(same, cols - 1, -1)


def path_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parents: torch.Tensor
) -> torch.Tensor:
    """The depthwise causal convolution of ``x`` ``(B, C, T)`` by ``weight`` ``(C, K)``
    (``F.conv1d(..., groups=C, padding=K - 1)[..., :T]``) along each cell's path:
    column ``t`` reads itself and its ``K - 1`` ancestors by ``parents`` ``(B, T)``
    (:func:`cell_parents`), zeros before the path's start, as its sequence alone does. On a
    flat row (:func:`seq_idx_parents`) that is each example's window restarted; on a tree
    row a branch's window continues its parent's last ``K - 1`` inputs, never a sibling's."""
    k, (b, c, t) = weight.shape[-1], x.shape
    cols = torch.arange(t, device=x.device).expand(b, t)
    tap, out = cols, None  # tap: (B, T) the cell j steps up each cell's path, -1 before it
    for j in range(k):
        if j:
            tap = torch.where(tap >= 0, parents.gather(1, tap.clamp(min=0)), -1)
        src = F.pad(x, (j, 0))[..., :t]  # the cell j columns before: a flat row's tap
        jump = (tap >= 0) & (tap != cols - j)
        if bool(jump.any()):  # a tree branch reads its parent's path: gather those cells
            far = x.gather(2, tap.clamp(min=0)[:, None].expand(b, c, t))
            src = torch.where(jump[:, None], far, src)
        term = src * (tap >= 0)[:, None].to(x.dtype) * weight[:, k - 1 - j, None].to(x.dtype)
        out = term if out is None else out + term
    return out if bias is None else out + bias.to(x.dtype)[:, None]


def _conv(x, weight, bias=None, activation=None, *, parents, **kw) -> torch.Tensor:
    """transformers' ``causal_conv1d_fn`` (``x`` ``(B, C, T)``) along each cell's path."""
    from transformers.activations import ACT2FN

    out = path_conv1d(x.to(weight.dtype), weight, bias, parents)
    return (out if activation is None else ACT2FN[activation](out)).to(x.dtype)


def selective_scan(
    u, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, *, parents, **kw
) -> torch.Tensor:
    """transformers' ``mamba_selective_scan`` (its per-token loop, the same ops; ``u`` (the
    hidden states), ``dt``, ``z`` ``(B, D, T)``, ``B``, ``C`` ``(B, N, T)``, ``A`` ``(D, N)``)
    along each cell's path: a cell's state continues its parent cell's (``parents``
    ``(B, T)``), zero where a path starts: each example restarted, each tree node forked from
    its parent's final state."""
    dtype, b = u.dtype, u.shape[0]
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2), C.transpose(1, 2)  # (B, T, N)
    decay = torch.exp(A[None, :, None, :] * dt[:, :, :, None])  # (B, D, T, N)
    inflow = dt[:, :, :, None] * B[:, None, :, :].float() * u[:, :, :, None].float()
    zero = torch.zeros(b, *decay.shape[1:2], A.shape[-1], dtype=dtype, device=dt.device)
    states: list[torch.Tensor] = []
    out = []
    steps = zip(parents.T.tolist(), decay.unbind(2), inflow.unbind(2), C.unbind(1), strict=True)
    for i, (col, decay_i, inflow_i, c_i) in enumerate(steps):  # unbound: one backward each
        if i and all(p == i - 1 for p in col):
            prev = states[-1]
        else:  # a path starts (zero) or a branch continues its parent's state
            prev = torch.stack([states[p][r] if p >= 0 else zero[r] for r, p in enumerate(col)])
        states.append(decay_i * prev + inflow_i)
        out.append(torch.matmul(states[-1].to(dtype), c_i.unsqueeze(-1))[:, :, 0])
    out = torch.stack(out, dim=-1)  # (B, D, T)
    if D is not None:
        out = out + u * D[None, :, None]
    return out if z is None else out * F.silu(z)


def chunk_gated_delta_rule(
    query, key, value, g, beta, chunk_size=64, use_qk_l2norm_in_kernel=False, *, parents, **kw
) -> tuple[torch.Tensor, None]:
    """transformers' ``torch_chunk_gated_delta_rule`` (``query``, ``key`` ``(B, T, Hk, Dk)``,
    ``value`` ``(B, T, Hv, Dv)``, ``g``, ``beta`` ``(B, T, Hv)``; float32 inside, as there) over
    whole flat rows, the state zeroed where an example starts (``parents`` ``(B, T)`` ``-1``,
    :func:`seq_idx_parents`): inside a chunk, pairs of cells of different examples are
    masked; a cell reads the chunk's incoming state only if its example began before the
    chunk, and the outgoing state holds only the chunk's last example -> ``(B, T, Hv, Dv)``,
    ``None``."""
    dtype, (b, t, hk, _), hv = query.dtype, key.shape, value.shape[-2]
    if hk != hv:
        query, key = (x.repeat_interleave(hv // hk, dim=2) for x in (query, key))
    query, key, value, beta, g = (
        x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        for x in (query, key, value, beta, g)
    )  # (B, H, T, ...)
    if use_qk_l2norm_in_kernel:
        query, key = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (query, key))
    query = query * query.shape[-1] ** -0.5
    pad = (chunk_size - t % chunk_size) % chunk_size
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    v_beta, k_beta = value * beta.unsqueeze(-1), key * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = (
        x.reshape(b, hv, -1, chunk_size, x.shape[-1]) for x in (query, key, k_beta, v_beta)
    )  # (B, H, N, C, D)
    seg = F.pad((parents < 0).cumsum(-1), (0, pad), value=-1).reshape(b, 1, -1, chunk_size)
    before = F.pad(seg[..., :-1, -1], (1, 0), value=-2)  # the example the state holds
    carried = (seg == before[..., None]).float()  # (B, 1, N, C): began before the chunk
    with_last = (seg == seg[..., -1:]).float()  # the chunk's last example: the state out
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=seg.device).tril()
    same = (seg[..., :, None] == seg[..., None, :]) & causal  # (B, 1, N, C, C)
    cum = g.reshape(b, hv, -1, chunk_size).cumsum(-1)  # (B, H, N, C)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~same, float("-inf")).exp()
    ut_system = (k_beta @ key.transpose(-1, -2)) * decay
    intra = (query @ key.transpose(-1, -2)) * decay
    read = cum.exp() * carried
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_read = k_beta * read.unsqueeze(-1)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, k_read, upper=False, unitriangular=True)
    query = query * read.unsqueeze(-1)
    key = key * ((cum[..., -1:] - cum).exp() * with_last).unsqueeze(-1)
    chunk_decay = (cum[..., -1].exp() * carried[..., -1])[..., None, None]
    state = query.new_zeros(b, hv, query.shape[-1], v_beta.shape[-1])
    out = []
    per_chunk = (x.unbind(2) for x in (query, key, new_values, k_cumdecay, intra, chunk_decay))
    for q, k, values, k_decay, attn, keep in zip(*per_chunk, strict=True):  # unbound: one backward
        v_new = values - k_decay @ state
        out.append(q @ state + attn @ v_new)
        state = state * keep + k.transpose(-1, -2) @ v_new
    core = torch.stack(out, dim=2).reshape(b, hv, -1, v_beta.shape[-1])[:, :, :t]
    return core.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), None


#: The kernels a mixer's forward calls by name from its module (transformers' hub-kernel
#: functions) -> their path-aware stand-ins, given the call's ``parents``.
STAND_INS = {
    "causal_conv1d_fn": _conv,
    "mamba_selective_scan": selective_scan,
    "torch_chunk_gated_delta_rule": chunk_gated_delta_rule,
    "mamba_inner_fn": lambda *args, **kwargs: None,  # fused: none, so the unfused steps run
}
#: The families (:data:`RESTARTABLE`) whose forward runs once per packed call with
#: :data:`STAND_INS` swapped in, on tree rows too (the rest of them: flat rows only; the
#: other families, and those on tree rows, run per node: :func:`runs`).
WHOLE_CALL = {"short convolution": True, "Mamba selective scan": True, "gated delta rule": False}


_CURRENT = threading.local()  # .parents: the packed mixer call's in this thread, or None


def _dispatching(name: str, original: Any) -> Any:
    """``original`` (a kernel of :data:`STAND_INS`), or its stand-in inside :func:`stand_ins`."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        parents = getattr(_CURRENT, "parents", None)
        if parents is None:
            return original(*args, **kwargs)
        return STAND_INS[name](*args, parents=parents, **kwargs)

    setattr(kernel, _MARK, True)
    return kernel


@contextlib.contextmanager
def stand_ins(module: torch.nn.Module, parents: torch.Tensor) -> Iterator[None]:
    """Inside, in this thread, the :data:`STAND_INS` that ``module``'s forward calls (by name
    from its class's module, at call time, as transformers' hub-kernel functions are looked
    up) follow ``parents`` ``(B, T)``. The names are rebound once per module to a dispatcher
    that runs the originals outside (and in other threads)."""
    space = vars(sys.modules[type(module).__module__])
    for name in STAND_INS.keys() & space.keys():
        if not getattr(space[name], _MARK, False):
            space[name] = _dispatching(name, space[name])
    outer, _CURRENT.parents = getattr(_CURRENT, "parents", None), parents
    try:
        yield
    finally:
        _CURRENT.parents = outer


def runs(parents: torch.Tensor) -> list[list[tuple[int, int, int]]]:
    """Per row, its runs in column order as ``(start, end, parent)``: the longest column
    spans in which each cell continues the one before (``parents`` ``(B, T)``,
    :func:`cell_parents`) and no cell but the last is a branch point (the parent of a cell
    elsewhere), with the index of the run whose last cell comes before the first (``-1``: a
    path starts there). A flat row ``[-1, 0, 1, -1, 3, -1]`` -> ``[[(0, 3, -1), (3, 5, -1),
    (5, 6, -1)]]``; the trie ``[-1, 0, 1, 1]`` -> ``[[(0, 2, -1), (2, 3, 0), (3, 4, 0)]]``."""
    out = []
    for row in parents.detach().cpu().numpy():  # one loop per row; spans vectorised
        cols = np.arange(row.shape[0])
        jump = (row != cols - 1) & (row >= 0)  # continues a cell elsewhere: that one branches
        cut = np.zeros(row.shape[0] + 1, dtype=bool)
        cut[0] = True
        cut[:-1][row != cols - 1] = True
        cut[row[jump] + 1] = True
        starts = np.flatnonzero(cut[:-1])
        ends = np.r_[starts[1:], row.shape[0]]
        up = row[starts]
        holder = np.searchsorted(starts, up, side="right") - 1
        parent = np.where(up >= 0, holder, -1)
        out.append(list(zip(starts.tolist(), ends.tolist(), parent.tolist(), strict=True)))
    return out


class ForkCache:
    """A one-layer cache in transformers' linear-attention interface that starts a node from
    its parent's final state and keeps its own: ``conv`` (the last ``k`` conv inputs of
    the path so far, ``(1, C, k)``) and ``state`` (the recurrent state). Functional, so
    autograd sees each fork: nothing is written in place, and ``is_recording_past`` keeps
    the mixers off their in-place one-token conv update."""

    def __init__(self, conv: torch.Tensor | None = None, state: torch.Tensor | None = None):
        self.conv, self.state = conv, state

    def fork(self) -> ForkCache:
        return ForkCache(self.conv, self.state)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.conv

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.state

    def is_recording_past(self, layer_idx: int) -> bool:
        return True

    def update_conv_state(
        self,
        x: torch.Tensor,
        layer_idx: int,
        state_idx: int = 0,
        conv_kernel_size: int = 1,
        **kw: Any,
    ) -> torch.Tensor:
        full = x if self.conv is None else torch.cat([self.conv, x], dim=-1)  # (1, C, k + L)
        self.conv = F.pad(full, (max(conv_kernel_size - full.shape[-1], 0), 0))[
            ..., -conv_kernel_size:
        ]
        return full

    def update_recurrent_state(
        self, state: torch.Tensor, layer_idx: int, state_idx: int = 0, **kw: Any
    ) -> torch.Tensor:
        self.state = state
        return state


def _row_nodes(
    module: torch.nn.Module, own: Any, x: torch.Tensor, nodes: list[tuple[int, int, int]]
) -> torch.Tensor:
    """One row ``x`` ``(1, T, H)`` through ``own`` (the module's forward) node by node:
    a root from zero (no cache), a child from its parent's final :class:`ForkCache`; a
    one-column child reruns its parent too (a one-token call takes the mixers' in-place
    decode step)."""
    has_child = {p for _, _, p in nodes if p >= 0}
    after: dict[int, ForkCache] = {}  # node -> the cache after it (its children's start)
    before: dict[int, ForkCache] = {}  # node -> the cache it started from
    out = []
    for i, (s, e, p) in enumerate(nodes):
        if p < 0 and i not in has_child:  # a flat example (or padding): as it runs alone
            out.append(own(module, x[:, s:e]))
            continue
        cols = x[:, s:e]
        before[i] = start = after[p] if p >= 0 else ForkCache()
        if p >= 0 and e - s == 1:  # the parent's columns too, from the parent's start
            ps, pe, _ = nodes[p]
            cols, start = torch.cat([x[:, ps:pe], cols], dim=1), before[p]
        cache = start.fork()
        out.append(own(module, cols, cache=cache)[:, -(e - s) :])
        after[i] = cache
    return torch.cat(out, dim=1)


@dataclass
class _Call:
    """The nodes of the model call in progress (set by the root's pre-hook)."""

    nodes: list[list[tuple[int, int, int]]] | None = None
    parents: torch.Tensor | None = None  # (B, T) cell parents (cell_parents)
    seq_idx: torch.Tensor | None = None  # the seq_idx the nodes were read from (flat calls)
    checkpointing: bool = False


def _restarted_forward(module: torch.nn.Module, call: _Call, name: str) -> Any:
    own = type(module).forward

    def forward(
        self: torch.nn.Module,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        seq_idx = kwargs.get("seq_idx")
        nodes, parents = call.nodes, call.parents  # read once per call (a host copy)
        if isinstance(seq_idx, torch.Tensor) and seq_idx is not call.seq_idx:
            # a recompute after the call (checkpointing), or a layer alone: flat rows
            parents = seq_idx_parents(seq_idx)
            nodes = runs(parents)
        if nodes is None:  # not a packed call: the module's own forward
            return own(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        if seq_idx is None and call.checkpointing:
            raise InvalidInput(
                f"{name} ({type(self).__name__}) is not handed seq_idx by its model, and"
                " gradient (activation) checkpointing would recompute it after the packed call,"
                " where exactpack cannot restart it — turn checkpointing off for this model"
            )
        rows, width = hidden_states.shape[:2]
        if len(nodes) != rows or (nodes and nodes[0][-1][1] != width):
            raise InvalidInput(
                f"{name} got hidden states of {rows} x {width} columns but packed rows of"
                f" {len(nodes)} rows — feed the model exactly hf_inputs(batch, ...)"
            )
        if cache is not None:
            raise InvalidInput(
                f"{name} got a cache on a packed call; packed rows are for training"
                " — pass use_cache=False (hf_inputs does)"
            )
        family = RESTARTABLE[type(self).__name__]
        if WHOLE_CALL.get(family) or (
            family in WHOLE_CALL and all(p < 0 for row in nodes for _, _, p in row)
        ):  # one call, its kernels path-aware (a gated delta rule: flat rows only)
            with stand_ins(self, parents.to(hidden_states.device)):
                return own(self, hidden_states)
        out = [_row_nodes(self, own, hidden_states[r : r + 1], row) for r, row in enumerate(nodes)]
        return torch.cat(out, dim=0)

    return types.MethodType(forward, module)


def _begin(model: torch.nn.Module, call: _Call, kwargs: dict) -> None:
    """Read the packed call's rows from ``kwargs`` (``seq_idx``, or :data:`PARENTS`, which
    is popped: the model never sees it) into ``call``."""
    seq_idx, parents = kwargs.get("seq_idx"), kwargs.pop(PARENTS, None)
    training = model.training and bool(getattr(model, "is_activation_checkpointing", False))
    call.checkpointing = training  # a recompute runs only in training
    call.seq_idx = seq_idx if isinstance(seq_idx, torch.Tensor) else None
    if isinstance(parents, torch.Tensor):
        if training:
            raise InvalidInput(
                f"{type(model).__name__}'s mixers start each tree node from its parent's"
                " state only inside the call, and gradient (activation) checkpointing"
                " would recompute them after it — turn checkpointing off for tree rows"
            )
        call.parents = parents
    elif call.seq_idx is not None:
        call.parents = seq_idx_parents(call.seq_idx)
    else:
        call.parents = None
    call.nodes = None if call.parents is None else runs(call.parents)


@contextlib.contextmanager
def packed_call(model: torch.nn.Module, kwargs: dict) -> Iterator[None]:
    """What :func:`restart_mixers`' hooks do around ``model(**kwargs)``, for a caller that
    runs a forward of ``model`` without its hooks (``exactpack.trl`` calls the backbone's
    own forward); pops :data:`PARENTS` from ``kwargs``. Nothing where ``model`` was not
    restarted."""
    call = getattr(model, _MARK, None)
    if call is None:
        yield
        return
    _begin(model, call, kwargs)
    try:
        yield
    finally:
        call.nodes = call.parents = call.seq_idx = None


def restart_mixers(model: torch.nn.Module) -> torch.nn.Module:
    """Make every :data:`RESTARTABLE` mixer of ``model`` restart at each example of a packed
    call (one that carries ``seq_idx``, as :func:`exactpack.hf.hf_inputs` gives); other
    calls run as before. Idempotent; returns ``model``.

    >>> # model = AutoModelForCausalLM.from_pretrained(...)   # e.g. LFM2, Mamba, Qwen3-Next
    >>> # restart_mixers(model)
    >>> # out = model(**hf_inputs(batch, "sdpa", config=model.config))
    """
    if getattr(model, _MARK, None) is not None:
        return model
    call = _Call()

    def before(module: Any, args: tuple, kwargs: dict) -> Any:
        _begin(model, call, kwargs)
        return args, kwargs

    def after(module: Any, args: tuple, kwargs: dict, out: Any) -> None:
        call.nodes = call.parents = call.seq_idx = None  # a later direct layer call is not this

    for name, module in mixer_modules(model):
        if getattr(module, _MARK, None) is None:
            module.forward = _restarted_forward(module, call, name)
            setattr(module, _MARK, True)
    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True, always_call=True)
    setattr(model, _MARK, call)
    config = getattr(model, "config", None)
    if config is not None:
        _PREPARED[id(config)] = config
        text = getattr(config, "get_text_config", lambda: config)()
        _PREPARED[id(text)] = text
    return model


def restarts(config: Any) -> bool:
    """True when ``config`` belongs to a model :func:`restart_mixers` has prepared."""
    return _PREPARED.get(id(config)) is config

"""Materialise a FlexAttention ``BlockMask`` into the cells it lets attend, for comparisons."""

from __future__ import annotations

import torch


def _tiles(num_blocks: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Bool ``(R, H, Qb, Kb)``: the first ``num_blocks`` of each query tile's ``indices``."""
    listed = torch.arange(indices.shape[-1], device=indices.device) < num_blocks[..., None]
    hits = torch.zeros(indices.shape, dtype=torch.int32, device=indices.device)
    return hits.scatter_add_(-1, indices.long(), listed.int()) > 0


def block_mask_cells(block_mask) -> torch.Tensor:
    """Bool ``(R, H, T, T)``: the cells a ``BlockMask`` lets attend.

    A cell in a *full* tile is attended without ``mask_mod``; one in a
    *partial* tile when ``mask_mod`` permits it; one in a skipped tile never.
    So a permitted cell in a skipped tile, or a forbidden cell in a full tile,
    shows up as a difference from the predicate.
    """
    from torch.nn.attention.flex_attention import create_mask

    rows, heads, q_len, kv_len = block_mask.shape
    bq, bk = block_mask.BLOCK_SIZE

    def cells_of(tiles: torch.Tensor) -> torch.Tensor:
        out = tiles.repeat_interleave(bq, 2).repeat_interleave(bk, 3)
        return out[..., :q_len, :kv_len].expand(rows, heads, q_len, kv_len)

    permitted = create_mask(block_mask.mask_mod, rows, heads, q_len, kv_len)
    partial = cells_of(_tiles(block_mask.kv_num_blocks, block_mask.kv_indices))
    out = partial.to(permitted.device) & permitted
    if block_mask.full_kv_num_blocks is not None:
        full = _tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
        out = out | cells_of(full).to(out.device)
    return out

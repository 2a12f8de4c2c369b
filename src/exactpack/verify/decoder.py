"""A tiny Llama-style causal decoder that runs separate, padded and packed layouts alike.

RMSNorm, rotary positions from the layout's **local** positions, SwiGLU, no biases, the
embedding tied to the output projection. One code path serves every layout
(:class:`~exactpack.nn.attention.AttentionLayout`: valid cells, local positions, keys per
query); attention is any backend in :data:`~exactpack.nn.attention.BACKENDS`.

On the fixture's packed row 0 the decoder sees::

    column     0   1   2   3    4    5
    inputs   [ 0, 99, 100,  0, 101,  -1]   -1: never gathered, embedding 0
    positions[ 0,  1,   2,  0,   1,   0]   rotary angle from these (B restarts)
    keys of q4: columns [3, 5)             A's columns 0-2 are not B's context

Profiles (vocabulary 266): ``large`` width 8, 2 heads, ff 16, 2 layers, max length 16 ->
3448 parameters; ``small`` width 4, 2 heads, ff 4, 1 layer, max length 4 -> 1188.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from exactpack.core.batch import PackedBatch
from exactpack.core.compact import pack_examples
from exactpack.core.config import PackConfig
from exactpack.core.errors import InvalidInput
from exactpack.core.examples import SequenceExample
from exactpack.core.loss import LossResult, token_weighted_loss
from exactpack.nn.attention import AttentionLayout, Backend, resolve_backend


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of a :class:`TinyDecoder`. ``max_len`` bounds local positions (rotary table)."""

    vocab_size: int = 266
    width: int = 8
    heads: int = 2
    ff: int = 16
    layers: int = 2
    max_len: int = 16
    rope_base: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "width", "heads", "ff", "layers", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidInput(f"DecoderConfig.{name} must be a positive int, got {value!r}")
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise InvalidInput(
                f"width {self.width} must split into {self.heads} heads of even width"
                " (rotary rotates pairs of channels)"
            )

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def parameter_count(self) -> int:
        """Closed form: tied embedding + per layer (4 W^2 attention, 3 W ff SwiGLU, 2 norms)."""
        w = self.width
        per_layer = 4 * w * w + 3 * w * self.ff + 2 * w
        return self.vocab_size * w + self.layers * per_layer + w


PROFILES: dict[str, DecoderConfig] = {
    "large": DecoderConfig(vocab_size=266, width=8, heads=2, ff=16, layers=2, max_len=16),
    "small": DecoderConfig(vocab_size=266, width=4, heads=2, ff=4, layers=1, max_len=4),
}


#: cos, sin (R, 1, T, D/2) at the layout's local positions.
Rope = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split convention: channel ``i`` pairs with ``i + D/2``."""
    x1, x2 = x.chunk(2, dim=-1)  # (R, H, T, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.q, self.k, self.v, self.o = (
            nn.Linear(cfg.width, cfg.width, bias=False) for _ in "qkvo"
        )

    def forward(
        self, x: torch.Tensor, rope: Rope, layout: AttentionLayout, backend: Backend
    ) -> torch.Tensor:
        R, T, W = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(R, T, self.heads, W // self.heads).transpose(1, 2)  # (R, H, T, D)

        q = rotate(heads(self.q(x)), *rope)
        k = rotate(heads(self.k(x)), *rope)
        v = heads(self.v(x))
        y = backend(q, k, v, layout, 1.0 / (W // self.heads) ** 0.5)  # (R, H, T, D)
        return self.o(y.transpose(1, 2).reshape(R, T, W))


class SwiGLU(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.width, cfg.ff, bias=False)
        self.up = nn.Linear(cfg.width, cfg.ff, bias=False)
        self.down = nn.Linear(cfg.ff, cfg.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.attn = SelfAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, rope: Rope, layout: AttentionLayout, backend: Backend
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, layout, backend)
        return x + self.mlp(self.mlp_norm(x))


class TinyDecoder(nn.Module):
    """Llama-style decoder over any :class:`AttentionLayout`.

    ``TinyDecoder(profile="large", seed=42)`` builds a profile of :data:`PROFILES`;
    ``TinyDecoder(config=DecoderConfig(...))`` any shape. ``attention``: a backend name
    (resolved at each forward) or function. Weights are drawn in float64 from
    ``torch.Generator().manual_seed(seed)`` in parameter order, then cast (any device).
    """

    def __init__(
        self,
        profile: str = "large",
        seed: int = 42,
        dtype: torch.dtype = torch.float64,
        attention: str | Backend = "ranges",
        *,
        config: DecoderConfig | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if config is None and profile not in PROFILES:
            raise InvalidInput(
                f"unknown decoder profile {profile!r}; choose one of {', '.join(PROFILES)}"
                " or pass config=DecoderConfig(...)"
            )
        self.profile = profile if config is None else "custom"
        self.config = config = config or PROFILES[profile]
        self.seed = seed
        self.attention = attention
        self.embed = nn.Embedding(config.vocab_size, config.width)  # tied with the output
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.width, config.norm_eps)
        self._init_weights(seed)
        inv_freq = config.rope_base ** (
            -torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim
        )
        angles = torch.outer(torch.arange(config.max_len, dtype=torch.float64), inv_freq)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)  # (max_len, D/2)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.to(device=device, dtype=dtype)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """Embedding N(0, 1/W); linear weights N(0, 1/fan_in); norm weights 1."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            fan_in = p.shape[1] if not name.startswith("embed") else self.config.width
            draw = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(draw / fan_in**0.5)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def embed_tokens(self, ids: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
        """Embeddings (R, T, W) of the valid cells; padding cells (``PAD_CELL``) stay 0."""
        R, T = layout.shape
        index = layout.valid_index  # (N,) flat valid cells
        vectors = self.embed(ids.reshape(-1).index_select(0, index))  # (N, W)
        flat = vectors.new_zeros(R * T, self.config.width).index_copy(0, index, vectors)
        return flat.view(R, T, self.config.width)

    def rotary(self, layout: AttentionLayout) -> Rope:
        """cos, sin (R, 1, T, D/2) at the layout's local positions."""
        top = layout.cached(
            "max_position", lambda: int(layout.positions.max()) if layout.valid.numel() else 0
        )
        if top >= self.config.max_len:
            raise InvalidInput(
                f"local position {top} reaches the decoder's max_len {self.config.max_len}"
                " — use shorter examples or a config with a larger max_len"
            )
        positions = layout.positions  # (R, T)
        return self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]

    def forward(
        self,
        ids: torch.Tensor,
        layout: AttentionLayout,
        attention: str | Backend | None = None,
    ) -> torch.Tensor:
        """Logits (R, T, V) for token ids (R, T) (int64, ``PAD_CELL`` on padding)."""
        if tuple(ids.shape) != layout.shape:
            raise InvalidInput(f"ids have shape {tuple(ids.shape)}; the layout is {layout.shape}")
        backend = self.attention if attention is None else attention
        backend = backend if callable(backend) else resolve_backend(backend)
        rope = self.rotary(layout)
        x = self.embed_tokens(ids, layout)  # (R, T, W)
        for block in self.blocks:
            x = block(x, rope, layout, backend)
        return self.norm(x) @ self.embed.weight.T  # (R, T, V), tied projection

    def inputs_of(self, batch: PackedBatch) -> tuple[torch.Tensor, AttentionLayout]:
        """Token ids (R, T) int64 and the layout of ``batch`` on this model's device."""
        if batch.binding.vocab_size > self.config.vocab_size:
            raise InvalidInput(
                f"batch vocabulary {batch.binding.vocab_size} exceeds the decoder's"
                f" {self.config.vocab_size} — build the decoder for the binding's vocabulary"
            )
        device = self.embed.weight.device
        ids = torch.as_tensor(batch.inputs, dtype=torch.int64, device=device)
        return ids, AttentionLayout.from_batch(batch, device)

    def forward_packed(self, batch: PackedBatch) -> torch.Tensor:
        """Logits (R, T, V) of a packed batch (any number of occurrences per row)."""
        return self(*self.inputs_of(batch))

    def loss_packed(self, batch: PackedBatch) -> LossResult:
        """Token-weighted loss of a packed batch (raises EmptyObjective when N = 0)."""
        return token_weighted_loss(self.forward_packed(batch), batch)

    def forward_padded(self, batch: PackedBatch) -> torch.Tensor:
        """Logits (R, T, V) of a right-padded batch: at most one example per row."""
        per_row = np.bincount(batch.occurrences.row, minlength=batch.shape[0])
        if per_row.size and int(per_row.max()) > 1:
            row = int(np.argmax(per_row))
            raise InvalidInput(
                f"row {row} holds {int(per_row[row])} examples; a padded batch holds one per"
                ' row — pack with policy="padded" or call forward_packed'
            )
        return self.forward_packed(batch)

    def forward_separate(self, example: SequenceExample) -> torch.Tensor:
        """Logits (L, V) of one example alone, in a single row of exactly its length."""
        config = PackConfig(capacity=len(example), max_rows_per_batch=1)
        epoch = pack_examples(example.partition, [example], example.binding, config)
        return self.forward_packed(epoch.batches[0])[0]

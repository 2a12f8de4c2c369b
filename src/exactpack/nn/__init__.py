"""PyTorch layer: attention backends over packed layouts (the tiny decoder and its checks
live in :mod:`exactpack.verify`)."""

# Importing the backend modules registers "varlen", "flex", "flash" and "auto";
# flex and flash import their kernels only when called.
from exactpack.nn import auto, flash, flex, varlen  # noqa: F401
from exactpack.nn.attention import BACKENDS, AttentionLayout, attention, register_backend

__all__ = ["BACKENDS", "AttentionLayout", "attention", "register_backend"]

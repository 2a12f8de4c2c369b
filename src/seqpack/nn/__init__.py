"""PyTorch layer: attention backends over packed layouts, the tiny decoder, verification."""

from .attention import BACKENDS, AttentionLayout, attention, register_backend

__all__ = ["BACKENDS", "AttentionLayout", "attention", "register_backend"]

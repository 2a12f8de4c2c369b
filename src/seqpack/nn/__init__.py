"""PyTorch layer: attention backends over packed layouts, the tiny decoder, verification."""

from .attention import BACKENDS, AttentionLayout, attention, register_backend
from .decoder import PROFILES, DecoderConfig, TinyDecoder

__all__ = [
    "BACKENDS",
    "PROFILES",
    "AttentionLayout",
    "DecoderConfig",
    "TinyDecoder",
    "attention",
    "register_backend",
]

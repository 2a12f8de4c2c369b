"""PyTorch layer: attention backends over packed layouts, the tiny decoder, verification."""

# Importing the backend modules registers "varlen", "flex", "flash" and "auto";
# flex and flash import their kernels only when called.
from seqpack.nn import auto, flash, flex, varlen  # noqa: F401
from seqpack.nn.attention import BACKENDS, AttentionLayout, attention, register_backend
from seqpack.nn.decoder import PROFILES, DecoderConfig, TinyDecoder

__all__ = [
    "BACKENDS",
    "PROFILES",
    "AttentionLayout",
    "DecoderConfig",
    "TinyDecoder",
    "attention",
    "register_backend",
]

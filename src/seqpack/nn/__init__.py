"""PyTorch layer: attention backends over packed layouts (the tiny decoder and its checks
live in :mod:`seqpack.verify`)."""

# Importing the backend modules registers "varlen", "flex", "flash" and "auto";
# flex and flash import their kernels only when called.
from seqpack._lazy import lazy_exports
from seqpack.nn import auto, flash, flex, varlen  # noqa: F401
from seqpack.nn.attention import BACKENDS, AttentionLayout, attention, register_backend

__all__ = ["BACKENDS", "AttentionLayout", "attention", "register_backend"]

_MOVED = dict.fromkeys(("PROFILES", "DecoderConfig", "TinyDecoder"), "seqpack.verify.decoder")
__getattr__, _ = lazy_exports(__name__, {}, _MOVED)

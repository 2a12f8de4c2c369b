"""What a task needs to know about its worker: its node (:func:`node_of_task`), its
threads (:func:`limit_tokenizer_threads`: the Rust pool sized to the task's CPUs, as Ray
does for OpenMP, else ``n`` one-CPU tasks each start ``n`` threads), its encoder
(:func:`task_tokenizer`: ``encode_batch_fast``, the same ids without offsets/strings).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from seqpack.io.tokenizers import HFTokenizer, Tokenizer


def _ray_worker() -> Any:
    """The ``ray`` module when this process is a connected Ray worker or driver, else None."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def node_of_task() -> dict[str, str]:
    """``{"node": Ray node id (hex), "node_ip": its address}``; off Ray, the host name."""
    ray = _ray_worker()
    if ray is None:
        return {"node": socket.gethostname(), "node_ip": ""}
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
    }


def limit_tokenizer_threads() -> None:
    """Size the Rust thread pool (``RAYON_NUM_THREADS``) to the task's CPUs, unless set
    (before the worker's first parallel encode: Rust builds its pool once a process)."""
    ray = _ray_worker()
    if ray is None or "RAYON_NUM_THREADS" in os.environ:
        return
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    os.environ["RAYON_NUM_THREADS"] = str(max(1, math.floor(cpus)))


class FastTokenizer:
    """A ``tokenizers`` tokenizer encoding with ``encode_batch_fast``: the same ids and
    identity as the :class:`~seqpack.io.tokenizers.HFTokenizer` it wraps, without the
    per-token offsets and strings ``encode_batch`` also builds."""

    def __init__(self, wrapped: HFTokenizer) -> None:
        self.backend = wrapped.backend
        self.identity = wrapped.identity
        self.vocab_size = wrapped.vocab_size

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids int32 [Σn] and offsets int64 [k+1] (BOS/EOS as the post-processor adds)."""
        encodings = self.backend.encode_batch_fast(list(texts), add_special_tokens=True)
        ids = pa.array([e.ids for e in encodings], type=pa.large_list(pa.int32()))
        offsets = ids.offsets.to_numpy()
        return ids.values.to_numpy(zero_copy_only=False), offsets


def task_tokenizer(tokenizer: Tokenizer | None) -> Tokenizer | None:
    """The tokenizer a task encodes with: :class:`FastTokenizer` where it applies."""
    if (
        isinstance(tokenizer, HFTokenizer)
        and tokenizer.kind == "tokenizers"
        and hasattr(tokenizer.backend, "encode_batch_fast")
    ):
        return FastTokenizer(tokenizer)
    return tokenizer

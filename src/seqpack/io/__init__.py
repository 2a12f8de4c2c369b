"""Files in and out: readers (JSON Lines, Parquet, ``datasets``), tokenizers, the packed store.

Needs pyarrow (``pip install 'seqpack[hf]'``) except for
:mod:`seqpack.io.tokenizers`, whose byte tokenizer is NumPy only. Names are
loaded on first use, so importing one submodule never imports the others.

=====================  =========================================================
module                 holds
=====================  =========================================================
``readers``            any input -> Arrow table -> :class:`Documents`
``documents``          :class:`Documents`, :class:`Origin`, the binding of a read
``jsonl``              the guarded JSON Lines reader
``tokenizers``         the byte tokenizer and local Hugging Face tokenizers
``shards``             the packed-row Parquet schema, one shard written or read
``store``              the packed directory: write, load, verify
``atomic``             hidden build folders, one-rename publication, recovery
=====================  =========================================================
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "COLUMNS": "readers",
    "read_arrow": "readers",
    "read_documents": "readers",
    "documents_from_arrow": "readers",
    "load_examples": "readers",
    "Documents": "documents",
    "Origin": "documents",
    "resolve_binding": "documents",
    "ByteTokenizer": "tokenizers",
    "load_tokenizer": "tokenizers",
    "PackedStore": "store",
    "load_packed": "store",
    "write_packed": "store",
}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)


def __dir__() -> list[str]:
    return sorted(_NAMES)

"""Files in and out: readers (JSON Lines, Parquet, ``datasets``), tokenizers, the packed store.

Needs pyarrow (``pip install 'seqpack[hf]'``) except for
:mod:`seqpack.io.tokenizers`, whose byte tokenizer is NumPy only. Names are
loaded on first use, so importing one submodule never imports the others;
``docs/architecture.md`` says which module holds what.
"""

from __future__ import annotations

from seqpack._lazy import lazy_exports

_NAMES = {
    "COLUMNS": "columns",
    "read_arrow": "readers",
    "read_documents": "readers",
    "documents_from_arrow": "columns",
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

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

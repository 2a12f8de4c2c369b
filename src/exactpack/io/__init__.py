"""Files in and out: readers (JSON Lines, Parquet, ``datasets``), tokenizers, the packed store.

Needs pyarrow (``pip install 'exactpack[hf]'``) except for
:mod:`exactpack.io.tokenizers`, whose byte tokenizer is NumPy only. Names are
loaded on first use, so importing one submodule never imports the others;
``docs/architecture.md`` says which module holds what.
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_NAMES = {
    **dict.fromkeys(("read_documents", "load_examples"), "readers"),
    **dict.fromkeys(("PackedStore", "load_packed", "write_packed"), "store"),
}

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

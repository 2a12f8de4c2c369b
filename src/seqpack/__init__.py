"""seqpack: pack tokenized examples into shared rows without joining their contexts.

The package is layered; each folder imports only the ones below it::

    cli                      the command line
    verify                   proof tooling: fixture, trace, figures, tiny decoder, verify
    ray                      the pipeline as Ray tasks, for clusters
    hf                       Hugging Face: datasets in/out, transformers adapter, collators
    training                 torch datasets, collators, samplers, loss normalisation
    nn                       attention backends over packed layouts
    pipeline                 read -> plan -> materialise -> write; PackOptions
    io                       readers, tokenizers, the packed store (pyarrow)
    core                     examples, policies, batches, permission, loss (NumPy only)

``import seqpack`` loads the NumPy core only (the names below); the other
layers are imported explicitly (``seqpack.nn`` needs PyTorch, ``seqpack.io``
and ``seqpack.pipeline`` pyarrow, ``seqpack.hf`` transformers and datasets).
"""

from seqpack import _compat
from seqpack.core.batch import NO_SEGMENT, PAD_CELL, Occurrences, PackedBatch
from seqpack.core.binding import Binding, Split, data_digest
from seqpack.core.compact import (
    CompactRows,
    PackedEpoch,
    compact_rows,
    materialize,
    pack_examples,
)
from seqpack.core.config import PackConfig
from seqpack.core.errors import (
    BindingMismatch,
    BudgetExceeded,
    EmptyObjective,
    InvalidInput,
    NotAvailable,
    OversizedExample,
    SeqpackError,
    SplitMismatch,
)
from seqpack.core.examples import ExampleTable, SequenceExample, cut_long, long_ranges
from seqpack.core.permission import CuSeqlens, KeyRanges
from seqpack.core.plan import Plan
from seqpack.core.policies import plan_rows
from seqpack.core.stream_packer import Placements, StreamPacker
from seqpack.io.tokenizers import ByteTokenizer, load_tokenizer
from seqpack.pipeline.options import PackOptions

__version__ = "0.2.0"

_compat.install()

__all__ = [
    "NO_SEGMENT",
    "PAD_CELL",
    "Binding",
    "BindingMismatch",
    "BudgetExceeded",
    "ByteTokenizer",
    "CompactRows",
    "CuSeqlens",
    "EmptyObjective",
    "ExampleTable",
    "InvalidInput",
    "KeyRanges",
    "NotAvailable",
    "Occurrences",
    "OversizedExample",
    "PackConfig",
    "PackOptions",
    "PackedBatch",
    "PackedEpoch",
    "Placements",
    "Plan",
    "SeqpackError",
    "SequenceExample",
    "Split",
    "SplitMismatch",
    "StreamPacker",
    "compact_rows",
    "cut_long",
    "data_digest",
    "load_tokenizer",
    "long_ranges",
    "materialize",
    "pack_examples",
    "plan_rows",
]


# vocab codemod: the 0.2 names, kept for one release
from seqpack._renames import renamed_names  # noqa: E402

__getattr__ = renamed_names(
    __name__,
    {
        "Partition": "Split",
        "PartitionMismatch": "SplitMismatch",
        "split_digest": "data_digest",
        "split_long": "cut_long",
    },
)

"""seqpack: pack tokenized examples into shared rows without joining their contexts.

Core layers import NumPy only; ``seqpack.nn`` and ``seqpack.training`` need PyTorch.
The data pipeline (``seqpack.io``, ``seqpack.store``, ``seqpack.pipeline``,
``seqpack.hf``) needs pyarrow (``pip install seqpack[hf]``) and is imported explicitly.
"""

from .batch import (
    NO_SEGMENT,
    PAD_CELL,
    Occurrences,
    PackConfig,
    PackedBatch,
    PackedEpoch,
    materialize,
    pack_examples,
)
from .compact import CompactRows, compact_rows
from .errors import (
    BindingMismatch,
    BudgetExceeded,
    EmptyObjective,
    InvalidInput,
    NotAvailable,
    OversizedExample,
    PartitionMismatch,
    SeqpackError,
)
from .examples import (
    Binding,
    ExampleTable,
    Partition,
    SequenceExample,
    long_ranges,
    split_digest,
    split_long,
)
from .permission import CuSeqlens, KeyRanges
from .policies import Plan, plan_rows
from .stream_packer import Placements, StreamPacker
from .tokenizers import ByteTokenizer, load_tokenizer

__version__ = "0.1.0"

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
    "PackedBatch",
    "PackedEpoch",
    "Partition",
    "PartitionMismatch",
    "Placements",
    "Plan",
    "SeqpackError",
    "SequenceExample",
    "StreamPacker",
    "compact_rows",
    "load_tokenizer",
    "long_ranges",
    "materialize",
    "pack_examples",
    "plan_rows",
    "split_digest",
    "split_long",
]

"""seqpack: pack tokenized examples into shared rows without joining their contexts.

Core layers import NumPy only; ``seqpack.nn`` and ``seqpack.training`` need PyTorch.
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
from .examples import Binding, ExampleTable, Partition, SequenceExample, split_digest
from .permission import CuSeqlens, KeyRanges
from .policies import Plan, plan_rows

__version__ = "0.1.0"

__all__ = [
    "NO_SEGMENT",
    "PAD_CELL",
    "Binding",
    "BindingMismatch",
    "BudgetExceeded",
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
    "Plan",
    "SeqpackError",
    "SequenceExample",
    "materialize",
    "pack_examples",
    "plan_rows",
    "split_digest",
]

"""exactpack: pack tokenized examples into shared rows without joining their contexts.

The package is layered; each folder imports only the ones below it::

    cli                      the command line
    verify                   proof tooling: fixture, trace, figures, tiny decoder, verify
    trl                      TRL's trainers on tree rows (exactpack.trl.pack)
    ray                      the pipeline as Ray tasks, for clusters
    hf                       Hugging Face: datasets in/out, transformers adapter, collators
    training                 torch datasets, collators, samplers, loss normalisation
    nn                       attention backends over packed layouts
    pipeline                 read -> plan -> materialise -> write; PackOptions
    io                       readers, tokenizers, the packed store (pyarrow)
    core                     examples, policies, batches, permission, loss (NumPy only)

``import exactpack`` loads the NumPy core only (the names below); the other
layers are imported explicitly (``exactpack.nn`` needs PyTorch, ``exactpack.io``
and ``exactpack.pipeline`` pyarrow, ``exactpack.hf`` transformers and datasets).
"""

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import Binding, Split, data_digest
from exactpack.core.compact import materialize, pack_examples
from exactpack.core.config import PackConfig
from exactpack.core.errors import (
    BindingMismatch,
    BudgetExceeded,
    EmptyObjective,
    ExactpackError,
    InvalidInput,
    NotAvailable,
    OversizedExample,
    SplitMismatch,
)
from exactpack.core.examples import ExampleTable, SequenceExample, cut_long
from exactpack.core.policies import plan_rows
from exactpack.core.stream_packer import StreamPacker
from exactpack.io.tokenizers import ByteTokenizer, load_tokenizer
from exactpack.pipeline.options import PackOptions

__version__ = "0.2.0"

__all__ = [
    "Binding",
    "BindingMismatch",
    "BudgetExceeded",
    "ByteTokenizer",
    "EmptyObjective",
    "ExactpackError",
    "ExampleTable",
    "InvalidInput",
    "NotAvailable",
    "OversizedExample",
    "PackConfig",
    "PackOptions",
    "PackedBatch",
    "SequenceExample",
    "Split",
    "SplitMismatch",
    "StreamPacker",
    "cut_long",
    "data_digest",
    "load_tokenizer",
    "materialize",
    "pack_examples",
    "plan_rows",
]

"""Training integration: data loading, distributed scheduling, loss normalisation.

``PackedBatches`` (a packed directory) or ``StreamDataset`` (documents packed
on the fly) -> ``RowSampler`` slots (every rank the same number of
micro-batches, every row once) -> ``PackedCollator`` tensors ->
``micro_batch_loss`` (raw sum divided by the whole step's eligible count).
"""

from seqpack.training.distributed import (
    RowSampler,
    RowStats,
    Slot,
    StepSchedule,
    row_costs,
    schedule_rows,
    step_eligible_counts,
)
from seqpack.training.global_loss import labels_nll_sum, loss_factor, micro_batch_loss, normalize
from seqpack.training.packed_data import (
    PackedBatches,
    PackedCollator,
    PackedDataset,
    ScheduledBatch,
    concat_batches,
    decoder_inputs,
    empty_batch,
    layout_from_features,
    move_features,
    select_rows,
)
from seqpack.training.stream import StreamDataset

__all__ = [
    "PackedBatches",
    "PackedCollator",
    "PackedDataset",
    "RowSampler",
    "RowStats",
    "ScheduledBatch",
    "Slot",
    "StepSchedule",
    "StreamDataset",
    "concat_batches",
    "decoder_inputs",
    "empty_batch",
    "labels_nll_sum",
    "layout_from_features",
    "loss_factor",
    "micro_batch_loss",
    "move_features",
    "normalize",
    "row_costs",
    "schedule_rows",
    "select_rows",
    "step_eligible_counts",
]

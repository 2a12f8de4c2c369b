"""Training integration: data loading, distributed scheduling, loss normalisation.

``PackedBatches`` (a packed directory) or ``StreamDataset`` (documents packed
on the fly) -> ``RowSampler`` slots (every rank the same number of
micro-batches, every row once) -> ``PackedCollator`` tensors ->
``micro_batch_loss`` (raw sum divided by the whole step's eligible count).
"""

from __future__ import annotations

from seqpack._lazy import lazy_exports

_NAMES = {
    "RowSampler": "distributed",
    "RowStats": "distributed",
    "Slot": "distributed",
    "StepSchedule": "distributed",
    "row_costs": "distributed",
    "schedule_rows": "distributed",
    "step_eligible_counts": "distributed",
    "labels_nll_sum": "global_loss",
    "loss_factor": "global_loss",
    "micro_batch_loss": "global_loss",
    "normalize": "global_loss",
    "PackedBatches": "packed_data",
    "PackedCollator": "packed_data",
    "PackedDataset": "packed_data",
    "ScheduledBatch": "packed_data",
    "concat_batches": "packed_data",
    "decoder_inputs": "packed_data",
    "empty_batch": "packed_data",
    "layout_from_features": "packed_data",
    "move_features": "packed_data",
    "select_rows": "packed_data",
    "StreamDataset": "stream",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

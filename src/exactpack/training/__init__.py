"""Training integration: data loading, distributed scheduling, loss normalisation.

``PackedBatches`` (a packed directory) or ``StreamDataset`` (documents packed
on the fly) -> ``RowSampler`` slots (every rank the same number of
micro-batches, every row once) -> ``PackedCollator`` tensors ->
``micro_batch_loss`` (raw sum divided by the whole step's eligible count).
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_EXPORTS = {
    "balance": "CostModel balanced_groups",
    "distributed": "RowSampler RowStats Slot StepSchedule row_costs schedule_rows"
    " step_eligible_counts",
    "global_loss": "labels_nll_sum loss_factor micro_batch_loss normalize",
    "packed_data": "PackedBatches PackedCollator ScheduledBatch concat_batches"
    " decoder_inputs empty_batch layout_from_features move_features select_rows",
    "stream": "StreamDataset",
}
_NAMES = {name: module for module, names in _EXPORTS.items() for name in names.split()}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

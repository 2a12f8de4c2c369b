"""Training integration: data loading, distributed scheduling, loss normalisation.

``PackedBatches`` (a packed directory) or ``StreamDataset`` (documents packed
on the fly) -> ``RowSampler`` slots (every rank the same number of
micro-batches, every row once) -> ``PackedCollator`` tensors ->
``micro_batch_loss`` (raw sum divided by the whole step's eligible count).
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_EXPORTS = {
    "distributed": "RowSampler RowStats",
    "global_loss": "micro_batch_loss",
    "packed_data": "PackedBatches PackedCollator ScheduledBatch decoder_inputs",
    "stream": "StreamDataset",
}
_NAMES = {name: module for module, names in _EXPORTS.items() for name in names.split()}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

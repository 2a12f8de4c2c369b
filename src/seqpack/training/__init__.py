"""Training integration: data loading, distributed scheduling, loss normalisation."""

from .distributed import StepSchedule, row_costs, schedule_rows

__all__ = ["StepSchedule", "row_costs", "schedule_rows"]

"""The engine's hook for executing steps instead of pricing them (GPU-in-the-loop replay).

An engine built with an executor hands it every step it schedules, before the step's sequences
advance, and advances its clock by the seconds the executor returns instead of the cost model's
prediction (which is still recorded in the step's ``t_*_s`` columns). Spans are off: every step
is executed. The implementation with a model on a GPU is `validation.step_executor`; the
simulator itself never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from blocksim.scheduling.outputs import SchedulerOutputs


@runtime_checkable
class StepExecutor(Protocol):
    def execute(self, step: int, out: "SchedulerOutputs", predicted: dict[str, float]) -> float:
        """Run step `step` (its sequences' block tables and lengths as scheduled, the block moves of
        `out`); return its measured duration in seconds. `predicted`: the cost model's components."""

    def save(self, out_dir) -> None:
        """Write the executor's own records (measured times) into the run directory."""

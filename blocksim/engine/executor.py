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


# An executor of a run with KV tiers also has `attach_tiers(store)` (the engine's
# `blocksim.memory.tiers.TierStore`, once, before the first step), which attaches a mover to the
# store (`TierStore.attach_mover`): the executor performs each tier move as the store issues it
# (the loads and write-backs issued while a step is scheduled before `execute`, the stores of the
# chunks it computed after it) and the store's transfers last the measured times.

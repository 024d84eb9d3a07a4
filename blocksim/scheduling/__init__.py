"""Continuous-batching schedulers: vLLM v0's queues and preemption (`scheduler`), the step's
outputs and budget (`outputs`), preemption victims (`victims`) and the variants (`variants`:
priority, SJF, Orca, static batching)."""

"""Continuous-batching schedulers (vLLM v0's queues and preemption) and their variants
(`scheduler`), and what a step decides under which budget (`outputs`)."""

"""Continuous-batching schedulers (vLLM v0's queues and preemption) and their variants."""

"""Which vLLM-layout kernel runs a decode: v1 (one thread block per head and sequence, the whole
context in shared memory) or v2 (512-token partitions, then a reduce)."""

from __future__ import annotations

import torch

PARTITION_SIZE = 512        # tokens per partition of the v2 kernel
V1_MAX_CONTEXT = 8192       # longest context that the automatic choice sends to v1


def choose_version(num_seqs: int, num_heads: int, max_context_len: int) -> str:
    """vLLM's rule: v1 (one thread block per head and sequence) when the longest context fits
    v1 comfortably (<= 8192 tokens) and either it is a single partition or there are already more
    than 512 (sequence, head) pairs to fill the GPU; otherwise v2 splits contexts into 512-token
    partitions for more parallelism."""
    partitions = -(-max_context_len // PARTITION_SIZE)
    if max_context_len <= V1_MAX_CONTEXT and (partitions == 1 or num_seqs * num_heads > 512):
        return "v1"
    return "v2"


def v1_max_context_len(device: torch.device | int | None = None, block_size: int = 16) -> int:
    """Longest context v1 can take on ``device``: one float of shared memory per token."""
    props = torch.cuda.get_device_properties(device)
    limit = getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024
    static = 2 * 1024  # the query and reduction scratch, at most ~1.1 KB
    return (limit - static) // 4 // block_size * block_size

"""Paged-attention and KV-cache kernels that execute blocksim's block-management decisions.

CUDA tensors run the CUDA kernels (built just in time on first use, see ``_build.py``); CPU
tensors run the PyTorch reference (``reference.py``). Importing this package needs torch but no
GPU and builds nothing.

    key_cache, value_cache = kernels.allocate_kv_cache(num_blocks, num_kv_heads, head_size,
                                                       block_size, torch.float16, "cuda")
    kernels.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    out = kernels.paged_attention(None, query, key_cache, value_cache, num_kv_heads, scale,
                                  block_tables, context_lens, block_size, max_context_len)
    kernels.copy_blocks(key_caches, value_caches, {src: [dst]})
    kernels.swap_blocks(gpu_key_cache, cpu_key_cache, [(gpu_block, cpu_block)])
"""

from .layout import (SUPPORTED_BLOCK_SIZES, SUPPORTED_DTYPES, SUPPORTED_HEAD_SIZES, allocate_kv_cache,
                     key_cache_shape, kv_x, value_cache_shape)
from .ops import (PARTITION_SIZE, V1_MAX_CONTEXT, choose_version, copy_blocks, paged_attention,
                  reshape_and_cache, swap_blocks)

__all__ = [
    "PARTITION_SIZE", "SUPPORTED_BLOCK_SIZES", "SUPPORTED_DTYPES", "SUPPORTED_HEAD_SIZES", "V1_MAX_CONTEXT",
    "allocate_kv_cache", "choose_version", "copy_blocks", "key_cache_shape", "kv_x", "paged_attention",
    "reshape_and_cache", "swap_blocks", "value_cache_shape",
]

"""Paged-attention and KV-cache kernels that execute blocksim's block-management decisions.

CUDA tensors run the CUDA kernels (built just in time on first use, see ``_build.py``); CPU
tensors run the PyTorch reference (``reference.py``). Importing this package needs neither torch nor a GPU and builds nothing: the names below load
on first use (so `blocksim validate` can be registered without torch).

    key_cache, value_cache = kernels.allocate_kv_cache(num_blocks, num_kv_heads, head_size,
                                                       block_size, torch.float16, "cuda")
    kernels.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    out = kernels.paged_attention(None, query, key_cache, value_cache, num_kv_heads, scale,
                                  block_tables, context_lens, block_size, max_context_len)
    kernels.copy_blocks(key_caches, value_caches, {src: [dst]})
    kernels.swap_blocks(gpu_key_cache, cpu_key_cache, [(gpu_block, cpu_block)])
"""

import importlib

_EXPORTS = {
    "SUPPORTED_BLOCK_SIZES": "kernels.layout", "SUPPORTED_DTYPES": "kernels.layout",
    "SUPPORTED_HEAD_SIZES": "kernels.layout", "allocate_kv_cache": "kernels.layout",
    "key_cache_shape": "kernels.layout", "kv_x": "kernels.layout", "value_cache_shape": "kernels.layout",
    "PARTITION_SIZE": "kernels.ops", "V1_MAX_CONTEXT": "kernels.ops", "choose_version": "kernels.ops",
    "copy_blocks": "kernels.ops", "paged_attention": "kernels.ops", "reshape_and_cache": "kernels.ops",
    "swap_blocks": "kernels.ops",
    "FAST_BLOCK_SIZES": "kernels.fast", "allocate_fast_kv_cache": "kernels.fast",
    "choose_launch": "kernels.fast", "choose_split_tokens": "kernels.fast", "fast_cache_shape": "kernels.fast",
    "fp8_scale": "kernels.fast",
    "reshape_and_cache_fast": "kernels.fast",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value

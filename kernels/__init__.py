"""Paged-attention and KV-cache kernels in two families, sharing the CUDA build (``_build.py``),
the argument checks (``_checks.py``) and the sources (``csrc/``):

* ``kernels.vllm``: vLLM's paged layout; v1 / v2 paged attention, ``reshape_and_cache``,
  ``copy_blocks``, ``swap_blocks``;
* ``kernels.fast``: the fast decode kernel over ``[num_blocks, block_size, num_kv_heads,
  head_size]`` caches (``impl="fast"``), float16 / bfloat16 or float8, and the paged prefill
  kernel over the same caches (``paged_prefill_attention``: chunked prefill, prefix caching).

Each family has ``layout``, ``launch``, ``ops`` and ``reference`` modules. CUDA tensors run the
CUDA kernels (built just in time on first use); CPU tensors run the PyTorch reference. Importing
this package needs neither torch nor a GPU and builds nothing: the names below load on first use
(so `blocksim validate` can be registered without torch). ``kernels/DESIGN.md`` describes the
design; ``python -m kernels.bench`` measures it.

    key_cache, value_cache = kernels.allocate_kv_cache(num_blocks, num_kv_heads, head_size,
                                                       block_size, torch.float16, "cuda")
    kernels.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    out = kernels.paged_attention(None, query, key_cache, value_cache, num_kv_heads, scale,
                                  block_tables, context_lens, block_size, max_context_len)
    out = kernels.paged_prefill_attention(None, query, key_cache, value_cache, num_kv_heads, scale,
                                          block_tables, query_start_loc, context_lens, block_size)
    kernels.copy_blocks(key_caches, value_caches, {src: [dst]})
    kernels.swap_blocks(gpu_key_cache, cpu_key_cache, [(gpu_block, cpu_block)])
"""

import importlib

_EXPORTS = {
    "SUPPORTED_BLOCK_SIZES": "kernels.vllm.layout", "SUPPORTED_DTYPES": "kernels.vllm.layout",
    "SUPPORTED_HEAD_SIZES": "kernels.vllm.layout", "allocate_kv_cache": "kernels.vllm.layout",
    "key_cache_shape": "kernels.vllm.layout", "kv_x": "kernels.vllm.layout",
    "value_cache_shape": "kernels.vllm.layout",
    "PARTITION_SIZE": "kernels.vllm.launch", "V1_MAX_CONTEXT": "kernels.vllm.launch",
    "choose_version": "kernels.vllm.launch",
    "copy_blocks": "kernels.vllm.ops", "reshape_and_cache": "kernels.vllm.ops", "swap_blocks": "kernels.vllm.ops",
    "paged_attention": "kernels.attention",
    "FAST_BLOCK_SIZES": "kernels.fast.layout", "allocate_fast_kv_cache": "kernels.fast.layout",
    "fast_cache_shape": "kernels.fast.layout", "fp8_scale": "kernels.fast.layout",
    "choose_launch": "kernels.fast.launch", "choose_split_tokens": "kernels.fast.launch",
    "reshape_and_cache_fast": "kernels.fast.ops",
    "PREFILL_HEAD_SIZES": "kernels.fast.prefill", "paged_prefill_attention": "kernels.fast.prefill",
    "choose_prefill_config": "kernels.fast.prefill",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value

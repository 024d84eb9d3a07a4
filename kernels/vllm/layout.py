"""The vLLM paged KV-cache layout: shapes, the element packing factor ``x``, and allocation.

A cache of ``num_blocks`` physical blocks, each holding ``block_size`` tokens of every KV head::

    key cache   [num_blocks, num_kv_heads, head_size // x, block_size, x]
    value cache [num_blocks, num_kv_heads, head_size, block_size]

with ``x = 16 // element_size`` (4 for float32, 8 for float16 / bfloat16), so that the ``x``
consecutive head dimensions of one token's key are one 16-byte load. Token ``t`` of a sequence
lives in physical block ``block_table[t // block_size]`` at offset ``t % block_size``; its slot is
``block * block_size + offset``.
"""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SUPPORTED_HEAD_SIZES = (32, 64, 80, 96, 112, 120, 128, 192, 256)
SUPPORTED_BLOCK_SIZES = (8, 16, 32)


def kv_x(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in 16 bytes: the innermost dimension of the key cache."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def key_cache_shape(num_blocks: int, num_kv_heads: int, head_size: int, block_size: int,
                    dtype: torch.dtype) -> tuple[int, ...]:
    x = kv_x(dtype)
    return (num_blocks, num_kv_heads, head_size // x, block_size, x)


def value_cache_shape(num_blocks: int, num_kv_heads: int, head_size: int,
                      block_size: int) -> tuple[int, ...]:
    return (num_blocks, num_kv_heads, head_size, block_size)


def allocate_kv_cache(num_blocks: int, num_kv_heads: int, head_size: int, block_size: int,
                      dtype: torch.dtype = torch.float16, device: str | torch.device = "cuda", *,
                      pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocates one layer's ``(key_cache, value_cache)`` in the layout above (uninitialised).

    ``pin_memory=True`` (CPU only) gives page-locked memory, which ``swap_blocks`` requires for
    the CPU side of a swap.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype} not supported; use one of {SUPPORTED_DTYPES}")
    if head_size % kv_x(dtype):
        raise ValueError(f"head_size {head_size} is not a multiple of x={kv_x(dtype)} for {dtype}")
    device = torch.device(device)
    if pin_memory and device.type != "cpu":
        raise ValueError("pin_memory applies to CPU caches only")
    key = torch.empty(key_cache_shape(num_blocks, num_kv_heads, head_size, block_size, dtype),
                      dtype=dtype, device=device, pin_memory=pin_memory)
    value = torch.empty(value_cache_shape(num_blocks, num_kv_heads, head_size, block_size),
                        dtype=dtype, device=device, pin_memory=pin_memory)
    return key, value


def blocks_to_dense(key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the given physical blocks, in order, as dense
    ``[len(block_ids) * block_size, num_kv_heads, head_size]`` tensors (copies)."""
    nb, kvh, hx, bs, x = key_cache.shape
    k = key_cache[block_ids]                       # [n, kvh, hs/x, bs, x]
    k = k.permute(0, 3, 1, 2, 4).reshape(-1, kvh, hx * x)
    v = value_cache[block_ids]                     # [n, kvh, hs, bs]
    v = v.permute(0, 3, 1, 2).reshape(-1, kvh, hx * x)
    return k, v

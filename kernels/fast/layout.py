"""The fast kernel's cache layout: storages, allocation and float8 scales.

Layout (one layer, key and value alike)::

    [num_blocks, block_size, num_kv_heads, head_size]

Token ``t`` of a sequence is row ``t % block_size`` of block ``block_table[t // block_size]``;
its slot is ``block * block_size + offset`` as in the vLLM layout. The kernel reads the caches
through their strides, so several storage orders work: ``"NHD"`` (contiguous as written above,
all KV heads of a token side by side: vLLM's flash layout, and one contiguous row per token for
``reshape_and_cache_fast``), ``"HND"`` (``[num_blocks, num_kv_heads, block_size, head_size]``
storage, handed over as a transposed view, so one block of one KV head is contiguous) and
``"H2ND"`` (``[num_blocks, num_kv_heads, 2, block_size, head_size]``: one storage for both caches,
the keys and values of one block of one KV head side by side). H2ND is the default: each warp's
key and value lines of a block lie next to each other in DRAM, which measured fastest
(``kernels/DESIGN.md``).

Element types: float16 or bfloat16 caches with a query of the same type, or float8_e4m3fn caches
(per-tensor scales ``k_scale``, ``v_scale``: the cache holds ``key / k_scale``) with a float16
query; float32 caches on the CPU reference only. Block sizes: powers of two from 8 to 256.
"""

from __future__ import annotations

import torch

FAST_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
FAST_DTYPES = (torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
STORAGES = ("NHD", "HND", "H2ND")
DEFAULT_STORAGE = "H2ND"


def fast_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
    return (num_blocks, block_size, num_kv_heads, head_size)


def allocate_fast_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           dtype: torch.dtype = torch.float16, device: str | torch.device = "cuda", *,
                           storage: str = DEFAULT_STORAGE) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's ``(key_cache, value_cache)``, each of shape
    ``[num_blocks, block_size, num_kv_heads, head_size]`` (uninitialised), stored ``"H2ND"``
    (the default: views of one ``[num_blocks, num_kv_heads, 2, block_size, head_size]`` storage),
    ``"HND"`` (transposed views of ``[num_blocks, num_kv_heads, block_size, head_size]`` storages)
    or ``"NHD"`` (contiguous); see the module docstring."""
    if dtype not in (*FAST_DTYPES, torch.float32, FP8):
        raise ValueError(f"dtype {dtype} not supported; use float16, bfloat16, float32 (CPU) or {FP8}")
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")

    if storage == "H2ND":
        both = torch.empty(num_blocks, num_kv_heads, 2, block_size, head_size, dtype=dtype, device=device)
        return both[:, :, 0].transpose(1, 2), both[:, :, 1].transpose(1, 2)

    def one():
        if storage == "NHD":
            return torch.empty(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype, device=device)
        return torch.empty(num_blocks, num_kv_heads, block_size, head_size, dtype=dtype, device=device).transpose(1, 2)
    return one(), one()


def fp8_scale(x: torch.Tensor) -> float:
    """A per-tensor scale that maps ``x``'s largest magnitude to float8_e4m3fn's largest finite
    value (448); 1.0 for an all-zero tensor."""
    amax = float(x.detach().abs().max()) if x.numel() else 0.0
    return amax / FP8_MAX if amax > 0 else 1.0

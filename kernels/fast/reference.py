"""The fast kernel's layout in plain PyTorch: the CPU backend of ``impl="fast"`` and the
yardstick of the fast kernel's tests.

Caches are ``[num_blocks, block_size, num_kv_heads, head_size]`` (any strides, see ``layout.py``),
float16 / bfloat16 / float32, or float8_e4m3fn holding ``value / scale`` with one float scale per
tensor (``k_scale``, ``v_scale``). No argument checking: call through ``kernels.fast.ops`` for
validated input. Attention is computed in ``compute_dtype`` from the cache's stored values (times
their scale).
"""

from __future__ import annotations

import torch

from .._reference import attend_sequences
from .layout import FP8, FP8_MAX


def gather_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
              context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's cached keys and values, ``[context_len, num_kv_heads, head_size]`` each,
    in the caches' dtype (copies)."""
    block_size = key_cache.shape[1]
    n_blocks = -(-int(context_len) // block_size)
    ids = block_table[:n_blocks].to(device=key_cache.device, dtype=torch.long)
    k = key_cache[ids].flatten(0, 1)[:context_len]
    v = value_cache[ids].flatten(0, 1)[:context_len]
    return k, v


def paged_attention(out: torch.Tensor | None, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                    max_context_len: int | None, alibi_slopes: torch.Tensor | None = None, *,
                    k_scale: float = 1.0, v_scale: float = 1.0,
                    compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``out[s, h] = softmax(scale * q[s, h] . K_s^T + alibi) V_s`` over the ``context_lens[s]``
    cached tokens of KV head ``h // (num_heads // num_kv_heads)``, with ``K = k_scale * key_cache``
    and ``V = v_scale * value_cache``; writes and returns ``out``."""
    return attend_sequences(out, query, lambda table, ctx: gather_kv(key_cache, value_cache, table, ctx),
                            scale, block_tables, context_lens, alibi_slopes, compute_dtype, k_scale, v_scale)


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x / scale`` rounded to float8_e4m3fn, saturated at +-448 (e4m3fn has no infinity)."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                      k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Token ``i``'s key and value (``[num_tokens, num_kv_heads, head_size]``) go to slot
    ``slot_mapping[i]`` (``block * block_size + offset``); negative slots are padding. An fp8
    cache stores ``key / k_scale`` and ``value / v_scale``."""
    block_size = key_cache.shape[1]
    slots = slot_mapping.to(device=key_cache.device, dtype=torch.long)
    keep = torch.nonzero(slots >= 0).flatten()
    slots = slots[keep]
    blk, off = slots // block_size, slots % block_size
    k = key.to(key_cache.device)[keep]
    v = value.to(value_cache.device)[keep]
    if key_cache.dtype == FP8:
        k, v = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    key_cache[blk, off] = k.to(key_cache.dtype)
    value_cache[blk, off] = v.to(value_cache.dtype)

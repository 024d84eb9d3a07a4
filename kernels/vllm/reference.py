"""The kernels' operations in plain PyTorch: the CPU backend of ``kernels`` and the yardstick of
the CUDA kernels' tests.

Each function takes the same arguments as its CUDA counterpart in ``kernels`` (see ``ops.py``)
and does no argument checking of its own: call it through ``kernels.paged_attention`` etc. for
validated input. Everything runs on whatever device the tensors are on (CPU in CI), and attention
is computed in ``compute_dtype`` (float32 by default) from the cache's stored values.
"""

from __future__ import annotations

import torch

from .._reference import attend_sequences
from .layout import blocks_to_dense


def gather_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
              context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's cached keys and values, ``[context_len, num_kv_heads, head_size]`` each."""
    block_size = value_cache.shape[-1]
    n_blocks = -(-int(context_len) // block_size)
    ids = block_table[:n_blocks].to(device=key_cache.device, dtype=torch.long)
    k, v = blocks_to_dense(key_cache, value_cache, ids)
    return k[:context_len], v[:context_len]


def paged_attention(out: torch.Tensor | None, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                    max_context_len: int | None, alibi_slopes: torch.Tensor | None = None, *,
                    compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Single-query attention of each sequence over its paged context; writes and returns ``out``.

    ``out[s, h] = softmax(scale * q[s, h] . K_s^T + alibi) V_s`` with ``K_s, V_s`` the keys and
    values of KV head ``h // (num_heads // num_kv_heads)`` over the ``context_lens[s]`` cached
    tokens, and ``alibi[t] = alibi_slopes[h] * (t - context_lens[s] + 1)``.
    """
    return attend_sequences(out, query, lambda table, ctx: gather_kv(key_cache, value_cache, table, ctx),
                            scale, block_tables, context_lens, alibi_slopes, compute_dtype)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Writes token ``i``'s key and value (``[num_tokens, num_kv_heads, head_size]``) into slot
    ``slot_mapping[i]`` of the caches; tokens with a negative slot are padding and skipped."""
    block_size = value_cache.shape[-1]
    x = key_cache.shape[-1]
    slots = slot_mapping.to(device=key_cache.device, dtype=torch.long)
    keep = slots >= 0
    slots = slots[keep]
    blk = slots // block_size
    off = slots % block_size
    n, kvh, hs = key.shape
    k = key.to(key_cache.device)[keep].reshape(-1, kvh, hs // x, x)
    v = value.to(value_cache.device)[keep]
    key_cache[blk, :, :, off, :] = k
    value_cache[blk, :, :, off] = v


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],
                block_mapping: torch.Tensor) -> None:
    """For every layer, block ``dst`` becomes a copy of block ``src`` for each ``(src, dst)`` row
    of ``block_mapping`` (``[num_pairs, 2]``). All sources are read before any destination is
    written."""
    mapping = block_mapping.to(torch.long)
    for cache in (*key_caches, *value_caches):
        m = mapping.to(cache.device)
        cache[m[:, 1]] = cache[m[:, 0]]


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Block ``d`` of ``dst`` becomes block ``s`` of ``src`` for each ``(s, d)`` row of
    ``block_mapping``; ``src`` and ``dst`` may be on different devices."""
    mapping = block_mapping.to(torch.long)
    src_ids = mapping[:, 0].to(src.device)
    dst_ids = mapping[:, 1].to(dst.device)
    dst[dst_ids] = src[src_ids].to(dst.device)

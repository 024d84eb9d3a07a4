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

ROWS_PER_STEP = 1 << 26  # paged_prefill_attention: logits (heads x queries x keys) computed per step


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


def paged_prefill_attention(out: torch.Tensor | None, query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            context_lens: torch.Tensor, alibi_slopes: torch.Tensor | None = None, *,
                            k_scale: float = 1.0, v_scale: float = 1.0,
                            compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Causal prefill attention of a varlen batch over its paged caches: sequence ``i``'s queries
    (rows ``query_start_loc[i]:query_start_loc[i+1]``, ``p_i`` of them) sit at positions
    ``c_i .. c_i + p_i - 1`` with ``c_i = context_lens[i] - p_i``; the query at position ``n``
    attends to keys ``0 .. n`` (``K = k_scale * key_cache``, ``V = v_scale * value_cache``) with the
    ALiBi bias ``slope * (t - n)`` of key ``t``. Computed in ``compute_dtype``; writes and returns
    ``out``."""
    if out is None:
        out = torch.empty_like(query)
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for s, ctx in enumerate(lens):
        q0, q1 = int(starts[s]), int(starts[s + 1])
        if q1 == q0:
            continue
        k, v = gather_kv(key_cache, value_cache, block_tables[s], int(ctx))
        k = k.to(compute_dtype).repeat_interleave(group, dim=1) * k_scale   # [ctx, heads, d]
        v = v.to(compute_dtype).repeat_interleave(group, dim=1) * v_scale
        cached = int(ctx) - (q1 - q0)
        rows = max(1, ROWS_PER_STEP // (num_heads * int(ctx)))  # queries per step: bounded logits
        for r0 in range(q0, q1, rows):
            r1 = min(q1, r0 + rows)
            q = query[r0:r1].to(device=k.device, dtype=compute_dtype)         # [n, heads, d]
            pos = torch.arange(cached + r0 - q0, cached + r1 - q0, device=k.device)  # the queries' positions
            seen = int(pos[-1]) + 1                                             # keys any of them sees
            logits = torch.einsum("phd,thd->hpt", q, k[:seen]) * scale
            rel = (torch.arange(seen, device=k.device)[None, :] - pos[:, None]).to(compute_dtype)  # [n, t]
            if alibi_slopes is not None:
                logits = logits + alibi_slopes.to(device=k.device, dtype=compute_dtype)[:, None, None] * rel
            probs = torch.softmax(logits.masked_fill(rel > 0, float("-inf")), dim=-1)
            out[r0:r1] = torch.einsum("hpt,thd->phd", probs, v[:seen]).to(device=out.device, dtype=out.dtype)
    return out

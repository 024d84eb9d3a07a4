"""Decode attention in plain PyTorch over keys and values already gathered from a cache: the
arithmetic both families' references (``vllm/reference.py``, ``fast/reference.py``) share."""

from __future__ import annotations

import torch


def attend_sequences(out: torch.Tensor | None, query: torch.Tensor, gather, scale: float,
                     block_tables: torch.Tensor, context_lens: torch.Tensor,
                     alibi_slopes: torch.Tensor | None, compute_dtype: torch.dtype,
                     k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Decode attention of each sequence over the keys and values ``gather(block_table, ctx)``
    returns for it (``[ctx, num_kv_heads, head_size]`` each, in a cache layout's dtype), computed in
    ``compute_dtype`` with the keys and values times ``k_scale`` and ``v_scale``; writes and returns
    ``out`` (a new tensor like ``query`` when None)."""
    if out is None:
        out = torch.empty_like(query)
    lens = context_lens.tolist()
    for s in range(query.shape[0]):
        k, v = gather(block_tables[s], int(lens[s]))
        k, v = k.to(compute_dtype), v.to(compute_dtype)
        if k_scale != 1.0:
            k = k * k_scale
        if v_scale != 1.0:
            v = v * v_scale
        out[s] = attend(query[s], k, v, scale, alibi_slopes).to(out.dtype)
    return out


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence's decode attention: query ``[heads, d]`` over keys and values ``[t, kv_heads, d]``
    (query head ``h`` reads KV head ``h // (heads // kv_heads)``), in ``k``'s dtype; ``[heads, d]``."""
    num_heads, head_size = q.shape
    ctx, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    qg = q.to(k.dtype).view(num_kv_heads, group, head_size)
    logits = torch.einsum("kgd,tkd->kgt", qg, k) * scale       # [kvh, g, t]
    if alibi_slopes is not None:
        pos = torch.arange(ctx, device=q.device, dtype=k.dtype) - (ctx - 1)
        logits = logits + alibi_slopes.to(k.dtype).view(num_kv_heads, group, 1) * pos
    probs = torch.softmax(logits, dim=-1)
    return torch.einsum("kgt,tkd->kgd", probs, v).reshape(num_heads, head_size)

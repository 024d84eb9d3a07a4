"""Helpers of the kernels tests: random fills and a naive dense attention."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def fill_(t: "torch.Tensor", gen: "torch.Generator") -> "torch.Tensor":
    """Fills with uniform(-1, 1) values (never zeros, which hide unwritten outputs)."""
    return t.uniform_(-1.0, 1.0, generator=gen)


def naive_attention(query, key_cache, value_cache, block_tables, context_lens, scale, alibi_slopes=None):
    """Dense float64 attention that reads the cache token by token from the layout's index
    formula (no shared code with kernels.reference)."""
    num_seqs, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[1]
    x = key_cache.shape[-1]
    block_size = value_cache.shape[-1]
    out = torch.empty(num_seqs, num_heads, head_size, dtype=torch.float64)
    d = torch.arange(head_size)
    for s in range(num_seqs):
        ctx = int(context_lens[s])
        keys = torch.empty(ctx, num_kv_heads, head_size, dtype=torch.float64)
        values = torch.empty_like(keys)
        for t in range(ctx):
            blk = int(block_tables[s, t // block_size])
            off = t % block_size
            keys[t] = key_cache[blk, :, d // x, off, d % x].double()
            values[t] = value_cache[blk, :, d, off].double()
        for h in range(num_heads):
            kvh = h // (num_heads // num_kv_heads)
            logits = keys[:, kvh] @ query[s, h].double() * scale
            if alibi_slopes is not None:
                logits = logits + float(alibi_slopes[h]) * (torch.arange(ctx, dtype=torch.float64) - ctx + 1)
            out[s, h] = torch.softmax(logits, 0) @ values[:, kvh]
    return out

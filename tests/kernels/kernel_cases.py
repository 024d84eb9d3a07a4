"""Helpers of the kernels tests: random fills and a naive dense attention."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def fill_(t: "torch.Tensor", gen: "torch.Generator") -> "torch.Tensor":
    """Fills with uniform(-1, 1) values (never zeros, which hide unwritten outputs)."""
    return t.uniform_(-1.0, 1.0, generator=gen)


def naive_attention(query, key_cache, value_cache, block_tables, context_lens, scale, alibi_slopes=None):
    """Dense float64 attention that reads the cache token by token from the layout's index
    formula (no shared code with kernels.vllm.reference)."""
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
        out[s] = naive_heads(query[s], keys, values, scale, alibi_slopes)
    return out


def naive_heads(query, keys, values, scale, alibi_slopes=None):
    """Dense float64 attention of one sequence's query ``[heads, d]`` over its keys and values
    ``[ctx, kv_heads, d]``, one head at a time; ``[heads, d]``."""
    num_heads, num_kv_heads, ctx = query.shape[0], keys.shape[1], keys.shape[0]
    out = torch.empty(num_heads, query.shape[1], dtype=torch.float64)
    for h in range(num_heads):
        kvh = h // (num_heads // num_kv_heads)
        logits = keys[:, kvh] @ query[h].double() * scale
        if alibi_slopes is not None:
            logits = logits + float(alibi_slopes[h]) * (torch.arange(ctx, dtype=torch.float64) - ctx + 1)
        out[h] = torch.softmax(logits, 0) @ values[:, kvh]
    return out


def assert_attention_close(out, want, *, atol, rel):
    """Every output written and finite, the relative error norm under ``rel`` and every element
    within ``atol`` of the float32 reference ``want``."""
    got = out.float()
    assert torch.isfinite(got).all(), "unwritten (NaN) or non-finite outputs"
    err = ((got - want).norm() / want.norm()).item()
    assert err < rel, f"relative error norm {err:.2e} >= {rel:.0e}"
    torch.testing.assert_close(got, want, atol=atol, rtol=0)

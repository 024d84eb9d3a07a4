"""Paged prefill attention on the CPU: the reference (kernels.fast.reference.paged_prefill_attention)
against dense causal attention on contiguous K/V (torch SDPA in float64) and against the decode
reference for one new token, and the argument checks of kernels.paged_prefill_attention. No GPU
needed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from kernels.fast import prefill  # noqa: E402
from kernels.fast import reference as fast_reference  # noqa: E402

from kernel_cases import fill_  # noqa: E402


def prefill_inputs(gen, *, cached, new, num_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float32,
                   storage="NHD", spare_blocks=5):
    """Random K/V of every sequence's cached + new tokens written into random blocks of a cache
    whose other slots hold NaN; the new tokens' queries. Returns the call's arguments and the
    dense per-sequence K/V."""
    lens = [c + p for c, p in zip(cached, new)]
    width = max(1, max(-(-n // block_size) for n in lens))
    num_blocks = sum(-(-n // block_size) for n in lens) + spare_blocks
    kc, vc = kernels.allocate_fast_kv_cache(num_blocks, block_size, num_kv_heads, head_size, dtype, "cpu",
                                            storage=storage)
    kc.fill_(float("nan"))
    vc.fill_(float("nan"))
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    dense, used = [], 0
    for s, n in enumerate(lens):
        nb = -(-n // block_size)
        tables[s, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
        k = fill_(torch.empty(n, num_kv_heads, head_size, dtype=dtype), gen)
        v = fill_(torch.empty(n, num_kv_heads, head_size, dtype=dtype), gen)
        slots = (tables[s, torch.arange(n) // block_size].long() * block_size + torch.arange(n) % block_size)
        kernels.reshape_and_cache_fast(k, v, kc, vc, slots)
        dense.append((k, v))
    query = fill_(torch.empty(sum(new), num_heads, head_size, dtype=dtype), gen)
    loc = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    return query, kc, vc, tables, loc, torch.tensor(lens, dtype=torch.int32), dense


def dense_causal(query, dense, cached, new, num_heads, scale, alibi=None):
    """float64 SDPA per sequence on contiguous K/V with the bottom-right-aligned causal mask."""
    out, q0 = [], 0
    for (k, v), c, p in zip(dense, cached, new):
        q = query[q0:q0 + p].double().transpose(0, 1)                  # [heads, p, d]
        group = num_heads // k.shape[1]
        kk = k.double().repeat_interleave(group, 1).transpose(0, 1)    # [heads, c + p, d]
        vv = v.double().repeat_interleave(group, 1).transpose(0, 1)
        rel = torch.arange(c + p)[None, :] - torch.arange(c, c + p)[:, None]
        mask = torch.where(rel > 0, float("-inf"), 0.0).double()
        if alibi is not None:
            mask = mask + alibi.double()[:, None, None] * rel.double()
        out.append(F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scale).transpose(0, 1))
        q0 += p
    return torch.cat(out)


CASES = [  # (cached, new) per sequence
    ([0], [37]),                       # plain prefill
    ([0, 0, 0], [1, 16, 33]),
    ([48, 5], [1, 1]),                 # one new token: decode
    ([16, 17, 31], [16, 15, 40]),      # chunk boundaries on and off the blocks
    ([100, 0, 3], [7, 60, 0]),         # a sequence without new tokens
]


@pytest.mark.parametrize("cached,new", CASES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("alibi", [False, True])
def test_reference_matches_dense_causal_attention(cached, new, num_heads, num_kv_heads, block_size, alibi):
    gen = torch.Generator().manual_seed(sum(cached) * 31 + sum(new) + num_heads + block_size)
    query, kc, vc, tables, loc, lens, dense = prefill_inputs(gen, cached=cached, new=new, num_heads=num_heads,
                                                             num_kv_heads=num_kv_heads, block_size=block_size)
    slopes = torch.rand(num_heads, generator=gen) * 0.2 if alibi else None
    scale = 64 ** -0.5
    out = kernels.paged_prefill_attention(None, query, kc, vc, num_kv_heads, scale, tables, loc, lens, block_size,
                                          slopes)
    want = dense_causal(query, dense, cached, new, num_heads, scale, slopes)
    assert torch.isfinite(out).all(), "a NaN slot of the cache was read"
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("storage", ["NHD", "HND", "H2ND"])
def test_reference_reads_every_storage(storage):
    gen = torch.Generator().manual_seed(7)
    cached, new = [21, 0], [11, 30]
    query, kc, vc, tables, loc, lens, dense = prefill_inputs(gen, cached=cached, new=new, storage=storage)
    out = kernels.paged_prefill_attention(None, query, kc, vc, 2, 0.125, tables, loc, lens, 16)
    torch.testing.assert_close(out.double(), dense_causal(query, dense, cached, new, 4, 0.125), atol=2e-5, rtol=0)


def test_one_new_token_equals_decode_reference():
    gen = torch.Generator().manual_seed(3)
    cached, new = [40, 7, 130], [1, 1, 1]
    query, kc, vc, tables, loc, lens, _ = prefill_inputs(gen, cached=cached, new=new, num_heads=8, num_kv_heads=2)
    slopes = torch.rand(8, generator=gen)
    out = kernels.paged_prefill_attention(None, query, kc, vc, 2, 0.1, tables, loc, lens, 16, slopes)
    tables_dense = tables.clamp(min=0)
    want = fast_reference.paged_attention(None, query, kc, vc, 2, 0.1, tables_dense, lens, 16, None, slopes)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)


def test_fp8_cache_scales():
    gen = torch.Generator().manual_seed(5)
    cached, new = [20], [12]
    query, kc, vc, tables, loc, lens, dense = prefill_inputs(gen, cached=cached, new=new)
    k8, v8 = kernels.allocate_fast_kv_cache(kc.shape[0], 16, 2, 64, kernels.fast.layout.FP8, "cpu")
    k_all = torch.cat([d[0] for d in dense])
    v_all = torch.cat([d[1] for d in dense])
    slots = (tables[0, torch.arange(32) // 16].long() * 16 + torch.arange(32) % 16)
    ks, vs = 0.01, 0.02
    kernels.reshape_and_cache_fast(k_all, v_all, k8, v8, slots, k_scale=ks, v_scale=vs)
    out = kernels.paged_prefill_attention(None, query, k8, v8, 2, 0.125, tables, loc, lens, 16, k_scale=ks,
                                          v_scale=vs)
    want = dense_causal(query, [(k8[tables[0, torch.arange(32) // 16].long(), torch.arange(32) % 16].float() * ks,
                                 v8[tables[0, torch.arange(32) // 16].long(), torch.arange(32) % 16].float() * vs)],
                        cached, new, 4, 0.125)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)
    exact = dense_causal(query, dense, cached, new, 4, 0.125)
    assert (out.double() - exact).abs().max() < 0.05  # fp8 rounding of K/V only


def test_long_context_is_processed_in_bounded_steps(monkeypatch):
    monkeypatch.setattr(fast_reference, "ROWS_PER_STEP", 4 * 300)  # one query row per step
    gen = torch.Generator().manual_seed(11)
    cached, new = [250], [50]
    query, kc, vc, tables, loc, lens, dense = prefill_inputs(gen, cached=cached, new=new)
    out = kernels.paged_prefill_attention(None, query, kc, vc, 2, 0.125, tables, loc, lens, 16)
    torch.testing.assert_close(out.double(), dense_causal(query, dense, cached, new, 4, 0.125), atol=2e-5, rtol=0)


def _args(**over):
    gen = torch.Generator().manual_seed(0)
    query, kc, vc, tables, loc, lens, _ = prefill_inputs(gen, cached=[5, 0], new=[3, 9])
    args = dict(out=None, query=query, key_cache=kc, value_cache=vc, num_kv_heads=2, scale=0.125,
                block_tables=tables, query_start_loc=loc, context_lens=lens, block_size=16)
    args.update(over)
    return args


def call(**over):
    a = _args(**over)
    kw = {k: a.pop(k) for k in list(a) if k in ("alibi_slopes", "k_scale", "v_scale", "max_query_len",
                                                 "max_context_len", "config", "validate", "key", "value")}
    return kernels.paged_prefill_attention(*a.values(), **kw)


@pytest.mark.parametrize("over,match", [
    (dict(query=torch.zeros(12, 4)), "query must be"),
    (dict(query=torch.zeros(12, 4, 48)), "head_size 48"),
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(block_size=8), "block_size 8"),
    (dict(scale="x"), "scale must be a float"),
    (dict(k_scale=2.0), "k_scale / v_scale"),
    (dict(query_start_loc=torch.tensor([0, 3], dtype=torch.int32)), "batch \\+ 1"),
    (dict(query_start_loc=torch.tensor([0, 3, 11], dtype=torch.int32)), "from 0 to the 12"),
    (dict(query_start_loc=torch.tensor([0, 13, 12], dtype=torch.int32)), "must not decrease"),
    (dict(query_start_loc=torch.tensor([0.0, 3, 12])), "query_start_loc must be int32"),
    (dict(context_lens=torch.tensor([8, 8], dtype=torch.int32)), "context_lens\\[1\\] = 8"),
    (dict(context_lens=torch.tensor([8, 9, 1], dtype=torch.int32)), "query_start_loc must have"),
    (dict(block_tables=torch.zeros(2, 0, dtype=torch.int32)), "needs 1 blocks"),
    (dict(block_tables=torch.full((2, 1), 99, dtype=torch.int32)), "block_tables\\[0, 0\\] = 99"),
    (dict(out=torch.zeros(12, 4, 32)), "out must be"),
    (dict(alibi_slopes=torch.zeros(3)), "alibi_slopes"),
    (dict(max_query_len=4), "max_query_len 4"),
    (dict(max_context_len=-1), "max_context_len must be"),
    (dict(config=2), "config must be"),
    (dict(config=9), "config must be"),
    (dict(key=torch.zeros(12, 2, 64)), "give the new tokens' keys and values both"),
    (dict(key=torch.zeros(12, 2, 64), value=torch.zeros(12, 4, 64)), "value must be the new tokens'"),
    (dict(key=torch.zeros(12, 2, 64, dtype=torch.float16), value=torch.zeros(12, 2, 64)), "key must be the new"),
])
def test_bad_arguments_raise_one_clear_error(over, match):
    with pytest.raises(ValueError, match=match):
        call(**over)


def test_new_keys_and_values_leave_the_reference_unchanged():
    """The CPU reference reads every key from the caches; the new tokens' own keys and values,
    where given, are checked and change nothing."""
    a = _args()
    kc, vc, tables = a["key_cache"], a["value_cache"], a["block_tables"]
    rows = []
    for s, (c, p) in enumerate(((5, 3), (0, 9))):
        pos = torch.arange(c, c + p)
        rows.append((kc[tables[s, pos // 16].long(), pos % 16], vc[tables[s, pos // 16].long(), pos % 16]))
    key, value = (torch.cat([r[i] for r in rows]) for i in (0, 1))
    assert torch.equal(call(key=key, value=value), call())


def test_unused_table_entries_are_not_checked():
    a = _args()
    a["block_tables"] = torch.cat([a["block_tables"], torch.full((2, 3), -7, dtype=torch.int32)], 1)
    out = call(block_tables=a["block_tables"])
    assert torch.isfinite(out).all()


def test_empty_batch():
    out = call(query=torch.zeros(0, 4, 64), query_start_loc=torch.zeros(1, dtype=torch.int32),
               context_lens=torch.zeros(0, dtype=torch.int32), block_tables=torch.zeros(0, 1, dtype=torch.int32))
    assert out.shape == (0, 4, 64)


@pytest.mark.parametrize("batch,new,heads,kv_heads,want", [
    (1, 512, 32, 8, 1),      # 16 row blocks x 8 KV heads: under one wave of large blocks
    (1, 2048, 32, 8, 0),     # 512 large blocks
    (64, 64, 32, 32, 1),     # 64 rows: half of a large block would be padding
    (64, 64, 32, 8, 0),      # 256 rows: two full large blocks
    (256, 1, 32, 8, 1),      # decode-like: 4 rows
])
def test_prefill_config_rule(batch, new, heads, kv_heads, want):
    assert kernels.choose_prefill_config(batch, new, heads, kv_heads, 128, 132) == want


def test_prefill_config_rule_above_head_128_has_one_shape():
    assert all(kernels.choose_prefill_config(b, 64, 32, 8, 256) == 0 for b in (1, 4, 64))


@pytest.mark.parametrize("batch,new,heads,kv_heads,want", [
    (1, 2048, 32, 8, 7),     # the warp-specialized warpgroup kernel where it runs
    (32, 32, 32, 8, 7),      # 128 rows: one item fills both consumer warpgroups
    (64, 64, 32, 32, 7),     # 64 rows: one warpgroup's worth, still the warp-specialized kernel
    (64, 32, 32, 32, 7),     # 32 rows: WS_MIN_ROWS
    (64, 31, 32, 32, 1),     # 31 rows over 2,048 items: below it, the mma.sync kernel's rule
    (33, 1, 32, 8, 7),       # 264 items: one wave at two blocks per SM of 132
    (34, 1, 32, 8, 1),       # 272 items: more than one wave
    (64, 16, 32, 32, 1),     # 16 rows over 2,048 items: the mma.sync kernel's blocks fill the SMs
    (16, 4, 32, 8, 7),       # 16 rows over 128 items: under one wave of mma.sync blocks
    (4, 1, 32, 32, 7),       # one new token of 4 sequences: 128 items
    (256, 1, 32, 8, 1),      # decode-like: 4 rows of 2,048 items stay on the mma.sync kernel's rule
])
def test_prefill_config_rule_with_the_warpgroup_kernel(batch, new, heads, kv_heads, want):
    assert kernels.choose_prefill_config(batch, new, heads, kv_heads, 128, 132, wgmma=True) == want
    assert kernels.choose_prefill_config(batch, new, heads, kv_heads, 256, 132, wgmma=True) == 0


def test_the_rule_runs_config_6_only_when_asked_for():
    from kernels.fast.prefill import WGMMA_CONFIG
    picks = {kernels.choose_prefill_config(b, n, 32, kv, 128, 132, wgmma=True)
             for b in (1, 4, 16, 64, 256) for n in (1, 4, 16, 31, 32, 64, 512, 4096) for kv in (1, 8, 32)}
    assert WGMMA_CONFIG not in picks and picks == {1, 7}  # below 32 rows a large block is mostly padding


@pytest.mark.parametrize("query_dtype,cache_dtype,head,alibi,capability,want", [
    (torch.float16, torch.float16, 128, False, (9, 0), True),
    (torch.bfloat16, torch.bfloat16, 128, False, (9, 0), True),
    (torch.float16, torch.float16, 128, False, (8, 0), False),
    (torch.float16, torch.float16, 128, False, (10, 0), False),
    (torch.float16, torch.float16, 64, False, (9, 0), False),
    (torch.float16, torch.float16, 128, True, (9, 0), False),
    (torch.float16, torch.float8_e4m3fn, 128, False, (9, 0), False),
])
def test_where_the_warpgroup_kernel_runs(query_dtype, cache_dtype, head, alibi, capability, want):
    assert prefill.wgmma_runs(query_dtype, cache_dtype, head, alibi, capability) is want


def test_the_warpgroup_config_needs_a_hopper_gpu():
    for config in prefill.WARPGROUP_CONFIGS:
        with pytest.raises(ValueError, match=rf"config {config} \(the warpgroup kernels\) needs a CUDA device of compute "
                                             r"capability 9\.0"):
            call(config=config)

"""The PyTorch reference (kernels.vllm.reference) against a naive dense attention, and the cache
operations' layout round trips. CPU only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kernels  # noqa: E402
from kernels.vllm import reference  # noqa: E402

from kernel_cases import fill_, naive_attention  # noqa: E402


def paged_inputs(gen, *, num_seqs, num_heads, num_kv_heads, head_size, block_size, dtype, num_blocks, lens):
    query = fill_(torch.empty(num_seqs, num_heads, head_size, dtype=dtype), gen)
    key_cache, value_cache = kernels.allocate_kv_cache(num_blocks, num_kv_heads, head_size, block_size, dtype, "cpu")
    fill_(key_cache, gen)
    fill_(value_cache, gen)
    width = -(-max(lens) // block_size)
    block_tables = torch.randint(0, num_blocks, (num_seqs, width), generator=gen, dtype=torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    return query, key_cache, value_cache, block_tables, context_lens


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("alibi", [False, True])
def test_reference_matches_naive_dense_attention(num_heads, num_kv_heads, block_size, alibi):
    gen = torch.Generator().manual_seed(num_heads * 100 + block_size + alibi)
    head_size = 64
    lens = [1, block_size, block_size + 1, 3 * block_size - 1, 77]
    q, kc, vc, bt, cl = paged_inputs(gen, num_seqs=len(lens), num_heads=num_heads, num_kv_heads=num_kv_heads,
                                     head_size=head_size, block_size=block_size, dtype=torch.float32,
                                     num_blocks=40, lens=lens)
    slopes = torch.rand(num_heads, generator=gen) if alibi else None
    scale = head_size ** -0.5
    out = torch.full_like(q, float("nan"))
    got = kernels.paged_attention(out, q, kc, vc, num_kv_heads, scale, bt, cl, block_size, max(lens), slopes)
    assert got is out
    want = naive_attention(q, kc, vc, bt, cl, scale, slopes)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_half_precision_computes_in_float32(dtype):
    gen = torch.Generator().manual_seed(3)
    lens = [5, 40]
    q, kc, vc, bt, cl = paged_inputs(gen, num_seqs=2, num_heads=4, num_kv_heads=2, head_size=80, block_size=16,
                                     dtype=dtype, num_blocks=10, lens=lens)
    ref32 = reference.paged_attention(torch.empty(q.shape), q, kc, vc, 2, 0.1, bt, cl, 16, 40)
    want = naive_attention(q, kc, vc, bt, cl, 0.1)
    torch.testing.assert_close(ref32.double(), want, atol=1e-5, rtol=1e-5)
    out = kernels.paged_attention(None, q, kc, vc, 2, 0.1, bt, cl, 16, None)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref32.to(dtype), atol=0, rtol=0, msg="one rounding of the float32 result")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_reshape_and_cache_then_gather_round_trips(dtype, block_size):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, kvh, hs = 12, 3, 96
    kc, vc = kernels.allocate_kv_cache(num_blocks, kvh, hs, block_size, dtype, "cpu")
    fill_(kc, gen)
    fill_(vc, gen)
    ctx = 2 * block_size + 5
    table = torch.randperm(num_blocks, generator=gen)[:3]
    slots = table[torch.arange(ctx) // block_size] * block_size + torch.arange(ctx) % block_size
    key = fill_(torch.empty(ctx, kvh, hs, dtype=dtype), gen)
    value = fill_(torch.empty(ctx, kvh, hs, dtype=dtype), gen)
    kernels.reshape_and_cache(key, value, kc, vc, slots)
    k, v = reference.gather_kv(kc, vc, table, ctx)
    assert torch.equal(k, key) and torch.equal(v, value)


def test_reshape_and_cache_skips_padding_slots():
    gen = torch.Generator().manual_seed(0)
    kc, vc = kernels.allocate_kv_cache(4, 2, 32, 8, torch.float16, "cpu")
    fill_(kc, gen)
    fill_(vc, gen)
    before_k, before_v = kc.clone(), vc.clone()
    key = fill_(torch.empty(3, 2, 32, dtype=torch.float16), gen)
    value = fill_(torch.empty(3, 2, 32, dtype=torch.float16), gen)
    kernels.reshape_and_cache(key, value, kc, vc, torch.tensor([-1, 9, -1]))
    changed = (kc != before_k).flatten(1).any(1) | (vc != before_v).flatten(1).any(1)
    assert changed.tolist() == [False, True, False, False], "only block 1 (slot 9) is written"
    k, v = reference.gather_kv(kc, vc, torch.tensor([1]), 2)
    assert torch.equal(k[1], key[1]) and torch.equal(v[1], value[1])


def test_copy_blocks_copies_every_layer():
    gen = torch.Generator().manual_seed(1)
    layers = [kernels.allocate_kv_cache(6, 2, 64, 16, torch.bfloat16, "cpu") for _ in range(3)]
    keys = [fill_(k, gen) for k, _ in layers]
    values = [fill_(v, gen) for _, v in layers]
    before = [t.clone() for t in keys + values]
    kernels.copy_blocks(keys, values, {0: [3, 4], 2: 5})
    for old, new in zip(before, keys + values):
        assert torch.equal(new[3], old[0]) and torch.equal(new[4], old[0]) and torch.equal(new[5], old[2])
        assert torch.equal(new[:3], old[:3])


def test_swap_blocks_on_cpu_moves_the_mapped_blocks():
    gen = torch.Generator().manual_seed(2)
    src, _ = kernels.allocate_kv_cache(5, 2, 32, 8, torch.float32, "cpu")
    dst, _ = kernels.allocate_kv_cache(7, 2, 32, 8, torch.float32, "cpu")
    fill_(src, gen)
    fill_(dst, gen)
    before = dst.clone()
    kernels.swap_blocks(src, dst, torch.tensor([[4, 0], [1, 6]]))
    assert torch.equal(dst[0], src[4]) and torch.equal(dst[6], src[1]) and torch.equal(dst[1:6], before[1:6])

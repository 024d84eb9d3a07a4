"""The fast decode kernel (impl="fast") against the float32 reference of its layout, on the GPU
(skipped without CUDA).

The grid of the vLLM-layout kernel's tests (7 sequences, heads / KV heads 40/40 and 64/8, every
supported head size, block sizes 16 and 32, random contexts up to 8192 with one at the maximum,
random block tables over a 4321-block cache), for float16 and bfloat16, plus block sizes 8 and
64-256, every storage order, forced splits, contexts up to 128k, GQA groups wider than a thread
block, ALiBi, poisoned block ids, fp8 caches.

Tolerances (|out| <= 1): float16 as for the vLLM kernel (atol 1e-3, relative error norm < 1e-3):
the probabilities are rounded to float16 for the tensor-core product (relative 2**-11, averaged
over the context) and the output once. bfloat16: the probabilities are rounded to bfloat16
(2**-9 relative) on top of the output's rounding (2**-9 below 1), so atol 1e-2 and a relative
error norm < 8e-3.
"""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import kernels  # noqa: E402
from kernels.fast import launch as fast_launch  # noqa: E402
from kernels.fast import layout as fast_layout  # noqa: E402
from kernels.fast import ops as fast_ops  # noqa: E402
from kernels.fast import reference as fast_reference  # noqa: E402
from kernel_cases import assert_attention_close  # noqa: E402

pytestmark = pytest.mark.gpu

NUM_BLOCKS = 4321
NUM_SEQS = 7
MAX_CONTEXT = 8192
DTYPES = (torch.float16, torch.bfloat16)
ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}
REL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
QUERY_RANGE = 4.0

_caches: dict = {}


def caches(num_kv_heads, head_size, block_size, dtype, storage="NHD", num_blocks=NUM_BLOCKS):
    """Random caches, kept for the next test of the same shape only."""
    key = (num_kv_heads, head_size, block_size, dtype, storage, num_blocks)
    if key not in _caches:
        _caches.clear()
        torch.cuda.empty_cache()
        gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(str(key).encode()))
        kc, vc = kernels.allocate_fast_kv_cache(num_blocks, block_size, num_kv_heads, head_size, dtype, "cuda",
                                                storage=storage)
        kc.uniform_(-1, 1, generator=gen)
        vc.uniform_(-1, 1, generator=gen)
        _caches[key] = (kc, vc)
    return _caches[key]


def run_case(*, num_heads, num_kv_heads, head_size, block_size, dtype, max_context=MAX_CONTEXT, lens=None,
             alibi=False, seed=0, num_seqs=NUM_SEQS, storage="NHD", split_tokens=None, num_blocks=NUM_BLOCKS,
             prefetch=None, stages=None, max_ctas_per_sm=None, warp_items=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kc, vc = caches(num_kv_heads, head_size, block_size, dtype, storage, num_blocks)
    if lens is None:
        lens = torch.randint(1, max_context + 1, (num_seqs,), generator=gen, device="cuda")
        lens[num_seqs // 2] = max_context
    context_lens = torch.as_tensor(lens, device="cuda").to(torch.int32)
    width = -(-max_context // block_size)
    block_tables = torch.randint(0, num_blocks, (len(context_lens), width), generator=gen, device="cuda",
                                 dtype=torch.int32)
    query = torch.empty(len(context_lens), num_heads, head_size, dtype=dtype, device="cuda")
    query.uniform_(-QUERY_RANGE, QUERY_RANGE, generator=gen)
    slopes = torch.rand(num_heads, generator=gen, device="cuda") * 0.1 if alibi else None
    scale = head_size ** -0.5
    out = torch.full_like(query, float("nan"))
    if prefetch is None and stages is None and max_ctas_per_sm is None and warp_items is None:
        kernels.paged_attention(out, query, kc, vc, num_kv_heads, scale, block_tables, context_lens, block_size,
                                max_context, slopes, impl="fast", split_tokens=split_tokens)
    else:
        fast_ops.paged_attention(out, query, kc, vc, num_kv_heads, scale, block_tables, context_lens, block_size,
                             max_context, slopes, split_tokens=split_tokens, prefetch=prefetch, stages=stages,
                             max_ctas_per_sm=max_ctas_per_sm, warp_items=warp_items)
    want = torch.empty(query.shape, dtype=torch.float32, device="cuda")
    fast_reference.paged_attention(want, query, kc, vc, num_kv_heads, scale, block_tables, context_lens, block_size,
                                   max_context, slopes)
    return out, want


def assert_matches(out, want, dtype):
    assert_attention_close(out, want, atol=ATOL[dtype], rel=REL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", kernels.SUPPORTED_HEAD_SIZES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(40, 40), (64, 8)])
def test_fast_matches_reference(num_heads, num_kv_heads, head_size, block_size, dtype):
    out, want = run_case(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                         block_size=block_size, dtype=dtype, seed=head_size + block_size)
    assert_matches(out, want, dtype)


@pytest.mark.parametrize("storage", ["NHD", "HND", "H2ND"])
@pytest.mark.parametrize("block_size", [8, 64, 128, 256])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_fast_block_sizes_and_storage(head_size, block_size, storage):
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=head_size, block_size=block_size,
                         dtype=torch.float16, storage=storage, num_blocks=NUM_BLOCKS * 16 // block_size + 8,
                         max_context=4000, seed=block_size)
    assert_matches(out, want, torch.float16)


@pytest.mark.parametrize("split_tokens", [16, 64, 496, 8192])
def test_fast_forced_splits(split_tokens):
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype=torch.float16,
                         split_tokens=split_tokens, max_context=5000, seed=split_tokens)
    assert_matches(out, want, torch.float16)


@pytest.mark.parametrize("split_tokens", [64, 1024, None])
@pytest.mark.parametrize("head_size", [64, 120, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fast_two_tiles_in_flight(dtype, head_size, split_tokens):
    """prefetch=True: the loop that keeps a second tile in flight per warp (heads <= 128)."""
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=head_size, block_size=16, dtype=dtype,
                         split_tokens=split_tokens, max_context=5000, seed=head_size, prefetch=True, stages=0)
    assert_matches(out, want, dtype)


@pytest.mark.parametrize("split_tokens", [64, 1024, None])
@pytest.mark.parametrize("head_size,stages", [(h, d) for h in (64, 120, 128) for d in (0, 2, 3, 4)] + [(256, 0)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fast_load_paths(dtype, head_size, stages, split_tokens):
    """Register loads (stages=0) and every cp.async ring depth (heads <= 128: the ring's limit)."""
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=head_size, block_size=16, dtype=dtype,
                         split_tokens=split_tokens, max_context=5000, seed=head_size + stages, stages=stages)
    assert_matches(out, want, dtype)


@pytest.mark.parametrize("stages", [0, 3])
@pytest.mark.parametrize("block_size", [8, 256])
def test_fast_load_paths_block_sizes(block_size, stages):
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=block_size, dtype=torch.float16,
                         storage="H2ND", num_blocks=NUM_BLOCKS * 16 // block_size + 8, max_context=4000,
                         seed=block_size + stages, stages=stages)
    assert_matches(out, want, torch.float16)


@pytest.mark.parametrize("stages,cap", [(0, 1), (0, 2), (2, 1), (2, 2), (3, 1), (4, 3)])
def test_fast_occupancy_cap(stages, cap):
    """max_ctas_per_sm pads the shared memory: same results, and the occupancy API reports the cap
    (or fewer where the kernel's own resources allow fewer)."""
    from kernels._build import extension

    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype=torch.float16,
                         storage="HND", max_context=4000, seed=stages + 10 * cap, stages=stages, max_ctas_per_sm=cap)
    assert_matches(out, want, torch.float16)
    free = extension().fast_decode_ctas_per_sm(128, "float16", stages, False, 0)
    assert extension().fast_decode_ctas_per_sm(128, "float16", stages, False, cap) == min(cap, free)


@pytest.mark.parametrize("split_tokens", [None, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", [64, 120, 128])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(40, 40), (64, 8), (24, 2), (32, 1), (12, 4), (40, 5)])
def test_fast_warp_items(num_heads, num_kv_heads, head_size, dtype, split_tokens):
    """Each warp a whole item: KV-head counts that do and do not fill the blocks' four warps,
    GQA groups wider than a block (32 heads on 1), forced splits (the partial outputs)."""
    out, want = run_case(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size, block_size=16,
                         dtype=dtype, storage="H2ND", max_context=3000, seed=head_size + num_kv_heads,
                         split_tokens=split_tokens, stages=2, warp_items=True)
    assert_matches(out, want, dtype)


@pytest.mark.parametrize("block_size", [8, 256])
def test_fast_warp_items_edges(block_size):
    """Contexts of 1 token and block / tile / split boundaries +- 1, ALiBi, block sizes 8 and 256."""
    lens = [1, 15, 16, 17, 255, 256, 257, 1024, 1025]
    for split, alibi in ((None, False), (256, True)):
        out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=block_size,
                             dtype=torch.float16, max_context=1025, lens=lens, split_tokens=split, alibi=alibi,
                             storage="H2ND", num_blocks=NUM_BLOCKS * 16 // block_size + 8, stages=2, warp_items=True)
        assert_matches(out, want, torch.float16)


def test_fast_default_launch_with_warp_items():
    """A batch the launch rule runs as warp items on this GPU (64 sequences x 8 KV heads, contexts
    up to 2048: 512 items in 128 blocks on a 132-SM GPU)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    launch = fast_launch.choose_launch(64, 32, 8, 128, torch.float16, 2048, sms, tuning=fast_launch.device_tuning(0))
    if not launch.warp_items:
        pytest.skip(f"the rule picks no warp items for this batch on {sms} SMs")
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype=torch.float16,
                         storage="H2ND", max_context=2048, num_seqs=64, seed=64)
    assert_matches(out, want, torch.float16)


def test_fast_warp_items_asked_for_run_on_the_two_stage_ring():
    """warp_items=True with the rest left to the launch rule, on a batch where the rule picks a
    3-stage ring (16 sequences x 8 KV heads of up to 512 tokens): it runs on 2 stages."""
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype=torch.float16,
                         storage="H2ND", max_context=512, num_seqs=16, seed=16, warp_items=True)
    assert_matches(out, want, torch.float16)


def test_fast_warp_items_need_the_two_stage_ring():
    kc, vc = caches(8, 128, 16, torch.float16)
    q = torch.zeros(1, 32, 128, dtype=torch.float16, device="cuda")
    bt = torch.zeros(1, 4, dtype=torch.int32, device="cuda")
    lens = torch.full((1,), 64, dtype=torch.int32, device="cuda")
    for stages in (0, 3):
        with pytest.raises(ValueError, match="warp_items runs on the 2-stage cp.async ring"):
            fast_ops.paged_attention(None, q, kc, vc, 8, 0.1, bt, lens, 16, 64, stages=stages, warp_items=True)


def test_fast_ring_shared_memory_matches_the_extension():
    from kernels._build import extension

    for head_size in kernels.SUPPORTED_HEAD_SIZES:
        for stages in (2, 3, 4):
            py = fast_launch.ring_smem_bytes(head_size, stages)
            ext = extension().fast_decode_smem_bytes(head_size, False, stages)
            assert ext == (py if py <= fast_launch.SMEM_LIMIT and head_size <= 128 else 0), (head_size, stages)
            assert extension().fast_decode_smem_bytes(head_size, True, stages) == 0  # fp8: register loads


@pytest.mark.parametrize("num_heads,num_kv_heads", [(32, 1), (32, 32), (24, 2), (12, 4)])
def test_fast_context_edges_and_group_sizes(num_heads, num_kv_heads):
    """Contexts of 1 token, block / tile / split boundaries +- 1; groups of 32, 1, 12 and 3 heads."""
    lens = [1, 15, 16, 17, 255, 256, 257, 1024, 1025]
    for split in (None, 256):
        out, want = run_case(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=128, block_size=16,
                             dtype=torch.float16, max_context=1025, lens=lens, split_tokens=split)
        assert_matches(out, want, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 256])
def test_fast_128k_context(dtype, block_size):
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=block_size, dtype=dtype,
                         max_context=131072, lens=[131072, 100000], num_blocks=131072 * 2 // block_size + 16,
                         seed=7)
    assert_matches(out, want, dtype)


@pytest.mark.parametrize("head_size", [80, 128])
def test_fast_alibi(head_size):
    out, want = run_case(num_heads=64, num_kv_heads=8, head_size=head_size, block_size=16, dtype=torch.float16,
                         alibi=True)
    assert_matches(out, want, torch.float16)


def test_fast_strided_query_from_a_fused_qkv_tensor():
    gen = torch.Generator(device="cuda").manual_seed(5)
    kc, vc = caches(8, 128, 16, torch.float16)
    qkv = torch.empty(NUM_SEQS, 64 + 2 * 8, 128, dtype=torch.float16, device="cuda").uniform_(-4, 4, generator=gen)
    query = qkv[:, :64]
    lens = torch.randint(1, 3000, (NUM_SEQS,), generator=gen, device="cuda", dtype=torch.int32)
    bt = torch.randint(0, NUM_BLOCKS, (NUM_SEQS, 3000 // 16 + 1), generator=gen, device="cuda", dtype=torch.int32)
    out = kernels.paged_attention(None, query, kc, vc, 8, 128 ** -0.5, bt, lens, 16, 3000, impl="fast")
    want = fast_reference.paged_attention(torch.empty(query.shape, device="cuda"), query, kc, vc, 8, 128 ** -0.5,
                                          bt, lens, 16, 3000)
    assert_matches(out, want, torch.float16)


@pytest.mark.parametrize("stages", [0, 2])
@pytest.mark.parametrize("split_tokens", [None, 64])
def test_fast_unchecked_bad_block_id_poisons_only_its_sequence(split_tokens, stages):
    gen = torch.Generator(device="cuda").manual_seed(9)
    kc, vc = caches(8, 128, 16, torch.float16)
    lens = torch.tensor([700, 700], dtype=torch.int32, device="cuda")
    bt = torch.randint(0, NUM_BLOCKS, (2, 44), generator=gen, device="cuda", dtype=torch.int32)
    bt[1, 40] = 1 << 30
    q = torch.empty(2, 32, 128, dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=gen)
    out = fast_ops.paged_attention(None, q, kc, vc, 8, 0.1, bt, lens, 16, 700, validate=False,
                               split_tokens=split_tokens, stages=stages)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all()
    want = fast_reference.paged_attention(torch.empty(1, 32, 128, device="cuda"), q[:1], kc, vc, 8, 0.1, bt[:1],
                                          lens[:1], 16, 700)
    assert_matches(out[:1], want, torch.float16)


@pytest.mark.parametrize("block_size", [16, 64])
def test_fast_fp8_cache(block_size):
    """fp8 e4m3 caches with per-tensor scales: equal to the reference on the dequantised values
    (float16 tolerance), and close to float16 attention on the unquantised ones."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    nb = 2048 * 16 // block_size
    kc16, vc16 = caches(8, 128, block_size, torch.float16, num_blocks=nb)
    ks, vs = kernels.fp8_scale(kc16), kernels.fp8_scale(vc16)
    k8, v8 = kernels.allocate_fast_kv_cache(nb, block_size, 8, 128, fast_layout.FP8, "cuda", storage="NHD")
    slots = torch.arange(nb * block_size, device="cuda")
    kernels.reshape_and_cache_fast(kc16.flatten(0, 1), vc16.flatten(0, 1), k8, v8, slots, k_scale=ks, v_scale=vs)
    lens = torch.randint(1, 6000, (NUM_SEQS,), generator=gen, device="cuda", dtype=torch.int32)
    bt = torch.randint(0, nb, (NUM_SEQS, -(-6000 // block_size)), generator=gen, device="cuda", dtype=torch.int32)
    q = torch.empty(NUM_SEQS, 32, 128, dtype=torch.float16, device="cuda").uniform_(-4, 4, generator=gen)
    scale = 128 ** -0.5
    out = kernels.paged_attention(None, q, k8, v8, 8, scale, bt, lens, block_size, 6000, impl="fast",
                                  k_scale=ks, v_scale=vs)
    want8 = fast_reference.paged_attention(torch.empty(q.shape, device="cuda"), q, k8, v8, 8, scale, bt, lens,
                                           block_size, 6000, k_scale=ks, v_scale=vs)
    assert_matches(out, want8, torch.float16)
    want16 = fast_reference.paged_attention(torch.empty(q.shape, device="cuda"), q, kc16, vc16, 8, scale, bt, lens,
                                            block_size, 6000)
    rel = ((out.float() - want16).norm() / want16.norm()).item()
    assert rel < 0.05, f"fp8 vs float16 relative error norm {rel:.3f}"


def test_reshape_and_cache_fast_on_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(12)
    kc, vc = kernels.allocate_fast_kv_cache(20, 16, 4, 128, torch.float16, "cpu", storage="NHD")
    kc.zero_()
    vc.zero_()
    key = torch.empty(100, 4, 128, dtype=torch.float16).uniform_(-1, 1, generator=gen)
    value = torch.empty_like(key).uniform_(-1, 1, generator=gen)
    slots = torch.randperm(320, generator=gen)[:100]
    slots[7] = -1
    gk, gv = kc.cuda(), vc.cuda()
    kernels.reshape_and_cache_fast(key.cuda(), value.cuda(), gk, gv, slots.cuda())
    kernels.reshape_and_cache_fast(key, value, kc, vc, slots)
    assert torch.equal(gk.cpu(), kc) and torch.equal(gv.cpu(), vc)


@pytest.mark.parametrize("storage", ["NHD", "HND", "H2ND"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_heads,head_size", [(8, 128), (32, 128), (4, 64), (2, 80), (1, 256)])
def test_cache_write_kernel_takes_strided_qkv_slices(storage, dtype, kv_heads, head_size):
    """The CUDA write kernel (keys and values as slices of a fused QKV output, rows strided) writes
    exactly what the indexed copy writes, skips padding slots and leaves every other slot alone."""
    gen = torch.Generator().manual_seed(kv_heads * head_size)
    heads, tokens, blocks, bs = 2 * kv_heads, 300, 40, 16
    kc, vc = kernels.allocate_fast_kv_cache(blocks, bs, kv_heads, head_size, dtype, "cpu", storage=storage)
    kc.copy_(torch.randn(kc.shape, generator=gen).to(dtype))
    vc.copy_(torch.randn(vc.shape, generator=gen).to(dtype))
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_size, generator=gen).to(dtype)
    key, value = qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:]
    slots = torch.randperm(blocks * bs, generator=gen)[:tokens]
    slots[::37] = -1
    gk, gv = kernels.allocate_fast_kv_cache(blocks, bs, kv_heads, head_size, dtype, "cuda", storage=storage)
    gk.copy_(kc)
    gv.copy_(vc)
    gq = qkv.cuda()
    assert fast_ops._kernel_writes(gq[:, heads:heads + kv_heads], gq[:, heads + kv_heads:], gk, gv)
    kernels.reshape_and_cache_fast(gq[:, heads:heads + kv_heads], gq[:, heads + kv_heads:], gk, gv, slots)  # CPU slots
    kernels.reshape_and_cache_fast(key, value, kc, vc, slots)
    assert torch.equal(gk.cpu(), kc) and torch.equal(gv.cpu(), vc)


def test_fast_agrees_with_the_vllm_kernel_on_the_same_tokens():
    gen = torch.Generator(device="cuda").manual_seed(13)
    kc, vc = caches(8, 128, 16, torch.float16)
    vk, vv = kernels.allocate_kv_cache(NUM_BLOCKS, 8, 128, 16, torch.float16, "cuda")
    kernels.reshape_and_cache(kc.flatten(0, 1), vc.flatten(0, 1), vk, vv, torch.arange(NUM_BLOCKS * 16, device="cuda"))
    lens = torch.randint(1, 8000, (NUM_SEQS,), generator=gen, device="cuda", dtype=torch.int32)
    bt = torch.randint(0, NUM_BLOCKS, (NUM_SEQS, 500), generator=gen, device="cuda", dtype=torch.int32)
    q = torch.empty(NUM_SEQS, 32, 128, dtype=torch.float16, device="cuda").uniform_(-4, 4, generator=gen)
    a = kernels.paged_attention(None, q, kc, vc, 8, 0.09, bt, lens, 16, 8000, impl="fast")
    b = kernels.paged_attention(None, q, vk, vv, 8, 0.09, bt, lens, 16, 8000)
    torch.testing.assert_close(a.float(), b.float(), atol=2e-3, rtol=0)


@pytest.mark.parametrize("split_tokens", [64, 1024])
def test_fast_split_reduce_as_dependent_launch_matches_an_ordinary_one(split_tokens):
    """pdl=True (the reduce kernel waits on griddepcontrol.wait) gives bit-identical outputs to an
    ordinary launch, over mixed contexts, repeated calls, and replays of a captured graph."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    kc, vc = caches(8, 128, 16, torch.float16)
    lens = torch.tensor([1, 63, 64, 65, 1000, 3001, 4096], dtype=torch.int32, device="cuda")
    bt = torch.randint(0, NUM_BLOCKS, (len(lens), 256), generator=gen, device="cuda", dtype=torch.int32)
    q = torch.empty(len(lens), 32, 128, dtype=torch.float16, device="cuda").uniform_(-4, 4, generator=gen)

    def run(pdl, out=None):
        return fast_ops.paged_attention(out, q, kc, vc, 8, 0.09, bt, lens, 16, 4096, split_tokens=split_tokens,
                                    pdl=pdl, validate=False)
    plain = run(False)
    want = fast_reference.paged_attention(torch.empty(q.shape, device="cuda"), q, kc, vc, 8, 0.09, bt, lens, 16, 4096)
    assert_matches(plain, want, torch.float16)
    for _ in range(3):
        assert torch.equal(run(True), plain)
    out = torch.full_like(q, float("nan"))
    run(True, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(2):
            run(True, out)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, plain)


def test_fast_reduce_over_more_splits_than_one_shared_memory_chunk():
    """16-token splits of a 20000-token context: 1250 splits, 20 of the reduce kernel's batches of
    64 (kReduceBatch), the last one partly filled."""
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype=torch.float16,
                         split_tokens=16, max_context=20000, lens=[20000, 17000, 1024, 1025, 3],
                         num_blocks=20000 * 5 // 16 + 8, seed=23)
    assert_matches(out, want, torch.float16)

"""The CUDA kernels against the PyTorch reference, on the GPU (skipped without CUDA).

Attention outputs are compared with the reference computed in float32 from the same cached
values; the cache operations must be bit-exact. Tolerances (|out| <= 1, since outputs are convex
combinations of values drawn from [-1, 1]):

* float32: atol 1e-3 as required, and a relative error norm under 1e-4 (float32 arithmetic in a
  different order, plus the fast exponential: ~1e-6 in practice).
* float16: the kernel computes in float32 and rounds once; half a float16 ulp below 1 is
  2**-12 = 2.4e-4, so atol 1e-3, and the relative error norm is at most 2**-11 = 4.9e-4 < 1e-3.
* bfloat16: same with 8 mantissa bits: half an ulp below 1 is 2**-9 = 2e-3, so atol 5e-3, and a
  relative error norm of at most 2**-8 = 3.9e-3 < 8e-3.
"""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import kernels  # noqa: E402
from kernels.vllm import launch as vllm_launch  # noqa: E402
from kernels.vllm import ops, reference  # noqa: E402
from kernel_cases import assert_attention_close  # noqa: E402

pytestmark = pytest.mark.gpu

NUM_BLOCKS = 4321
NUM_SEQS = 7
MAX_CONTEXT = kernels.V1_MAX_CONTEXT          # the longest context the automatic rule gives v1
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ATOL = {torch.float32: 1e-3, torch.float16: 1e-3, torch.bfloat16: 5e-3}
REL = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 8e-3}
QUERY_RANGE = 4.0  # q in [-4, 4]: logits with a standard deviation of ~1.3, so the softmax is not flat


def uniform(shape, dtype, gen, bound=1.0):
    return torch.empty(shape, dtype=dtype, device="cuda").uniform_(-bound, bound, generator=gen)


_caches: dict = {}


def caches(num_kv_heads, head_size, block_size, dtype):
    """Random caches of NUM_BLOCKS blocks, kept for the next test of the same shape only."""
    key = (num_kv_heads, head_size, block_size, dtype)
    if key not in _caches:
        _caches.clear()
        torch.cuda.empty_cache()
        gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(str(key).encode()))
        kc, vc = kernels.allocate_kv_cache(NUM_BLOCKS, num_kv_heads, head_size, block_size, dtype, "cuda")
        kc.uniform_(-1, 1, generator=gen)
        vc.uniform_(-1, 1, generator=gen)
        _caches[key] = (kc, vc)
    return _caches[key]


def run_case(*, num_heads, num_kv_heads, head_size, block_size, dtype, version, max_context=MAX_CONTEXT,
             lens=None, alibi=False, seed=0, num_seqs=NUM_SEQS):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kc, vc = caches(num_kv_heads, head_size, block_size, dtype)
    if lens is None:
        lens = torch.randint(1, max_context + 1, (num_seqs,), generator=gen, device="cuda")
        lens[num_seqs // 2] = max_context                           # one at the maximum
    context_lens = torch.as_tensor(lens, device="cuda").to(torch.int32)
    width = -(-max_context // block_size)
    block_tables = torch.randint(0, NUM_BLOCKS, (len(context_lens), width), generator=gen, device="cuda",
                                 dtype=torch.int32)
    query = uniform((len(context_lens), num_heads, head_size), dtype, gen, QUERY_RANGE)
    slopes = torch.rand(num_heads, generator=gen, device="cuda") * 0.1 if alibi else None
    scale = head_size ** -0.5
    out = torch.full_like(query, float("nan"))                    # every element must be written
    kernels.paged_attention(out, query, kc, vc, num_kv_heads, scale, block_tables, context_lens, block_size,
                            max_context, slopes, version=version)
    want = torch.empty(query.shape, dtype=torch.float32, device="cuda")
    reference.paged_attention(want, query, kc, vc, num_kv_heads, scale, block_tables, context_lens, block_size,
                              max_context, slopes)
    return out, want


def assert_matches(out, want, dtype):
    assert_attention_close(out, want, atol=ATOL[dtype], rel=REL[dtype])


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", kernels.SUPPORTED_HEAD_SIZES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(40, 40), (64, 8)])
def test_paged_attention_matches_reference(num_heads, num_kv_heads, head_size, block_size, dtype, version):
    out, want = run_case(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                         block_size=block_size, dtype=dtype, version=version, seed=head_size + block_size)
    assert_matches(out, want, dtype)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", [80, 120, 128, 256])
def test_block_size_8(head_size, dtype, version):
    out, want = run_case(num_heads=64, num_kv_heads=8, head_size=head_size, block_size=8, dtype=dtype,
                         version=version, max_context=2000)
    assert_matches(out, want, dtype)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("head_size", [80, 128])
def test_alibi(head_size, version):
    out, want = run_case(num_heads=64, num_kv_heads=8, head_size=head_size, block_size=16, dtype=torch.float16,
                         version=version, alibi=True)
    assert_matches(out, want, torch.float16)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(32, 1), (32, 32)])
def test_context_edges(num_heads, num_kv_heads):
    """Contexts of 1 token, block and partition boundaries +- 1, under both kernels."""
    lens = [1, 15, 16, 17, 511, 512, 513, 1024, 1025]
    for version in ("v1", "v2"):
        out, want = run_case(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=128, block_size=16,
                             dtype=torch.float16, version=version, max_context=1025, lens=lens)
        assert_matches(out, want, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_v2_long_context(dtype):
    """Past v1's automatic limit: 40 partitions of 512 tokens."""
    out, want = run_case(num_heads=64, num_kv_heads=8, head_size=128, block_size=16, dtype=dtype, version=None,
                         max_context=20000, num_seqs=3)
    assert kernels.choose_version(3, 64, 20000) == "v2"
    assert_matches(out, want, dtype)


def test_v1_beyond_the_default_shared_memory_limit():
    """16384 tokens need 64 KB of logits: v1 raises its dynamic shared-memory limit."""
    out, want = run_case(num_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype=torch.float16,
                         version="v1", max_context=16384, num_seqs=3)
    assert_matches(out, want, torch.float16)


def test_v1_too_long_for_shared_memory_is_refused():
    too_long = vllm_launch.v1_max_context_len(0, 16) + 16
    kc, vc = caches(8, 128, 16, torch.float16)
    q = torch.zeros(1, 8, 128, dtype=torch.float16, device="cuda")
    bt = torch.zeros(1, too_long // 16, dtype=torch.int32, device="cuda")
    lens = torch.tensor([too_long], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="use version='v2'"):
        kernels.paged_attention(None, q, kc, vc, 8, 0.1, bt, lens, 16, too_long, version="v1")


def test_strided_query_from_a_fused_qkv_tensor():
    gen = torch.Generator(device="cuda").manual_seed(5)
    kc, vc = caches(8, 128, 16, torch.float16)
    qkv = uniform((NUM_SEQS, 64 + 2 * 8, 128), torch.float16, gen, QUERY_RANGE)
    query = qkv[:, :64]                                    # stride(0) = 80 * 128
    lens = torch.randint(1, 3000, (NUM_SEQS,), generator=gen, device="cuda", dtype=torch.int32)
    bt = torch.randint(0, NUM_BLOCKS, (NUM_SEQS, 3000 // 16 + 1), generator=gen, device="cuda", dtype=torch.int32)
    out = kernels.paged_attention(None, query, kc, vc, 8, 128 ** -0.5, bt, lens, 16, 3000)
    want = reference.paged_attention(torch.empty(query.shape, device="cuda"), query, kc, vc, 8, 128 ** -0.5, bt,
                                     lens, 16, 3000)
    assert_matches(out, want, torch.float16)


def test_block_id_out_of_range_is_rejected_on_cuda():
    kc, vc = caches(8, 128, 16, torch.float16)
    q = torch.zeros(2, 8, 128, dtype=torch.float16, device="cuda")
    bt = torch.tensor([[0, 1], [2, NUM_BLOCKS]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([20, 20], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=f"block_tables\\[1, 1\\] = {NUM_BLOCKS} is outside"):
        kernels.paged_attention(None, q, kc, vc, 8, 0.1, bt, lens, 16, 20)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_unchecked_bad_block_id_poisons_only_its_sequence(version):
    """With validate=False the kernel still never reads outside the cache: the sequence with the
    bad id gets NaN, the others are right."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    kc, vc = caches(8, 128, 16, torch.float16)
    lens = torch.tensor([700, 700], dtype=torch.int32, device="cuda")
    bt = torch.randint(0, NUM_BLOCKS, (2, 44), generator=gen, device="cuda", dtype=torch.int32)
    bt[1, 40] = 1 << 30
    q = uniform((2, 32, 128), torch.float16, gen)
    out = kernels.paged_attention(None, q, kc, vc, 8, 0.1, bt, lens, 16, 700, version=version, validate=False)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all()
    want = reference.paged_attention(torch.empty(1, 32, 128, device="cuda"), q[:1], kc, vc, 8, 0.1, bt[:1], lens[:1],
                                     16, 700)
    assert_matches(out[:1], want, torch.float16)


# ---- cache operations: bit-exact against the reference ----

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_size", [80, 128])
def test_reshape_and_cache_is_exact(dtype, block_size, head_size):
    gen = torch.Generator(device="cuda").manual_seed(block_size)
    num_blocks, kvh, tokens = 97, 8, 301
    kc, vc = kernels.allocate_kv_cache(num_blocks, kvh, head_size, block_size, dtype, "cuda")
    kc.uniform_(-1, 1, generator=gen)
    vc.uniform_(-1, 1, generator=gen)
    qkv = uniform((tokens, 3, kvh, head_size), dtype, gen)        # key/value as strided views
    key, value = qkv[:, 1], qkv[:, 2]
    slots = torch.randperm(num_blocks * block_size, generator=gen, device="cuda")[:tokens]
    slots[::7] = -1                                               # padding tokens
    want_k, want_v = kc.clone(), vc.clone()
    reference.reshape_and_cache(key, value, want_k, want_v, slots)
    kernels.reshape_and_cache(key, value, kc, vc, slots.to(torch.int32))
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_blocks_is_exact_for_every_layer(dtype):
    gen = torch.Generator().manual_seed(11)
    layers = [kernels.allocate_kv_cache(256, 8, 128, 16, dtype, "cuda") for _ in range(4)]
    keys, values = [k for k, _ in layers], [v for _, v in layers]
    for t in keys + values:
        t.uniform_(-1, 1)
    ids = torch.randperm(256, generator=gen)[:60]
    mapping = torch.stack([ids[:30], ids[30:]], 1)
    want = [t.clone() for t in keys + values]
    reference.copy_blocks(want[:4], want[4:], mapping)
    kernels.copy_blocks(keys, values, mapping)
    assert all(torch.equal(a, b) for a, b in zip(keys + values, want))


@pytest.mark.parametrize("direction", ["out", "in", "gpu"])
def test_swap_blocks_is_exact(direction):
    gen = torch.Generator().manual_seed(13)
    gpu, _ = kernels.allocate_kv_cache(300, 8, 128, 16, torch.bfloat16, "cuda")
    host, _ = kernels.allocate_kv_cache(200, 8, 128, 16, torch.bfloat16, "cpu", pin_memory=True)
    gpu.uniform_(-1, 1)
    host.uniform_(-1, 1)
    if direction == "out":
        src, dst = gpu, host
    elif direction == "in":
        src, dst = host, gpu
    else:
        src, dst = gpu, kernels.allocate_kv_cache(300, 8, 128, 16, torch.bfloat16, "cuda")[0].uniform_(-1, 1)
    s = torch.randperm(src.shape[0], generator=gen)[:50]
    d = torch.randperm(dst.shape[0], generator=gen)[:50]
    mapping = torch.stack([s, d], 1)
    want = dst.cpu().clone()
    reference.swap_blocks(src.cpu(), want, mapping)
    kernels.swap_blocks(src, dst, mapping)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), want)
    # Pinned host memory is mapped into the GPU's address space (UVA): one kernel for all pairs.
    assert ops.extension().swap_path(src, dst) == "kernel"


def test_swap_with_pageable_cpu_memory_is_refused():
    gpu, _ = kernels.allocate_kv_cache(4, 2, 64, 16, torch.float16, "cuda")
    host, _ = kernels.allocate_kv_cache(4, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match="must be pinned"):
        kernels.swap_blocks(gpu, host, [(0, 1)])

"""The paged prefill kernel (kernels.paged_prefill_attention on CUDA) against the float32 PyTorch
reference of the fast layout, on the GPU (skipped without CUDA).

Grid: plain prefill (c = 0), one new token over a cached context (checked against the decode
kernel too), chunks whose boundaries fall inside blocks, prefixes whose blocks several sequences
of the batch share, up to 16k new tokens and 128k cached ones; MHA, GQA and MQA; every head size;
float16, bfloat16 and fp8 (e4m3) caches with scales; block sizes 8 to 256; every storage order;
ALiBi; the warpgroup (wgmma) kernel on Hopper over the same grid where it applies (float16 and
bfloat16 at head size 128, no ALiBi). Block tables are random and every cache slot no sequence uses holds NaN (as do unused
table entries' blocks), so a read of one shows in the output. Tolerances are the decode kernel's
(tests/kernels/test_fast_decode.py).
"""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import kernels  # noqa: E402
from kernels.fast import layout as fast_layout  # noqa: E402
from kernels.fast import reference as fast_reference  # noqa: E402
from kernels.fast.prefill import PREFILL_CONFIGS, WARPGROUP_CONFIGS, WS_CONFIG  # noqa: E402
from kernel_cases import assert_attention_close  # noqa: E402

pytestmark = pytest.mark.gpu
HOPPER = torch.cuda.get_device_capability() == (9, 0)
# the kernels a test runs: the mma.sync kernel's configurations, and the warpgroup kernels on Hopper
WGMMA = list(WARPGROUP_CONFIGS) if HOPPER else []
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the warpgroup kernel runs on compute capability 9.0")

ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2, fast_layout.FP8: 1e-3}
REL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, fast_layout.FP8: 1e-3}
QUERY_RANGE = 4.0


def build(*, cached, new, num_heads=8, num_kv_heads=2, head_size=128, block_size=16, dtype=torch.float16,
          storage="NHD", shared_blocks=0, alibi=False, seed=0, spare_blocks=7):
    """A batch whose sequence i has cached[i] + new[i] tokens in random blocks of a NaN-filled cache
    (the first ``shared_blocks`` blocks of every table are the same blocks: a shared prefix), the
    new tokens' queries; returns the call's arguments as a dict."""
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr((cached, new, num_heads, head_size, block_size,
                                                                      str(dtype), storage, seed)).encode()))
    lens = [c + p for c, p in zip(cached, new)]
    assert all(n >= shared_blocks * block_size for n in lens)
    own = [-(-n // block_size) - shared_blocks for n in lens]
    num_blocks = shared_blocks + sum(own) + spare_blocks
    cache_dtype = dtype
    q_dtype = torch.float16 if dtype == fast_layout.FP8 else dtype
    kc, vc = kernels.allocate_fast_kv_cache(num_blocks, block_size, num_kv_heads, head_size, cache_dtype, "cuda",
                                            storage=storage)
    kc.view(torch.uint8).fill_(0x7f if dtype == fast_layout.FP8 else 0xff)  # NaN in every storage
    vc.view(torch.uint8).fill_(0x7f if dtype == fast_layout.FP8 else 0xff)
    perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    width = max(-(-n // block_size) for n in lens) + 3
    tables = perm[num_blocks - 1].repeat(len(lens), width)  # unused entries: a NaN block
    shared, used = perm[:shared_blocks], shared_blocks
    for s, n in enumerate(lens):
        tables[s, :shared_blocks] = shared
        tables[s, shared_blocks:shared_blocks + own[s]] = perm[used:used + own[s]]
        used += own[s]
    k_scale = v_scale = 1.0
    if dtype == fast_layout.FP8:
        k_scale, v_scale = 0.9 / fast_layout.FP8_MAX, 1.1 / fast_layout.FP8_MAX
    written = set()
    new_k, new_v = [], []  # the new tokens' keys and values, as the cache holds them (not for fp8)
    for s, n in enumerate(lens):
        pos = torch.arange(n, device="cuda")
        slots = tables[s, pos // block_size].long() * block_size + pos % block_size
        fresh = torch.tensor([int(x) not in written for x in slots.tolist()], device="cuda")
        written.update(slots.tolist())
        k = torch.empty(n, num_kv_heads, head_size, device="cuda").uniform_(-1, 1, generator=gen)
        v = torch.empty(n, num_kv_heads, head_size, device="cuda").uniform_(-1, 1, generator=gen)
        kernels.reshape_and_cache_fast(k[fresh].to(q_dtype), v[fresh].to(q_dtype), kc, vc, slots[fresh],
                                       k_scale=k_scale, v_scale=v_scale)
        new_k.append(k[cached[s]:].to(q_dtype))
        new_v.append(v[cached[s]:].to(q_dtype))
    query = torch.empty(sum(new), num_heads, head_size, dtype=q_dtype, device="cuda")
    query.uniform_(-QUERY_RANGE, QUERY_RANGE, generator=gen)
    loc = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    slopes = torch.rand(num_heads, generator=gen, device="cuda") * 0.1 if alibi else None
    return dict(query=query, key_cache=kc, value_cache=vc, num_kv_heads=num_kv_heads, scale=head_size ** -0.5,
                block_tables=tables, query_start_loc=loc, context_lens=torch.tensor(lens, dtype=torch.int32,
                                                                                     device="cuda"),
                block_size=block_size, alibi_slopes=slopes, k_scale=k_scale, v_scale=v_scale,
                key=torch.cat(new_k), value=torch.cat(new_v))


def check(a, dtype=None, config=None, new_kv=False, want_cache=None):
    """The kernel's output against the reference over ``want_cache`` (the call's caches unless
    given); ``new_kv`` passes the new tokens' keys and values."""
    dtype = a["key_cache"].dtype if dtype is None else dtype
    out = torch.full_like(a["query"], float("nan"))
    extra = dict(key=a["key"], value=a["value"]) if new_kv else {}
    kernels.paged_prefill_attention(out, a["query"], a["key_cache"], a["value_cache"], a["num_kv_heads"], a["scale"],
                                    a["block_tables"], a["query_start_loc"], a["context_lens"], a["block_size"],
                                    a["alibi_slopes"], k_scale=a["k_scale"], v_scale=a["v_scale"], config=config,
                                    **extra)
    kc, vc = want_cache or (a["key_cache"], a["value_cache"])
    want = fast_reference.paged_prefill_attention(None, a["query"].float(), kc, vc,
                                                  a["num_kv_heads"], a["scale"], a["block_tables"],
                                                  a["query_start_loc"], a["context_lens"], a["alibi_slopes"],
                                                  k_scale=a["k_scale"], v_scale=a["v_scale"])
    assert_attention_close(out, want, atol=ATOL[dtype], rel=REL[dtype])
    return out


BATCHES = {  # (cached, new)
    "plain": ([0, 0, 0], [1, 200, 77]),
    "chunks": ([16, 37, 300, 5], [64, 91, 1, 130]),
    "decode": ([1000, 5, 33], [1, 1, 1]),
}


@pytest.mark.parametrize("config", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_size", kernels.PREFILL_HEAD_SIZES)
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (4, 1)])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_head_sizes_and_groups(config, dtype, head_size, heads, batch):
    cached, new = BATCHES[batch]
    check(build(cached=cached, new=new, num_heads=heads[0], num_kv_heads=heads[1], head_size=head_size, dtype=dtype),
          config=config)


@needs_hopper
@pytest.mark.parametrize("config", WGMMA)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (4, 1), (32, 8)])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_warpgroup_kernel_groups(config, dtype, heads, batch):
    cached, new = BATCHES[batch]
    check(build(cached=cached, new=new, num_heads=heads[0], num_kv_heads=heads[1], dtype=dtype), config=config)


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_default_runs_the_warpgroup_kernel(dtype):
    new = [300, 64, 1, 129]
    assert kernels.choose_prefill_config(4, max(new), 32, 8, 128, 132, wgmma=True) == WS_CONFIG
    check(build(cached=[0, 700, 33, 2000], new=new, num_heads=32, num_kv_heads=8, dtype=dtype))


@needs_hopper
@pytest.mark.parametrize("config", WGMMA)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (4, 1), (32, 8)])
def test_warpgroup_pingpong_kernel(config, dtype, heads):
    """Contexts the launch rule gives the ping-pong kernel (a new token sees 512 to 4096 keys on
    average): row blocks past a short sequence's rows, blocks whose second warpgroup has no rows,
    one new token, chunks not aligned to blocks."""
    check(build(cached=[1500, 0, 700, 3], new=[600, 2000, 1, 130], num_heads=heads[0], num_kv_heads=heads[1],
                dtype=dtype), config=config)


@pytest.mark.parametrize("config", [0, *WGMMA])
@pytest.mark.parametrize("offset", [0, 1, 8])
def test_output_and_query_inside_larger_buffers(config, offset):
    """Output and query as views at an element offset into larger buffers (16-byte aligned at 0 and
    8, 2 bytes off at 1, where the wrapper copies the query and runs into an aligned output before
    copying it back): the right rows, and the output buffer around them keeps its values."""
    a = build(cached=[0, 300, 5], new=[513, 64, 130], num_heads=32, num_kv_heads=8)
    n = a["query"].numel()
    qbuf = torch.zeros(n + 16, dtype=a["query"].dtype, device="cuda")
    query = qbuf[offset:offset + n].view(a["query"].shape)
    query.copy_(a["query"])
    buf = torch.full((n + 16,), 7.0, dtype=a["query"].dtype, device="cuda")
    out = buf[offset:offset + n].view(a["query"].shape)
    kernels.paged_prefill_attention(out, query, a["key_cache"], a["value_cache"], a["num_kv_heads"], a["scale"],
                                    a["block_tables"], a["query_start_loc"], a["context_lens"], a["block_size"],
                                    config=config)
    want = fast_reference.paged_prefill_attention(None, a["query"].float(), a["key_cache"], a["value_cache"],
                                                  a["num_kv_heads"], a["scale"], a["block_tables"],
                                                  a["query_start_loc"], a["context_lens"], None)
    assert_attention_close(out, want, atol=ATOL[torch.float16], rel=REL[torch.float16])
    rest = torch.cat([buf[:offset], buf[offset + n:]])
    assert bool((rest == 7.0).all())


@pytest.mark.parametrize("config", sorted(PREFILL_CONFIGS))
def test_every_tile_configuration(config):
    check(build(cached=[0, 700, 33, 2000], new=[300, 64, 1, 129], num_heads=32, num_kv_heads=8, alibi=True),
          config=config)


@pytest.mark.parametrize("config", [0, *WGMMA])
@pytest.mark.parametrize("block_size", fast_layout.FAST_BLOCK_SIZES)
@pytest.mark.parametrize("storage", fast_layout.STORAGES)
def test_block_sizes_and_storages(block_size, storage, config):
    check(build(cached=[3 * block_size + 5, 0, block_size], new=[block_size + 3, 2 * block_size - 1, 1],
                block_size=block_size, storage=storage, num_heads=32, num_kv_heads=8), config=config)


@pytest.mark.parametrize("config", [0, 1])
@pytest.mark.parametrize("head_size", [64, 120, 128, 256])
@pytest.mark.parametrize("alibi", [False, True])
def test_fp8_caches_with_scales(config, head_size, alibi):
    check(build(cached=[0, 123, 700], new=[150, 40, 1], head_size=head_size, dtype=fast_layout.FP8, alibi=alibi),
          config=config)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(8, 8), (32, 8)])
def test_alibi(dtype, heads):
    check(build(cached=[0, 77, 1024], new=[300, 19, 64], num_heads=heads[0], num_kv_heads=heads[1], dtype=dtype,
                alibi=True))


@pytest.mark.parametrize("config", [0, *WGMMA])
@pytest.mark.parametrize("block_size", [16, 64])
def test_prefix_blocks_shared_by_the_batch(block_size, config):
    shared = 5
    c0 = shared * block_size
    check(build(cached=[c0, c0 + 7, c0 + block_size, c0], new=[33, 1, 200, 64], shared_blocks=shared,
                block_size=block_size, num_heads=32, num_kv_heads=8), config=config)


@pytest.mark.parametrize("config", [0, *WGMMA])
@pytest.mark.parametrize("seed", range(4))
def test_random_chunks_not_aligned_to_blocks(seed, config):
    gen = torch.Generator().manual_seed(seed)
    cached = torch.randint(0, 3000, (6,), generator=gen).tolist()
    new = torch.randint(1, 700, (6,), generator=gen).tolist()
    check(build(cached=cached, new=new, num_heads=32, num_kv_heads=8, block_size=[8, 16, 32, 128][seed], seed=seed),
          config=config)


@pytest.mark.parametrize("config", [None, *WGMMA])
def test_one_new_token_equals_the_decode_kernel(config):
    a = build(cached=[4000, 17, 130, 1], new=[1, 1, 1, 1], num_heads=32, num_kv_heads=8, alibi=config is None)
    out = check(a, config=config)
    dec = kernels.paged_attention(None, a["query"], a["key_cache"], a["value_cache"], 8, a["scale"],
                                  a["block_tables"], a["context_lens"], 16, None, a["alibi_slopes"], impl="fast")
    torch.testing.assert_close(out.float(), dec.float(), atol=1e-3, rtol=0)


@pytest.mark.parametrize("config", [0, 1, *WGMMA])
@pytest.mark.parametrize("cached,new", [([0], [16384]), ([131072], [512]), ([120000, 3000], [16384, 100])])
def test_long_contexts(config, cached, new):
    check(build(cached=cached, new=new, num_heads=8, num_kv_heads=2, block_size=64), config=config)


@pytest.mark.parametrize("config", WGMMA)
@pytest.mark.parametrize("block_size", [8, 16, 64])
def test_block_ids_outside_the_cache_read_as_zeros_without_validate(block_size, config):
    """validate=False trusts the block ids: the warpgroup kernels read an entry outside the cache
    (past its last block, or negative) as a block of zeros, without reading memory. The reference
    reads those entries from a zeroed block the sequences do not use."""
    a = build(cached=[300, 0, 1000], new=[200, 257, 64], num_heads=32, num_kv_heads=8, block_size=block_size)
    nb = a["key_cache"].shape[0]
    tables = a["block_tables"].clone()
    bad = {(0, 3): nb, (1, 0): nb + 5, (2, 1000 // block_size - 2): 2 ** 31 - 1, (2, 1): -3}
    spare = int(a["block_tables"][0, -1])  # the NaN block of every unused entry: read by none of the keys
    ref_tables = tables.clone()
    for (s, j), bid in bad.items():
        tables[s, j] = bid
        ref_tables[s, j] = spare
    kc, vc = a["key_cache"].clone(), a["value_cache"].clone()
    kc[spare] = 0
    vc[spare] = 0
    out = torch.full_like(a["query"], float("nan"))
    kernels.paged_prefill_attention(out, a["query"], a["key_cache"], a["value_cache"], 8, a["scale"], tables,
                                    a["query_start_loc"], a["context_lens"], block_size, max_query_len=257,
                                    max_context_len=1064, validate=False, config=config)
    want = fast_reference.paged_prefill_attention(None, a["query"].float(), kc, vc, 8, a["scale"], ref_tables,
                                                  a["query_start_loc"], a["context_lens"], None)
    assert_attention_close(out, want, atol=ATOL[torch.float16], rel=REL[torch.float16])


@pytest.mark.parametrize("config", [0, *WGMMA])
def test_graph_capture_with_given_lengths(config):
    a = build(cached=[100, 0], new=[50, 300], num_heads=32, num_kv_heads=8)
    out = torch.full_like(a["query"], float("nan"))
    args = (out, a["query"], a["key_cache"], a["value_cache"], 8, a["scale"], a["block_tables"], a["query_start_loc"],
            a["context_lens"], 16)
    kernels.paged_prefill_attention(*args, max_query_len=300, max_context_len=400, validate=False, config=config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    want = out.clone()
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        kernels.paged_prefill_attention(*args, max_query_len=300, max_context_len=400, validate=False, config=config)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want, atol=0, rtol=0)


CONTRADICTING = """
import sys, torch
sys.path[:0] = {paths!r}
import kernels
from kernels.fast import reference as fast_reference
from kernel_cases import assert_attention_close
from test_paged_prefill import ATOL, REL, build
a = build(cached=[40, 0, 300], new=[200, 300, 77], num_heads=32, num_kv_heads=8)
lens = a["context_lens"].clone()
lens[1] = 100  # 300 new tokens in a context of 100
out = torch.full_like(a["query"], float("nan"))
kernels.paged_prefill_attention(out, a["query"], a["key_cache"], a["value_cache"], 8, a["scale"], a["block_tables"],
                                a["query_start_loc"], lens, a["block_size"], max_query_len=300, max_context_len=377,
                                validate=False, config={config})
torch.cuda.synchronize()
want = fast_reference.paged_prefill_attention(None, a["query"].float(), a["key_cache"], a["value_cache"], 8,
                                              a["scale"], a["block_tables"], a["query_start_loc"], a["context_lens"],
                                              None)
for rows in (slice(0, 200), slice(500, 577)):
    assert_attention_close(out[rows], want[rows], atol=ATOL[torch.float16], rel=REL[torch.float16])
print("finished")
"""


@pytest.mark.parametrize("config", [0, *WGMMA])
def test_contradicting_lengths_without_validate_still_finish(config):
    """validate=False trusts the lengths: a sequence whose context is shorter than its new tokens
    gets no defined output, but the kernel finishes and the other sequences' rows are right. Run in
    a process of its own with a time limit, so that a kernel that waits for ever fails the test
    instead of stopping the suite."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    paths = [str(here.parents[1]), str(here)]
    code = CONTRADICTING.format(paths=paths, config=config)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"config {config}: the kernel did not finish within 300 s on contradicting lengths")
    assert done.returncode == 0 and "finished" in done.stdout, done.stderr[-3000:]


# The new tokens' keys and values given (key=, value=): the warp-specialized kernel reads the tiles
# of new keys from them by TMA, the rest through the block table.
NEW_KV_BATCHES = {  # (cached, new)
    "plain": ([0, 0, 0, 0], [1, 200, 128, 1000]),
    "aligned prefixes": ([128, 256, 4096], [300, 128, 77]),
    "unaligned chunks": ([16, 37, 300, 5], [64, 91, 1, 130]),
}


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (4, 1), (32, 8)])
@pytest.mark.parametrize("batch", sorted(NEW_KV_BATCHES))
@pytest.mark.parametrize("block_size", [16, 64])
def test_new_keys_and_values_given(dtype, heads, batch, block_size):
    cached, new = NEW_KV_BATCHES[batch]
    a = build(cached=cached, new=new, num_heads=heads[0], num_kv_heads=heads[1], dtype=dtype, block_size=block_size)
    check(a, config=WS_CONFIG, new_kv=True)


@needs_hopper
@pytest.mark.parametrize("cached", [[0, 0], [256, 128], [40, 0]])
def test_tiles_of_new_keys_never_read_the_cache(cached):
    """The 128-key tiles that hold only new tokens of their sequence come from the given keys and
    values only: the cache's slots of those tokens are overwritten with NaN after the reference is
    taken, and the output stays right."""
    a = build(cached=cached, new=[700, 333], num_heads=32, num_kv_heads=8)
    want_cache = (a["key_cache"].clone(), a["value_cache"].clone())
    for s, (c, p) in enumerate(zip(cached, [700, 333])):
        pos = torch.arange(-(-c // 128) * 128, (c + p) // 128 * 128, device="cuda")
        assert len(pos) > 0
        blocks = a["block_tables"][s, pos // 16].long()
        a["key_cache"][blocks, pos % 16] = float("nan")
        a["value_cache"][blocks, pos % 16] = float("nan")
    check(a, config=WS_CONFIG, new_kv=True, want_cache=want_cache)


@needs_hopper
def test_a_tile_past_a_sequences_keys_never_reads_the_next_sequences_rows():
    """The tile that holds a sequence's last keys and runs past them goes through the block table:
    the next sequence's rows of the given keys and values (here infinite, as an overflowed
    projection would be) never reach the first sequence's output."""
    a = build(cached=[0, 0], new=[200, 300], num_heads=32, num_kv_heads=8)
    a["key"][200:] = float("nan")
    a["value"][200:] = float("inf")
    out = torch.full_like(a["query"], float("nan"))
    kernels.paged_prefill_attention(out, a["query"], a["key_cache"], a["value_cache"], 8, a["scale"],
                                    a["block_tables"], a["query_start_loc"], a["context_lens"], 16,
                                    config=WS_CONFIG, key=a["key"], value=a["value"])
    want = fast_reference.paged_prefill_attention(None, a["query"].float(), a["key_cache"], a["value_cache"], 8,
                                                  a["scale"], a["block_tables"], a["query_start_loc"],
                                                  a["context_lens"], None)
    assert_attention_close(out[:200], want[:200], atol=ATOL[torch.float16], rel=REL[torch.float16])


@needs_hopper
def test_new_keys_and_values_inside_a_fused_projection():
    """Keys and values as column slices of one [tokens, q + k + v] projection (token stride larger
    than their rows), as a model's QKV output gives them."""
    a = build(cached=[0, 300], new=[513, 129], num_heads=32, num_kv_heads=8)
    q, k, v = a["query"], a["key"], a["value"]
    fused = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    a["key"] = fused[:, 32 * 128:40 * 128].view(-1, 8, 128)
    a["value"] = fused[:, 40 * 128:].view(-1, 8, 128)
    assert a["key"].stride(0) == 48 * 128
    check(a, config=WS_CONFIG, new_kv=True)


@needs_hopper
def test_new_keys_and_values_in_a_cuda_graph():
    a = build(cached=[0, 256, 40], new=[400, 128, 99], num_heads=32, num_kv_heads=8)
    out = torch.empty_like(a["query"])

    def call():
        kernels.paged_prefill_attention(out, a["query"], a["key_cache"], a["value_cache"], 8, a["scale"],
                                        a["block_tables"], a["query_start_loc"], a["context_lens"], 16,
                                        max_query_len=400, max_context_len=400, validate=False, config=WS_CONFIG,
                                        key=a["key"], value=a["value"])
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = fast_reference.paged_prefill_attention(None, a["query"].float(), a["key_cache"], a["value_cache"], 8,
                                                  a["scale"], a["block_tables"], a["query_start_loc"],
                                                  a["context_lens"], None)
    assert_attention_close(out, want, atol=ATOL[torch.float16], rel=REL[torch.float16])

"""The fast layout on the CPU: its reference (kernels.fast.reference) against a naive dense
attention, against the vLLM-layout reference on the same data, the cache writes (float16 and
float8), the default storage, and the argument checks of impl="fast". No GPU needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import kernels  # noqa: E402
from kernels.fast import layout as fast_layout  # noqa: E402
from kernels.fast import ops as fast_ops  # noqa: E402
from kernels.fast import reference as fast_reference  # noqa: E402
from kernels.vllm import reference  # noqa: E402

from kernel_cases import fill_, naive_heads  # noqa: E402


def naive_fast_attention(query, key_cache, value_cache, block_tables, context_lens, scale, alibi_slopes=None,
                         k_scale=1.0, v_scale=1.0):
    """Dense float64 attention reading the fast layout token by token (no code shared with
    kernels.fast.reference)."""
    num_seqs, num_heads, head_size = query.shape
    block_size = key_cache.shape[1]
    out = torch.empty(num_seqs, num_heads, head_size, dtype=torch.float64)
    for s in range(num_seqs):
        ctx = int(context_lens[s])
        keys = torch.stack([key_cache[int(block_tables[s, t // block_size]), t % block_size].double()
                            for t in range(ctx)]) * k_scale
        values = torch.stack([value_cache[int(block_tables[s, t // block_size]), t % block_size].double()
                              for t in range(ctx)]) * v_scale
        out[s] = naive_heads(query[s], keys, values, scale, alibi_slopes)
    return out


def fast_inputs(gen, *, num_heads, num_kv_heads, head_size, block_size, dtype, num_blocks, lens, storage="NHD"):
    query = fill_(torch.empty(len(lens), num_heads, head_size, dtype=dtype), gen)
    kc, vc = kernels.allocate_fast_kv_cache(num_blocks, block_size, num_kv_heads, head_size, dtype, "cpu",
                                            storage=storage)
    fill_(kc, gen)
    fill_(vc, gen)
    width = -(-max(lens) // block_size)
    bt = torch.randint(0, num_blocks, (len(lens), width), generator=gen, dtype=torch.int32)
    return query, kc, vc, bt, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("storage", ["NHD", "HND", "H2ND"])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [8, 16, 64, 256])
@pytest.mark.parametrize("alibi", [False, True])
def test_fast_reference_matches_naive_dense_attention(storage, num_heads, num_kv_heads, block_size, alibi):
    gen = torch.Generator().manual_seed(num_heads * 1000 + block_size + alibi)
    lens = [1, block_size - 1, block_size + 1, 77, 300]
    q, kc, vc, bt, cl = fast_inputs(gen, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=32,
                                    block_size=block_size, dtype=torch.float32, num_blocks=12, lens=lens,
                                    storage=storage)
    slopes = torch.rand(num_heads, generator=gen) if alibi else None
    out = torch.full_like(q, float("nan"))
    got = kernels.paged_attention(out, q, kc, vc, num_kv_heads, 0.125, bt, cl, block_size, None, slopes, impl="fast")
    assert got is out
    torch.testing.assert_close(out.double(), naive_fast_attention(q, kc, vc, bt, cl, 0.125, slopes),
                               atol=1e-5, rtol=1e-5)


def test_fast_layout_agrees_with_the_vllm_layout_on_the_same_tokens():
    gen = torch.Generator().manual_seed(1)
    lens = [5, 40, 33]
    q, kc, vc, bt, cl = fast_inputs(gen, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                                    dtype=torch.float16, num_blocks=10, lens=lens)
    vk, vv = kernels.allocate_kv_cache(10, 2, 64, 16, torch.float16, "cpu")
    slots = torch.arange(10 * 16)
    kernels.reshape_and_cache(kc.flatten(0, 1), vc.flatten(0, 1), vk, vv, slots)   # same tokens, vLLM layout
    want = reference.paged_attention(torch.empty(q.shape), q, vk, vv, 2, 0.1, bt, cl, 16, 40)
    got = fast_reference.paged_attention(torch.empty(q.shape), q, kc, vc, 2, 0.1, bt, cl, 16, 40)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("storage", ["NHD", "HND", "H2ND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reshape_and_cache_fast_round_trips_and_skips_padding(storage, dtype):
    gen = torch.Generator().manual_seed(2)
    kc, vc = kernels.allocate_fast_kv_cache(6, 16, 3, 64, dtype, "cpu", storage=storage)
    kc.zero_()
    vc.zero_()
    ctx = 40
    table = torch.tensor([4, 0, 2])
    slots = table[torch.arange(ctx) // 16] * 16 + torch.arange(ctx) % 16
    slots_padded = torch.cat([slots[:20], torch.tensor([-1]), slots[20:]])
    key = fill_(torch.empty(ctx + 1, 3, 64, dtype=dtype), gen)
    value = fill_(torch.empty(ctx + 1, 3, 64, dtype=dtype), gen)
    kernels.reshape_and_cache_fast(key, value, kc, vc, slots_padded)
    keep = slots_padded >= 0
    k, v = fast_reference.gather_kv(kc, vc, table, ctx)
    assert torch.equal(k, key[keep]) and torch.equal(v, value[keep])
    assert int((kc[1] != 0).sum()) == 0, "a block no slot points at was written"


def test_fp8_cache_stores_scaled_values_within_e4m3_rounding():
    gen = torch.Generator().manual_seed(3)
    kc, vc = kernels.allocate_fast_kv_cache(4, 16, 2, 64, fast_layout.FP8, "cpu")
    key = fill_(torch.empty(64, 2, 64), gen) * 3
    value = fill_(torch.empty(64, 2, 64), gen)
    ks, vs = kernels.fp8_scale(key), kernels.fp8_scale(value)
    assert ks == pytest.approx(float(key.abs().max()) / 448)
    kernels.reshape_and_cache_fast(key, value, kc, vc, torch.arange(64), k_scale=ks, v_scale=vs)
    k = kc.flatten(0, 1).float() * ks
    v = vc.flatten(0, 1).float() * vs
    # e4m3: 3 mantissa bits, relative rounding error <= 2**-4 (normal range).
    assert ((k - key).abs() <= key.abs() * 2**-4 + ks * 2**-9).all()
    assert ((v - value).abs() <= value.abs() * 2**-4 + vs * 2**-9).all()


def test_fp8_reference_is_close_to_float16_attention():
    gen = torch.Generator().manual_seed(4)
    lens = [100, 257]
    q, kc, vc, bt, cl = fast_inputs(gen, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                                    dtype=torch.float16, num_blocks=40, lens=lens)
    ks, vs = fast_layout.fp8_scale(kc), fast_layout.fp8_scale(vc)
    k8, v8 = kernels.allocate_fast_kv_cache(40, 16, 2, 64, fast_layout.FP8, "cpu")
    kernels.reshape_and_cache_fast(kc.flatten(0, 1), vc.flatten(0, 1), k8, v8, torch.arange(640), k_scale=ks,
                                   v_scale=vs)
    want = fast_reference.paged_attention(torch.empty(q.shape), q, kc, vc, 2, 0.125, bt, cl, 16, 257)
    got = kernels.paged_attention(torch.empty_like(q), q, k8, v8, 2, 0.125, bt, cl, 16, 257, impl="fast",
                                  k_scale=ks, v_scale=vs)
    naive = naive_fast_attention(q, k8.float(), v8.float(), bt, cl, 0.125, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got.double(), naive, atol=1e-3, rtol=0)
    rel = ((got.float() - want).norm() / want.norm()).item()
    assert rel < 0.05, f"fp8 relative error norm {rel:.3f} vs float16"


def attend_fast(**over):
    gen = torch.Generator().manual_seed(0)
    args = dict(zip(("query", "key_cache", "value_cache", "block_tables", "context_lens"),
                    fast_inputs(gen, num_heads=8, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float16,
                                num_blocks=10, lens=[20, 5])))
    args.update(out=None, num_kv_heads=2, scale=0.125, block_size=16, max_context_len=20)
    kw = {k: over.pop(k) for k in list(over) if k in ("k_scale", "v_scale", "version", "validate")}
    for k, v in over.items():
        args[k] = v(args) if callable(v) else v
    return kernels.paged_attention(args["out"], args["query"], args["key_cache"], args["value_cache"],
                                   args["num_kv_heads"], args["scale"], args["block_tables"], args["context_lens"],
                                   args["block_size"], args["max_context_len"], impl="fast", **kw)


@pytest.mark.parametrize("over,match", [
    (dict(key_cache=lambda a: a["key_cache"].flatten(0, 1)), "key_cache must be \\[num_blocks, block_size"),
    (dict(value_cache=lambda a: a["value_cache"].float()), "must match"),
    (dict(block_size=32), "block_size 32 does not match"),
    (dict(num_kv_heads=4), "num_kv_heads 4 does not match"),
    (dict(block_tables=lambda a: a["block_tables"].masked_fill(a["block_tables"] >= 0, 10)), "outside the cache"),
    (dict(context_lens=lambda a: torch.tensor([0, 5], dtype=torch.int32)), "context_lens must be >= 1"),
    (dict(max_context_len=19), "less than the longest context 20"),
    (dict(k_scale=0.5), "apply to float8_e4m3fn caches only"),
    (dict(version="v1"), "version applies to impl='vllm' only"),
    (dict(query=lambda a: torch.zeros(2, 8, 72, dtype=torch.float16)), "head_size 72 not supported"),
])
def test_fast_arguments_are_checked(over, match):
    with pytest.raises(ValueError, match=match):
        attend_fast(**over)


def test_fast_block_size_must_be_a_power_of_two_up_to_256():
    kc, vc = kernels.allocate_fast_kv_cache(4, 48, 2, 64, torch.float16, "cpu")
    q = torch.zeros(1, 4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="block_size 48 not supported by impl='fast'"):
        kernels.paged_attention(None, q, kc, vc, 2, 0.1, torch.zeros(1, 1, dtype=torch.int32),
                                torch.ones(1, dtype=torch.int32), 48, 1, impl="fast")


def test_vllm_impl_refuses_fast_only_options():
    with pytest.raises(ValueError, match="apply to impl='fast' only"):
        kc, vc = kernels.allocate_kv_cache(4, 2, 64, 16, torch.float16, "cpu")
        kernels.paged_attention(None, torch.zeros(1, 4, 64, dtype=torch.float16), kc, vc, 2, 0.1,
                                torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 16, 1,
                                split_tokens=64)


def test_importing_kernels_stays_lazy():
    code = "import sys, kernels; kernels.__all__; assert 'torch' not in sys.modules; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert {"allocate_fast_kv_cache", "reshape_and_cache_fast", "choose_split_tokens", "fp8_scale"} <= set(kernels.__all__)


def test_bad_stage_count_is_refused_before_any_work():
    kc, vc = fast_layout.allocate_fast_kv_cache(4, 16, 2, 128, torch.float16, "cpu", storage="NHD")
    q = torch.zeros(1, 4, 128, dtype=torch.float16)
    bt = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="stages must be 0 or 2 to 4"):
        fast_ops.paged_attention(None, q, kc, vc, 2, 0.1, bt, lens, 16, 1, stages=5)
    with pytest.raises(ValueError, match="stages must be 0 for head_size 128"):
        fast_ops.paged_attention(None, q, kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn), 2, 0.1, bt, lens, 16,
                             1, stages=2)


@pytest.mark.parametrize("option,bad,message", [
    *[("max_ctas_per_sm", bad, "max_ctas_per_sm must be None or an integer from 1 to 32")
      for bad in (0, 33, 1.5, True, "2")],
    *[("warp_items", bad, "warp_items must be None, True or False") for bad in (1, "yes", 0.0)],
])
def test_bad_launch_option_is_refused(option, bad, message):
    kc, vc = fast_layout.allocate_fast_kv_cache(4, 16, 2, 128, torch.float16, "cpu", storage="NHD")
    q = torch.zeros(1, 4, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match=message):
        fast_ops.paged_attention(None, q, kc, vc, 2, 0.1, torch.zeros(1, 1, dtype=torch.int32),
                             torch.ones(1, dtype=torch.int32), 16, 1, **{option: bad})


def test_h2nd_storage_puts_both_caches_in_one_allocation():
    """The default storage: views of one [num_blocks, kv_heads, 2, block_size, head_size] tensor, the
    keys and values of one block of one KV head side by side; writes go where the layout says."""
    kc, vc = fast_layout.allocate_fast_kv_cache(5, 16, 3, 64, torch.float16, "cpu")
    assert fast_layout.DEFAULT_STORAGE == "H2ND"
    assert kc.shape == vc.shape == (5, 16, 3, 64)
    assert kc.untyped_storage().data_ptr() == vc.untyped_storage().data_ptr()
    assert kc.stride() == (3 * 2 * 16 * 64, 64, 2 * 16 * 64, 1) == vc.stride()
    assert vc.data_ptr() - kc.data_ptr() == 16 * 64 * 2   # one block-head of keys (bytes) before its values
    kc.zero_()
    vc.fill_(1.0)
    assert kc.abs().sum() == 0 and bool((vc == 1).all())

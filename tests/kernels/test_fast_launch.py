"""The fast kernel's launch rule (kernels.fast.launch) as properties over many shapes and devices:
the splits cover every token of every sequence once, split lengths stay within their limits, the
launch fits the wave and the shared memory it claims, whole batches are never split, and warp
items only run where every warp has an item and the blocks make one even wave. No GPU needed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kernels.fast import launch  # noqa: E402
from kernels.fast.layout import FP8  # noqa: E402
from kernels.vllm.layout import SUPPORTED_HEAD_SIZES  # noqa: E402

RING_DTYPES = (torch.float16, torch.bfloat16)
TUNINGS = st.one_of(st.just(launch.Tuning()), st.sampled_from(list(launch.TUNING.values())),
                    st.builds(launch.Tuning, split_ctas_per_sm=st.integers(1, 3), one_per_sm_stages=st.integers(2, 4)))


@st.composite
def shapes(draw, dtypes=(*RING_DTYPES, FP8), head_sizes=SUPPORTED_HEAD_SIZES):
    """(num_seqs, num_heads, num_kv_heads, head_size, dtype, max_context_len, num_sms)."""
    kv_heads = draw(st.sampled_from((1, 2, 4, 5, 8, 16, 32, 40)))
    group = draw(st.sampled_from((1, 2, 4, 5, 8, 12, 16)))
    num_seqs = draw(st.one_of(st.integers(1, 16), st.integers(1, 1024)))
    ctx = draw(st.one_of(st.integers(0, 300), st.integers(1, 8192), st.integers(1, 262144)))
    num_sms = draw(st.sampled_from((16, 46, 78, 108, 114, 132, 144)))
    return (num_seqs, kv_heads * group, kv_heads, draw(st.sampled_from(head_sizes)), draw(st.sampled_from(dtypes)),
            ctx, num_sms)


def splits_launched(max_context_len: int, split_tokens: int) -> int:
    """The grid's splits per item, as ``paged_attention`` sizes them."""
    return max(1, -(-max_context_len // split_tokens))


def covered_tokens(context_len: int, split_tokens: int, max_splits: int) -> list[int]:
    """How often each token of a sequence is read: split ``s`` reads tokens
    ``[s * split_tokens, (s + 1) * split_tokens)`` of its context, for the ``max_splits`` splits of
    the grid (kernels/csrc/fast_decode.cuh)."""
    counts = [0] * context_len
    for s in range(max_splits):
        for t in range(s * split_tokens, min((s + 1) * split_tokens, context_len)):
            counts[t] += 1
    return counts


@settings(max_examples=300, deadline=None)
@given(shape=shapes(), tuning=TUNINGS, data=st.data())
def test_splits_cover_every_token_of_every_sequence_once(shape, tuning, data):
    b, h, kvh, hs, dtype, ctx, sms = shape
    got = launch.choose_launch(b, h, kvh, hs, dtype, ctx, sms, tuning=tuning)
    n = splits_launched(ctx, got.split_tokens)
    lens = data.draw(st.lists(st.integers(0, min(ctx, 4096)), min_size=1, max_size=3) if ctx <= 4096
                     else st.lists(st.sampled_from((1, ctx // 3, ctx - 1, ctx)), min_size=1, max_size=3))
    for length in lens:
        assert covered_tokens(length, got.split_tokens, n) == [1] * length, (length, got, n)
    assert (n - 1) * got.split_tokens < max(ctx, 1), f"an empty split for the longest sequence: {got}, {n} splits"


@settings(max_examples=400, deadline=None)
@given(shape=shapes(), tuning=TUNINGS)
def test_split_lengths_are_whole_tiles_and_never_longer_than_the_context(shape, tuning):
    b, h, kvh, hs, dtype, ctx, sms = shape
    got = launch.choose_launch(b, h, kvh, hs, dtype, ctx, sms, tuning=tuning)
    whole = launch.whole_tokens(ctx)
    assert got.split_tokens % launch.TILE == 0 and launch.TILE <= got.split_tokens <= whole, got
    if got.split_tokens < whole:  # a real split: one tile per warp at least
        assert got.split_tokens % (launch.WARPS * launch.TILE) == 0, got


@settings(max_examples=400, deadline=None)
@given(shape=shapes(), tuning=TUNINGS)
def test_the_load_path_fits_the_shared_memory(shape, tuning):
    b, h, kvh, hs, dtype, ctx, sms = shape
    got = launch.choose_launch(b, h, kvh, hs, dtype, ctx, sms, tuning=tuning)
    assert got.stages in (0, 2, 3, 4), got
    if got.stages:
        assert dtype != FP8 and hs <= 128, f"a ring for {dtype}, head {hs}"
        assert launch.ring_smem_bytes(hs, got.stages) <= min(launch.SMEM_LIMIT, 227 * 1024), got  # sm_90's opt-in limit
        assert got.stages <= launch.max_stages(hs, dtype)
    else:
        assert launch.max_stages(hs, dtype) == 0, f"register loads where the ring exists: {got}"
    assert got.max_ctas_per_sm is None or 1 <= got.max_ctas_per_sm <= 32


@settings(max_examples=400, deadline=None)
@given(shape=shapes(dtypes=RING_DTYPES, head_sizes=(64, 80, 96, 128)), tuning=TUNINGS)
def test_ring_launches_that_split_make_one_wave_at_their_cap(shape, tuning):
    b, h, kvh, hs, dtype, ctx, sms = shape
    got = launch.choose_launch(b, h, kvh, hs, dtype, ctx, sms, tuning=tuning)
    items = launch.work_items(b, h, kvh)
    n = splits_launched(ctx, got.split_tokens)
    if items > sms:
        assert n == 1, f"{items} items already fill {sms} SMs, yet {n} splits"
        return
    assert got.max_ctas_per_sm is not None and not got.warp_items, got
    assert items * n <= got.max_ctas_per_sm * sms, f"{items} items x {n} splits exceed one wave of {got}"
    if items >= launch.ONE_PER_SM_FILL * sms:
        assert (n, got.max_ctas_per_sm) == (1, 1), f"about one block per SM already, yet {got}"
    else:
        assert got.max_ctas_per_sm in (1, tuning.split_ctas_per_sm), got


@settings(max_examples=400, deadline=None)
@given(shape=shapes(), tuning=TUNINGS)
def test_warp_items_only_where_every_warp_has_an_item_in_one_even_wave(shape, tuning):
    b, h, kvh, hs, dtype, ctx, sms = shape
    got = launch.choose_launch(b, h, kvh, hs, dtype, ctx, sms, tuning=tuning)
    if not got.warp_items:
        return
    pairs = launch.work_items(1, h, kvh)
    blocks = b * pairs // launch.WARPS
    assert pairs % launch.WARPS == 0, f"{pairs} items per sequence leave warps idle"
    assert got.split_tokens == launch.whole_tokens(ctx) >= launch.WARP_ITEMS_CONTEXT, got
    assert (got.stages, got.max_ctas_per_sm) == (2, 2), got
    assert any(launch.ONE_PER_SM_FILL * k * sms <= blocks <= k * sms for k in (1, 2)), f"{blocks} blocks on {sms} SMs"


@settings(max_examples=300, deadline=None)
@given(shape=shapes(), stages=st.sampled_from((0, 2, 3, 4)))
def test_float8_large_heads_or_a_given_ring_take_the_plain_split_rule_uncapped(shape, stages):
    b, h, kvh, hs, dtype, ctx, sms = shape
    plain = launch.choose_split_tokens(b, h, kvh, ctx, sms)
    assert launch.choose_launch(b, h, kvh, hs, dtype, ctx, sms, stages=stages) == launch.Launch(plain, stages, None)
    if launch.max_stages(hs, dtype) == 0:
        assert launch.choose_launch(b, h, kvh, hs, dtype, ctx, sms) == launch.Launch(plain, 0, None)


@settings(max_examples=400, deadline=None)
@given(shape=shapes())
def test_plain_split_rule_limits(shape):
    b, h, kvh, _, _, ctx, sms = shape
    split = launch.choose_split_tokens(b, h, kvh, ctx, sms)
    whole = launch.whole_tokens(ctx)
    items = launch.work_items(b, h, kvh)
    n = splits_launched(ctx, split)
    assert split % launch.TILE == 0 and split <= whole
    if items >= 4 * sms:
        assert split == whole, "at least 4 blocks per SM: no split"
    assert split >= min(whole, launch.MIN_SPLIT_TOKENS_SMALL)
    if items * (whole // launch.TILE) >= launch.SMALL_TILES_PER_SM * sms:
        assert split >= min(whole, launch.MIN_SPLIT_TOKENS), "plenty of work: no split under MIN_SPLIT_TOKENS"
    if n > 1:
        assert split % 64 == 0 and n <= -(-16 * sms // items), f"{n} splits of {split} for {items} items"


@given(name=st.text(max_size=30))
def test_tuning_is_the_entry_named_in_the_device_name_else_the_default(name):
    matches = [t for key, t in launch.TUNING.items() if key in name]
    assert launch.tuning_for(name) == (matches[0] if matches else launch.Tuning())
    assert launch.tuning_for("NVIDIA H100 80GB HBM3") == launch.TUNING["H100"] != launch.Tuning()
    assert launch.tuning_for("NVIDIA H200") == launch.Tuning()


def test_warp_items_fit_one_even_wave_that_fills_the_gpu():
    # 8 pairs per sequence: 2 blocks of 4 warp items; 90-100% of the SMs with one block each, or two
    fits = [n for n in range(1, 200) if launch.warp_items_fit(n, 8, 2, 132)]
    assert [2 * n for n in fits] == list(range(120, 133, 2)) + list(range(238, 265, 2))
    assert [n for n in range(1, 200) if launch.warp_items_fit(n, 8, 1, 132)] == list(range(60, 67))
    # idle warps: pairs not a multiple of 4, however many blocks
    assert not any(launch.warp_items_fit(n, pairs, 2, 132) for n in range(1, 1100) for pairs in (1, 2, 5, 6))


def test_prefetch_is_chosen_only_for_latency_bound_half_precision_shapes():
    assert launch.choose_prefetch(1, 32, 8, 128, torch.float16)           # 8 thread-block groups on 132 SMs
    assert not launch.choose_prefetch(64, 32, 32, 128, torch.float16)     # the batch fills the GPU
    assert not launch.choose_prefetch(8, 32, 8, 128, torch.float16)       # 64 groups
    assert not launch.choose_prefetch(1, 32, 8, 256, torch.float16)       # large heads keep one tile
    assert not launch.choose_prefetch(1, 32, 8, 128, FP8)


def test_load_path_rule_and_ring_limits():
    """The 2-stage ring is chosen wherever it exists, never for float8 caches or heads over 128;
    its shared memory decides the deepest ring."""
    assert launch.choose_stages(512, 128, torch.float16) == 2
    assert launch.choose_stages(32768, 64, torch.bfloat16) == 2
    assert launch.choose_stages(256, 256, torch.float16) == 0
    assert launch.choose_stages(256, 128, FP8) == 0
    assert launch.ring_smem_bytes(128, 2) == 4 * 2 * (2 * 16 * 128 * 2 + 256)
    assert launch.max_stages(128, torch.float16) == 4          # 135 KB for 4 stages fits 227 KB
    assert launch.max_stages(192, torch.float16) == 0 == launch.max_stages(128, FP8)

"""The prefill kernel's blocks placed on the SMs (`blocksim.cost.placement`): the kernel's own
configuration choice, the per-SM keys against a plain recount, the share read from a profile's
batch cells, and the profiled model's price of a multi-prompt step."""

import json

import numpy as np
import pytest
from cost_profiles import synthetic_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from blocksim.cost import ProfiledCostModel, load_profile, placement
from blocksim.experiments.runner import build_config

SHAPES = [(32, 8, 128, 132), (32, 32, 128, 132), (40, 8, 128, 108), (32, 8, 256, 132), (16, 2, 64, 58)]


def recount(new, cached, heads, kv, head, sms):
    """Per SM (longest block's keys, all its keys, blocks), block by block as the kernel launches them."""
    group = heads // kv
    rows = [p * group for p in new]
    bm = placement.LARGE_ROWS if placement.prefill_config(len(new), max(new), heads, kv, head, sms) == 0 \
        else placement.LARGE_ROWS // 2
    bx = -(-max(rows) // bm)
    longest, total, count = [0] * sms, [0] * sms, [0] * sms
    index = 0
    for z in range(len(new)):
        for _h in range(kv):
            for x in range(bx):
                first = (bx - 1 - x) * bm
                if first < rows[z]:
                    keys = cached[z] + min(new[z], (first + bm - 1) // group + 1)
                    sm = index % sms
                    longest[sm] = max(longest[sm], keys)
                    total[sm] += keys
                    count[sm] += 1
                index += 1
    return longest, total, count


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 700), st.integers(0, 9000)), min_size=1, max_size=5),
       st.sampled_from(SHAPES))
def test_sm_keys_equal_a_block_by_block_recount(prompts, shape):
    new, cached = [p for p, _ in prompts], [c for _, c in prompts]
    got = placement.sm_keys(new, cached, *shape)
    for a, b in zip(got, recount(new, cached, *shape)):
        assert a.tolist() == b


@pytest.mark.parametrize("shape", SHAPES)
def test_the_configuration_is_the_kernels_own(shape):
    pytest.importorskip("torch")
    from kernels.fast.prefill import choose_prefill_config
    heads, kv, head, sms = shape
    for n in (1, 2, 3, 8, 32):
        for p in (1, 16, 31, 64, 100, 127, 128, 300, 512, 1000, 4096):
            want = choose_prefill_config(n, p, heads, kv, head, sms)
            assert placement.prefill_config(n, p, heads, kv, head, sms) == want


def test_share_is_read_back_from_cells_that_follow_it():
    """Batch cells made by the placement rule itself (each cell's time proportional to its busiest
    SM at share 0.6) give back 0.6."""
    heads, kv, head, sms = 32, 8, 128, 132
    batches, new, cached = [1, 2, 4, 8], [16, 64, 128, 256, 512], [0, 512, 2048]
    secs = np.array([[[placement.busiest([p] * b, [c] * b, heads, kv, head, sms, 0.6) * 1e-6 for c in cached]
                      for p in new] for b in batches])
    assert placement.share_of(batches, new, cached, secs, heads, kv, head, sms) == pytest.approx(0.6)
    assert placement.share_of([1], new, cached, secs[:1], heads, kv, head, sms) is None


def profiled(tmp_path, prefill: str | None, share: float = 0.62):
    """llama-3-8b on an H100 whose prefill table follows the placement rule at `share`."""
    prof = synthetic_profile("llama-3-8b")
    a = prof["components"]["attn_prefill"]
    b, p, c = a["grid"]["batch"], [16, 64, 128, 256, 512, 1024], [0, 512, 2048, 4096]
    a["grid"]["new_tokens"], a["grid"]["cached_tokens"] = p, c
    a["seconds"] = [[[1.1e-6 * placement.busiest([x] * n, [y] * n, 32, 8, 128, 132, share) for y in c]
                     for x in p] for n in b]
    if prefill:
        prof["prefill_attention"] = prefill
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    return ProfiledCostModel(build_config(model="llama-3-8b", gpu="h100-80gb"), load_profile(path))


def test_two_long_blocks_on_one_sm_price_a_two_chunk_step_longer(tmp_path):
    """Two chunks whose longest row blocks share an SM (160 tokens over 2,900 cached beside 352
    new) last longer than the long chunk alone, by the busiest SM's keys; where they do not share
    one (128 beside 384), the step is priced as before. Without the mma.sync kernel in the profile,
    or the SM count, no placement."""
    placed, plain = profiled(tmp_path, "kernel"), profiled(tmp_path, None)
    assert placed.placement is not None and placed.placement[-1] == pytest.approx(0.62, rel=0.02)
    assert plain.placement is None
    for first, shares in ((160, True), (128, False), (96, True), (256, False)):
        new, cached = [first, 512 - first], [2900, 0]
        alone = placed.attn_prefill([first], [2900])
        before, after = plain.attn_prefill(new, cached), placed.attn_prefill(new, cached)
        if shares:
            ratio = placement.busiest(new, cached, 32, 8, 128, 132, 0.62) / placement.busiest(
                [first], [2900], 32, 8, 128, 132, 0.62)
            assert ratio > 1.2
            assert after == pytest.approx(max(before, alone * ratio), rel=0.02)
            assert after > 1.15 * before
        else:
            assert after == before
    # many blocks to an SM: the table's batch cells price it, the placement adds nothing
    assert placed.attn_prefill([2048, 2048], [0, 512]) == plain.attn_prefill([2048, 2048], [0, 512])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 9000)), min_size=1, max_size=4),
       st.sampled_from(SHAPES))
def test_shortcuts_agree_with_the_full_count(prompts, shape):
    """`busiest` of one prompt and `live_blocks` give what `sm_keys` counts."""
    new, cached = [p for p, _ in prompts], [c for _, c in prompts]
    longest, total, count = placement.sm_keys(new, cached, *shape)
    assert placement.live_blocks(new, *shape) == count.sum()
    one_l, one_t, _ = placement.sm_keys(new[:1], cached[:1], *shape)
    assert placement.busiest(new[:1], cached[:1], *shape, 0.6) == float(np.max(np.maximum(one_l, 0.6 * one_t)))


def test_one_prompt_between_one_and_two_blocks_an_sm_is_priced_by_its_busiest_sm(tmp_path):
    """Between the prefill grid's 256 new tokens (blocks one to an SM) and 512 (two to an SM), one
    prompt's price is the cells' seconds per busiest-SM key times its own busiest SM: exact for a
    table that follows the placement, where interpolating the seconds themselves is not."""
    placed, plain = profiled(tmp_path, "kernel"), profiled(tmp_path, None)
    assert placed._per_key[:2] == (256.0, 512.0)
    for p, c in ((288, 2900), (300, 512), (384, 1500), (511, 4096)):
        want = 1.1e-6 * placement.busiest([p], [c], 32, 8, 128, 132, placed.placement[-1])
        assert placed.attn_prefill([p], [c]) == pytest.approx(want, rel=1e-9)
    assert abs(plain.attn_prefill([288], [2900]) / (1.1e-6 * placement.busiest([288], [2900], 32, 8, 128, 132, 0.62))
               - 1) > 0.05
    # on the grid's points, outside the pair, and below 512 cached tokens: the table as before
    for p, c in ((256, 2900), (512, 2900), (128, 100), (1024, 0), (300, 0), (400, 511)):
        assert placed.attn_prefill([p], [c]) == plain.attn_prefill([p], [c])
    # beyond the grid's cached tokens the seconds per key are held at its edge
    edge = placed.attn_prefill([300], [4096]) / placement.busiest([300], [4096], 32, 8, 128, 132, placed.placement[-1])
    far = placed.attn_prefill([300], [9000]) / placement.busiest([300], [9000], 32, 8, 128, 132, placed.placement[-1])
    assert far == pytest.approx(edge, rel=1e-12)


def test_prompts_of_no_new_token_are_priced_without_placing_them(tmp_path):
    placed, plain = profiled(tmp_path, "kernel"), profiled(tmp_path, None)
    for new, cached in (([0, 0], [2900, 100]), ([1, 0, 1, 0, 0], None), ([0, 160, 352], [5000, 2900, 0])):
        got = placed.attn_prefill(new, cached)
        assert np.isfinite(got) and got >= plain.attn_prefill(new, cached)
    assert placement.busiest([0], [4000], 32, 8, 128, 132, 0.6) == 0.0
    assert [a.sum() for a in placement.sm_keys([0, 0], [10, 20], 32, 8, 128, 132)] == [0, 0, 0]


def test_no_placement_without_what_it_needs(tmp_path):
    """No placement where the profile's prefill table has no batch-1 cells or no cell gives the
    share, where the head size runs other tiles, or where the SMs are unknown; under tensor
    parallelism the heads are those of one GPU."""
    from blocksim.config import GPUSpec
    base = profiled(tmp_path, "kernel")
    assert base.placement is not None
    prof = synthetic_profile("llama-3-8b")
    prof["prefill_attention"] = "kernel"
    a = prof["components"]["attn_prefill"]
    a["grid"]["batch"], a["seconds"] = [2, 4, 8], a["seconds"][1:]  # no batch of one
    path = tmp_path / "nobatch1.json"
    path.write_text(json.dumps(prof))
    assert ProfiledCostModel(build_config(model="llama-3-8b", gpu="h100-80gb"), load_profile(path)).placement is None
    assert placement.share_of([2, 4], [256], [2048], np.ones((2, 1, 1)), 32, 8, 128, 132) is None
    assert placement.share_of([1, 2], [16], [0], np.ones((2, 1, 1)), 32, 8, 128, 132) is None  # no cell qualifies
    cfg = build_config(model="llama-3-8b", gpu="h100-80gb")
    wide = cfg.model.__class__(**{**cfg.model.__dict__, "head_size": 256})
    assert ProfiledCostModel._placement(cfg.__class__(**{**cfg.__dict__, "model": wide}),
                                        load_profile(tmp_path / "p.json")) is None
    nosm = GPUSpec(**{**cfg.gpu.__dict__, "num_sms": 0})
    assert ProfiledCostModel._placement(cfg.__class__(**{**cfg.__dict__, "gpu": nosm}),
                                        load_profile(tmp_path / "p.json")) is None
    tp2 = build_config(model="llama-3-8b", gpu="h100-80gb", tensor_parallel=2)
    assert ProfiledCostModel._placement(tp2, load_profile(tmp_path / "p.json"))[:2] == (16, 4)


@pytest.mark.parametrize("value", ["abc", -5, [132], 13.7, True])
def test_a_profile_naming_a_bad_sm_count_is_refused_in_one_line(tmp_path, value):
    from blocksim.config import ConfigError
    prof = synthetic_profile("llama-3-8b")
    prof["num_sms"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError, match=r"num_sms: expected a whole number of SMs >= 0") as e:
        load_profile(path)
    assert "\n" not in str(e.value)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 700), st.integers(0, 9000)), min_size=2, max_size=6))
def test_few_and_many_prompts_are_priced_by_one_rule(prompts):
    """The plain-Python path for a few prompts and the array path for many give the same price:
    the same prompts, padded with copies of themselves past the few, against pricing them alone."""
    import tempfile
    from pathlib import Path
    from blocksim.cost import profiled as pm
    with tempfile.TemporaryDirectory() as d:
        m = profiled(Path(d), "kernel")
    new, cached = [p for p, _ in prompts], [c for _, c in prompts]
    few = m.attn_prefill(new, cached)
    old, pm.FEW_PROMPTS = pm.FEW_PROMPTS, 0
    try:
        many = m.attn_prefill(new, cached)
    finally:
        pm.FEW_PROMPTS = old
    assert many == pytest.approx(few, rel=1e-12)

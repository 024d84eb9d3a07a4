"""Specification of blocksim/memory/address_space.py: buddy and first-fit contiguous reservations."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blocksim.memory.address_space import (
    CONTIGUOUS_ALLOCATORS,
    RESERVATION_MODES,
    BuddyAllocator,
    FirstFitAllocator,
    reservation_slots,
)


# -- buddy: hand-checked split / merge ------------------------------------------

def test_buddy_split_and_merge_capacity_16():
    a = BuddyAllocator(16)
    assert a.alloc("r3", 3) == 0, "3 slots round to 4, lowest address"
    assert a.allocated_slots("r3") == 4
    assert list(a.free_blocks()) == [4, 8], "16 splits into 8+8, then 8 into 4+4"
    assert a.alloc("r8", 8) == 8, "the free 8-block is the upper half"
    assert a.used_slots == 12 and a.free_slots == 4
    a.check_invariants()
    a.free("r3")
    a.free("r8")
    a.check_invariants()
    assert list(a.free_blocks()) == [16], "all buddies merge back into the root"
    assert list(a.free_extents()) == [16]


def test_buddy_prefers_smallest_sufficient_block_then_lowest_address():
    a = BuddyAllocator(16)
    assert [a.alloc(i, 4) for i in range(4)] == [0, 4, 8, 12]
    a.free(0)
    a.free(2)
    a.free(3)  # 8 and 12 merge into an 8-block; 0 stays a lone 4-block
    assert list(a.free_blocks()) == [4, 8]
    assert a.alloc("x", 2) == 0, "split the 4-block at 0, not the 8-block at 8"
    assert a.alloc("y", 4) == 8, "an exact-size block is made by splitting the 8-block"
    a.check_invariants()


def test_buddy_merge_stops_at_non_buddy_neighbours():
    a = BuddyAllocator(16)
    for i in range(4):
        a.alloc(i, 4)
    a.free(1)
    a.free(2)  # free 4@4 and 4@8 are adjacent but have different parents
    assert list(a.free_blocks()) == [4, 4], "non-buddies must not merge"
    assert list(a.free_extents()) == [8], "but they form one contiguous free run"
    assert a.largest_free_extent() == 8
    assert a.largest_free_block() == 4
    assert not a.can_alloc(5), "an 8-chunk does not fit although 8 contiguous slots are free"
    assert a.alloc("big", 8) is None, "alloc signals full with None, never raises"
    a.check_invariants()


def test_buddy_non_power_of_two_capacity_uses_several_roots():
    a = BuddyAllocator(24)
    assert list(a.free_blocks()) == [16, 8], "24 = root of 16 at 0 + root of 8 at 16"
    assert list(a.free_extents()) == [24]
    assert a.fits_ever(16) and not a.fits_ever(17), "no chunk larger than the largest root"
    assert a.alloc("a", 8) == 16, "the exact-size root is taken before splitting the 16"
    assert a.alloc("b", 16) == 0
    assert a.alloc("c", 1) is None
    a.free("a")
    a.free("b")
    assert list(a.free_blocks()) == [16, 8], "roots never merge with each other"
    a.check_invariants()


def test_buddy_min_slots_rounds_up_and_reports_unusable_remainder():
    a = BuddyAllocator(100, min_slots=16)
    assert a.usable_slots == 96 and a.unusable_slots == 4, "100 = 6 units of 16 + 4 unusable"
    assert list(a.free_blocks()) == [64, 32]
    assert a.chunk_slots(1) == 16 and a.chunk_slots(17) == 32 and a.chunk_slots(64) == 64
    assert a.alloc("r", 5) == 64, "a 16-chunk splits the 32-root, the smallest block that fits"
    assert a.allocated_slots("r") == 16
    assert a.used_slots + a.free_slots + a.unusable_slots == a.capacity_slots
    a.check_invariants()


def test_buddy_rejects_bad_construction():
    with pytest.raises(ValueError, match="power of two"):
        BuddyAllocator(64, min_slots=12)
    with pytest.raises(ValueError, match="smaller than min_slots"):
        BuddyAllocator(8, min_slots=16)
    with pytest.raises(ValueError):
        BuddyAllocator(0)


# -- first fit: hand-checked ----------------------------------------------------

def test_first_fit_takes_lowest_address_extent_that_fits():
    a = FirstFitAllocator(20)
    assert [a.alloc(i, 5) for i in range(4)] == [0, 5, 10, 15]
    a.free(1)  # extent 5@5
    a.free(3)  # extent 5@15
    assert a.alloc("x", 3) == 5, "first fit by address, not best fit"
    assert a.alloc("y", 3) == 15, "remaining 2@8 is too small"
    assert a.alloc("z", 3) is None
    assert list(a.free_extents()) == [2, 2]
    a.check_invariants()


def test_first_fit_coalesces_with_both_neighbours():
    a = FirstFitAllocator(30)
    for i in range(3):
        a.alloc(i, 10)
    a.free(0)
    a.free(2)
    assert list(a.free_extents()) == [10, 10]
    a.free(1)
    assert list(a.free_extents()) == [30], "freeing the middle chunk joins prev and next extents"
    assert a.alloc("all", 30) == 0
    a.check_invariants()


def test_first_fit_exact_sizes_have_no_rounding():
    a = FirstFitAllocator(10)
    assert a.chunk_slots(7) == 7
    assert a.alloc("a", 7) == 0 and a.allocated_slots("a") == 7
    assert a.can_alloc(3) and not a.can_alloc(4)
    assert not a.fits_ever(11)


# -- shared behaviour -------------------------------------------------------------

ALLOCATORS = [lambda: BuddyAllocator(64), lambda: FirstFitAllocator(64)]


@pytest.mark.parametrize("make", ALLOCATORS, ids=["buddy", "first-fit"])
def test_double_free_raises_key_error(make):
    a = make()
    a.alloc("r", 4)
    a.free("r")
    with pytest.raises(KeyError, match="freed twice"):
        a.free("r")
    with pytest.raises(KeyError, match="'ghost'"):
        a.free("ghost")


@pytest.mark.parametrize("make", ALLOCATORS, ids=["buddy", "first-fit"])
def test_duplicate_request_and_bad_sizes_are_refused(make):
    a = make()
    a.alloc("r", 4)
    with pytest.raises(ValueError, match="already holds"):
        a.alloc("r", 4)
    with pytest.raises(ValueError):
        a.alloc("s", 0)
    with pytest.raises(TypeError):
        a.alloc("s", 2.5)


@pytest.mark.parametrize("make", ALLOCATORS, ids=["buddy", "first-fit"])
def test_oversized_request_returns_none(make):
    a = make()
    assert not a.fits_ever(65) and not a.can_alloc(65)
    assert a.alloc("huge", 65) is None
    assert len(a) == 0 and a.used_slots == 0


def test_registry_names():
    assert CONTIGUOUS_ALLOCATORS == {"buddy": BuddyAllocator, "first-fit": FirstFitAllocator}


# -- property tests -----------------------------------------------------------------

def _bitmap(a, capacity):
    """Slot occupancy rebuilt from the allocations; raises on overlap."""
    used = np.zeros(capacity, dtype=bool)
    for rid in list(a._allocs):
        o, n = a.offset(rid), a.allocated_slots(rid)
        assert o >= 0 and o + n <= a.usable_slots, f"chunk of {rid} out of range"
        assert not used[o:o + n].any(), f"chunk of {rid} overlaps another"
        used[o:o + n] = True
    return used


def _runs(free_mask):
    """(start, length) of maximal runs of True, in address order."""
    padded = np.concatenate(([False], free_mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[0::2].tolist(), (edges[1::2] - edges[0::2]).tolist()))


ops = st.lists(
    st.one_of(st.tuples(st.just("alloc"), st.integers(1, 80)), st.tuples(st.just("free"), st.integers(0, 10**6))),
    max_size=60,
)


def _apply(a, script, after_alloc):
    live = []
    for step, (op, arg) in enumerate(script):
        if op == "alloc":
            can = a.can_alloc(arg)
            off = a.alloc(step, arg)
            assert (off is not None) == can, "can_alloc must predict alloc"
            after_alloc(a, step, arg, off)
            if off is not None:
                live.append(step)
        elif live:
            a.free(live.pop(arg % len(live)))
        a.check_invariants()
        assert a.used_slots + a.free_slots == a.usable_slots
        assert sum(a.allocated_slots(r) for r in live) == a.used_slots
        free_mask = ~_bitmap(a, a.usable_slots)
        assert list(a.free_extents()) == [n for _, n in _runs(free_mask)], "free_extents = maximal free runs"
    for rid in live:
        a.free(rid)
    a.check_invariants()
    assert a.used_slots == 0 and len(a) == 0


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 200), min_exp=st.integers(0, 3), script=ops)
def test_buddy_random_sequences_keep_invariants(capacity, min_exp, script):
    min_slots = 1 << min_exp
    if capacity < min_slots:
        capacity = min_slots
    a = BuddyAllocator(capacity, min_slots=min_slots)
    roots = list(a.free_blocks())
    root_spans = list(zip(np.cumsum([0] + roots[:-1]).tolist(), roots))

    def after_alloc(a, rid, size, off):
        chunk = a.chunk_slots(size)
        assert chunk >= max(size, min_slots) and chunk & (chunk - 1) == 0
        if off is not None:
            assert a.allocated_slots(rid) == chunk
            assert off % chunk == 0, "chunk aligned to its size"
            return
        # full: then no aligned, wholly free, chunk-sized region lies inside one root
        free_mask = ~_bitmap(a, a.usable_slots)
        for root_off, root_size in root_spans:
            for o in range(root_off, root_off + root_size - chunk + 1, chunk):
                assert not free_mask[o:o + chunk].all(), f"alloc({size}) returned None but [{o}, {o + chunk}) is free"

    _apply(a, script, after_alloc)
    assert list(a.free_blocks()) == roots, "freeing everything restores one free block per root"
    assert list(a.free_extents()) == [a.usable_slots]


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 200), script=ops)
def test_first_fit_random_sequences_match_bitmap_reference(capacity, script):
    a = FirstFitAllocator(capacity)

    def after_alloc(a, rid, size, off):
        # reference first fit: the first maximal free run, by address, long enough
        used = _bitmap(a, capacity)
        if off is not None:
            used[off:off + size] = False
        expected = next((s for s, n in _runs(~used) if n >= size), None)
        assert off == expected, f"first fit of {size} should land at {expected}, got {off}"

    _apply(a, script, after_alloc)
    assert list(a.free_extents()) == [capacity]


# -- reservation sizes ----------------------------------------------------------------

def test_reservation_modes():
    assert RESERVATION_MODES == ("max", "pow2", "oracle")
    assert reservation_slots("oracle", 100, 27, 2048) == 127
    assert reservation_slots("pow2", 100, 27, 2048) == 132, "the output is over-reserved to a power of two"
    assert reservation_slots("pow2", 100, 32, 2048) == 132
    assert reservation_slots("pow2", 100, 33, 2048) == 164
    assert reservation_slots("max", 100, 27, 2048) == 2048
    assert reservation_slots("max", 2000, 100, 2048) == 2100, "max never reserves less than the true total"
    assert reservation_slots("oracle", 5, 0, 2048) == 5


def test_reservation_unknown_mode_lists_known_ones():
    with pytest.raises(ValueError, match="max, pow2, oracle"):
        reservation_slots("exact", 1, 1, 16)


def test_reservation_rejects_negative_or_empty_requests():
    with pytest.raises(ValueError):
        reservation_slots("oracle", -1, 5, 16)
    with pytest.raises(ValueError):
        reservation_slots("oracle", 0, 0, 16)


@given(prompt=st.integers(1, 5000), output=st.integers(0, 5000), max_len=st.integers(1, 8192))
def test_reservation_orders_oracle_le_pow2_and_max(prompt, output, max_len):
    oracle = reservation_slots("oracle", prompt, output, max_len)
    pow2 = reservation_slots("pow2", prompt, output, max_len)
    assert oracle == prompt + output <= pow2 < prompt + 2 * max(output, 1)
    assert reservation_slots("max", prompt, output, max_len) >= oracle

"""vLLM V1's block pool and free queue (scenarios of vLLM v0.11's tests/v1/core/test_kv_cache_utils.py
and the pool parts of test_prefix_caching.py, re-expressed)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blocksim.memory.block_pool import BlockPool, FreeBlockQueue
from blocksim.memory.blocks import BlockError


def test_free_queue_starts_with_every_block_in_id_order():
    q = FreeBlockQueue(4)
    assert q.num_free == 4 and q.blocks() == [0, 1, 2, 3]
    assert q.head == 0 and q.tail == 3


def test_free_queue_popleft_remove_append_keep_the_links():
    q = FreeBlockQueue(6)
    assert q.popleft() == 0
    q.remove(3)        # from the middle
    q.remove(5)        # the tail
    q.remove(1)        # the head
    assert q.blocks() == [2, 4] and q.num_free == 2 and q.head == 2 and q.tail == 4
    q.append(3)
    q.append(0)
    assert q.blocks() == [2, 4, 3, 0]
    assert [q.popleft() for _ in range(4)] == [2, 4, 3, 0]
    assert q.num_free == 0 and q.blocks() == []
    with pytest.raises(BlockError, match="empty"):
        q.popleft()
    q.append(5)
    assert q.blocks() == [5] and q.head == q.tail == 5


def test_pool_takes_the_null_block_out_at_start():
    pool = BlockPool(11)
    assert pool.num_free == 10
    assert pool.get_new_blocks(3) == [1, 2, 3], "block 0 is the null block, never handed out"
    with pytest.raises(BlockError, match="cannot take 8 blocks, 7 free"):
        pool.get_new_blocks(8)


def test_freed_blocks_join_the_tail_in_the_given_order():
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)  # 1, 2, 3
    pool.free_blocks(reversed(blocks))
    assert pool.free_queue.blocks() == [4, 5, 3, 2, 1]
    with pytest.raises(BlockError, match="freed twice"):
        pool.free_blocks([1])
    b = pool.get_new_blocks(1)[0]
    with pytest.raises(BlockError, match="freed twice"):
        pool.free_blocks([b, b])  # the same block twice in one call


def test_touching_a_free_cached_block_takes_it_out_of_the_queue():
    pool = BlockPool(5)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a, b], [111, 222], 0, 2)
    pool.free_blocks([b, a])
    assert pool.free_queue.blocks() == [3, 4, b, a]
    pool.touch([a])
    assert pool.ref_cnt[a] == 1 and pool.free_queue.blocks() == [3, 4, b]
    pool.touch([a])  # a block in use: only its reference count changes
    assert pool.ref_cnt[a] == 2 and pool.num_free == 3
    pool.check()


def test_cached_block_keeps_its_hash_until_the_queue_hands_it_out():
    pool = BlockPool(3)  # 2 usable blocks
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [7], 0, 1)
    pool.free_blocks([b, a])
    assert pool.get_cached_block(7) == a, "a free cached block can still be hit"
    assert pool.get_new_blocks(1) == [b]
    assert pool.get_cached_block(7) == a and pool.evictions == 0
    assert pool.get_new_blocks(1) == [a]
    assert pool.get_cached_block(7) is None and pool.block_hash[a] is None and pool.evictions == 1


def test_equal_hashes_on_several_blocks_are_kept_and_evicted_one_by_one():
    """vLLM does not de-duplicate cached blocks (block tables stay append-only); a lookup returns
    the first block cached under a hash, and evicting one copy leaves the others."""
    pool = BlockPool(4)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_full_blocks([a, b], [9, 9], 0, 2)
    assert (pool.cached[9], pool.duplicates[9]) == (a, [b]) and pool.get_cached_block(9) == a
    pool.free_blocks([a])
    assert pool.get_new_blocks(1) == [a]
    assert pool.get_cached_block(9) == b and pool.evictions == 1
    pool.free_blocks([b, c, a])
    pool.check()


def test_evicting_other_hashes_leaves_the_copies_of_a_duplicated_hash():
    pool = BlockPool(5)  # 4 usable blocks
    a, b, c, d = pool.get_new_blocks(4)
    pool.cache_full_blocks([a, b, c, d], [9, 9, 5, 6], 0, 4)
    pool.free_blocks([c, d, a])
    assert pool.get_new_blocks(2) == [c, d]  # no copy of 5 or 6: forgotten together
    assert pool.get_cached_block(5) is None and pool.get_cached_block(6) is None and pool.evictions == 2
    assert (pool.cached[9], pool.duplicates[9]) == (a, [b])
    assert pool.get_new_blocks(1) == [a]  # its copy b stays cached
    assert pool.get_cached_block(9) == b and 9 not in pool.duplicates and pool.evictions == 3
    pool.check()


def test_caching_disabled_records_no_hash():
    pool = BlockPool(4, enable_caching=False)
    a, = pool.get_new_blocks(1)
    pool.cache_full_blocks([a], [5], 0, 1)
    assert pool.get_cached_block(5) is None and pool.block_hash[a] is None


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["take", "free", "touch", "cache"]), st.integers(0, 30)), max_size=80))
def test_pool_invariants_hold_under_any_sequence_of_calls(ops):
    """The free queue holds exactly the blocks with no reference, whatever the calls."""
    pool = BlockPool(9)
    held: list[int] = []
    for op, x in ops:
        if op == "take" and pool.num_free:
            held += pool.get_new_blocks(1 + x % pool.num_free)
        elif op == "free" and held:
            b = held.pop(x % len(held))
            pool.free_blocks([b])
        elif op == "touch":
            b = 1 + x % 8
            if pool.ref_cnt[b] or pool.block_hash[b] is not None:
                pool.touch([b])
                held.append(b)
        elif op == "cache" and held:
            b = held[x % len(held)]
            if pool.block_hash[b] is None:
                pool.cache_full_blocks([b], [x % 4], 0, 1)
        pool.check()
        assert pool.num_free + len(set(held)) == 8


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["take", "pop", "remove", "free"]), st.integers(0, 40)), max_size=120))
def test_free_queue_hands_out_blocks_in_eviction_order(ops):
    """Taking, popping, removing from the middle and freeing, against a plain list of the free
    blocks in eviction order: every take returns that list's head, however many removed entries
    lie ahead of it."""
    q, ref, used = FreeBlockQueue(24), list(range(24)), []
    for op, x in ops:
        if op == "take" and ref:
            n = 1 + x % len(ref)
            assert q.take(n) == ref[:n]
            used += ref[:n]
            del ref[:n]
        elif op == "pop" and ref:
            assert q.popleft() == ref.pop(0)
        elif op == "remove" and ref:
            b = ref.pop(x % len(ref))
            q.remove(b)
            used.append(b)
        elif op == "free" and used:
            k = 1 + x % len(used)
            back, used = used[-k:], used[:-k]
            q.extend(back)
            ref += back
        assert q.blocks() == ref and q.num_free == len(ref)
        assert q.peek(x) == ref[:x], "peek: the blocks a take would return, left in place"
        assert q.blocks() == ref and q.num_free == len(ref)


def test_clean_head_counts_the_new_blocks_before_the_first_that_evicts_a_lookup_hit():
    """A span under KV tiers ends before a new block evicts content a lookup could find: the free
    queue's leading blocks without a hash (or with a hash no lookup reaches) are the clean ones."""
    from blocksim.memory.block_pool import UNIQUE
    pool = BlockPool(7)
    blocks = pool.get_new_blocks(6)
    pool.cache_full_blocks(blocks, [10, 11, 12, 13], 1, 3)  # blocks[1] and blocks[2] get hashes 11, 12
    pool.block_hash[blocks[3]] = UNIQUE                      # a deferred hash: no lookup finds it
    pool.free_blocks([blocks[0], blocks[3], blocks[1], blocks[4], blocks[2]])
    assert pool.clean_head(10) == 2 and pool.clean_head(1) == 1
    pool.touch([blocks[1]])  # a hit takes the first cached block out of the queue
    assert pool.clean_head(10) == 3
    assert pool.free_queue.blocks() == [blocks[0], blocks[3], blocks[4], blocks[2]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), max_size=10), max_size=5), st.integers(0, 3))
def test_caching_a_batch_of_full_blocks_is_caching_them_one_by_one(batches, start):
    """`cache_full_blocks_of` on several tables at once, hashes repeated within and across them,
    leaves the cache map, its duplicates and each block's hash as one block at a time would."""
    pool = BlockPool(64)
    filled, want_cached, want_dups, want_hash = [], {}, {}, {}
    for hashes in batches:
        blocks = pool.get_new_blocks(len(hashes)) if hashes else []
        lo = min(start, len(hashes))
        filled.append((blocks, hashes, lo, len(hashes)))
        for b, h in zip(blocks[lo:], hashes[lo:]):
            want_hash[b] = h
            if h in want_cached:
                want_dups.setdefault(h, []).append(b)
            else:
                want_cached[h] = b
    pool.cache_full_blocks_of(filled)
    assert pool.cached == want_cached and pool.duplicates == want_dups
    assert all(pool.block_hash[b] == h for b, h in want_hash.items())
    assert list(pool.cached) == list(want_cached)

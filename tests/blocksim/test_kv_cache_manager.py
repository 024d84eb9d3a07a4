"""vLLM V1's KV cache manager: the scenarios of vLLM v0.11's tests/v1/core/test_prefix_caching.py
(full attention, one KV cache group), re-expressed with block contents given as per-block ids."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blocksim.memory.block_pool import UNIQUE
from blocksim.memory.kv_cache_manager import ROOT_HASH, KVCacheManager
from blocksim.sequence import SequenceGroup

BS = 16


def manager(num_blocks=11, caching=True, block_size=BS):
    m = KVCacheManager(block_size, num_blocks, max_model_len=8192, enable_caching=caching)
    m.hash_block_tokens = block_size  # one content id per block
    return m


def request(index, contents, tail_tokens=0, block_size=BS, output=17):
    """A request whose full prompt blocks hold `contents` (one id per block) and `tail_tokens` more."""
    prompt = len(contents) * block_size + tail_tokens
    return SequenceGroup(index, index, 0.0, prompt, output, 1, 0, index, prefix_hashes=list(contents))


def admit(m, g):
    """get_computed_blocks + allocate_slots for the whole prompt, as the scheduler's first step."""
    blocks, hit = m.get_computed_blocks(g)
    ok = m.allocate_slots(g.seqs[0], hit, g.seqs[0].num_tokens - hit, blocks)
    return blocks, hit, ok


def free(m, g):
    m.free_request(g.seqs[0], g.seqs[0].num_tokens)


def test_prefill_hits_shared_blocks_and_frees_tail_first():
    m = manager()
    common = [0, 1, 2]
    r0 = request(0, common, tail_tokens=7)
    blocks, hit, ok = admit(m, r0)
    assert (blocks, hit, ok) == ([], 0, True)
    assert r0.seqs[0].block_table == [1, 2, 3, 4]
    parent = ROOT_HASH
    for block, content in zip((1, 2, 3), common):  # full blocks: hashes chained through the parent
        parent = hash((parent, content))
        assert m.pool.block_hash[block] == parent and m.pool.ref_cnt[block] == 1
    assert m.pool.block_hash[4] is None and m.pool.ref_cnt[4] == 1, "a partial block is never cached"

    r1 = request(1, common, tail_tokens=5)  # hit while the blocks are in use
    blocks, hit, ok = admit(m, r1)
    assert blocks == [1, 2, 3] and hit == 48 and ok
    assert r1.seqs[0].block_table == [1, 2, 3, 5]
    assert all(m.pool.ref_cnt[b] == 2 for b in (1, 2, 3))
    assert m.num_free_gpu_blocks == 5

    free(m, r0)
    free(m, r1)
    assert m.num_free_gpu_blocks == 10
    # never used (6-10), then r0's unshared tail (4), then r1's blocks tail first (5, 3, 2, 1)
    assert m.pool.free_queue.blocks() == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]

    r2 = request(2, common, tail_tokens=6)  # hit on free cached blocks
    blocks, hit, ok = admit(m, r2)
    assert blocks == [1, 2, 3] and hit == 48
    assert r2.seqs[0].block_table == [1, 2, 3, 6]
    assert m.num_free_gpu_blocks == 6 and all(m.pool.ref_cnt[b] == 0 for b in m.pool.free_queue.blocks())
    free(m, r2)

    r3 = request(3, [99] * 10)  # a miss that takes every block: the eviction order
    blocks, hit, ok = admit(m, r3)
    assert hit == 0 and ok
    assert r3.seqs[0].block_table == [7, 8, 9, 10, 4, 5, 6, 3, 2, 1]
    assert m.num_free_gpu_blocks == 0 and m.pool.free_queue.head == -1


def test_decode_fills_the_last_block_then_takes_a_new_one():
    m = manager()
    r0 = request(0, [0, 1, 2], tail_tokens=7)
    admit(m, r0)
    s = r0.seqs[0]
    s.num_tokens += 4  # four generated tokens
    assert m.allocate_slots(s, 55, 4)
    assert len(s.block_table) == 4 and m.pool.block_hash[s.block_table[-1]] is None
    s.num_tokens += 19  # 9 fill the last block, 10 go into a new one
    assert m.allocate_slots(s, 59, 19)
    assert len(s.block_table) == 5
    assert m.pool.block_hash[s.block_table[-2]] is not None, "the block filled by generated tokens is cached"
    assert m.pool.block_hash[s.block_table[-1]] is None


def test_evict_least_recently_freed_and_tail_first():
    m = manager()
    r0 = request(0, [10, 11, 12, 13, 14], tail_tokens=7)
    admit(m, r0)
    assert len(r0.seqs[0].block_table) == 6
    r1 = request(1, [20, 21, 22])
    admit(m, r1)
    assert len(r1.seqs[0].block_table) == 3 and m.num_free_gpu_blocks == 1
    free(m, r0)
    free(m, r1)
    assert m.pool.free_queue.blocks() == [10, 6, 5, 4, 3, 2, 1, 9, 8, 7]
    r2 = request(2, [10, 11], tail_tokens=3)  # touches the first two blocks of r0
    blocks, hit, ok = admit(m, r2)
    assert blocks == [1, 2] and hit == 32 and ok
    assert r2.seqs[0].block_table == [1, 2, 10]
    assert m.num_free_gpu_blocks == 7


def test_a_reused_block_forgets_its_old_hash():
    m = manager(num_blocks=2)  # one usable block
    r0 = request(0, [5])  # 16 tokens: the block fills and is cached
    admit(m, r0)
    b = r0.seqs[0].block_table[0]
    assert m.pool.block_hash[b] is not None
    free(m, r0)
    r1 = request(1, [], tail_tokens=15)  # a partial block takes it: evicted, no hash
    admit(m, r1)
    assert r1.seqs[0].block_table == [b] and m.pool.block_hash[b] is None and m.pool.evictions == 1


def test_a_hit_block_is_not_the_one_evicted():
    m = manager(num_blocks=3)  # two usable blocks
    r0, r1 = request(0, [1]), request(1, [2])
    admit(m, r0)
    admit(m, r1)
    assert r0.seqs[0].block_table == [1] and r1.seqs[0].block_table == [2]
    free(m, r0)
    free(m, r1)
    r2 = request(2, [1, 2])  # block 0 hits r0's; block 1's parent differs from r1's, so it misses
    blocks, hit, ok = admit(m, r2)
    assert blocks == [1] and hit == BS and ok
    assert r2.seqs[0].block_table == [1, 2], "the other free block is evicted, not the hit one"


def test_a_hit_never_covers_the_last_prompt_token():
    m = manager()
    r0 = request(0, [1, 2])
    admit(m, r0)
    r1 = request(1, [1, 2])  # the same 32 tokens: at most 31 can hit, so one block
    blocks, hit, _ = admit(m, r1)
    assert blocks == [1] and hit == BS
    assert r1.seqs[0].block_table == [1, 3]


def test_prefix_caching_disabled_never_hits():
    m = manager(num_blocks=5, caching=False, block_size=4)
    r1 = SequenceGroup(1, 1, 0.0, 10, 5, 1, 0, 1)
    blocks, hit, ok = admit(m, r1)
    assert (blocks, hit, ok) == ([], 0, True) and len(r1.seqs[0].block_table) == 3
    free(m, r1)
    r2 = SequenceGroup(2, 2, 0.0, 16, 5, 1, 0, 2)
    blocks, hit, ok = admit(m, r2)
    assert (blocks, hit, ok) == ([], 0, True) and len(r2.seqs[0].block_table) == 4
    r3 = SequenceGroup(3, 3, 0.0, 4, 5, 1, 0, 3)
    assert admit(m, r3)[2] is False, "no block left"


def test_not_enough_free_blocks_with_computed_blocks_changes_nothing():
    m = manager()
    common = [0, 1, 2]
    r0 = request(0, common)
    admit(m, r0)
    part0 = list(r0.seqs[0].block_table)
    r1 = request(1, common * 2)
    blocks, hit, ok = admit(m, r1)
    assert blocks == part0 and hit == 48 and ok
    part1 = list(r1.seqs[0].block_table)
    free(m, r1)
    assert {m.pool.ref_cnt[b] for b in part1[:3]} == {1} and {m.pool.ref_cnt[b] for b in part1[3:]} == {0}
    r2 = request(2, [7, 7])
    assert admit(m, r2)[1] == 0
    assert m.num_free_gpu_blocks == 5
    r3 = request(3, common * 3)  # 6 blocks hit (3 of them free), 3 new: 6 free blocks needed, 5 free
    blocks, hit = m.get_computed_blocks(r3)
    assert blocks == part1 and hit == 96
    assert not m.allocate_slots(r3.seqs[0], hit, 48, blocks)
    assert r3.seqs[0].block_table == []
    assert {m.pool.ref_cnt[b] for b in part1[:3]} == {1} and {m.pool.ref_cnt[b] for b in part1[3:]} == {0}
    assert m.num_free_gpu_blocks == 5


def test_memory_breakdown_adds_up_and_counts_scheduled_slots():
    m = manager()
    r0 = request(0, [0, 1], tail_tokens=3)
    admit(m, r0)
    mem = m.memory_breakdown(None, 0)
    assert mem.token_states == 35 and mem.reservation == 0 and mem.external_frag == 0
    assert mem.internal_frag == 4 * BS - 35  # 3 blocks + the null block, 35 slots written
    assert sum(mem) == 11 * BS
    r1 = request(1, [0, 1], tail_tokens=1)
    admit(m, r1)  # 2 shared blocks count once
    assert m.memory_breakdown(None, 0).token_states == 35 + 1
    free(m, r0)
    free(m, r1)
    assert m.memory_breakdown(None, 0).token_states == 0 and m.filled_slots == 0


def test_block_size_must_fit_the_hash_granularity():
    m = KVCacheManager(16, 11, 8192)
    m.hash_block_tokens = 24
    with pytest.raises(Exception, match="24 tokens.*block size 16"):
        m.get_computed_blocks(request(0, [1, 2]))


def test_hashes_extended_by_decode_and_spans_equal_those_computed_at_once():
    m = manager()
    m.defer_unique_hashes = False  # every hash computed as its block fills
    g = request(0, [1, 2], tail_tokens=5)
    admit(m, g)
    s = g.seqs[0]
    s.num_tokens += 1
    for _ in range(20):  # the scheduler's fast path, one token a step
        assert m.allocate_decode_slots([g], 0, 1, 1) == (1, s.num_tokens)
        s.num_tokens += 1
    takers = [0 for j in range(1, 26) if (s.num_tokens - 1 + j) % BS == 0]  # step j writes position n - 1 + j
    m.append_span_slots([s], 25, takers)  # a span of 25 further steps, as the engine advances one
    s.num_tokens += 25
    fresh = manager()
    want = fresh.block_hashes(s, len(m._hashes[s.seq_id]))
    assert m._hashes[s.seq_id] == want and len(want) == (s.num_tokens - 1) // BS


def decode_and_span(m, g, steps=20, span=25):
    """`steps` decode steps on the scheduler's fast path, then a span of `span` further steps."""
    s = g.seqs[0]
    s.num_tokens += 1
    for _ in range(steps):
        assert m.allocate_decode_slots([g], 0, 1, 1) == (1, s.num_tokens)
        s.num_tokens += 1
    takers = [0 for j in range(1, span + 1) if (s.num_tokens - 1 + j) % BS == 0]
    m.append_span_slots([s], span, takers)
    s.num_tokens += span


def same_pools(deferred, eager):
    """The same blocks free, in the same order, with the same references and evictions; each block
    holds the same hash but for those of unique content marked UNIQUE, which no lookup can find."""
    d, e = deferred.pool, eager.pool
    assert (d.free_queue.blocks(), d.ref_cnt, d.evictions) == (e.free_queue.blocks(), e.ref_cnt, e.evictions)
    unique = {e.block_hash[b] for b, h in enumerate(d.block_hash) if h is UNIQUE}
    assert None not in unique
    assert [None if h is UNIQUE else h for h in d.block_hash] == \
        [None if h in unique else h for h in e.block_hash]
    assert d.cached == {h: b for h, b in e.cached.items() if h not in unique} and d.duplicates == e.duplicates
    return len(unique)


@pytest.mark.parametrize("contents, tail", [([1, 2], 5), ([], 40), ([7], 0)])
def test_deferred_unique_hashes_give_the_pool_of_hashing_each_block_as_it_fills(contents, tail):
    """Unique content's hashes deferred until a preemption: the pool then holds what computing each
    hash as its block filled gives; evictions of never-hashed blocks count the same."""
    eager, deferred = manager(num_blocks=40), manager(num_blocks=40)
    eager.defer_unique_hashes = False
    groups = {}
    for m in (eager, deferred):
        first = request(0, contents, tail_tokens=tail)  # finishes: its unique blocks are never hashed
        admit(m, first)
        decode_and_span(m, first)
        m.free(first.seqs[0])
        g = groups[id(m)] = request(1, contents, tail_tokens=tail)
        admit(m, g)
        decode_and_span(m, g, steps=9, span=30)
        m.free_request(g.seqs[0], g.seqs[0].kv_len)  # a preemption: hashes computed, blocks cached
        g.preemptions += 1
    assert same_pools(deferred, eager) > 0, "the finished request's unique blocks stay unhashed"
    assert any(h is not None and h is not UNIQUE for h in deferred.pool.block_hash)
    for m in (eager, deferred):  # back from preemption: hits on its own blocks, then more steps
        g = groups[id(m)]
        blocks, hit, ok = admit(m, g)
        assert ok and hit > 0
        decode_and_span(m, g, steps=3, span=20)
        taker = request(2, [99], tail_tokens=m.num_free_gpu_blocks * BS - BS)  # takes every free block
        admit(m, taker)
    same_pools(deferred, eager)
    assert deferred.pool.evictions > 0
    deferred.pool.check()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-2**62, 2**62), min_size=1, max_size=12), st.integers(0, 6000),
       st.sampled_from([(16, 512), (16, 16), (8, 64), (32, 16), (64, 16), (256, 64), (16, 256), (1, 4)]),
       st.booleans())
def test_block_keys_follow_their_hash_blocks(hashes, prompt_tokens, sizes, as_array):
    """Each full prompt block's key, as the definition reads: block j of a hash block of `per`
    blocks is that hash times `per` plus j's offset; a block of several hash blocks takes its
    last one's hash; blocks past the hashes get none."""
    import numpy as np

    from blocksim.memory.prefix_cache import block_keys
    bs, h = sizes
    full = prompt_tokens // bs
    if h % bs == 0:
        want = [hashes[(j * bs) // h] * (h // bs) + j % (h // bs) for j in range(full) if (j * bs) // h < len(hashes)]
    else:
        want = [hashes[((j + 1) * bs) // h - 1] for j in range(full) if ((j + 1) * bs) // h - 1 < len(hashes)]
    given_hashes = np.array(hashes, dtype=np.int64) if as_array else hashes
    assert block_keys(given_hashes, prompt_tokens, bs, h) == want


def test_clean_takes_spares_only_the_refused_requests_hit_where_the_scheduler_names_it():
    """Under KV tiers a span ends before a new block that could change a waiting request's plan:
    any block of prefix-cached content, or, where the scheduler names the GPU hit that plan rests
    on alone (`refused_hit`), a block of that hit."""
    m = manager(num_blocks=9)
    r0, r1 = request(0, [0, 1, 2]), request(1, [5, 6])
    admit(m, r0)
    admit(m, r1)
    assert (r0.seqs[0].block_table, r1.seqs[0].block_table) == ([1, 2, 3], [4, 5])
    free(m, r0)  # back in the queue tail first, still cached
    free(m, r1)
    assert m.pool.free_queue.blocks() == [6, 7, 8, 3, 2, 1, 5, 4]
    assert m.clean_takes(8) == m.pool.clean_head(8) == 3, "new blocks up to the first cached one"
    m.refused_hit = [1, 2]  # a waiting request hits r0's first two blocks: only those matter to it
    assert m.clean_takes(8) == 4, "new blocks up to block 2"
    assert m.clean_takes(2) == 2

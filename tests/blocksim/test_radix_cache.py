"""The radix tree and the radix pool (blocksim.memory.radix_tree / radix_manager), scenario by
scenario as SGLang's own radix-cache tests exercise its RadixCache: insert and match, node
splits, lock references, LRU eviction of unlocked leaves, page-granular matching."""

import pytest

from blocksim.config import ConfigError
from blocksim.memory.radix_manager import RadixCacheManager
from blocksim.memory.radix_tree import Content, RadixTree
from blocksim.sequence import SeqStatus, SequenceGroup

H = 4  # tokens per prefix hash in these scenarios


def content(uid, hashes, prompt):
    return Content(uid, hashes, min(prompt, len(hashes) * H))


def freed_into(bag):
    return bag.extend


def test_insert_then_match_shares_the_common_hash_blocks_and_splits_the_node():
    tree = RadixTree(1, H, pages=False)
    a = content(1, [10, 11, 12], 12)
    b = content(2, [10, 11, 99], 12)
    assert tree.insert(a, 12, None)[0] == 0
    end, node = tree.match(b, 11)
    assert end == 8, "b agrees with a on its first two hash blocks (8 tokens)"
    assert (node.start, node.end) == (0, 8), "the match ends inside a's node, which is split there"
    assert len(node.children) == 1 and next(iter(node.children.values())).end == 12
    assert tree.insert(b, 12, None)[0] == 8, "inserting b finds 8 tokens already in the tree"
    assert len(node.children) == 2, "b's last block branches off beside a's"


def test_private_tokens_match_only_their_own_request():
    tree = RadixTree(1, H, pages=False)
    a = content(1, [10, 11], 8)
    tree.insert(a, 14, None)  # 8 hashed prompt tokens + 6 private ones (outputs)
    assert tree.match(content(2, [10, 11], 8), 14)[0] == 8, "another request stops where the hashes end"
    assert tree.match(content(1, [10, 11], 8), 14)[0] == 14, "the same request matches its private tokens too"


def test_page_size_floors_matches_to_whole_pages():
    tree = RadixTree(2, H, pages=False)
    a = content(1, [10, 11, 12], 12)
    tree.insert(a, 12, None)
    b = Content(2, [10, 11, 12], 11)  # its prompt ends inside the last page: that page is private
    assert tree.match(b, 11)[0] == 10, "11 tokens asked, 10 in whole pages"
    assert tree.match(content(3, [10, 77], 8), 8)[0] == 4, "a mismatch in block 1 keeps block 0's two pages"


def test_locked_nodes_are_protected_and_unlocking_makes_them_evictable():
    tree = RadixTree(1, H)
    _, leaf = tree.insert(content(1, [1, 2], 8), 8, list(range(8)))
    assert (tree.evictable_tokens, tree.protected_tokens) == (8, 0)
    tree.inc_lock(leaf)
    assert (tree.evictable_tokens, tree.protected_tokens) == (0, 8)
    freed = []
    assert tree.evict(100, freed.extend) == 0 and freed == [], "a locked node is never evicted"
    tree.dec_lock(leaf)
    assert tree.evict(1, freed.extend) == 8 and sorted(freed) == list(range(8)), "a whole leaf goes at once"
    assert tree.evictable_tokens == 0 and tree.num_nodes == 1


def test_eviction_takes_the_least_recently_used_leaf_and_then_its_childless_parent():
    tree = RadixTree(1, H)
    tree.insert(content(1, [1, 2], 8), 8, list(range(8)))
    tree.insert(content(2, [1, 3], 8), 8, [90, 91, 92, 93, 20, 21, 22, 23])  # splits at 4: parent [0,4), leaves [4,8)
    tree.insert(content(3, [5], 4), 4, [30, 31, 32, 33])
    tree.match(content(1, [1, 2], 8), 8)                      # request 1's path is now the most recent
    freed = []
    tree.evict(4, freed.extend)
    assert freed == [20, 21, 22, 23], "request 2's leaf is the least recently used"
    tree.evict(4, freed.extend)
    assert freed[4:] == [30, 31, 32, 33]
    tree.evict(8, freed.extend)
    assert sorted(freed[8:]) == list(range(8)), "leaf [4,8) then its parent [0,4), childless by then"


def group(seq_id, prompt, output=4, hashes=None):
    return SequenceGroup(seq_id, seq_id, 0.0, prompt, output, 1, 0, seq_id, hashes)


def admit(bm, g):
    bm.match(g)
    bm.allocate(g, filled=0)
    g.seqs[0].status = SeqStatus.RUNNING
    bm.add_filled(g, g.num_cached_tokens, g.seqs[0].num_tokens)


def test_a_prefill_inserted_as_unfinished_is_hit_by_the_next_request():
    bm = RadixCacheManager(1, 64)
    bm.hash_block_tokens = H
    a, b = group(0, 12, hashes=[1, 2, 3]), group(1, 12, hashes=[1, 2, 9])
    admit(bm, a)
    bm.cache_unfinished(a)
    admit(bm, b)
    assert b.num_cached_tokens == 8, "b's first two hash blocks are in the tree, locked by a"
    assert b.seqs[0].block_table[:8] == a.seqs[0].block_table[:8], "shared slots, not copies"
    bm.check_invariants([a.seqs[0], b.seqs[0]])
    assert bm.memory_breakdown(None, 0).token_states == 16, "12 of a + 4 own of b"


def test_finishing_inserts_the_outputs_frees_duplicates_and_unlocks():
    bm = RadixCacheManager(1, 64)
    bm.hash_block_tokens = H
    a, b = group(0, 8, hashes=[1, 2]), group(1, 8, hashes=[1, 2])
    admit(bm, a)
    admit(bm, b)  # admitted before a's prefill was inserted: its own copy of the same 7 tokens
    bm.cache_unfinished(a)
    bm.cache_unfinished(b)
    assert b.seqs[0].block_table == a.seqs[0].block_table, "b's duplicate slots are freed, it takes a's"
    bm.check_invariants([a.seqs[0], b.seqs[0]])
    for s in (a.seqs[0], b.seqs[0]):
        bm.append_slots(s)
        s.num_tokens += 1
    bm.free(a.seqs[0])
    bm.free(b.seqs[0])
    bm.check_invariants([])
    mem = bm.memory_breakdown(None, 0)
    assert mem.token_states == 0 and mem.free == 64, "everything left is evictable cache, counted free"
    assert bm.evictable_tokens == 10, "8 shared prompt tokens and each request's one private output token"


def test_retraction_frees_own_slots_and_leaves_the_prefix_evictable():
    bm = RadixCacheManager(1, 32)
    bm.hash_block_tokens = H
    a = group(0, 8, output=10, hashes=[1, 2])
    admit(bm, a)
    bm.cache_unfinished(a)
    for _ in range(3):
        a.seqs[0].num_tokens += 1
        bm.append_slots(a.seqs[0])
    bm.retract(a.seqs[0])
    assert bm.available_tokens == 24 and bm.evictable_tokens == 8 and bm.retractions == 1
    bm.check_invariants([])


def test_page_size_that_does_not_divide_the_hash_granularity_is_refused_naming_both():
    bm = RadixCacheManager(16, 64)
    with pytest.raises(ConfigError, match=r"page_size .* 16 .* 24-token"):
        bm.hash_block_tokens = 24
    bm.hash_block_tokens = 512  # 16 divides 512

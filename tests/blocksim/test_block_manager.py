"""BlockSpaceManager: vLLM v0 allocation, append, copy-on-write, swap and free semantics."""

import pytest

from blocksim.memory.paged import BlockSpaceManager
from blocksim.interfaces import AllocStatus
from blocksim.memory.blocks import BlockError
from blocksim.sequence import SeqStatus
from tests.blocksim.conftest import make_group


def admit(bm, g):
    bm.allocate(g)
    for s in g.seqs:
        s.status = SeqStatus.RUNNING


def step(g):
    """What the engine does after a step: each running sequence gains a token."""
    for s in g.seqs:
        if s.status is SeqStatus.RUNNING:
            s.num_tokens += 1


def test_allocate_without_watermark_uses_every_block(bm):
    g = make_group(prompt=40)  # 10 blocks of 4
    assert bm.can_allocate(g) is AllocStatus.OK
    admit(bm, g)
    assert bm.gpu.num_free == 0
    assert len(g.seqs[0].block_table) == 10


def test_watermark_turns_ok_into_later_and_never():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=10, num_cpu_blocks=0, watermark_blocks=2)
    assert bm.watermark_blocks == 2
    assert bm.can_allocate(make_group(prompt=32)) is AllocStatus.OK       # 8 blocks: 10 - 8 >= 2
    assert bm.can_allocate(make_group(prompt=33)) is AllocStatus.NEVER    # 9 blocks: 10 - 9 < 2
    admit(bm, make_group(prompt=8))                                        # 2 blocks used, 8 free
    assert bm.can_allocate(make_group(prompt=28, index=1)) is AllocStatus.LATER  # 7 blocks: 8 - 7 < 2


def test_absolute_watermark_blocks():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=10, num_cpu_blocks=0, watermark_blocks=3)
    assert bm.can_allocate(make_group(prompt=28)) is AllocStatus.OK
    assert bm.can_allocate(make_group(prompt=29)) is AllocStatus.NEVER


def test_exactly_one_new_block_every_block_size_tokens(bm):
    g = make_group(prompt=4)
    admit(bm, g)
    step(g)  # prefill done: 4 KV tokens, 5 tokens
    s = g.seqs[0]
    sizes = []
    for _ in range(12):
        bm.append_slots(s)
        sizes.append(len(s.block_table))
        step(g)
    # Decode steps write positions 4..15: a new block at positions 4, 8 and 12, nowhere else.
    assert sizes == [2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]
    bm.check_invariants([s])


def test_copy_on_write_on_a_forked_group(bm):
    g = make_group(prompt=6, n=2)  # 2 blocks shared, the second half full
    admit(bm, g)
    a, b = g.seqs
    assert a.block_table == b.block_table
    assert [bm.gpu.ref_counts[x] for x in a.block_table] == [2, 2]
    step(g)
    cow_a = bm.append_slots(a)
    cow_b = bm.append_slots(b)
    assert cow_a is not None and cow_a[0] == b.block_table[1], "the first writer copies the shared last block"
    assert cow_b is None, "after the copy the second sequence owns the old block alone"
    assert a.block_table[0] == b.block_table[0] and a.block_table[1] != b.block_table[1]
    assert bm.gpu.ref_counts[a.block_table[0]] == 2
    step(g)
    bm.check_invariants(g.seqs)


def test_fork_shares_blocks_and_counts_references(bm):
    g = make_group(prompt=8)
    admit(bm, g)
    step(g)
    child = make_group(prompt=8, index=1, first_seq_id=5).seqs[0]
    child.num_tokens = g.seqs[0].num_tokens
    child.status = SeqStatus.RUNNING
    bm.fork(g.seqs[0], child)
    assert all(bm.gpu.ref_counts[x] == 2 for x in child.block_table)
    bm.free(child)
    assert all(bm.gpu.ref_counts[x] == 1 for x in g.seqs[0].block_table)


def test_swap_round_trip_preserves_tables_and_counts(bm):
    g = make_group(prompt=6, n=2)
    admit(bm, g)
    step(g)
    bm.append_slots(g.seqs[0])
    bm.append_slots(g.seqs[1])
    step(g)
    shared = g.seqs[0].block_table[0]
    filled = bm.gpu_filled_slots
    assert bm.can_swap_out(g)
    out_map = bm.swap_out(g)
    assert len(out_map) == 3, "the shared prompt block moves once"
    assert bm.gpu.num_free == 10 and bm.gpu_filled_slots == 0
    assert bm.cpu.ref_counts[out_map[shared]] == 2
    assert bm.can_swap_in(g) is AllocStatus.OK
    in_map = bm.swap_in(g)
    assert sorted(in_map) == sorted(out_map.values())
    assert g.seqs[0].block_table[0] == g.seqs[1].block_table[0]
    assert bm.gpu.ref_counts[g.seqs[0].block_table[0]] == 2
    assert bm.gpu_filled_slots == filled and bm.cpu.num_free == 10
    bm.check_invariants(g.seqs)


def test_double_free_is_rejected(bm):
    g = make_group(prompt=4)
    admit(bm, g)
    block = g.seqs[0].block_table[0]
    bm.gpu.free(block)
    with pytest.raises(BlockError, match="double free"):
        bm.gpu.free(block)


def test_freeing_a_sequence_twice_is_harmless_but_a_stale_table_is_not(bm):
    g = make_group(prompt=4)
    admit(bm, g)
    step(g)
    stale = list(g.seqs[0].block_table)
    bm.free(g.seqs[0])
    bm.free(g.seqs[0])  # its table is empty now: nothing left to release
    g.seqs[0].block_table = stale
    with pytest.raises(BlockError, match="double free"):
        bm.free(g.seqs[0])


def test_never_for_a_prompt_larger_than_the_cache(bm):
    assert bm.can_allocate(make_group(prompt=41)) is AllocStatus.NEVER


def test_can_append_needs_a_free_block_per_running_sequence(bm):
    g = make_group(prompt=36, n=2)  # 9 blocks, 1 free
    admit(bm, g)
    assert not bm.can_append_slots(g), "vLLM's rule: one free block for each running sequence"


def test_allocate_many_takes_the_blocks_single_allocations_take():
    """A prompt's blocks in one call are the blocks (and the order) that as many `allocate` calls
    give, from a LIFO stack or a FIFO queue, after frees have reordered the free list."""
    from blocksim.memory.blocks import BlockAllocator, Device

    for order in ("lifo", "fifo"):
        one, many = BlockAllocator(Device.GPU, 30, order), BlockAllocator(Device.GPU, 30, order)
        for a in (one, many):
            held = [a.allocate() for _ in range(12)]
            for b in held[::3]:
                a.free(b)
        for n in (0, 5, 1, 9):
            assert many.allocate_many(n) == [one.allocate() for _ in range(n)], order
        assert one.ref_counts == many.ref_counts
        many.check()
        with pytest.raises(BlockError, match="out of blocks"):
            many.allocate_many(many.num_free + 1)


def test_free_table_releases_unshared_tables_whole_and_shared_blocks_alone(bm):
    """An unshared table goes back to the free list in table order and returns its filled slots; in a
    table sharing blocks with a fork only the blocks left without references are released."""
    g = make_group(prompt=10)
    admit(bm, g)
    table = list(g.seqs[0].block_table)
    assert bm.gpu.free_table(table, 10, 4) == 10
    assert [bm.gpu.allocate() for _ in range(3)] == table[::-1], "LIFO: the last released comes back first"
    for b in table:
        bm.gpu.free(b)
    bm.gpu.check()

    g = make_group(prompt=10, n=2)
    admit(bm, g)
    first, second = g.seqs
    step(g)
    assert bm.append_slots(second) is not None, "the shared last block is copied on write"
    free_before = bm.gpu.num_free
    # only its own copy of the last block goes, holding K/V positions 8 and 9
    assert bm.gpu.free_table(second.block_table, second.kv_len, 4) == 2
    assert bm.gpu.num_free == free_before + 1
    bm.gpu.check()

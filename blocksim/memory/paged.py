"""vLLM v0's block space manager: block tables, reference counts, copy-on-write and swapping.

Semantics follow vLLM 0.2-0.6 `core/block_manager` (v1):

* `can_allocate` answers OK / LATER / NEVER against `watermark_blocks`; the watermark applies to
  admission and swap-in, never to appends.
* `allocate` gives a group's prompt one set of blocks shared by all its sequences (ref count =
  number of sequences).
* `can_append_slots` is vLLM's conservative rule: one free block per running sequence of the group.
* `append_slots` returns a copy-on-write `(src, dst)` pair when the sequence's last block is shared.
* `swap_out` / `swap_in` return block-number mappings; a block shared by siblings moves once.

Between steps a running sequence's table covers exactly `ceil(kv_len / block_size)` blocks,
where `kv_len = num_tokens - 1` (the newest sampled token's KV is written by the next step).
`gpu_filled_slots` counts token slots holding KV across all GPU blocks, kept incrementally.

It implements `blocksim.interfaces.MemoryManager`: swapping, appends that take a block at each
block boundary; no clock, no address-space extents, no prefix hashing.
"""

from __future__ import annotations

from blocksim.interfaces import AllocStatus, MemoryBreakdown
from blocksim.memory.blocks import BlockAllocator, BlockError, Device, cdiv
from blocksim.sequence import Sequence, SequenceGroup, SeqStatus


class BlockSpaceManager:
    supports_swap = True
    uses_clock = False
    has_extents = False
    hashes_prefixes = False
    reserves_prefill = False
    allocates_on_append = True
    hash_block_tokens: int | None = None

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark_blocks: int,
                 order: str = "lifo") -> None:
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark_blocks = int(watermark_blocks)  # SimConfig.watermark_blocks
        self.gpu = BlockAllocator(Device.GPU, num_gpu_blocks, order)
        self.cpu = BlockAllocator(Device.CPU, num_cpu_blocks, order)
        self.gpu_filled_slots = 0

    # --- admission ---------------------------------------------------------------------------
    def blocks_for_allocation(self, group: SequenceGroup) -> int:
        seq = group.seqs_with(SeqStatus.WAITING)[0]
        return cdiv(seq.num_tokens, self.block_size)

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        required = self.blocks_for_allocation(group)
        if self.num_total_gpu_blocks - required < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu.num_free - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, group: SequenceGroup, filled: int | None = None) -> None:
        """Allocate the prompt (or recompute) blocks once, shared by every waiting sequence.

        `filled`: prompt tokens whose K/V is counted now; default all of them. Chunked prefill
        passes 0 and reports each chunk with `add_filled`.
        """
        seqs = group.seqs_with(SeqStatus.WAITING)
        num_tokens = seqs[0].num_tokens
        table = self.gpu.allocate_many(cdiv(num_tokens, self.block_size))
        if len(seqs) > 1:
            for b in table:
                self.gpu.ref_counts[b] = len(seqs)
        for s in seqs:
            s.block_table = table.copy()
        self.gpu_filled_slots += num_tokens if filled is None else filled

    def add_filled(self, group: SequenceGroup, start: int, stop: int) -> None:
        """A prompt chunk writes positions [start, stop) into blocks the group's sequences share."""
        self.gpu_filled_slots += stop - start

    def num_cached_tokens(self, group: SequenceGroup) -> int:
        """No prefix cache: every prompt token is prefilled."""
        return 0

    def mark_blocks_as_computed(self) -> None:
        """No prefix cache: nothing to mark."""

    # --- decode ------------------------------------------------------------------------------
    def can_append_slots(self, group: SequenceGroup) -> bool:
        return self.gpu.num_free >= sum(1 for s in group.seqs if s.status is SeqStatus.RUNNING)

    def append_slots(self, seq: Sequence) -> tuple[int, int] | None:
        """Make room for the KV of token `num_tokens - 1`; return a CoW (src, dst) pair if one is needed."""
        table = seq.block_table
        if len(table) * self.block_size < seq.num_tokens:
            table.append(self.gpu.allocate())
            self.gpu_filled_slots += 1
            return None
        last = table[-1]
        if self.gpu.ref_counts[last] == 1:
            self.gpu_filled_slots += 1
            return None
        new = self.gpu.allocate()
        table[-1] = new
        self.gpu.free(last)
        copied = seq.num_tokens - 1 - (len(table) - 1) * self.block_size
        self.gpu_filled_slots += copied + 1
        return last, new

    def append_decode_slots(self, groups: list[SequenceGroup], start: int, end: int) -> tuple[int, int]:
        """`append_slots` for groups[start:end] in order while a group decodes one sequence whose
        last block is its own (no copy-on-write) and a free block remains (vLLM's conservative
        `can_append_slots`); returns `(stop, context_tokens)` of the groups served.

        The scheduler's per-step fast path: one call serves the whole running queue in the
        common case, and the scheduler takes groups[stop] on its general path.
        """
        gpu, bs = self.gpu, self.block_size
        refs, free = gpu.ref_counts, gpu.num_free
        ctx = 0
        i = start
        while i < end and free:
            group = groups[i]
            if group.prefill_pos is not None:
                break
            try:
                (seq,) = group.seqs
                table = seq.block_table
                last = table[-1]
            except (ValueError, IndexError):  # several sequences, or no block
                break
            if refs[last] != 1:
                break
            n = seq.num_tokens
            if len(table) * bs < n:
                table.append(gpu.allocate())
                free -= 1
            ctx += n
            i += 1
        self.gpu_filled_slots += i - start
        return i, ctx

    def fork(self, parent: Sequence, child: Sequence) -> None:
        child.block_table = parent.block_table.copy()
        for b in child.block_table:
            self.gpu.incref(b)

    # --- swapping ----------------------------------------------------------------------------
    def _unique_blocks(self, seqs: list[Sequence]) -> set[int]:
        return {b for s in seqs for b in s.block_table}

    def can_swap_in(self, group: SequenceGroup) -> AllocStatus:
        seqs = group.seqs_with(SeqStatus.SWAPPED)
        required = len(self._unique_blocks(seqs)) + len(seqs)  # + one block per sequence for its next append
        if self.num_total_gpu_blocks - required < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu.num_free - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return len(self._unique_blocks(group.seqs_with(SeqStatus.RUNNING))) <= self.cpu.num_free

    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        """Move the group's running sequences to CPU blocks; return {gpu_block: cpu_block}."""
        mapping: dict[int, int] = {}
        for seq in group.seqs_with(SeqStatus.RUNNING):
            kv_len = seq.kv_len
            new_table = []
            for i, g in enumerate(seq.block_table):
                c = mapping.get(g)
                if c is None:
                    c = mapping[g] = self.cpu.allocate()
                else:
                    self.cpu.incref(c)
                new_table.append(c)
                self._free_gpu_block(g, kv_len, i)
            seq.block_table = new_table
            seq.status = SeqStatus.SWAPPED
        return mapping

    def swap_in(self, group: SequenceGroup) -> dict[int, int]:
        """Bring the group's swapped sequences back; return {cpu_block: gpu_block}."""
        mapping: dict[int, int] = {}
        for seq in group.seqs_with(SeqStatus.SWAPPED):
            kv_len = seq.kv_len
            new_table = []
            for i, c in enumerate(seq.block_table):
                g = mapping.get(c)
                if g is None:
                    g = mapping[c] = self._swap_in_block(c, i, kv_len)
                else:
                    self.gpu.incref(g)
                new_table.append(g)
                self.cpu.free(c)
            seq.block_table = new_table
            seq.status = SeqStatus.RUNNING
        return mapping

    def _swap_in_block(self, cpu_block: int, index: int, kv_len: int) -> int:
        """The GPU block that receives CPU block `cpu_block`, block `index` of a sequence holding
        `kv_len` tokens of K/V: a fresh one, whose slots count as filled."""
        block = self.gpu.allocate()
        self.gpu_filled_slots += min(self.block_size, kv_len - index * self.block_size)
        return block

    # --- freeing -----------------------------------------------------------------------------
    def _free_gpu_block(self, block: int, kv_len: int, index: int) -> None:
        self.gpu.free(block)
        if self.gpu.ref_counts[block] == 0:
            self.gpu_filled_slots -= max(0, min(self.block_size, kv_len - index * self.block_size))

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks (GPU or CPU, by its status). Freeing twice is an error."""
        table = seq.block_table
        if not table:
            return
        if seq.status is SeqStatus.SWAPPED:
            for c in table:
                self.cpu.free(c)
        else:
            self.gpu_filled_slots -= self.gpu.free_table(table, seq.kv_len, self.block_size)
        seq.block_table = []

    # --- accounting (the engine's view of any memory manager) ---------------------------------
    @property
    def num_gpu_blocks_used(self) -> int:
        return self.gpu.num_used

    @property
    def num_cpu_blocks_used(self) -> int:
        return self.cpu.num_used

    @property
    def num_free_gpu_blocks(self) -> int:
        return self.gpu.num_free

    def memory_breakdown(self, next_group: SequenceGroup | None,
                         pending_prefill_slots: int) -> MemoryBreakdown:
        """GPU token slots by use.

        Any free block serves any request, so external fragmentation is 0. Reservation is only the
        `pending_prefill_slots`: prompt positions of chunked prefills whose blocks are allocated but
        not written yet. Internal fragmentation is the rest of the unfilled part of used blocks.
        """
        used = self.gpu.num_used * self.block_size
        unfilled = used - self.gpu_filled_slots
        return MemoryBreakdown(self.gpu_filled_slots, pending_prefill_slots, unfilled - pending_prefill_slots, 0,
                               self.gpu.num_free * self.block_size)

    def set_clock(self, now_s: float) -> None:
        """No clock: the plain free list has no notion of time (`uses_clock` is False)."""

    def free_extents(self):
        raise BlockError("paged blocks have no address-space extents (has_extents is False)")

    def stats(self) -> dict[str, int]:
        return {}

    # --- spans of identical decode steps (engine.spans) ----------------------------------------
    def append_span_slots(self, seqs: list[Sequence], steps: int, takers: list[int]) -> None:
        """`steps` further decode steps of `seqs`: new blocks for `takers` (indices into `seqs`, in
        step order, then running order), one filled slot per sequence and step."""
        allocate = self.gpu.allocate
        for i in takers:
            seqs[i].block_table.append(allocate())
        self.gpu_filled_slots += steps * len(seqs)

    # --- checks ------------------------------------------------------------------------------
    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """Every block's ref count equals the tables pointing at it; free lists agree; slots add up.

        `live_seqs` are all sequences holding blocks (running or swapped). O(blocks); for tests.
        """
        self.gpu.check()
        self.cpu.check()
        gpu_refs = [0] * self.num_total_gpu_blocks
        cpu_refs = [0] * self.num_total_cpu_blocks
        fill: dict[int, int] = {}
        for s in live_seqs:
            if len(set(s.block_table)) != len(s.block_table):
                raise BlockError(f"sequence {s.seq_id}: a block appears twice in its table {s.block_table}")
            refs = cpu_refs if s.status is SeqStatus.SWAPPED else gpu_refs
            for b in s.block_table:
                refs[b] += 1
            if s.status is SeqStatus.RUNNING:
                kv_len = s.kv_len
                if s.group.prefill_pos is None and len(s.block_table) != cdiv(kv_len, self.block_size):
                    raise BlockError(f"sequence {s.seq_id}: {len(s.block_table)} blocks for {kv_len} KV tokens")
                for i, b in enumerate(s.block_table):
                    fill[b] = max(0, min(self.block_size, kv_len - i * self.block_size))
        if gpu_refs != self.gpu.ref_counts:
            bad = [b for b in range(len(gpu_refs)) if gpu_refs[b] != self.gpu.ref_counts[b]][:5]
            raise BlockError(f"GPU reference counts disagree with block tables at blocks {bad}")
        if cpu_refs != self.cpu.ref_counts:
            bad = [b for b in range(len(cpu_refs)) if cpu_refs[b] != self.cpu.ref_counts[b]][:5]
            raise BlockError(f"CPU reference counts disagree with block tables at blocks {bad}")
        if sum(fill.values()) != self.gpu_filled_slots:
            raise BlockError(f"filled slots {self.gpu_filled_slots} != recount {sum(fill.values())}")

"""Contiguous reservation: the PagedAttention paper's Orca baselines as a memory manager.

Each request reserves one contiguous chunk of token slots at admission, big enough for its
prompt plus its maximum output (`max`: the model's max length, `pow2`: the next power of two of
the true total, `oracle`: exactly the true total), in one address space managed by a buddy
allocator (as the paper's baselines) or first fit. Sequences of a group keep separate copies of
the prompt (no sharing), so a group of n reserves n chunks' worth in one chunk. Nothing grows
after admission, so appends never fail and nothing is ever preempted or swapped.

Memory accounting per resident group, in token slots (summed incrementally):
  token states   KV written so far;
  reservation    slots the group will still fill (`need - written`, need = n x (prompt + output - 1));
  internal frag  reserved but never to be filled (`chunk - need`: over-reservation and buddy rounding);
  external frag  free slots in pieces too small for the next waiting request (0 when it fits or none waits);
  free           the rest.
"""

from __future__ import annotations

import numpy as np

from blocksim.interfaces import AllocStatus, MemoryBreakdown
from blocksim.memory.paged import cdiv
from blocksim.memory.blocks import BlockError
from blocksim.memory.address_space import CONTIGUOUS_ALLOCATORS, reservation_slots
from blocksim.sequence import Sequence, SequenceGroup, SeqStatus


class ContiguousManager:
    """A `MemoryManager` over a contiguous address space: never swaps, samples its free extents,
    reserves every slot a request will write at admission (prompt chunks and outputs alike)."""

    supports_swap = False
    uses_clock = False
    has_extents = True
    hashes_prefixes = False
    reserves_prefill = True
    allocates_on_append = False
    hash_block_tokens = None

    def __init__(self, block_size: int, num_gpu_blocks: int, reservation: str, address_space: str,
                 max_model_len: int) -> None:
        if address_space not in CONTIGUOUS_ALLOCATORS:
            raise ValueError(f"address space {address_space!r}; known: {', '.join(CONTIGUOUS_ALLOCATORS)}")
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = 0
        self.capacity_slots = num_gpu_blocks * block_size
        self.space = CONTIGUOUS_ALLOCATORS[address_space](self.capacity_slots)
        self.reservation = reservation
        self.max_model_len = max_model_len
        self.watermark_blocks = 0
        self.gpu_filled_slots = 0
        self._need: dict[int, int] = {}      # group index -> slots it will ever fill
        self._alive: dict[int, int] = {}     # group index -> sequences still holding the chunk
        self.need_slots = 0
        self.chunk_total = 0

    def _size(self, group: SequenceGroup) -> int:
        per_seq = reservation_slots(self.reservation, group.prompt_tokens, group.output_tokens, self.max_model_len)
        return len(group.seqs) * per_seq

    # --- admission ---------------------------------------------------------------------------
    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        size = self._size(group)
        if not self.space.fits_ever(size):
            return AllocStatus.NEVER
        return AllocStatus.OK if self.space.can_alloc(size) else AllocStatus.LATER

    def allocate(self, group: SequenceGroup, filled: int | None = None) -> None:
        if self.space.alloc(group.index, self._size(group)) is None:
            raise BlockError(f"request {group.request_id}: allocate() without room; call can_allocate first")
        seqs = group.seqs_with(SeqStatus.WAITING)
        need = len(seqs) * (group.prompt_tokens + group.output_tokens - 1)
        self._need[group.index] = need
        self._alive[group.index] = len(seqs)
        self.need_slots += need
        self.chunk_total += self.space.allocated_slots(group.index)
        self.gpu_filled_slots += len(seqs) * (seqs[0].num_tokens if filled is None else filled)

    # --- decode ------------------------------------------------------------------------------
    def can_append_slots(self, group: SequenceGroup) -> bool:
        return True

    def append_slots(self, seq: Sequence) -> None:
        self.gpu_filled_slots += 1
        return None

    def append_decode_slots(self, groups: list[SequenceGroup], start: int, end: int) -> tuple[int, int]:
        """`append_slots` for groups[start:end] in order while a group decodes one sequence (its
        slot was reserved at admission); returns `(stop, context_tokens)` of the groups served."""
        ctx = 0
        i = start
        while i < end:
            group = groups[i]
            seqs = group.seqs
            if group.prefill_pos is not None or len(seqs) != 1:
                break
            ctx += seqs[0].num_tokens
            i += 1
        self.gpu_filled_slots += i - start
        return i, ctx

    def add_filled(self, group: SequenceGroup, start: int, stop: int) -> None:
        """A prompt chunk writes positions [start, stop) for each running sequence (no sharing here)."""
        self.gpu_filled_slots += len(group.seqs_with(SeqStatus.RUNNING)) * (stop - start)

    def num_cached_tokens(self, group: SequenceGroup) -> int:
        """No prefix cache: every prompt token is prefilled."""
        return 0

    def mark_blocks_as_computed(self) -> None:
        """No prefix cache: nothing to mark."""

    # --- swapping: never needed ----------------------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool:
        return False

    def can_swap_in(self, group: SequenceGroup) -> AllocStatus:
        return AllocStatus.NEVER

    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        raise BlockError("a contiguous reservation is never swapped (supports_swap is False)")

    def swap_in(self, group: SequenceGroup) -> dict[int, int]:
        raise BlockError("a contiguous reservation is never swapped (supports_swap is False)")

    # --- freeing -----------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        g = seq.group.index
        if g not in self._alive:
            return
        self.gpu_filled_slots -= seq.kv_len
        self._alive[g] -= 1
        if self._alive[g] == 0:
            del self._alive[g]
            self.need_slots -= self._need.pop(g)
            self.chunk_total -= self.space.allocated_slots(g)
            self.space.free(g)

    # --- accounting --------------------------------------------------------------------------
    @property
    def num_gpu_blocks_used(self) -> int:
        return cdiv(self.space.used_slots, self.block_size)

    num_cpu_blocks_used = 0

    @property
    def num_free_gpu_blocks(self) -> int:
        return (self.capacity_slots - self.space.used_slots) // self.block_size

    def _external(self, next_group: SequenceGroup | None) -> int:
        if next_group is None:
            return 0
        size = self._size(next_group)
        if self.space.can_alloc(size) or not self.space.fits_ever(size):
            return 0
        pieces = self.space.free_pieces()
        chunk = self.space.chunk_slots(size)
        return int(pieces[pieces < chunk].sum())

    def memory_breakdown(self, next_group: SequenceGroup | None,
                         pending_prefill_slots: int) -> MemoryBreakdown:
        """GPU token slots by use; unwritten prompt chunks are already reservation here
        (`reserves_prefill`), so `pending_prefill_slots` is 0 and ignored."""
        external = self._external(next_group)
        free = self.capacity_slots - self.chunk_total - external
        filled = self.gpu_filled_slots
        return MemoryBreakdown(filled, self.need_slots - filled, self.chunk_total - self.need_slots, external, free)

    def set_clock(self, now_s: float) -> None:
        """No clock (`uses_clock` is False)."""

    def stats(self) -> dict[str, int]:
        return {}

    # --- spans of identical decode steps (engine.spans) ----------------------------------------
    def append_span_slots(self, seqs: list[Sequence], steps: int, takers: list[int]) -> None:
        """`steps` further decode steps: each sequence fills `steps` reserved slots (`takers` is empty)."""
        self.gpu_filled_slots += steps * len(seqs)

    def free_extents(self) -> np.ndarray:
        return self.space.free_extents()

    # --- checks ------------------------------------------------------------------------------
    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        self.space.check_invariants()
        groups = {s.group.index for s in live_seqs}
        if groups != set(self._alive):
            raise BlockError(f"resident groups {sorted(groups)[:5]} disagree with reservations {sorted(self._alive)[:5]}")
        written = sum(s.kv_len for s in live_seqs)
        if written != self.gpu_filled_slots:
            raise BlockError(f"filled slots {self.gpu_filled_slots} != recount {written}")
        if self.chunk_total != self.space.used_slots:
            raise BlockError(f"chunk total {self.chunk_total} != allocator's used {self.space.used_slots}")

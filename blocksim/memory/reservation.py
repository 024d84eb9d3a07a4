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

from blocksim.memory.paged import cdiv
from blocksim.memory.blocks import AllocStatus, BlockError
from blocksim.memory.address_space import CONTIGUOUS_ALLOCATORS, reservation_slots
from blocksim.sequence import Sequence, SequenceGroup, SeqStatus


class ContiguousManager:
    """Memory manager with the `BlockSpaceManager` interface over a contiguous address space."""

    supports_swap = False

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

    def add_filled(self, group: SequenceGroup, start: int, stop: int) -> None:
        """A prompt chunk writes positions [start, stop) for each running sequence (no sharing here)."""
        self.gpu_filled_slots += len(group.seqs_with(SeqStatus.RUNNING)) * (stop - start)

    # --- swapping: never needed ----------------------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool:
        return False

    def can_swap_in(self, group: SequenceGroup) -> AllocStatus:
        return AllocStatus.NEVER

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

    def _external(self, next_group: SequenceGroup | None) -> int:
        if next_group is None:
            return 0
        size = self._size(next_group)
        if self.space.can_alloc(size) or not self.space.fits_ever(size):
            return 0
        pieces = self.space.free_blocks() if hasattr(self.space, "free_blocks") else self.space.free_extents()
        chunk = self.space.chunk_slots(size)
        return int(pieces[pieces < chunk].sum())

    def memory_breakdown(self, next_group: SequenceGroup | None = None) -> tuple[int, int, int, int, int]:
        external = self._external(next_group)
        free = self.capacity_slots - self.chunk_total - external
        filled = self.gpu_filled_slots
        return filled, self.need_slots - filled, self.chunk_total - self.need_slots, external, free

    # --- spans -------------------------------------------------------------------------------
    def span_blocks(self, lens, k: int):
        return k, np.zeros((k - 1, len(lens)), dtype=bool)

    def apply_span(self, seqs: list[Sequence], crossing) -> None:
        steps_more = crossing.shape[0]
        for s in seqs:
            s.num_tokens += steps_more
        self.gpu_filled_slots += steps_more * len(seqs)

    def span_memory(self, k: int, num_seqs: int, crossing, next_group: SequenceGroup | None = None) -> dict:
        """Memory columns over a decode span: K/V grows into the reservation, the rest is constant."""
        filled = self.gpu_filled_slots + num_seqs * np.arange(k, dtype=np.int64)
        _, _, internal, external, free = self.memory_breakdown(next_group)
        return {"gpu_blocks_used": self.num_gpu_blocks_used, "mem_token_states": filled,
                "mem_reservation": self.need_slots - filled, "mem_internal_frag": internal,
                "mem_external_frag": external, "mem_free": free}

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

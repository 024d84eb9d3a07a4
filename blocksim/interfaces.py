"""The memory manager's contract with the scheduler and the engine.

vLLM 0.6 names its block manager's contract in `core/interfaces.py` (`BlockSpaceManager`, an ABC);
here it is `MemoryManager`, a `typing.Protocol`, so that a plug-in allocator need not inherit
anything. The scheduler and the engine call only what it declares, and read its capability flags
instead of probing a manager's type or attributes.

Built in: `memory.paged.BlockSpaceManager` (vLLM v0's paged blocks), its subclass
`memory.prefix_cache.PrefixCachingBlockManager` (automatic prefix caching) and
`memory.reservation.ContiguousManager` (one contiguous reservation per request: Orca, static
batching). `AllocStatus` lives here because both sides speak it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from blocksim.sequence import Sequence, SequenceGroup

if TYPE_CHECKING:
    import numpy as np


class AllocStatus(enum.Enum):
    """Whether a sequence group can be allocated now (OK), after others free blocks (LATER), or never."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class MemoryBreakdown(NamedTuple):
    """GPU token slots by use; the five always add up to the GPU cache's capacity in slots."""

    token_states: int   # slots holding K/V
    reservation: int    # slots set aside for tokens not written yet (outputs, unwritten prompt chunks)
    internal_frag: int  # slots allocated to a request that it will never fill
    external_frag: int  # free slots in pieces too small for the next waiting request
    free: int           # the rest


@runtime_checkable
class MemoryManager(Protocol):
    """What a KV memory manager provides (vLLM v0's block space manager vocabulary).

    A plug-in allocator (``--allocator package.module:factory``, built as ``factory(config)``)
    provides every member below. Subclassing `BlockSpaceManager` or `ContiguousManager` gives all
    of them; a manager written from scratch sets the capability flags as class attributes and may
    implement a method its flags rule out by raising (the caller never reaches it).

    Capabilities:

    * `supports_swap`: `can_swap_out`/`swap_out`/`can_swap_in`/`swap_in` work. False: every
      preemption recomputes (vLLM's `PreemptionMode.RECOMPUTE`).
    * `uses_clock`: the engine calls `set_clock(now_s)` before each step is scheduled (an LRU
      evictor's notion of time).
    * `has_extents`: `free_extents()` returns the free address-space runs, sampled by the engine
      into `free_extents.parquet`.
    * `hashes_prefixes`: the manager reuses blocks by content; the engine sets `hash_block_tokens`
      from a trace that carries prefix hashes, and a vLLM v0 scheduler calls
      `mark_blocks_as_computed` at the end of each `schedule()` and may ask `num_cached_tokens`.
    * `reserves_prefill`: `memory_breakdown` counts the not yet written slots of a chunked prefill
      as reservation itself. False: the engine passes them as `pending_prefill_slots`.
    * `allocates_on_append`: a decoded token writes into its sequence's last block and takes a new
      block at each block boundary (paged). False: every slot a request will write was reserved
      at admission; an append never allocates (its slot leaves the reservation).

    Invariant: after every call, `memory_breakdown(...)` adds up to `num_total_gpu_blocks *
    block_size` slots.
    """

    supports_swap: bool
    uses_clock: bool
    has_extents: bool
    hashes_prefixes: bool
    reserves_prefill: bool
    allocates_on_append: bool

    block_size: int
    num_total_gpu_blocks: int
    num_total_cpu_blocks: int
    watermark_blocks: int
    hash_block_tokens: int | None  # tokens per prefix hash (read when `hashes_prefixes`)

    @property
    def num_gpu_blocks_used(self) -> int: ...

    @property
    def num_cpu_blocks_used(self) -> int: ...

    @property
    def num_free_gpu_blocks(self) -> int: ...

    # --- admission ---------------------------------------------------------------------------
    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        """OK, LATER or NEVER for the group's waiting sequences (vLLM: against the watermark)."""

    def allocate(self, group: SequenceGroup, filled: int | None = None) -> None:
        """Memory for the group's waiting sequences; `filled` prompt tokens' K/V is counted now
        (default all; chunked prefill passes 0 and reports each chunk with `add_filled`)."""

    def add_filled(self, group: SequenceGroup, start: int, stop: int) -> None:
        """A prompt chunk wrote the K/V of positions [start, stop)."""

    def num_cached_tokens(self, group: SequenceGroup) -> int:
        """Prompt tokens of a waiting group that `allocate` now would not prefill (prefix-cache
        hits whose K/V is computed); 0 without prefix caching."""

    def mark_blocks_as_computed(self) -> None:
        """The step being scheduled will have computed the blocks it writes (vLLM v0 marks them
        at the end of `schedule()`): from now on a hit on them skips their prefill."""

    # --- decode ------------------------------------------------------------------------------
    def can_append_slots(self, group: SequenceGroup) -> bool:
        """Whether every running sequence of the group can get its next slot."""

    def append_slots(self, seq: Sequence) -> tuple[int, int] | None:
        """The slot for the K/V of token `num_tokens - 1`; a copy-on-write (src, dst) pair or None."""

    def append_decode_slots(self, groups: list[SequenceGroup], start: int, end: int) -> tuple[int, int]:
        """The scheduler's fast path: `append_slots` for groups[start:end] in order, as long as a
        group decodes one sequence, needs no copy-on-write and finds room (`can_append_slots`).

        Returns `(stop, context_tokens)`: groups[start:stop] got their slots and their contexts
        hold `context_tokens` tokens in all; the scheduler takes groups[stop] on its general path
        (preemption, copy-on-write, several sequences). Returning `(start, 0)` is always correct.
        """

    # --- swapping ----------------------------------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool: ...

    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        """Move the group's running sequences to CPU; {gpu_block: cpu_block}."""

    def can_swap_in(self, group: SequenceGroup) -> AllocStatus: ...

    def swap_in(self, group: SequenceGroup) -> dict[int, int]:
        """Bring the group's swapped sequences back; {cpu_block: gpu_block}."""

    # --- freeing -----------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Release a sequence's memory (GPU or CPU, by its status)."""

    # --- spans of identical decode steps (engine.spans) ----------------------------------------
    def append_span_slots(self, seqs: list[Sequence], steps: int, takers: list[int]) -> None:
        """`steps` further decode steps of `seqs`, each writing one slot per sequence per step;
        `takers` lists, in step order, the index in `seqs` of each sequence taking a new block
        (empty unless `allocates_on_append`)."""

    # --- accounting --------------------------------------------------------------------------
    def memory_breakdown(self, next_group: SequenceGroup | None,
                         pending_prefill_slots: int) -> MemoryBreakdown:
        """GPU slots by use now. `next_group`: the head of the waiting queue, for external
        fragmentation; `pending_prefill_slots`: allocated prompt slots a chunked prefill has not
        written yet (0 when `reserves_prefill`)."""

    def set_clock(self, now_s: float) -> None: ...

    def free_extents(self) -> np.ndarray: ...

    def stats(self) -> dict[str, int]:
        """Counters for summary.json (prefix cache hits, ...); empty when there are none."""

    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """Recount everything from the live sequences' state; raise on a disagreement (tests)."""

"""Contiguous-reservation allocators: the PagedAttention paper's Orca baselines (§6.1).

Each request reserves ONE contiguous chunk of KV token slots for its prompt plus
its maximum output, in a single address space of ``capacity_slots`` slots.  How
big the reservation is comes from :func:`reservation_slots` (``max``, ``pow2``,
``oracle``); where it goes comes from an allocator:

* :class:`BuddyAllocator` -- a binary buddy system, as the paper's baselines use.
  Chunks are rounded up to a power of two (internal fragmentation), and free
  memory split into unmergeable buddies can be too scattered for the next
  request (external fragmentation).
* :class:`FirstFitAllocator` -- exact-size chunks, first fit by address over a
  sorted, coalesced free-extent list (external fragmentation only).

Both share one API, all sizes and offsets in token slots::

    alloc(request_id, size_slots) -> offset | None   # None when it does not fit now
    free(request_id)                                 # KeyError on unknown id / double free
    can_alloc(size_slots) -> bool                    # would alloc succeed now
    fits_ever(size_slots) -> bool                    # could it succeed in an empty space
    chunk_slots(size_slots) -> int                   # what alloc would really take
    allocated_slots(request_id) -> int               # chunk size held by a request
    offset(request_id) -> int
    used_slots, free_slots, usable_slots, unusable_slots, capacity_slots
    largest_free_extent() -> int                     # longest run of contiguous free slots
    free_extents() -> np.ndarray[int64]              # maximal free runs, in address order
    free_pieces() -> np.ndarray[int64]               # free runs one chunk can lie in (buddy: free blocks)
    check_invariants()                               # raises AssertionError on corruption

``can_alloc`` / ``fits_ever`` are vLLM's ``AllocStatus`` OK / LATER / NEVER in two
booleans: OK if ``can_alloc``, LATER if only ``fits_ever``, NEVER otherwise.  A
request whose reservation exceeds the address space is the caller's to refuse.

Invariant after every call: ``used_slots + free_slots == usable_slots`` and
``usable_slots + unusable_slots == capacity_slots``.  Neither allocator does per-slot
Python work: alloc/free are O(log capacity) for the buddy system and
O(number of free extents) for first fit.
"""

from __future__ import annotations

import heapq
import operator
from bisect import bisect_left
from collections.abc import Hashable

import numpy as np

from blocksim.config import RESERVATION_MODES

__all__ = [
    "RESERVATION_MODES",
    "CONTIGUOUS_ALLOCATORS",
    "reservation_slots",
    "BuddyAllocator",
    "FirstFitAllocator",
]


def _next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def _positive_int(value, name: str) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def reservation_slots(mode: str, prompt_tokens: int, output_tokens: int, max_model_len: int) -> int:
    """Token slots one request reserves up front under an Orca-baseline ``mode``.

    * ``"max"``    -- ``max_model_len``: the request may generate up to the model's
      maximum length; never less than ``prompt_tokens + output_tokens``, so a trace
      request longer than the model's limit still gets its true total.
    * ``"pow2"``   -- the prompt plus the next power of two >= ``output_tokens``: the
      output is over-reserved by at most 2x (the PagedAttention paper's Orca (Pow2)).
    * ``"oracle"`` -- exactly ``prompt_tokens + output_tokens`` (an upper bound on
      what reservation can achieve: the true output length is known in advance).

    The buddy allocator rounds every reservation up to a power of two on top of
    this; the difference is internal fragmentation, not reservation.  Whether the
    result fits the address space at all is the caller's check (``fits_ever``).
    """
    if mode not in RESERVATION_MODES:
        raise ValueError(f"unknown reservation mode {mode!r}; known modes: {', '.join(RESERVATION_MODES)}")
    for name, value in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if operator.index(value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    total = _positive_int(operator.index(prompt_tokens) + operator.index(output_tokens), "prompt_tokens + output_tokens")
    max_model_len = _positive_int(max_model_len, "max_model_len")
    if mode == "max":
        return max(max_model_len, total)
    if mode == "pow2":
        return operator.index(prompt_tokens) + (_next_pow2(operator.index(output_tokens)) if output_tokens else 0)
    return total


class BuddyAllocator:
    """Binary buddy allocator over ``capacity_slots`` token slots.

    Layout: the address space is covered by *roots*, the largest power-of-two
    blocks that fit, from address 0 down (capacity 24 -> roots of 16 at 0 and 8 at
    16), as real buddy systems run several max-order blocks.  Every root is a
    multiple of ``min_slots``; the ``capacity_slots % min_slots`` slots left at the
    top are ``unusable_slots`` and are neither free nor used.  Roots never merge.

    ``alloc`` rounds the size up to a power of two >= ``min_slots``, takes a free
    block of the smallest sufficient size (the lowest-address one of that size),
    splitting larger blocks when none of the exact size is free and keeping the
    lower half each time.  ``free`` merges the block with its buddy recursively.
    Both are O(log capacity) amortised: one set and one lazy min-heap per order.

    Invariants (``check_invariants``): free + used == usable; blocks are aligned
    to their size and tile the usable space without overlap; no two free buddies
    are left unmerged.
    """

    name = "buddy"

    def __init__(self, capacity_slots: int, min_slots: int = 1):
        self.capacity_slots = _positive_int(capacity_slots, "capacity_slots")
        self.min_slots = _positive_int(min_slots, "min_slots")
        if self.min_slots & (self.min_slots - 1):
            raise ValueError(f"min_slots must be a power of two, got {self.min_slots}")
        units = self.capacity_slots // self.min_slots
        if units == 0:
            raise ValueError(f"capacity_slots ({self.capacity_slots}) is smaller than min_slots ({self.min_slots})")
        self.usable_slots = units * self.min_slots
        self.unusable_slots = self.capacity_slots - self.usable_slots
        self._num_orders = units.bit_length()  # order k holds blocks of min_slots << k
        self._free: list[set[int]] = [set() for _ in range(self._num_orders)]
        self._heaps: list[list[int]] = [[] for _ in range(self._num_orders)]
        self._roots: set[tuple[int, int]] = set()  # (offset, order)
        offset = 0
        for order in range(self._num_orders - 1, -1, -1):
            if units >> order & 1:
                self._roots.add((offset, order))
                self._push(offset, order)
                offset += self.min_slots << order
        self._allocs: dict[Hashable, tuple[int, int]] = {}  # request_id -> (offset, order)
        self.used_slots = 0

    # -- free lists ----------------------------------------------------------
    def _push(self, offset: int, order: int) -> None:
        self._free[order].add(offset)
        heap = self._heaps[order]
        heapq.heappush(heap, offset)
        if len(heap) > 2 * len(self._free[order]) + 32:  # drop stale entries
            self._heaps[order] = sorted(self._free[order])

    def _pop_lowest(self, order: int) -> int:
        free, heap = self._free[order], self._heaps[order]
        while True:
            offset = heapq.heappop(heap)
            if offset in free:
                free.remove(offset)
                return offset

    def _order_for(self, size_slots: int) -> int:
        units = -(-size_slots // self.min_slots)
        return (units - 1).bit_length()

    # -- API -----------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return self.usable_slots - self.used_slots

    def chunk_slots(self, size_slots: int) -> int:
        """Slots ``alloc`` takes for ``size_slots``: next power of two >= max(size, min_slots)."""
        return self.min_slots << self._order_for(_positive_int(size_slots, "size_slots"))

    def fits_ever(self, size_slots: int) -> bool:
        """True if ``size_slots`` fits in the largest root, i.e. in an empty address space."""
        return self._order_for(_positive_int(size_slots, "size_slots")) < self._num_orders

    def can_alloc(self, size_slots: int) -> bool:
        """True if ``alloc(_, size_slots)`` would succeed now."""
        order = self._order_for(_positive_int(size_slots, "size_slots"))
        return any(self._free[k] for k in range(order, self._num_orders))

    def alloc(self, request_id: Hashable, size_slots: int) -> int | None:
        """Reserve a chunk for ``request_id``; return its offset, or None if no free block is large enough."""
        order = self._order_for(_positive_int(size_slots, "size_slots"))
        if request_id in self._allocs:
            raise ValueError(f"request {request_id!r} already holds a chunk; free it first")
        for found in range(order, self._num_orders):
            if self._free[found]:
                break
        else:
            return None
        offset = self._pop_lowest(found)
        while found > order:  # split, keep the lower half, free the upper buddy
            found -= 1
            self._push(offset + (self.min_slots << found), found)
        self._allocs[request_id] = (offset, order)
        self.used_slots += self.min_slots << order
        return offset

    def free(self, request_id: Hashable) -> None:
        """Release ``request_id``'s chunk and merge free buddies up to its root."""
        try:
            offset, order = self._allocs.pop(request_id)
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no chunk in this BuddyAllocator (never allocated, or freed twice)") from None
        self.used_slots -= self.min_slots << order
        while (offset, order) not in self._roots:
            buddy = offset ^ (self.min_slots << order)
            if buddy not in self._free[order]:
                break
            self._free[order].remove(buddy)  # its heap entry goes stale
            offset = min(offset, buddy)
            order += 1
        self._push(offset, order)

    def allocated_slots(self, request_id: Hashable) -> int:
        """Chunk size (slots, rounded up) held by ``request_id``; KeyError if none."""
        return self.min_slots << self._allocs[request_id][1]

    def offset(self, request_id: Hashable) -> int:
        return self._allocs[request_id][0]

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._allocs

    def __len__(self) -> int:
        """Number of requests holding a chunk."""
        return len(self._allocs)

    def _free_block_list(self) -> list[tuple[int, int]]:
        """Free blocks as (offset, size_slots), in address order."""
        return sorted((o, self.min_slots << k) for k, offsets in enumerate(self._free) for o in offsets)

    def free_blocks(self) -> np.ndarray:
        """Sizes (slots) of the blocks on the buddy free lists, in address order."""
        return np.array([size for _, size in self._free_block_list()], dtype=np.int64)

    def free_pieces(self) -> np.ndarray:
        """Free runs one chunk can lie in: the free blocks (a chunk never spans two buddies)."""
        return self.free_blocks()

    def largest_free_block(self) -> int:
        """Largest block on the free lists: the largest chunk ``alloc`` can hand out now."""
        for order in range(self._num_orders - 1, -1, -1):
            if self._free[order]:
                return self.min_slots << order
        return 0

    def free_extents(self) -> np.ndarray:
        """Sizes of the maximal runs of contiguous free slots, in address order.

        Adjacent free blocks that are not buddies (different parents or different
        roots) form one run, so a run can be larger than any allocatable chunk.
        """
        runs: list[int] = []
        end = -1
        for offset, size in self._free_block_list():
            if offset == end:
                runs[-1] += size
            else:
                runs.append(size)
            end = offset + size
        return np.array(runs, dtype=np.int64)

    def largest_free_extent(self) -> int:
        """Longest run of contiguous free slots (see ``largest_free_block`` for what fits)."""
        extents = self.free_extents()
        return int(extents.max()) if extents.size else 0

    def check_invariants(self) -> None:
        """Raise AssertionError if the allocator's state is inconsistent."""
        def require(cond: bool, msg: str) -> None:
            if not cond:
                raise AssertionError(f"BuddyAllocator invariant broken: {msg}")

        root_of: dict[int, int] = {o: k for o, k in self._roots}
        root_starts = sorted(root_of)
        intervals = []
        for order, offsets in enumerate(self._free):
            size = self.min_slots << order
            require(offsets <= set(self._heaps[order]), f"order {order} free set has offsets missing from its heap")
            for o in offsets:
                require(o % size == 0, f"free block at {o} not aligned to its size {size}")
                if (o, order) not in self._roots:
                    require((o ^ size) not in offsets, f"free buddies at {o} and {o ^ size} (size {size}) not merged")
                intervals.append((o, size, "free"))
        used = 0
        for rid, (o, order) in self._allocs.items():
            size = self.min_slots << order
            require(o % size == 0, f"request {rid!r} chunk at {o} not aligned to its size {size}")
            used += size
            intervals.append((o, size, rid))
        require(used == self.used_slots, f"used_slots {self.used_slots} != sum of chunks {used}")
        require(self.used_slots + self.free_slots == self.usable_slots, "free + used != usable")
        intervals.sort(key=lambda t: t[0])
        end = 0
        for o, size, owner in intervals:
            require(o == end, f"gap or overlap at slot {end} (next block {owner!r} starts at {o})")
            # a block must lie inside one root
            root = root_starts[bisect_left(root_starts, o + 1) - 1]
            require(o + size <= root + (self.min_slots << root_of[root]), f"block {owner!r} at {o} crosses root {root}")
            end = o + size
        require(end == self.usable_slots, f"blocks cover {end} slots, usable is {self.usable_slots}")


class FirstFitAllocator:
    """Exact-size contiguous allocation, first fit by address.

    Free space is a sorted list of coalesced extents (start, size).  ``alloc``
    takes the front of the lowest-address extent large enough; ``free`` reinserts
    the chunk and coalesces it with its neighbours.  Both are O(number of free
    extents) (a scan, resp. list insertion).  No rounding, so no internal
    fragmentation: ``chunk_slots(n) == n``; all capacity is usable.
    """

    name = "first-fit"

    def __init__(self, capacity_slots: int):
        self.capacity_slots = _positive_int(capacity_slots, "capacity_slots")
        self.usable_slots = self.capacity_slots
        self.unusable_slots = 0
        self._starts: list[int] = [0]
        self._sizes: list[int] = [self.capacity_slots]
        self._allocs: dict[Hashable, tuple[int, int]] = {}  # request_id -> (offset, size)
        self.used_slots = 0

    @property
    def free_slots(self) -> int:
        return self.capacity_slots - self.used_slots

    def chunk_slots(self, size_slots: int) -> int:
        return _positive_int(size_slots, "size_slots")

    def fits_ever(self, size_slots: int) -> bool:
        return _positive_int(size_slots, "size_slots") <= self.capacity_slots

    def can_alloc(self, size_slots: int) -> bool:
        return _positive_int(size_slots, "size_slots") <= self.largest_free_extent()

    def alloc(self, request_id: Hashable, size_slots: int) -> int | None:
        """Reserve exactly ``size_slots`` for ``request_id`` at the lowest-address fit; None if none fits."""
        size = _positive_int(size_slots, "size_slots")
        if request_id in self._allocs:
            raise ValueError(f"request {request_id!r} already holds a chunk; free it first")
        sizes = self._sizes
        for i, extent in enumerate(sizes):
            if extent >= size:
                break
        else:
            return None
        offset = self._starts[i]
        if extent == size:
            del self._starts[i], sizes[i]
        else:
            self._starts[i] += size
            sizes[i] -= size
        self._allocs[request_id] = (offset, size)
        self.used_slots += size
        return offset

    def free(self, request_id: Hashable) -> None:
        """Release ``request_id``'s chunk, coalescing with adjacent free extents."""
        try:
            offset, size = self._allocs.pop(request_id)
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no chunk in this FirstFitAllocator (never allocated, or freed twice)") from None
        self.used_slots -= size
        starts, sizes = self._starts, self._sizes
        i = bisect_left(starts, offset)  # extents before i end at or before offset
        merge_prev = i > 0 and starts[i - 1] + sizes[i - 1] == offset
        merge_next = i < len(starts) and starts[i] == offset + size
        if merge_prev and merge_next:
            sizes[i - 1] += size + sizes[i]
            del starts[i], sizes[i]
        elif merge_prev:
            sizes[i - 1] += size
        elif merge_next:
            starts[i] = offset
            sizes[i] += size
        else:
            starts.insert(i, offset)
            sizes.insert(i, size)

    def allocated_slots(self, request_id: Hashable) -> int:
        return self._allocs[request_id][1]

    def offset(self, request_id: Hashable) -> int:
        return self._allocs[request_id][0]

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._allocs

    def __len__(self) -> int:
        return len(self._allocs)

    def free_extents(self) -> np.ndarray:
        """Sizes of the (coalesced) free extents, in address order."""
        return np.array(self._sizes, dtype=np.int64)

    def free_pieces(self) -> np.ndarray:
        """Free runs one chunk can lie in: the free extents."""
        return self.free_extents()

    def largest_free_extent(self) -> int:
        return max(self._sizes, default=0)

    def check_invariants(self) -> None:
        """Raise AssertionError if the allocator's state is inconsistent."""
        def require(cond: bool, msg: str) -> None:
            if not cond:
                raise AssertionError(f"FirstFitAllocator invariant broken: {msg}")

        require(len(self._starts) == len(self._sizes), "extent lists differ in length")
        for i, (s, n) in enumerate(zip(self._starts, self._sizes)):
            require(n > 0, f"empty free extent at {s}")
            if i:
                prev_end = self._starts[i - 1] + self._sizes[i - 1]
                require(prev_end < s, f"free extents at {self._starts[i - 1]} and {s} overlap or are not coalesced")
        used = sum(n for _, n in self._allocs.values())
        require(used == self.used_slots, f"used_slots {self.used_slots} != sum of chunks {used}")
        require(sum(self._sizes) == self.free_slots, "free extents do not sum to free_slots")
        intervals = sorted([(o, n, rid) for rid, (o, n) in self._allocs.items()]
                           + [(s, n, "free") for s, n in zip(self._starts, self._sizes)], key=lambda t: t[0])
        end = 0
        for o, n, owner in intervals:
            require(o == end, f"gap or overlap at slot {end} (next block {owner!r} starts at {o})")
            end = o + n
        require(end == self.capacity_slots, f"blocks cover {end} slots, capacity is {self.capacity_slots}")


CONTIGUOUS_ALLOCATORS = {BuddyAllocator.name: BuddyAllocator, FirstFitAllocator.name: FirstFitAllocator}

"""Physical KV blocks of one device: a free list and reference counts.

vLLM v0's `BlockAllocator`, with block numbers as plain ints instead of block objects. The
invariant kept by every call: `num_free + num_used == num_blocks`, and a block is on the free list
exactly when its reference count is 0.
"""

from __future__ import annotations

import enum
from collections import deque


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for positive b (blocks needed for a tokens)."""
    return -(-a // b)

class BlockError(RuntimeError):
    """A block-accounting bug: double free, allocation from an empty pool, bad block number."""


class Device(enum.Enum):
    GPU = "gpu"
    CPU = "cpu"


class BlockAllocator:
    """Free list over `num_blocks` physical blocks with reference counts.

    `order="lifo"` reuses the most recently freed block first (vLLM v0: `free_blocks.pop()` /
    `append`); `"fifo"` reuses the least recently freed first.
    """

    def __init__(self, device: Device, num_blocks: int, order: str = "lifo") -> None:
        if num_blocks < 0:
            raise ValueError(f"{device.value} allocator: num_blocks must be >= 0, got {num_blocks}")
        if order not in ("lifo", "fifo"):
            raise ValueError(f"{device.value} allocator: order must be 'lifo' or 'fifo', got {order!r}")
        self.device = device
        self.num_blocks = num_blocks
        self.order = order
        self.ref_counts = [0] * num_blocks
        # a stack for LIFO (blocks taken from its end, several in one slice), a queue for FIFO
        self._free: list[int] | deque[int] = list(range(num_blocks)) if order == "lifo" else deque(range(num_blocks))
        self._take = self._free.pop if order == "lifo" else self._free.popleft

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        """Take a free block; its reference count becomes 1."""
        if not self._free:
            raise BlockError(f"{self.device.value} allocator: out of blocks ({self.num_blocks} all in use)")
        block = self._take()
        self.ref_counts[block] = 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """`n` blocks, taken as `n` calls of `allocate` take them (a prompt's blocks at admission)."""
        if type(self).allocate is not BlockAllocator.allocate:
            return [self.allocate() for _ in range(n)]
        if n > len(self._free):
            raise BlockError(f"{self.device.value} allocator: out of blocks ({self.num_blocks} all in use)")
        take, refs = self._take, self.ref_counts
        if self.order == "lifo":  # the last n of the stack, last first
            free = self._free
            blocks = free[:-n - 1:-1] if n > 0 else []
            del free[len(free) - len(blocks):]
        else:
            blocks = [take() for _ in range(n)]
        for block in blocks:
            refs[block] = 1
        return blocks

    def incref(self, block: int) -> None:
        if self.ref_counts[block] <= 0:
            raise BlockError(f"{self.device.value} block {block}: cannot share a free block")
        self.ref_counts[block] += 1

    def free(self, block: int) -> None:
        """Drop one reference; the block returns to the free list when none remain."""
        rc = self.ref_counts[block]
        if rc <= 0:
            raise BlockError(f"{self.device.value} block {block}: double free (reference count is already 0)")
        rc -= 1
        self.ref_counts[block] = rc
        if rc == 0:
            self._release(block)

    def free_table(self, table: list[int], kv_len: int, block_size: int) -> int:
        """Drop one reference to each block of a block table; return the slots of K/V released.

        Block i of the table holds `min(block_size, kv_len - i * block_size)` filled slots (at
        least 0); those of blocks whose last reference goes are released. One loop over the
        table: this runs for every finished request.
        """
        refs, free_list = self.ref_counts, self._free
        plain = type(self)._release is BlockAllocator._release
        if plain:
            for b in table:
                if refs[b] != 1:
                    break
            else:  # the common case: no block shared, every one released in table order
                for b in table:
                    refs[b] = 0
                free_list.extend(table)
                return max(0, min(kv_len, len(table) * block_size))
        release = free_list.append if plain else self._release
        shared = False
        for b in table:
            rc = refs[b] - 1
            if rc < 0:
                raise BlockError(f"{self.device.value} block {b}: double free (reference count is already 0)")
            refs[b] = rc
            if rc:
                shared = True
            else:
                release(b)
        if not shared:  # every block released: the table's filled slots
            return max(0, min(kv_len, len(table) * block_size))
        return sum(max(0, min(block_size, kv_len - i * block_size))
                   for i, b in enumerate(table) if refs[b] == 0)

    def _release(self, block: int) -> None:
        """A block whose last reference went: back on the free list (subclasses may keep it cached)."""
        self._free.append(block)

    def check(self) -> None:
        """Verify the free list against the reference counts (O(num_blocks); for tests)."""
        free = list(self._free)
        if len(set(free)) != len(free):
            raise BlockError(f"{self.device.value} allocator: a block is on the free list twice")
        zero = {b for b, rc in enumerate(self.ref_counts) if rc == 0}
        if zero != set(free):
            raise BlockError(f"{self.device.value} allocator: free list {sorted(set(free) ^ zero)[:5]}... "
                             f"disagrees with reference counts")
        if any(rc < 0 for rc in self.ref_counts):
            raise BlockError(f"{self.device.value} allocator: negative reference count")

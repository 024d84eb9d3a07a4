"""vLLM V1's block pool: every GPU block, its reference count and content hash, and the free queue.

Follows `vllm/v1/core/block_pool.py` and `kv_cache_utils.py` of vLLM v0.11:

* Blocks are ints `0 .. num_blocks - 1`. Block 0 is the null block (a placeholder vLLM takes out
  of the free queue at start-up and never hands out), so `num_blocks - 1` blocks serve requests.
* The free queue (`FreeBlockQueue`, vLLM's `FreeKVCacheBlockQueue`) holds the free blocks in
  eviction order: new blocks are taken from its head, freed blocks appended at its tail, and a
  block anywhere in it can be taken out in O(1) (a prefix-cache hit on a free block). vLLM links
  them in a doubly linked list; here they are one list with each block's position, so that taking
  and freeing many blocks is a slice and an extend.
* A cached block keeps its hash while it waits in the free queue; it is evicted (its hash
  forgotten) only when the queue hands it out as a new block. A hash may name several blocks
  (vLLM does not de-duplicate, so block tables stay append-only); a lookup returns the first.

Invariant after every call: a block other than the null block is in the free queue exactly when
its reference count is 0; `num_free + num_used == num_blocks - 1`.
"""

from __future__ import annotations

from collections.abc import Iterable

from blocksim.memory.blocks import BlockError

NULL_BLOCK = 0
_NIL = -1


class FreeBlockQueue:
    """The free blocks in eviction order (vLLM's `FreeKVCacheBlockQueue`), as one append-only list.

    vLLM links the free blocks in a doubly linked list. Here `order[pos - base]` holds the
    block appended at position `pos` (positions count every append), the queue runs from position
    `start` to the end, and `pos[b]` is the position of block b's entry: b is free exactly when
    `pos[b] >= start`. Taking blocks from the head moves `start` on (a slice of the list, no work
    per block); appending sets the block's position; a block taken out of the middle (a prefix hit)
    leaves a stale entry behind (`pos[b]` no longer points at it), which taking from the head skips.
    The list drops the entries before `start` once they are half of it.
    """

    __slots__ = ("order", "pos", "base", "start", "stale", "num_free")

    def __init__(self, num_blocks: int) -> None:
        self.order = list(range(num_blocks))
        self.pos = list(range(num_blocks))
        self.base = 0    # position of order[0]
        self.start = 0   # position of the head's entry
        self.stale = 0   # entries from `start` on that no longer hold their block
        self.num_free = num_blocks

    def __contains__(self, b: int) -> bool:
        return self.pos[b] >= self.start

    @property
    def head(self) -> int:
        """The block taken next (-1 when none is free)."""
        order, pos, base = self.order, self.pos, self.base
        for p in range(self.start, base + len(order)):
            if pos[order[p - base]] == p:
                return order[p - base]
        return _NIL

    @property
    def tail(self) -> int:
        """The block appended last (-1 when none is free)."""
        order, pos, base = self.order, self.pos, self.base
        for p in range(base + len(order) - 1, self.start - 1, -1):
            if pos[order[p - base]] == p:
                return order[p - base]
        return _NIL

    def take(self, n: int) -> list[int]:
        """The first `n` blocks of the queue, taken out (the caller checks that `n` are free)."""
        i = self.start - self.base
        order = self.order
        if not self.stale:
            out = order[i:i + n]
            self.start += n
        else:
            pos, out, p = self.pos, [], self.start
            while len(out) < n:
                b = order[p - self.base]
                if pos[b] == p:
                    out.append(b)
                else:
                    self.stale -= 1
                p += 1
            self.start = p
        self.num_free -= n
        if not self.num_free:  # nothing left: the entries left are stale
            self.start = self.base + len(order)
            self.stale = 0
        if self.start - self.base > len(order) >> 1 and len(order) > 64:
            self._compact()
        return out

    def _compact(self) -> None:
        del self.order[:self.start - self.base]
        self.base = self.start

    def popleft(self) -> int:
        if not self.num_free:
            raise BlockError("free block queue: empty")
        if self.stale:
            return self.take(1)[0]
        i = self.start - self.base
        b = self.order[i]
        self.start += 1
        self.num_free -= 1
        if i > 32 and i >= len(self.order) >> 1:
            self._compact()
        return b

    def remove(self, b: int) -> None:
        if self.pos[b] < self.start:
            raise BlockError(f"free block queue: block {b} is not in the queue")
        self.pos[b] = -1
        self.stale += 1
        self.num_free -= 1
        if not self.num_free:
            self.start = self.base + len(self.order)
            self.stale = 0

    def append(self, b: int) -> None:
        self.pos[b] = self.base + len(self.order)
        self.order.append(b)
        self.num_free += 1

    def extend(self, blocks: list[int]) -> None:
        """Append `blocks` in order."""
        order = self.order
        p = self.base + len(order)
        pos = self.pos
        for b in blocks:
            pos[b] = p
            p += 1
        order += blocks
        self.num_free += len(blocks)

    def blocks(self) -> list[int]:
        """The free blocks from head (evicted first) to tail; O(num_free), for tests and checks."""
        order, pos, base = self.order, self.pos, self.base
        return [b for p, b in enumerate(order[self.start - base:], self.start) if pos[b] == p]


class BlockPool:
    """Reference counts, content hashes and the free queue of one GPU's blocks (vLLM V1's `BlockPool`).

    `enable_caching=False` (vLLM's `--no-enable-prefix-caching`) never records a hash, so nothing
    is ever hit or evicted.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise BlockError(f"block pool: {num_blocks} blocks leave none besides the null block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}            # hash -> the first block cached with that content
        self.duplicates: dict[int, list[int]] = {}  # hash -> later blocks with that content, in caching order
        self.free_queue = FreeBlockQueue(num_blocks)
        self.free_queue.popleft()  # the null block
        self.evictions = 0
        #: Called as `on_evict(block, hash)` when a hash leaves the cache with its last block (KV tiers).
        self.on_evict = None

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    def get_cached_block(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[int]:
        """`n` blocks from the head of the free queue, each evicted from the cache if it held content."""
        q = self.free_queue
        if n > q.num_free:
            raise BlockError(f"block pool: cannot take {n} blocks, {q.num_free} free")
        out = q.take(n)
        refs = self.ref_cnt
        if self.cached:
            hashes = self.block_hash
            held = [b for b in out if hashes[b] is not None]
            if held:
                if self.duplicates or self.on_evict is not None:
                    for b in held:
                        self._evict(b)
                else:  # each hash names one block: `_evict` is forgetting it
                    cached = self.cached
                    for b in held:
                        del cached[hashes[b]]
                        hashes[b] = None
                    self.evictions += len(held)
        for b in out:
            refs[b] = 1
        return out

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        dups = self.duplicates.get(h)
        if self.cached[h] == b:
            if dups:
                self.cached[h] = dups.pop(0)
                if not dups:
                    del self.duplicates[h]
            else:
                del self.cached[h]
                if self.on_evict is not None:
                    self.on_evict(b, h)
        else:
            dups.remove(b)
            if not dups:
                del self.duplicates[h]
        self.block_hash[b] = None
        self.evictions += 1

    def touch(self, blocks: Iterable[int]) -> None:
        """A prefix-cache hit: one more reference each, taken out of the free queue if it was free."""
        refs, remove = self.ref_cnt, self.free_queue.remove
        for b in blocks:
            if refs[b] == 0:
                remove(b)
            refs[b] += 1

    def free_blocks(self, ordered: Iterable[int]) -> list[int]:
        """Drop one reference each; blocks left with none join the free queue in the given order
        (the first is evicted first). Returns those blocks."""
        refs = self.ref_cnt
        blocks = list(ordered)
        if [refs[b] for b in blocks].count(1) == len(blocks):  # the common case: every block released
            for b in blocks:
                refs[b] = 0
            self.free_queue.extend(blocks)
            return blocks
        released = []
        for b in blocks:
            rc = refs[b] - 1
            if rc < 0:
                raise BlockError(f"block pool: block {b} freed twice")
            refs[b] = rc
            if rc == 0:
                released.append(b)
        if released:
            self.free_queue.extend(released)
        return released

    def cache_full_blocks(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        """Record the content hashes of `blocks[start:stop]`, which have just become full."""
        self.cache_full_blocks_of([(blocks, hashes, start, stop)])

    def cache_full_blocks_of(self, filled: list[tuple[list[int], list[int], int, int]]) -> None:
        """`cache_full_blocks(blocks, hashes, start, stop)` for each tuple of `filled`, in order."""
        if not self.enable_caching:
            return
        cached, bh, dups = self.cached, self.block_hash, self.duplicates
        for blocks, hashes, start, stop in filled:
            if stop - start == 1:
                b, h = blocks[start], hashes[start]
                bh[b] = h
                if h in cached:
                    dups.setdefault(h, []).append(b)
                else:
                    cached[h] = b
                continue
            new_hashes, new_blocks = hashes[start:stop], blocks[start:stop]
            if cached.keys().isdisjoint(new_hashes) and len(set(new_hashes)) == len(new_hashes):
                cached.update(zip(new_hashes, new_blocks))  # new content only: each the first of its hash
                for b, h in zip(new_blocks, new_hashes):
                    bh[b] = h
                continue
            for b, h in zip(new_blocks, new_hashes):
                bh[b] = h
                if h in cached:
                    dups.setdefault(h, []).append(b)
                else:
                    cached[h] = b

    def check(self) -> None:
        """The free queue against the reference counts and the cache maps (O(num_blocks); tests)."""
        q = self.free_queue
        free = q.blocks()
        if len(free) != q.num_free or len(set(free)) != len(free):
            raise BlockError("block pool: the free queue's length disagrees with its entries")
        if len(q.order) - (q.start - q.base) != q.num_free + q.stale:
            raise BlockError("block pool: the free queue's count of stale entries is wrong")
        zero = {b for b in range(1, self.num_blocks) if self.ref_cnt[b] == 0}
        if set(free) != zero or NULL_BLOCK in free:
            raise BlockError(f"block pool: free queue disagrees with reference counts at "
                             f"{sorted(set(free) ^ zero)[:5]}")
        if any(rc < 0 for rc in self.ref_cnt):
            raise BlockError("block pool: negative reference count")
        for h, b in self.cached.items():
            if any(self.block_hash[x] != h for x in [b, *self.duplicates.get(h, ())]):
                raise BlockError(f"block pool: hash {h} maps to a block that holds other content")
        if not set(self.duplicates) <= set(self.cached):
            raise BlockError("block pool: duplicates of a hash no block is cached under")
        if len(self.cached) + sum(map(len, self.duplicates.values())) != sum(h is not None for h in self.block_hash):
            raise BlockError("block pool: a hashed block is missing from the cache map")

"""vLLM V1's block pool: every GPU block, its reference count and content hash, and the free queue.

Follows `vllm/v1/core/block_pool.py` and `kv_cache_utils.py` of vLLM v0.11:

* Blocks are ints `0 .. num_blocks - 1`. Block 0 is the null block (a placeholder vLLM takes out
  of the free queue at start-up and never hands out), so `num_blocks - 1` blocks serve requests.
* The free queue (`FreeBlockQueue`, vLLM's `FreeKVCacheBlockQueue`) is a doubly linked list in
  eviction order: new blocks are taken from its head, freed blocks appended at its tail, and a
  block anywhere in it can be taken out in O(1) (a prefix-cache hit on a free block).
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
    """Doubly linked list of free block ids (vLLM's `FreeKVCacheBlockQueue`), as two int arrays."""

    __slots__ = ("prev", "next", "head", "tail", "num_free")

    def __init__(self, num_blocks: int) -> None:
        self.prev = [i - 1 for i in range(num_blocks)]
        self.next = [i + 1 for i in range(num_blocks)]
        if num_blocks:
            self.next[-1] = _NIL
        self.head = 0 if num_blocks else _NIL
        self.tail = num_blocks - 1 if num_blocks else _NIL
        self.num_free = num_blocks

    def popleft(self) -> int:
        b = self.head
        if b == _NIL:
            raise BlockError("free block queue: empty")
        n = self.next[b]
        self.head = n
        if n == _NIL:
            self.tail = _NIL
        else:
            self.prev[n] = _NIL
        self.prev[b] = self.next[b] = _NIL
        self.num_free -= 1
        return b

    def remove(self, b: int) -> None:
        p, n = self.prev[b], self.next[b]
        if p == _NIL:
            if self.head != b:
                raise BlockError(f"free block queue: block {b} is not in the queue")
            self.head = n
        else:
            self.next[p] = n
        if n == _NIL:
            self.tail = p
        else:
            self.prev[n] = p
        self.prev[b] = self.next[b] = _NIL
        self.num_free -= 1

    def append(self, b: int) -> None:
        t = self.tail
        self.prev[b] = t
        self.next[b] = _NIL
        if t == _NIL:
            self.head = b
        else:
            self.next[t] = b
        self.tail = b
        self.num_free += 1

    def blocks(self) -> list[int]:
        """The free blocks from head (evicted first) to tail; O(num_free), for tests and checks."""
        out, b = [], self.head
        while b != _NIL:
            out.append(b)
            b = self.next[b]
        return out


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
        nxt, prv, refs, hashes = q.next, q.prev, self.ref_cnt, self.block_hash
        cached, dups = self.cached, self.duplicates
        out = []
        b = q.head
        for _ in range(n):  # the queue's popleft and `_evict`, unrolled
            out.append(b)
            n_ = nxt[b]
            prv[b] = nxt[b] = _NIL
            h = hashes[b]
            if h is not None:
                if h in dups or cached[h] != b:
                    self._evict(b)
                else:
                    del cached[h]
                    hashes[b] = None
                    self.evictions += 1
                    if self.on_evict is not None:
                        self.on_evict(b, h)
            refs[b] = 1
            b = n_
        q.head = b
        if b == _NIL:
            q.tail = _NIL
        else:
            prv[b] = _NIL
        q.num_free -= n
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
        released = []
        for b in ordered:
            rc = refs[b] - 1
            if rc < 0:
                raise BlockError(f"block pool: block {b} freed twice")
            refs[b] = rc
            if rc == 0:
                released.append(b)
        if released:  # the queue's append, unrolled: link the released blocks after the tail
            q = self.free_queue
            nxt, prv = q.next, q.prev
            t = q.tail
            for b in released:
                prv[b] = t
                if t == _NIL:
                    q.head = b
                else:
                    nxt[t] = b
                t = b
            nxt[t] = _NIL
            q.tail = t
            q.num_free += len(released)
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
            for i in range(start, stop):
                b, h = blocks[i], hashes[i]
                bh[b] = h
                if h in cached:
                    dups.setdefault(h, []).append(b)
                else:
                    cached[h] = b

    def check(self) -> None:
        """The free queue against the reference counts and the cache maps (O(num_blocks); tests)."""
        free = self.free_queue.blocks()
        if len(free) != self.free_queue.num_free or len(set(free)) != len(free):
            raise BlockError("block pool: the free queue's length disagrees with its links")
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

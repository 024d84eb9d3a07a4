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
#: `BlockPool.block_hash` of a full block whose content no other request shares and whose hash is
#: not computed (`KVCacheManager` defers those hashes): it is evicted like a cached block, but no
#: lookup can find it.
UNIQUE = object()


class FreeBlockQueue:
    """The free blocks in eviction order (vLLM's `FreeKVCacheBlockQueue`), as one append-only list.

    vLLM links the free blocks in a doubly linked list. Here the queue is `order[first:]`: blocks
    are taken from the head by moving `first` on (a slice, no work per block) and appended at the
    end. A block taken out of the middle (a prefix hit on a free block) leaves its entry in place
    and is counted in `removed`; taking from the head skips as many entries of that block as it has
    removals: a block's entries ahead of the head are its removed ones, then, when it is free, its
    last one. The entries before `first` are dropped once they are half of the list.
    """

    __slots__ = ("order", "first", "removed", "num_free")

    def __init__(self, num_blocks: int) -> None:
        self.order = list(range(num_blocks))
        self.first = 0
        self.removed: dict[int, int] = {}  # block -> its entries from `first` on that are no longer in the queue
        self.num_free = num_blocks

    def _live(self, limit: int | None = None) -> list[int]:
        """The free blocks from the head, in the order `take` returns them (the first `limit` of
        them), read from the entries themselves (not from `num_free`)."""
        i, order, removed = self.first, self.order, self.removed
        if not removed:
            return order[i:] if limit is None else order[i:i + limit]
        out: list[int] = []
        skipped: dict[int, int] = {}  # block -> its removed entries passed so far
        end = len(order)
        while i < end and len(out) != limit:
            b = order[i]
            i += 1
            k = skipped.get(b, 0)
            if removed.get(b, 0) > k:
                skipped[b] = k + 1
            else:
                out.append(b)
        return out

    @property
    def head(self) -> int:
        """The block taken next (-1 when none is free)."""
        live = self._live(1)
        return live[0] if live else _NIL

    @property
    def tail(self) -> int:
        """The block appended last (-1 when none is free)."""
        live = self._live()
        return live[-1] if live else _NIL

    def take(self, n: int) -> list[int]:
        """The first `n` blocks of the queue, taken out (the caller checks that `n` are free)."""
        i, order = self.first, self.order
        if not self.removed:
            out = order[i:i + n]
            i += n
        else:
            removed, out = self.removed, []
            while len(out) < n:
                b = order[i]
                i += 1
                r = removed.get(b)
                if r:
                    if r == 1:
                        del removed[b]
                    else:
                        removed[b] = r - 1
                else:
                    out.append(b)
        self.num_free -= n
        if not self.num_free:  # the entries left are removed ones
            i = len(order)
            self.removed.clear()
        if i > 64 and i >= len(order) >> 1:
            del order[:i]
            i = 0
        self.first = i
        return out

    def peek(self, n: int) -> list[int]:
        """The first `n` blocks `take(n)` would return (fewer when fewer are free), left in place."""
        return self._live(n)

    def popleft(self) -> int:
        if not self.num_free:
            raise BlockError("free block queue: empty")
        if self.removed or self.num_free == 1:
            return self.take(1)[0]
        i = self.first
        b = self.order[i]
        i += 1
        if i > 64 and i >= len(self.order) >> 1:
            del self.order[:i]
            i = 0
        self.first = i
        self.num_free -= 1
        return b

    def remove(self, b: int) -> None:
        """Take block `b`, which the caller knows to be free, out of the queue."""
        self.removed[b] = self.removed.get(b, 0) + 1
        self.num_free -= 1
        if not self.num_free:
            self.first = len(self.order)
            self.removed.clear()

    def append(self, b: int) -> None:
        self.order.append(b)
        self.num_free += 1

    def extend(self, blocks: list[int]) -> None:
        """Append `blocks` in order."""
        self.order += blocks
        self.num_free += len(blocks)

    def blocks(self) -> list[int]:
        """The free blocks from head (evicted first) to tail; O(num_free), for tests and checks."""
        return self._live()


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

    def clean_head(self, limit: int, spare: list[int] | None = None) -> int:
        """How many of the next `limit` new blocks evict no content a lookup can find: the free
        queue's leading blocks without a hash (or with a hash no lookup reaches, `UNIQUE`). With
        `spare` (blocks), how many come before the first of those blocks instead."""
        head = self.free_queue.peek(limit)
        if spare is not None:
            spare = set(spare)
            return next((i for i, b in enumerate(head) if b in spare), len(head))
        hashes = self.block_hash
        n = 0
        for b in head:
            h = hashes[b]
            if h is not None and h is not UNIQUE:
                break
            n += 1
        return n

    def get_new_blocks(self, n: int) -> list[int]:
        """`n` blocks from the head of the free queue, each evicted from the cache if it held content."""
        q = self.free_queue
        if n > q.num_free:
            raise BlockError(f"block pool: cannot take {n} blocks, {q.num_free} free")
        out = q.take(n)
        refs, hashes = self.ref_cnt, self.block_hash
        held = [h for h in map(hashes.__getitem__, out) if h is not None]
        if held:
            dups = self.duplicates
            if self.on_evict is not None or (dups and not dups.keys().isdisjoint(held)):
                for b in out:
                    if hashes[b] is not None:
                        self._evict(b)
            else:  # each hash held here names one block (no duplicates of it): `_evict` forgets it
                if held.count(UNIQUE) != len(held):
                    cached = self.cached
                    for h in held:
                        if h is not UNIQUE:
                            del cached[h]
                self.evictions += len(held)
                for b in out:
                    hashes[b] = None
                    refs[b] = 1
                return out
        for b in out:
            refs[b] = 1
        return out

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        if h is UNIQUE:
            self.block_hash[b] = None
            self.evictions += 1
            return
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
        if [refs[b] for b in blocks].count(1) == len(blocks) and len(set(blocks)) == len(blocks):
            # the common case: every block released, each once
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
            for i in range(start, stop):
                b, h = blocks[i], hashes[i]
                bh[b] = h
                if h in cached:
                    dups.setdefault(h, []).append(b)
                else:
                    cached[h] = b

    def hold_unique(self, blocks: list[int]) -> None:
        """`blocks` have just become full with content no other request shares (`UNIQUE`)."""
        if not self.enable_caching:
            return
        bh = self.block_hash
        for b in blocks:
            bh[b] = UNIQUE

    def check(self) -> None:
        """The free queue against the reference counts and the cache maps (O(num_blocks); tests)."""
        q = self.free_queue
        free = q.blocks()
        if len(free) != q.num_free or len(set(free)) != len(free):
            raise BlockError("block pool: the free queue's length disagrees with its entries")
        if len(q.order) - q.first != q.num_free + sum(q.removed.values()):
            raise BlockError("block pool: the free queue's count of removed entries is wrong")
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
        if len(self.cached) + sum(map(len, self.duplicates.values())) != sum(h is not None and h is not UNIQUE for h in self.block_hash):
            raise BlockError("block pool: a hashed block is missing from the cache map")

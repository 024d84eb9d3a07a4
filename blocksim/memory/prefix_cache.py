"""Automatic prefix caching (vLLM's APC) on paged blocks.

A full prompt block's identity is its content key: for traces with prefix hashes (e.g. Mooncake's
`hash_ids` of 512-token blocks) the key of a `block_size`-token block is derived from the hash id
covering it and its offset inside that hash block (a hash id already depends on the whole prefix,
so equal keys mean equal prefixes). Blocks without a key (partial last blocks, generated tokens,
traces without hashes) are never shared.

At admission each leading full prompt block whose key is cached is reused (a hit; reference
counted like any shared block) and only the tokens after the cached prefix are prefilled (at
least the last one, as vLLM recomputes it). A block whose last reference goes keeps its content
and key and waits in an evictor; it still counts as free. A new block comes from the never-cached
free list first, else the evictor gives up its least recently freed block, ties going to the
deepest block of a chain (the one furthest into its prompt), and its key is forgotten.
"""

from __future__ import annotations

import heapq
import itertools

from blocksim.memory.paged import BlockSpaceManager, cdiv
from blocksim.memory.blocks import BlockAllocator, BlockError, Device
from blocksim.sequence import SequenceGroup, SeqStatus



def prompt_block_keys(group: SequenceGroup, block_size: int, hash_block_tokens: int | None) -> list[int]:
    """Content keys of a request's full prompt blocks derived from its trace prefix hashes (empty
    without them): block j of `block_size` tokens inside hash block `j * block_size //
    hash_block_tokens` gets that hash id times the blocks per hash block plus its offset; a block
    covering several hash blocks gets the last one's id (a hash id depends on its whole prefix)."""
    hashes, h, bs = group.prefix_hashes, hash_block_tokens, block_size
    if hashes is None or not len(hashes) or not h:
        return []
    full = group.prompt_tokens // bs
    if h % bs == 0:
        per = h // bs
        return [int(hashes[(j * bs) // h]) * per + (j % per) for j in range(full) if (j * bs) // h < len(hashes)]
    if bs % h == 0:
        return [int(hashes[((j + 1) * bs) // h - 1]) for j in range(full) if ((j + 1) * bs) // h - 1 < len(hashes)]
    raise BlockError(f"prefix hashes cover {h} tokens, which neither divides nor is a multiple "
                     f"of the block size {bs}; choose a block size that does")


class CachingBlockAllocator(BlockAllocator):
    """GPU free list plus an LRU evictor of cached blocks with no references."""

    def __init__(self, num_blocks: int, order: str = "lifo") -> None:
        super().__init__(Device.GPU, num_blocks, order)
        self.key_of: dict[int, int] = {}      # block -> content key
        self.block_of: dict[int, int] = {}    # content key -> block
        self.depth: dict[int, int] = {}       # block -> index in its prompt
        self._heap: list[tuple[float, int, int, int]] = []
        self._in_evictor: dict[int, int] = {}  # block -> live heap entry id
        self._ids = itertools.count()
        self.clock = 0.0
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._in_evictor)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def allocate(self) -> int:
        if self._free:
            block = self._take()
        else:
            block = self._evict()
        self.ref_counts[block] = 1
        return block

    def _evict(self) -> int:
        while self._heap:
            _, _, entry, block = heapq.heappop(self._heap)
            if self._in_evictor.get(block) == entry:
                del self._in_evictor[block]
                key = self.key_of.pop(block)
                del self.block_of[key]
                self.depth.pop(block, None)
                self.evictions += 1
                return block
        raise BlockError(f"gpu allocator: out of blocks ({self.num_blocks} all in use)")

    def _release(self, block: int) -> None:
        """A cached block keeps its content and key in the evictor; others go to the free list."""
        if block in self.key_of:
            entry = next(self._ids)
            self._in_evictor[block] = entry
            heapq.heappush(self._heap, (self.clock, -self.depth.get(block, 0), entry, block))
        else:
            self._free.append(block)

    def reuse(self, block: int) -> None:
        """A cache hit on `block`: one more reference, taken out of the evictor if it was there."""
        if self.ref_counts[block] == 0:
            del self._in_evictor[block]  # its heap entry goes stale
        self.ref_counts[block] += 1

    def register(self, block: int, key: int, depth: int) -> None:
        self.key_of[block] = key
        self.block_of[key] = block
        self.depth[block] = depth

    def check(self) -> None:
        free = list(self._free)
        zero = {b for b, rc in enumerate(self.ref_counts) if rc == 0}
        if len(set(free)) != len(free) or set(free) & set(self._in_evictor):
            raise BlockError("gpu allocator: a block is free twice")
        if zero != set(free) | set(self._in_evictor):
            raise BlockError("gpu allocator: free list and evictor disagree with reference counts")
        if any(self.block_of[k] != b for b, k in self.key_of.items()):
            raise BlockError("gpu allocator: cache maps disagree")


class PrefixCachingBlockManager(BlockSpaceManager):
    """`BlockSpaceManager` with automatic prefix caching: its evictor needs the clock
    (`uses_clock`) and it reuses blocks by prefix hash (`hashes_prefixes`)."""

    uses_clock = True
    hashes_prefixes = True

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark_blocks: int,
                 order: str = "lifo") -> None:
        super().__init__(block_size, num_gpu_blocks, num_cpu_blocks, watermark_blocks, order)
        self.gpu = CachingBlockAllocator(num_gpu_blocks, order)
        self.hits = 0
        self.queries = 0

    def set_clock(self, now_s: float) -> None:
        self.gpu.clock = now_s

    def block_keys(self, group: SequenceGroup) -> list[int]:
        """Content keys of the group's full prompt blocks (empty without prefix hashes)."""
        if group.block_keys is None:
            group.block_keys = prompt_block_keys(group, self.block_size, self.hash_block_tokens)
        return group.block_keys

    def allocate(self, group: SequenceGroup, filled: int | None = None) -> None:
        """Reuse cached leading blocks, allocate the rest; `filled=0` counts only the cached content
        (chunked prefill then reports each chunk through `add_filled`)."""
        seqs = group.seqs_with(SeqStatus.WAITING)
        n, num_tokens, bs, gpu = len(seqs), seqs[0].num_tokens, self.block_size, self.gpu
        keys = self.block_keys(group)
        table, hits, leading = [], 0, True
        written = 0
        for j in range(cdiv(num_tokens, bs)):
            fill = min(bs, num_tokens - j * bs)
            key = keys[j] if j < len(keys) else None
            block = gpu.block_of.get(key) if key is not None else None
            if block is not None and leading:
                self.queries += 1
                self.hits += 1
                hits += 1
                if gpu.ref_counts[block] == 0:
                    written += fill  # back from the evictor: its slots hold K/V again
                gpu.reuse(block)
                gpu.ref_counts[block] += n - 1
            else:
                if key is not None:
                    self.queries += 1
                leading = False
                block = gpu.allocate()
                gpu.ref_counts[block] = n
                if key is not None:
                    if key in gpu.block_of:  # a non-leading duplicate: keep the cached copy
                        key = None
                    else:
                        gpu.register(block, key, j)
                if filled is None:
                    written += fill
            table.append(block)
        for s in seqs:
            s.block_table = table.copy()
        cached = min(hits * bs, ((num_tokens - 1) // bs) * bs)
        group.num_cached_tokens = cached
        group.hit_tokens = hits * bs
        group.prefix_hit_tokens += cached
        self.gpu_filled_slots += written

    def add_filled(self, group: SequenceGroup, start: int, stop: int) -> None:
        """Positions inside cache-hit blocks already hold their K/V; only later ones add slots."""
        self.gpu_filled_slots += max(0, stop - max(start, group.hit_tokens))

    def stats(self) -> dict[str, int]:
        return {"prefix_cache_hits": self.hits, "prefix_cache_queries": self.queries,
                "prefix_cache_evictions": self.gpu.evictions}

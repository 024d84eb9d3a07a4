"""Automatic prefix caching (vLLM's APC) on paged blocks.

A full prompt block's identity is its content key: for traces with prefix hashes (e.g. Mooncake's
`hash_ids` of 512-token blocks) the key of a `block_size`-token block is derived from the hash id
covering it and its offset inside that hash block (a hash id already depends on the whole prefix,
so equal keys mean equal prefixes). Blocks without a key (partial last blocks, generated tokens,
traces without hashes) are never shared.

At admission each leading full prompt block whose key is cached is reused (a hit; reference
counted like any shared block) and only the tokens of the computed prefix are skipped (at least
the last prompt token is prefilled, as vLLM recomputes it). As in vLLM v0, a block's K/V counts
as computed only after the step that writes it has been scheduled (`mark_blocks_as_computed`,
called at the end of `schedule()`; with chunked prefill, the step whose chunk covers the block):
a hit on a block not computed yet shares it when no one else holds it (and prefills it again),
and takes a fresh block when its owner is still computing it; either way the skipped prefix
ends there. A block whose last reference goes keeps its content and key and waits in an evictor;
it still counts as free. A new block comes from the never-cached free list first, else the
evictor gives up its least recently freed block, ties going to the deepest block of a chain (the
one furthest into its prompt), and its key is forgotten. A swapped-out block keeps its key on
the CPU; at swap-in, a GPU block cached under that key is reused (from the evictor, or shared),
as vLLM v0's cached allocator does, instead of taking a fresh block.
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
    return block_keys(group.prefix_hashes, group.prompt_tokens, block_size, hash_block_tokens)


def block_keys(hashes, prompt_tokens: int, block_size: int, hash_block_tokens: int | None) -> list[int]:
    """`prompt_block_keys` of a prompt of `prompt_tokens` tokens with prefix hashes `hashes`."""
    h, bs = hash_block_tokens, block_size
    if hashes is None or not len(hashes) or not h:
        return []
    full = prompt_tokens // bs
    if h % bs == 0:  # block j lies in hash block j // per, at offset j % per
        per = h // bs
        n = min(full, len(hashes) * per)
        offsets = range(per)
        keys = [base + k for base in [int(x) * per for x in hashes[:-(-n // per)]] for k in offsets]
        del keys[n:]
        return keys
    if bs % h == 0:  # block j ends with hash block (j + 1) * per - 1
        per = bs // h
        return [int(x) for x in hashes[per - 1:per * full:per]]
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
        self.not_computed: set[int] = set()  # cached blocks whose K/V no scheduled step has written yet
        self.on_evict = None  # called as on_evict(block, key) when a cached block is evicted (KV tiers)

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
                self.not_computed.discard(block)
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(block, key)
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
        if not self.not_computed <= set(self.key_of):
            raise BlockError("gpu allocator: a block waiting for its K/V is not cached")


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
        self.saved_tokens = 0
        self.swap_in_reuses = 0
        self._computing: list[int] = []      # blocks this step writes: computed once it is scheduled
        self._cpu_key: dict[int, int] = {}   # CPU block -> content key of the GPU block swapped into it
        self.tiers = None                    # a `blocksim.memory.tiers.TierStore` (attach_tiers)
        self._tier_chunks: dict[int, tuple] = {}  # chunk key -> its blocks' keys (write-back tiers)

    def set_clock(self, now_s: float) -> None:
        self.gpu.clock = now_s

    def clean_takes(self, limit: int) -> int:
        """How many of the next `limit` new blocks evict no prefix-cached content (spans with tiers):
        those the never-cached free list holds."""
        return min(limit, len(self.gpu._free))

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
        nc, refs = gpu.not_computed, gpu.ref_counts
        table, hits, computed_hits, leading, computed_leading = [], 0, 0, True, True
        written = 0
        for j in range(cdiv(num_tokens, bs)):
            fill = min(bs, num_tokens - j * bs)
            key = keys[j] if j < len(keys) else None
            block = gpu.block_of.get(key) if key is not None else None
            if block is not None and block in nc and refs[block]:
                block = None  # its owner is still computing it: a fresh block, prefilled here too
            if block is not None and leading:
                self.queries += 1
                self.hits += 1
                hits += 1
                if refs[block] == 0:
                    written += fill  # back from the evictor: its slots hold K/V again
                if block in nc:  # never computed: this group prefills it
                    computed_leading = False
                    if filled is None:
                        self._computing.append(block)
                elif computed_leading:
                    computed_hits += 1
                gpu.reuse(block)
                refs[block] += n - 1
            else:
                if key is not None:
                    self.queries += 1
                leading = False
                block = gpu.allocate()
                refs[block] = n
                if key is not None:
                    if key in gpu.block_of:  # a duplicate: keep the cached copy
                        key = None
                    else:
                        gpu.register(block, key, j)
                        nc.add(block)
                        if filled is None:
                            self._computing.append(block)
                if filled is None:
                    written += fill
            table.append(block)
        for s in seqs:
            s.block_table = table.copy()
        cached = min(computed_hits * bs, ((num_tokens - 1) // bs) * bs)
        self.gpu_filled_slots += written
        loaded = 0
        if self.tiers is not None:
            loaded = self._tier_admit(group, table, keys, hits, computed_hits, cached, filled)
        group.num_cached_tokens = cached + loaded
        group.hit_tokens = hits * bs + loaded
        group.prefix_hit_tokens += cached
        self.saved_tokens += cached

    # --- KV tiers (blocksim.memory.tiers) ------------------------------------------------------
    def attach_tiers(self, tiers) -> None:
        """Look prefixes up in `tiers` after the GPU, and report computed, hit and evicted chunks."""
        self.tiers = tiers
        if tiers.wants_gpu_evictions:
            # a closure over the tables, not a bound method: the allocator would refer back to the manager
            chunks, block_of = self._tier_chunks, self.gpu.block_of
            self.gpu.on_evict = lambda block, key: tiers.on_gpu_block_evicted(block, key, chunks.get(key), block_of.get)

    def _tier_admit(self, group: SequenceGroup, table: list[int], keys: list[int], hits: int, computed_hits: int,
                    cached: int, filled: int | None) -> int:
        """After `allocate`'s GPU match: load the chunks the tiers hold after the computed hit into the
        group's fresh blocks (their K/V then counts as computed: the step that prefills the rest waits
        for the loads, `TierStore.load_wait_s`). Returns the tokens loaded. The tiers are looked up
        only when every GPU hit was computed and the hit ends on a chunk boundary (always, with
        one-block chunks)."""
        t, bs = self.tiers, self.block_size
        cb, ct = t.chunk_blocks, t.chunk_tokens
        num_tokens = group.seqs_with(SeqStatus.RUNNING if not group.seqs_with(SeqStatus.WAITING)
                                     else SeqStatus.WAITING)[0].num_tokens
        t.count_query(cached, num_tokens)
        c0 = computed_hits // cb
        if t.wants_gpu_hits:
            for c in range(c0):
                t.on_gpu_hit(keys[(c + 1) * cb - 1], table[c * cb:(c + 1) * cb])
        limit = min((num_tokens - 1) // bs, len(keys)) // cb
        tokens = group.tier_tokens
        if tokens is None:
            tokens = group.tier_tokens = [0, 0, 0]
        tokens[0] += cached
        if hits != computed_hits or computed_hits % cb or c0 >= limit:
            return 0
        ckeys = [keys[(c + 1) * cb - 1] for c in range(c0, limit)]
        found = t.match(ckeys)
        n = t.plan_onload(ckeys, found, c0 * ct) if found else 0
        skipped = t.skipped_tokens
        ready, host, disk, n = t.commit(ckeys, found, n, table[c0 * cb:])
        group.onload_skipped_tokens += t.skipped_tokens - skipped
        if not n:
            return 0
        loaded = table[c0 * cb:(c0 + n) * cb]
        self.gpu.not_computed.difference_update(loaded)  # the loads write their K/V
        if self._computing:
            done = set(loaded)
            self._computing = [b for b in self._computing if b not in done]
        if filled is not None:  # chunked prefill counts slots per chunk: the loaded ones hold K/V now
            self.gpu_filled_slots += n * ct
        if t.wants_gpu_evictions:
            for c in range(c0, c0 + n):
                self._tier_chunks[keys[(c + 1) * cb - 1]] = tuple(keys[c * cb:(c + 1) * cb])
        if ready > t.load_wait_s:
            t.load_wait_s = ready
        tokens[1] += host
        tokens[2] += disk
        group.onload_issue_s = t.now_s  # the engine adds the step's wait for the loads
        return n * ct

    def tier_computed(self, group: SequenceGroup, start: int, stop: int) -> None:
        """Report the prompt chunks a prefill of tokens [start, stop) completed."""
        t = self.tiers
        cb = t.chunk_blocks
        ct = cb * self.block_size
        keys = group.block_keys or ()
        last = min(min(stop, group.prompt_tokens) // ct, len(keys) // cb)
        first = start // ct
        if last <= first:
            return
        ckeys = keys[(first + 1) * cb - 1:last * cb:cb]
        if t.wants_gpu_evictions:
            for c, key in zip(range(first, last), ckeys):
                self._tier_chunks[key] = tuple(keys[c * cb:(c + 1) * cb])
        t.on_computed(ckeys, group.seqs[0].block_table, first * cb)

    def num_cached_tokens(self, group: SequenceGroup) -> int:
        """The computed cached prefix `allocate` would skip now (vLLM 0.6.4's uncached-token admission)."""
        seq = group.seqs_with(SeqStatus.WAITING)[0]
        gpu, bs = self.gpu, self.block_size
        count = 0
        for key in self.block_keys(group):
            block = gpu.block_of.get(key)
            if block is None or block in gpu.not_computed:
                break
            count += 1
        return min(count * bs, ((seq.num_tokens - 1) // bs) * bs)

    def add_filled(self, group: SequenceGroup, start: int, stop: int) -> None:
        """Positions inside cache-hit blocks already hold their K/V; only later ones add slots. Cached
        blocks the chunk completes count as computed once the step is scheduled."""
        self.gpu_filled_slots += max(0, stop - max(start, group.hit_tokens))
        nc = self.gpu.not_computed
        if nc:
            table, bs = group.seqs[0].block_table, self.block_size
            self._computing += [b for b in table[start // bs: stop // bs] if b in nc]

    def mark_blocks_as_computed(self) -> None:
        """The scheduled step writes the K/V of the blocks it prefills: later hits skip them."""
        if self._computing:
            self.gpu.not_computed.difference_update(self._computing)
            self._computing.clear()

    # --- swapping: cached copies are reused ----------------------------------------------------
    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        key_of = self.gpu.key_of
        keys = {b: key_of.get(b) for s in group.seqs_with(SeqStatus.RUNNING) for b in s.block_table}
        mapping = super().swap_out(group)
        for g, c in mapping.items():
            key = keys[g]
            if key is None:
                self._cpu_key.pop(c, None)
            else:
                self._cpu_key[c] = key
        return mapping

    def _swap_in_block(self, cpu_block: int, index: int, kv_len: int) -> int:
        """A GPU block cached under the CPU block's key is reused (from the evictor, or shared);
        else a fresh block, registered under that key."""
        gpu, bs = self.gpu, self.block_size
        key = self._cpu_key.get(cpu_block)
        g = gpu.block_of.get(key) if key is not None else None
        if g is None:
            g = super()._swap_in_block(cpu_block, index, kv_len)
            if key is not None:
                gpu.register(g, key, index)
            return g
        if gpu.ref_counts[g] == 0:
            self.gpu_filled_slots += min(bs, kv_len - index * bs)
        gpu.reuse(g)
        gpu.not_computed.discard(g)  # the swap writes its K/V
        self.swap_in_reuses += 1
        return g

    def stats(self) -> dict[str, int]:
        return {"prefix_cache_hits": self.hits, "prefix_cache_queries": self.queries,
                "prefix_cache_evictions": self.gpu.evictions, "prefix_saved_tokens": self.saved_tokens,
                "swap_in_cache_reuses": self.swap_in_reuses}

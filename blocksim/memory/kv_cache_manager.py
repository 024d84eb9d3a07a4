"""vLLM V1's KV cache manager: block hashes, prefix-cache lookups and slot allocation per request.

Follows `vllm/v1/core/kv_cache_manager.py` and `single_type_kv_cache_manager.py` of vLLM v0.11
(one full-attention KV cache group), on the `BlockPool` of `blocksim.memory.block_pool`:

* Block hashes are chained: the hash of full block j is `hash((hash of block j - 1, content of
  block j))`, so equal hashes mean equal prefixes. The content of a prompt block covered by a
  trace's prefix hashes derives from the hash id covering it (as `prefix_cache.prompt_block_keys`);
  every other block (prompts without hashes, generated tokens) has content no other request shares.
* `get_computed_blocks` returns the longest run of leading blocks whose hashes are cached, never
  covering the last token of the request (its logits must be computed): at most
  `(num_tokens - 1) // block_size` blocks.
* `allocate_slots` gives a request blocks for `num_computed + num_new` tokens. It counts the hit
  blocks still in the free queue as needing a free block each (they leave the queue), refuses
  (returns False) when the free queue is too short, and records the hashes of blocks that the
  scheduled tokens fill (cached at scheduling, as V1 does, so a request scheduled later in the
  same step hits them).
* `free` releases a request's blocks tail first, so within a request the last block is evicted
  first, and across requests the least recently freed first (LRU).
* Hashes of content no other request shares are computed only when they can matter
  (`defer_unique_hashes`): only the request itself can hit such a block, and only after it is
  preempted. Until then its full blocks of unique content are marked `UNIQUE` in the pool (each is
  evicted and counted like a cached block when the free queue hands it out); a preemption computes
  their hashes and caches them in table order, as caching each when it filled would have. KV tiers
  key chunks by their last block's hash: they compute the hashes of the prompt chunks they look up
  and store (a chunk whose last block no other request has goes to them as private to its request,
  which can look it up only after a preemption: `tier_computed`, `free_request`), and a write-back
  tier, which stores a chunk when the GPU evicts its blocks, turns the deferral off, as recorded
  plans and step executors (which read every block's hash) do.

There is no swap space and no watermark (V1 preempts by recomputation only). Memory accounting:
a scheduled token's slot counts as holding K/V from the step it is scheduled in (as the v0
manager counts an appended slot); blocks hold no slots for unscheduled tokens, so nothing is ever
reserved; cached blocks waiting in the free queue count as free. The null block counts as used.

It implements `blocksim.interfaces.MemoryManager` for the engine; the admission, append and swap
methods of vLLM v0's vocabulary are not part of V1 and raise (`blocksim.scheduling.v1_scheduler`
calls `get_computed_blocks`, `allocate_slots` and `free_request` instead).
"""

from __future__ import annotations

from blocksim.interfaces import MemoryBreakdown
from blocksim.memory.block_pool import NULL_BLOCK, UNIQUE, BlockPool
from blocksim.memory.blocks import BlockError, cdiv
from blocksim.memory.prefix_cache import prompt_block_keys
from blocksim.sequence import Sequence, SequenceGroup, SeqStatus

#: Parent hash of a request's first block (vLLM's NONE_HASH, fixed here so runs are reproducible).
ROOT_HASH = 0x5EED


class KVCacheManager:
    supports_swap = False
    uses_clock = False
    has_extents = False
    hashes_prefixes = True
    reserves_prefill = True
    allocates_on_append = True

    def __init__(self, block_size: int, num_gpu_blocks: int, max_model_len: int,
                 enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = 0
        self.watermark_blocks = 0
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.hash_block_tokens: int | None = None
        self.pool = BlockPool(num_gpu_blocks, enable_caching)
        self.filled_slots = 0
        self._hashes: dict[int, list[int]] = {}      # seq_id -> chained hashes of its full blocks so far
        self._num_cached: dict[int, int] = {}        # seq_id -> leading blocks whose hashes are recorded
        self._covered: dict[int, int] = {}           # seq_id -> leading blocks the trace's prefix hashes cover
        self._keys: dict[int, list[int]] = {}        # seq_id -> its prompt blocks' content keys (prompt_block_keys)
        #: Unique content's hashes computed only when its request is preempted (the module's notes).
        self.defer_unique_hashes = enable_caching
        # vLLM V1's PrefixCacheStats, in tokens: new requests, and requests coming back from preemption.
        self.queries = self.hits = self.requests = 0
        self.preempted_queries = self.preempted_hits = self.preempted_requests = 0
        self.hit_blocks = self.query_blocks = self.saved_tokens = 0
        self.tiers = None                            # a `blocksim.memory.tiers.TierStore` (attach_tiers)
        #: the GPU hit of the waiting request the scheduler refused blocks at the last step, where its
        #: tier plan depends on that hit alone (`clean_takes`); None otherwise
        self.refused_hit: list[int] | None = None
        self._tier_chunks: dict[int, tuple] = {}     # chunk key -> its blocks' hashes (write-back tiers)
        #: the trace's prefix hash ids that only one request has (`tier_trace_hashes`); None: unknown
        self._tier_once: set[int] | None = None
        self._tier_private: dict[int, int] = {}      # seq_id -> its first block no other request has

    # --- hashes ------------------------------------------------------------------------------
    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Chained hashes of the sequence's first `num_blocks` full blocks (extended as needed)."""
        hashes = self._hashes.get(seq.seq_id)
        if hashes is None:
            hashes = self._hashes[seq.seq_id] = []
        if len(hashes) >= num_blocks:
            return hashes
        g = seq.group
        bs = self.block_size
        keys = self._prompt_keys(seq) if len(hashes) < g.prompt_tokens // bs else ()
        parent = hashes[-1] if hashes else ROOT_HASH
        append = hashes.append
        for j in range(len(hashes), min(num_blocks, len(keys))):  # blocks the trace's prefix hashes cover
            parent = hash((parent, keys[j]))
            append(parent)
        unique = g.index << 24
        for j in range(len(hashes), num_blocks):  # content no other request shares
            parent = hash((parent, ~(unique | j)))
            append(parent)
        return hashes

    def covered_blocks(self, seq: Sequence) -> int:
        """Leading blocks of the sequence whose content the trace's prefix hashes give (content
        other requests may share); every later block's content is its own."""
        g = seq.group
        if g.prefix_hashes is None or not self.hash_block_tokens:
            return 0
        c = self._covered.get(seq.seq_id)
        if c is None:
            c = self._covered[seq.seq_id] = len(self._prompt_keys(seq))
        return c

    def _prompt_keys(self, seq: Sequence) -> list[int]:
        """The content keys of the sequence's prompt blocks (`prompt_block_keys`), computed once per
        sequence, not at every extension."""
        keys = self._keys.get(seq.seq_id)
        if keys is None:
            keys = self._keys[seq.seq_id] = prompt_block_keys(seq.group, self.block_size, self.hash_block_tokens)
        return keys

    def _cache_full(self, seq: Sequence, done: int, full: int) -> None:
        """Record blocks [done, full) of the sequence's table as cached (unique content deferred)."""
        table, pool = seq.block_table, self.pool
        if self.defer_unique_hashes and not seq.group.preemptions:
            covered = self.covered_blocks(seq)
            if done < covered:
                stop = min(full, covered)
                pool.cache_full_blocks(table, self.block_hashes(seq, stop), done, stop)
                done = stop
            if full > done:
                pool.hold_unique(table[done:full])
        else:
            pool.cache_full_blocks(table, self.block_hashes(seq, full), done, full)

    def _hash_deferred(self, seq: Sequence) -> None:
        """Before a request that deferred its unique content's hashes is preempted: compute them
        and cache its blocks of unique content in table order."""
        done = self._num_cached.get(seq.seq_id, 0)
        covered = self.covered_blocks(seq)
        if done <= covered:
            return
        table, bh = seq.block_table, self.pool.block_hash
        for b in table[covered:done]:
            if bh[b] is not UNIQUE:
                raise BlockError(f"sequence {seq.seq_id}: block {b} of deferred unique content is not marked so")
            bh[b] = None
        self.pool.cache_full_blocks(table, self.block_hashes(seq, done), covered, done)

    # --- V1's KVCacheManager -----------------------------------------------------------------
    def get_computed_blocks(self, group: SequenceGroup) -> tuple[list[int], int]:
        """The longest cached prefix of a waiting request: (its blocks, its tokens)."""
        seq = group.seqs[0]
        if not self.enable_caching:
            return [], 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        prompt_blocks = group.prompt_tokens // self.block_size
        if self.defer_unique_hashes and not group.preemptions:  # no lookup can find its unique content
            hashes = self.block_hashes(seq, self.covered_blocks(seq))
        else:
            hashes = self.block_hashes(seq, max(max_blocks, prompt_blocks))
            if group.block_keys is None:
                group.block_keys = hashes[:prompt_blocks]  # the plan's content identity of prompt blocks
        blocks: list[int] = []
        if max_blocks:
            get = self.pool.get_cached_block
            for h in hashes[:max_blocks]:
                b = get(h)
                if b is None:
                    break
                blocks.append(b)
        return blocks, len(blocks) * self.block_size

    def record_hit(self, group: SequenceGroup, hit_tokens: int) -> None:
        """Count an admitted request's lookup (vLLM counts every lookup, a request waiting several
        steps included; here each admission counts once): in tokens as vLLM V1's PrefixCacheStats
        (new and preempted requests apart), and in blocks as the other prefix caches here."""
        n = group.seqs[0].num_tokens
        self.hit_blocks += hit_tokens // self.block_size
        self.query_blocks += (n - 1) // self.block_size
        self.saved_tokens += hit_tokens
        if group.preemptions:
            self.preempted_requests += 1
            self.preempted_queries += n
            self.preempted_hits += hit_tokens
        else:
            self.requests += 1
            self.queries += n
            self.hits += hit_tokens

    def allocate_slots(self, seq: Sequence, num_computed: int, num_new: int,
                       computed_blocks: list[int] = (), cache: bool = True) -> bool:
        """Blocks for `num_new` tokens after `num_computed` (hits in `computed_blocks` included);
        False, changing nothing, when the free queue is too short. `cache=False` leaves the new
        blocks' hashes unrecorded (blocks a tier is still loading: cached when the request is
        scheduled after the load)."""
        pool, bs, table = self.pool, self.block_size, seq.block_table
        need_tokens = min(num_computed + num_new, self.max_model_len)
        evictable = 0
        if computed_blocks:
            refs = pool.ref_cnt
            evictable = sum(1 for b in computed_blocks if refs[b] == 0)
        num_new_blocks = cdiv(need_tokens, bs) - len(computed_blocks) - len(table)
        if num_new_blocks + evictable > pool.free_queue.num_free:
            return False
        if computed_blocks:
            pool.touch(computed_blocks)
            table.extend(computed_blocks)
            self.filled_slots += evictable * bs  # back from the free queue: their slots hold K/V again
            self._num_cached[seq.seq_id] = len(computed_blocks)
        if num_new_blocks > 0:
            table.extend(pool.get_new_blocks(num_new_blocks))
        self.filled_slots += num_new
        if self.enable_caching and cache:
            full = min(num_computed + num_new, seq.num_tokens) // bs
            done = self._num_cached.get(seq.seq_id, 0)
            if full > done:
                self._cache_full(seq, done, full)
                self._num_cached[seq.seq_id] = full
        return True

    def allocate_decode_slots(self, groups: list[SequenceGroup], start: int, end: int,
                              max_groups: int) -> tuple[int, int]:
        """`allocate_slots(seq, kv_len, 1)` for groups[start:end] in order, at most `max_groups` of
        them, while a group decodes (its prompt done), stays under max_model_len and finds a free
        block where it needs one; returns `(stop, context_tokens)` of the groups served.

        The scheduler's per-step fast path; it takes groups[stop] on its general path.
        """
        pool, bs = self.pool, self.block_size
        q, refs, block_hash = pool.free_queue, pool.ref_cnt, pool.block_hash
        caching, ncached, hashes_of = self.enable_caching, self._num_cached, self._hashes
        defer = self.defer_unique_hashes
        limit = self.max_model_len
        stop = min(end, start + max_groups)
        ctx = 0
        i = start
        while i < stop:
            g = groups[i]
            if g.prefill_pos is not None:
                break
            s = g.seqs[0]
            n = s.num_tokens  # K/V slots after this step's token
            if n >= limit:
                break
            table = s.block_table
            if n > len(table) * bs:
                if not q.num_free:
                    break
                b = q.popleft()
                if block_hash[b] is not None:
                    pool._evict(b)
                refs[b] = 1
                table.append(b)
            if caching and n % bs == 0 and defer and not g.preemptions:  # fills its block: cache it
                j = n // bs
                sid = s.seq_id
                done = ncached.get(sid, 0)
                if j > done:
                    if done == j - 1 and done >= g.prompt_tokens // bs:  # a generated block: unique
                        block_hash[table[done]] = UNIQUE
                    else:
                        self._cache_full(s, done, j)
                    ncached[sid] = j
            elif caching and n % bs == 0:
                j = n // bs
                sid = s.seq_id
                hs = hashes_of.get(sid)
                if hs and len(hs) == j - 1 and j - 1 >= g.prompt_tokens // bs:  # block_hashes, inlined
                    hs.append(hash((hs[-1], ~((g.index << 24) | (j - 1)))))
                elif hs is None or len(hs) < j:
                    hs = self.block_hashes(s, j)
                done = ncached.get(sid, 0)
                if j > done:
                    pool.cache_full_blocks(table, hs, done, j)
                    ncached[sid] = j
            ctx += n
            i += 1
        self.filled_slots += i - start
        return i, ctx

    def free_request(self, seq: Sequence, num_computed: int) -> None:
        """Release a request's blocks, tail first; `num_computed` tokens of K/V were in them. The
        request may come back (a preemption): its unique content's hashes are computed now."""
        if self.defer_unique_hashes and not seq.group.preemptions and self.enable_caching:
            self._hash_deferred(seq)
            if self.tiers is not None:
                self.tiers.on_preempted(seq.seq_id)
        self._release(seq, num_computed)

    def _release(self, seq: Sequence, num_computed: int) -> None:
        table = seq.block_table
        if not table:
            return
        bs = self.block_size
        released = self.pool.free_blocks(reversed(table))
        if len(released) == len(table):  # every block released
            self.filled_slots -= min(num_computed, len(table) * bs)
        else:
            released = set(released)
            self.filled_slots -= sum(max(0, min(bs, num_computed - i * bs))
                                     for i, b in enumerate(table) if b in released)
        seq.block_table = []
        self._num_cached.pop(seq.seq_id, None)

    def release_reserved(self, seq: Sequence, tokens: int) -> None:
        """Give back the blocks of `seq`'s table beyond the first `tokens` tokens: blocks reserved
        for a first prefill chunk after tier loads (no K/V, no hash), when the chunk the request
        runs is shorter than the one reserved."""
        table = seq.block_table
        keep = cdiv(tokens, self.block_size)
        if len(table) > keep:
            self.pool.free_blocks(reversed(table[keep:]))
            del table[keep:]

    # --- KV tiers (blocksim.memory.tiers) ----------------------------------------------------------
    def attach_tiers(self, tiers) -> None:
        """Look prefixes up in `tiers` after the GPU, and report computed, hit and evicted chunks."""
        self.tiers = tiers
        tiers.chained_keys = True  # a chunk's key is its last block's hash, chained over the prefix
        if tiers.wants_gpu_evictions:  # a block's hash must be known when it is evicted
            self.defer_unique_hashes = False
            # a closure over the tables, not a bound method: the pool would refer back to the manager
            chunks, cached = self._tier_chunks, self.pool.cached
            self.pool.on_evict = lambda block, block_hash: tiers.on_gpu_block_evicted(
                block, block_hash, chunks.get(block_hash), cached.get)

    def tier_trace_hashes(self, hashes) -> None:
        """The prefix hashes of every request of the trace (lists of ids): a block whose id no other
        request has holds content only its own request can look up (`tier_computed`)."""
        seen: dict[int, int] = {}
        for ids in hashes:
            for x in ids:
                seen[x] = x in seen
        self._tier_once = {x for x, again in seen.items() if not again}

    def _private_from(self, seq: Sequence) -> int:
        """The sequence's first prompt block that no other request has: the first whose prefix hash
        id the trace gives it alone, else the first its prefix hashes do not cover (chained hashes:
        every block after it is its own too)."""
        p = self._tier_private.get(seq.seq_id)
        if p is None:
            p = covered = self.covered_blocks(seq)
            ids, once = seq.group.prefix_hashes, self._tier_once
            if covered and once is not None:
                j = next((j for j, x in enumerate(ids) if x in once), len(ids))
                h, bs = self.hash_block_tokens, self.block_size
                p = min(covered, j * (h // bs) if h % bs == 0 else j // (bs // h))
            self._tier_private[seq.seq_id] = p
        return p

    def _chunk_key(self, hashes: list[int], c: int) -> int:
        return hashes[(c + 1) * self.tiers.chunk_blocks - 1]

    def tier_match(self, group: SequenceGroup, blocks: list[int]) -> tuple[list[int], list[int], int]:
        """After `get_computed_blocks`: (the GPU hit blocks kept, the chunk keys that follow them,
        how many of those the tiers hold, leading). A GPU hit ending inside a chunk is cut back
        to the chunk's start when the tiers hold that chunk (a tier loads whole chunks)."""
        t, bs = self.tiers, self.block_size
        cb = t.chunk_blocks
        seq = group.seqs[0]
        limit = min((seq.num_tokens - 1) // bs, group.prompt_tokens // bs) // cb
        c0 = len(blocks) // cb
        if c0 >= limit:
            return blocks, [], 0
        hashes = self._hashes[seq.seq_id]
        if len(hashes) < limit * cb:  # unique content's hashes deferred: the tiers key chunks by them
            hashes = self.block_hashes(seq, limit * cb)
        keys = hashes[(c0 + 1) * cb - 1:limit * cb:cb]
        found = t.match(keys)
        if found and len(blocks) % cb:
            blocks = blocks[:c0 * cb]
        return blocks, keys, found

    def tier_gpu_hits(self, group: SequenceGroup, blocks: list[int]) -> None:
        """Report the whole chunks of an admitted request's GPU hit."""
        t = self.tiers
        if not t.wants_gpu_hits:
            return
        cb, hashes = t.chunk_blocks, self._hashes[group.seqs[0].seq_id]
        for c in range(len(blocks) // cb):
            t.on_gpu_hit(self._chunk_key(hashes, c), blocks[c * cb:(c + 1) * cb])

    def tier_computed(self, group: SequenceGroup, start: int, stop: int) -> None:
        """Report the prompt chunks a prefill of tokens [start, stop) completed."""
        t = self.tiers
        cb = t.chunk_blocks
        ct = cb * self.block_size
        last = min(stop, group.prompt_tokens) // ct
        first = start // ct
        if last <= first:
            return
        seq = group.seqs[0]
        hashes = self._hashes[seq.seq_id]
        if len(hashes) < last * cb:  # unique content's hashes deferred
            hashes = self.block_hashes(seq, last * cb)
        keys = hashes[(first + 1) * cb - 1:last * cb:cb]
        if t.wants_gpu_evictions:
            for c, key in zip(range(first, last), keys):
                self._tier_chunks[key] = tuple(hashes[c * cb:(c + 1) * cb])
        if self.defer_unique_hashes and not group.preemptions:
            # chunks whose last block no other request has: only this request can ask for them,
            # after a preemption (`free_request` tells the tiers)
            private = last - max(first, self._private_from(seq) // cb)
            if private > 0:
                t.on_computed(keys, seq.block_table, first * cb, private, seq.seq_id)
                return
        t.on_computed(keys, seq.block_table, first * cb)

    def tier_loaded(self, seq: Sequence, keys: list[int], first_block: int) -> None:
        """Chunks loaded into the table from `first_block` on (write-back tiers store them again when
        the GPU evicts them)."""
        if not self.tiers.wants_gpu_evictions:
            return
        cb, hashes = self.tiers.chunk_blocks, self._hashes[seq.seq_id]
        for j, key in enumerate(keys):
            b0 = first_block + j * cb
            self._tier_chunks[key] = tuple(hashes[b0:b0 + cb])

    # --- MemoryManager: what the engine calls ----------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """A finished sequence: its K/V covers `kv_len` tokens."""
        self._release(seq, seq.kv_len)
        self._hashes.pop(seq.seq_id, None)
        self._covered.pop(seq.seq_id, None)
        self._keys.pop(seq.seq_id, None)
        if self.tiers is not None:
            self._tier_private.pop(seq.seq_id, None)
            self.tiers.on_finished(seq.seq_id)

    @property
    def num_gpu_blocks_used(self) -> int:
        return self.num_total_gpu_blocks - self.pool.free_queue.num_free

    @property
    def num_cpu_blocks_used(self) -> int:
        return 0

    @property
    def num_free_gpu_blocks(self) -> int:
        return self.pool.free_queue.num_free

    def clean_takes(self, limit: int) -> int:
        """How many of the next `limit` new blocks leave the plan of the waiting request as it is
        (spans with tiers): they evict no prefix-cached content, or, where the scheduler named the
        hit that plan depends on alone (`refused_hit`), none of that hit's blocks."""
        return self.pool.clean_head(limit, self.refused_hit)

    def memory_breakdown(self, next_group: SequenceGroup | None,
                         pending_prefill_slots: int) -> MemoryBreakdown:
        """K/V slots (scheduled tokens included), no reservation, the unfilled rest of used blocks
        (and the null block) as internal fragmentation, no external fragmentation, free blocks."""
        used = self.num_gpu_blocks_used * self.block_size
        return MemoryBreakdown(self.filled_slots, 0, used - self.filled_slots, 0,
                               self.pool.free_queue.num_free * self.block_size)

    def append_span_slots(self, seqs: list[Sequence], steps: int, takers: list[int]) -> None:
        """`steps` further decode steps: a new block for each taker (step order), each block that
        the steps fill cached, one K/V slot per sequence and step."""
        if takers:
            new = self.pool.get_new_blocks(len(takers))  # in step order, as stepping takes them
            for i, b in zip(takers, new):
                seqs[i].block_table.append(b)
        self.filled_slots += steps * len(seqs)
        if not self.enable_caching:
            return
        bs, ncached, hashes_of = self.block_size, self._num_cached, self._hashes
        filled = []
        cache = filled.append
        if self.defer_unique_hashes:
            bh = self.pool.block_hash
            for s in seqs:  # as below, unique content marked
                full = (s.num_tokens + steps) // bs
                done = ncached.get(s.seq_id, 0)
                if full > done:
                    g = s.group
                    if g.preemptions:
                        cache((s.block_table, self.block_hashes(s, full), done, full))
                    elif done >= g.prompt_tokens // bs:  # generated blocks
                        for b in s.block_table[done:full]:
                            bh[b] = UNIQUE
                    else:
                        covered = self.covered_blocks(s)
                        if done < covered:
                            stop = min(full, covered)
                            cache((s.block_table, self.block_hashes(s, stop), done, stop))
                            done = stop
                        for b in s.block_table[done:full]:
                            bh[b] = UNIQUE
                    ncached[s.seq_id] = full
            self.pool.cache_full_blocks_of(filled)
            return
        for s in seqs:  # step j writes position num_tokens - 1 + j; blocks full after the last step
            full = (s.num_tokens + steps) // bs
            done = ncached.get(s.seq_id, 0)
            if full > done:
                hs = hashes_of.get(s.seq_id)
                if hs is None or len(hs) < full:
                    g = s.group
                    if hs and len(hs) >= g.prompt_tokens // bs:  # generated blocks: block_hashes, inlined
                        unique = g.index << 24
                        for k in range(len(hs), full):
                            hs.append(hash((hs[-1], ~(unique | k))))
                    else:
                        hs = self.block_hashes(s, full)
                cache((s.block_table, hs, done, full))
                ncached[s.seq_id] = full
        self.pool.cache_full_blocks_of(filled)

    def set_clock(self, now_s: float) -> None:
        """No clock: the free queue's order is the LRU order (`uses_clock` is False)."""

    def free_extents(self):
        raise BlockError("paged blocks have no address-space extents (has_extents is False)")

    def stats(self) -> dict[str, int]:
        """Prefix-cache hits and lookups in blocks (as every prefix cache here reports them), prompt
        tokens not prefilled thanks to hits, evictions of cached blocks, and vLLM V1's own counters
        in tokens (new requests, and requests back from preemption)."""
        return {"prefix_cache_hits": self.hit_blocks, "prefix_cache_queries": self.query_blocks,
                "prefix_cache_evictions": self.pool.evictions, "prefix_saved_tokens": self.saved_tokens,
                "v1_prefix_cache_hit_tokens": self.hits, "v1_prefix_cache_query_tokens": self.queries,
                "v1_prefix_cache_requests": self.requests,
                "v1_prefix_cache_preempted_hit_tokens": self.preempted_hits,
                "v1_prefix_cache_preempted_query_tokens": self.preempted_queries}

    # --- vLLM v0's vocabulary: not part of V1 ---------------------------------------------------
    def _not_v1(self, *_args, **_kwargs):
        raise BlockError("vLLM V1's KV cache manager has no v0 admission, append or swap calls; "
                         "schedule it with the v1 scheduler")

    can_allocate = allocate = add_filled = can_append_slots = append_slots = _not_v1
    can_swap_out = swap_out = can_swap_in = swap_in = _not_v1

    def append_decode_slots(self, groups, start: int, end: int) -> tuple[int, int]:
        return start, 0

    def num_cached_tokens(self, group: SequenceGroup) -> int:
        """V1 looks hits up with `get_computed_blocks`; a v0 scheduler never runs on this manager."""
        return 0

    def mark_blocks_as_computed(self) -> None:
        """V1 caches a block's hash when it is scheduled: nothing to mark after the step."""

    # --- checks ------------------------------------------------------------------------------
    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """Reference counts equal the tables pointing at each block; tables cover exactly the K/V
        of each sequence; filled slots add up. O(blocks); for tests."""
        self.pool.check()
        refs = [0] * self.num_total_gpu_blocks
        fill: dict[int, int] = {}
        bs = self.block_size
        for s in live_seqs:
            if s.status is not SeqStatus.RUNNING and not s.group.onload_state:
                raise BlockError(f"sequence {s.seq_id}: {s.status.value} under V1, which never swaps")
            if len(set(s.block_table)) != len(s.block_table) or NULL_BLOCK in s.block_table:
                raise BlockError(f"sequence {s.seq_id}: bad block table {s.block_table}")
            kv_len = s.kv_len
            # a request holding blocks for tier loads also holds those of its first prefill chunk
            if len(s.block_table) != cdiv(kv_len, bs) and not (s.group.onload_state
                                                                and len(s.block_table) > cdiv(kv_len, bs)):
                raise BlockError(f"sequence {s.seq_id}: {len(s.block_table)} blocks for {kv_len} K/V tokens")
            for i, b in enumerate(s.block_table):
                refs[b] += 1
                fill[b] = max(fill.get(b, 0), min(bs, max(0, kv_len - i * bs)))
        pool_refs = list(self.pool.ref_cnt)
        pool_refs[NULL_BLOCK] = 0
        if refs != pool_refs:
            bad = [b for b in range(len(refs)) if refs[b] != pool_refs[b]][:5]
            raise BlockError(f"reference counts disagree with block tables at blocks {bad}")
        if sum(fill.values()) != self.filled_slots:
            raise BlockError(f"filled slots {self.filled_slots} != recount {sum(fill.values())}")


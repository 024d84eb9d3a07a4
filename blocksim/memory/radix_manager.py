"""SGLang's KV memory: a token (or page) pool shared through a radix tree.

Follows SGLang's `RadixCache` with its `TokenToKVPoolAllocator` (SGLang 0.4-0.5): the pool holds
`num_total_gpu_blocks` pages of `block_size` (SGLang's `page_size`) token slots; 1 is SGLang's
default, a token-granular pool. A request's K/V lives in two parts:

* positions [0, `protected`): pages of tree nodes on its locked path (`last_node`), shared with
  every request that matched them;
* positions [`protected`, allocated end): its own pages, allocated chunk by chunk at prefill and
  one slot per decoded token (a page at each page boundary).

The scheduler (`blocksim.scheduling.sglang_scheduler`) calls, in SGLang's words:
`match` (`match_prefix`), `allocate` (lock the matched prefix, `inc_lock_ref`), `add_filled`
(allocate a prompt chunk's slots, evicting when the pool runs short), `cache_unfinished`
(`cache_unfinished_req`: insert what a prefill wrote so others can match it; slots that duplicate
tree content are freed and the request takes the tree's), `free` at finish (`cache_finished_req`:
insert every token with K/V, free duplicates and the unaligned tail, unlock), `retract`
(`retract_decode`: free the request's own slots, unlock its prefix) and `evict`.

Memory split (slots): tokens of locked nodes and of requests' own pages are token states;
evictable (unlocked) tree tokens are free, as they are reclaimed on demand (vLLM's evictor blocks
count as free too); the unwritten part of own pages is internal fragmentation; nothing is
reserved or externally fragmented (a chunk allocates only what it writes).

Deliberate differences from SGLang are listed in `docs/sglang.md`.
"""

from __future__ import annotations

import numpy as np

from blocksim.config import ConfigError
from blocksim.interfaces import AllocStatus, MemoryBreakdown
from blocksim.memory.blocks import BlockError, cdiv
from blocksim.memory.prefix_cache import block_keys, prompt_block_keys
from blocksim.memory.radix_tree import Content, Node, RadixTree
from blocksim.sequence import Sequence, SequenceGroup


class ReqState:
    """What the pool knows of one running request (SGLang's `Req` memory fields)."""

    __slots__ = ("content", "last_node", "matched", "protected", "allocated")

    def __init__(self, content: Content) -> None:
        self.content = content
        self.last_node: Node | None = None  # locked while the request is admitted
        self.matched = 0                    # tokens of the last match (prefix_indices)
        self.protected = 0                  # tokens held through the tree (cache_protected_len)
        self.allocated = 0                  # tokens with slots: tree part + own part


class RadixCacheManager:
    supports_swap = False
    uses_clock = False
    has_extents = False
    hashes_prefixes = True
    reserves_prefill = True  # chunks allocate only what they write: nothing pending
    allocates_on_append = True

    def __init__(self, page_size: int, num_pages: int) -> None:
        self.block_size = page_size
        self.num_total_gpu_blocks = num_pages
        self.num_total_cpu_blocks = 0
        self.watermark_blocks = 0
        self._hash_tokens: int | None = None
        self.free_pages: list[int] = list(range(num_pages - 1, -1, -1))
        self.tree = RadixTree(page_size, None)
        self.reqs: dict[int, ReqState] = {}   # seq_id -> state, for sequences holding memory
        self._contents: dict[int, Content] = {}
        self._matched: dict[int, tuple[int, Node]] = {}  # seq_id -> (end, node) of its last match
        self.own_tokens = 0                   # tokens written into requests' own pages
        self.hit_tokens = 0
        self.query_tokens = 0
        self.retractions = 0
        self.tiers = None                     # a `blocksim.memory.tiers.TierStore` (attach_tiers)
        self._tier_pending: dict[int, tuple] = {}  # seq_id -> a lookup `tier_extend` found, to commit

    # --- prefix hashes -------------------------------------------------------------------------
    @property
    def hash_block_tokens(self) -> int | None:
        return self._hash_tokens

    @hash_block_tokens.setter
    def hash_block_tokens(self, tokens: int | None) -> None:
        ps = self.block_size
        if tokens and tokens % ps:
            raise ConfigError(f"page_size (--page-size) {ps} does not divide the {tokens}-token granularity of "
                              f"the trace's prefix hashes; choose a page size that divides {tokens} (e.g. 1 or 16)")
        self._hash_tokens = tokens or None
        if self.tree.num_nodes == 1:
            self.tree = RadixTree(ps, self._hash_tokens)

    def _content(self, group: SequenceGroup) -> Content:
        """The group's content (kept until it finishes, so that a retracted request matches its own
        private tokens again)."""
        sid = group.seqs[0].seq_id
        c = self._contents.get(sid)
        if c is not None:
            return c
        h, hashes, ps = self._hash_tokens, group.prefix_hashes, self.block_size
        if h and hashes is not None and len(hashes):
            shared = min(group.prompt_tokens, len(hashes) * h)
            shared -= shared % ps
            self._set_block_keys(group, hashes, h)
            c = Content(sid, hashes, shared)
        else:
            group.block_keys = []
            c = Content(sid, None, 0)
        self._contents[sid] = c
        return c

    content = _content

    def matched_node(self, group: SequenceGroup) -> Node:
        """The node where the group's last `match` ended."""
        return self._matched[group.seqs[0].seq_id][1]

    def _set_block_keys(self, group: SequenceGroup, hashes, h: int) -> None:
        """Content keys of full prompt pages, as `PrefixCachingBlockManager.block_keys` (for plans)."""
        group.block_keys = block_keys(hashes, group.prompt_tokens, self.block_size, h)

    # --- KV tiers (blocksim.memory.tiers) --------------------------------------------------------
    def attach_tiers(self, tiers) -> None:
        """Look prefixes up in `tiers` after the tree (SGLang HiCache's host and storage tiers under
        the radix cache); chunks are keyed by the trace's prefix hashes."""
        self.tiers = tiers

    def _chunk_keys(self, group: SequenceGroup) -> list[int]:
        return prompt_block_keys(group, self.tiers.chunk_tokens, self._hash_tokens)

    def tier_extend(self, group: SequenceGroup, matched: int) -> int:
        """Tokens after the tree's `matched` that the tiers hold and the onload mode loads (whole
        chunks; none when the match ends inside a chunk). Changes nothing; `tier_commit` loads them."""
        t = self.tiers
        ct = t.chunk_tokens
        seq = group.seqs[0]
        self._tier_pending.pop(seq.seq_id, None)
        if matched % ct:
            return 0
        keys = self._chunk_keys(group)
        limit = min((seq.num_tokens - 1) // ct, len(keys))
        c0 = matched // ct
        if c0 >= limit:
            return 0
        ckeys = keys[c0:limit]
        found = t.match(ckeys)
        n = t.plan_onload(ckeys, found, matched) if found else 0
        self._tier_pending[seq.seq_id] = (ckeys, found, n, matched)
        return n * ct

    def tier_commit(self, group: SequenceGroup, start: int) -> int:
        """After the admitted request's slots are allocated: count its lookup, load the chunks
        `tier_extend` found into its pages (the step that prefills the rest waits for them), report
        its whole-chunk tree hits. Returns where its prefill starts: `start`, or earlier when chunks
        left the tiers since (another request's stores in the same batch)."""
        t, ps = self.tiers, self.block_size
        ct = t.chunk_tokens
        cb = ct // ps
        seq = group.seqs[0]
        st = self.reqs[seq.seq_id]
        p = self._tier_pending.pop(seq.seq_id, None)
        if p is None and start != st.matched:  # a later chunk of a chunked prefill
            return start
        t.count_query(st.matched, seq.num_tokens)
        tokens = group.tier_tokens
        if tokens is None:
            tokens = group.tier_tokens = [0, 0, 0]
        tokens[0] += st.matched
        if p is not None:
            ckeys, found, n, matched = p
            skipped = t.skipped_tokens
            ready, host, disk, loaded = t.commit(ckeys, found, n, seq.block_table[matched // ps:])
            group.onload_skipped_tokens += t.skipped_tokens - skipped
            tokens[1] += host
            tokens[2] += disk
            if loaded:
                if ready > t.load_wait_s:
                    t.load_wait_s = ready
                group.onload_issue_s = t.now_s
            start = matched + loaded * ct
            group.num_cached_tokens = group.hit_tokens = start
        if t.wants_gpu_hits:
            keys = self._chunk_keys(group)
            for c in range(min(st.matched // ct, len(keys))):
                t.on_gpu_hit(keys[c], seq.block_table[c * cb:(c + 1) * cb])
        return start

    def tier_computed(self, group: SequenceGroup, start: int, stop: int) -> None:
        """Report the prompt chunks a prefill of tokens [start, stop) completed."""
        t = self.tiers
        ct = t.chunk_tokens
        keys = self._chunk_keys(group)
        last = min(min(stop, group.prompt_tokens) // ct, len(keys))
        first = start // ct
        if last > first:
            t.on_computed(keys[first:last], group.seqs[0].block_table, first * (ct // self.block_size))

    # --- the pool ------------------------------------------------------------------------------
    @property
    def available_tokens(self) -> int:
        """Free slots (SGLang's `available_size`)."""
        return len(self.free_pages) * self.block_size

    @property
    def evictable_tokens(self) -> int:
        return self.tree.evictable_tokens

    def _release(self, pages: list) -> None:
        self.free_pages += pages

    def evict(self, num_tokens: int) -> int:
        t = self.tiers
        return self.tree.evict(num_tokens, self._release,
                               self._write_back if t is not None and t.wants_gpu_evictions else None)

    def _write_back(self, node: Node) -> None:
        """Hand the tiers each whole prompt chunk that ends in `node`, about to leave the tree, with
        the pages that hold it (the chunk's earlier pages are its ancestors': a leaf leaves first)."""
        c = node.content
        t = self.tiers
        ct, ps = t.chunk_tokens, self.block_size
        stop = min(node.end, c.shared_len) // ct  # chunks ending in the node, inside the hashed prompt
        first = node.start // ct
        if stop <= first:  # (a content without prefix hashes has no hashed prompt)
            return
        keys = block_keys(c.hashes, c.shared_len, ct, self._hash_tokens)
        for j in range(first, min(stop, len(keys))):
            pages, n, pos = [], node, (j + 1) * ct - ps
            while len(pages) < ct // ps:  # the chunk's pages, last first, up the path
                while pos < n.start:
                    n = n.parent
                pages.append(n.pages[(pos - n.start) // ps])
                pos -= ps
            t.on_gpu_evicted(keys[j], pages[::-1])

    def make_room(self, pages: int) -> None:
        """Before a batch allocates `pages` pages: evict that many pages' worth of tokens when the
        free list is short (SGLang's `alloc_token_slots`, one eviction per batch)."""
        if len(self.free_pages) < pages:
            self.evict(pages * self.block_size)

    def _take(self, n: int) -> list[int]:
        """`n` pages, evicting `n` pages' worth of tokens first when the free list is short (SGLang)."""
        free = self.free_pages
        if len(free) < n:
            self.evict(n * self.block_size)
            if len(free) < n:
                raise BlockError(f"radix pool: {n} pages needed, {len(free)} free and nothing evictable")
        if n == 1:
            return [free.pop()]
        got = free[-n:]
        del free[-n:]
        return got

    # --- admission -----------------------------------------------------------------------------
    def match(self, group: SequenceGroup) -> int:
        """Match the group's tokens but the last against the tree (SGLang's `init_next_round_input`);
        returns the matched tokens and remembers the node for `allocate` (valid until the next
        eviction: match and allocate in the same scheduling pass)."""
        seq = group.seqs[0]
        end, node = self.tree.match(self._content(group), seq.num_tokens - 1)
        self._matched[seq.seq_id] = (end, node)
        return end

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        """Whether the group's prompt fits in free plus evictable slots (SGLang admits by its own
        estimate; this answers the generic contract)."""
        need = cdiv(group.seqs[0].num_tokens, self.block_size)
        if need > self.num_total_gpu_blocks:
            return AllocStatus.NEVER
        return AllocStatus.OK if need <= self.num_free_gpu_blocks else AllocStatus.LATER

    def allocate(self, group: SequenceGroup, filled: int | None = None) -> None:
        """Lock the matched prefix (`match` first) and give the sequence its tree pages; the slots
        of the rest come chunk by chunk through `add_filled` (all now when `filled` is None)."""
        if len(group.seqs) != 1:
            raise BlockError("the radix pool runs one sequence per request")
        seq = group.seqs[0]
        if seq.seq_id not in self._matched:
            self.match(group)
        matched, node = self._matched.pop(seq.seq_id)
        st = self.reqs[seq.seq_id] = ReqState(self._contents[seq.seq_id])
        st.last_node, st.matched = node, matched
        self.tree.inc_lock(node)
        seq.block_table = self.tree.path_pages(node)
        st.protected = st.allocated = matched
        group.num_cached_tokens = group.hit_tokens = matched
        group.prefix_hit_tokens += matched
        self.hit_tokens += matched
        self.query_tokens += seq.num_tokens
        if filled is None:
            self.add_filled(group, matched, seq.num_tokens)

    def unlock(self, group: SequenceGroup) -> None:
        """Undo a lock taken by `allocate` before any slot was allocated (an admission given up)."""
        st = self.reqs.pop(group.seqs[0].seq_id)
        self.tree.dec_lock(st.last_node)
        group.seqs[0].block_table = []
        self.hit_tokens -= st.matched
        self.query_tokens -= group.seqs[0].num_tokens
        group.prefix_hit_tokens -= st.matched
        group.num_cached_tokens = group.hit_tokens = 0

    def add_filled(self, group: SequenceGroup, start: int, stop: int) -> None:
        """A prompt chunk computes positions [start, stop): its slots are allocated now."""
        seq = group.seqs[0]
        st = self.reqs[seq.seq_id]
        have = len(seq.block_table)
        need = cdiv(stop, self.block_size) - have
        if need > 0:
            seq.block_table += self._take(need)
        self.own_tokens += stop - st.allocated
        st.allocated = stop

    def cache_unfinished(self, group: SequenceGroup) -> None:
        """Insert the written tokens (whole pages) so others can match them; the request's slots
        that duplicate tree content are freed and its table points at the tree's pages."""
        seq = group.seqs[0]
        st = self.reqs[seq.seq_id]
        end = st.allocated - st.allocated % self.block_size
        if end <= st.protected:
            return
        node = self._insert(seq, st, end)
        self.tree.inc_lock(node)
        self.tree.dec_lock(st.last_node)
        st.last_node = node
        self.own_tokens -= end - st.protected
        st.protected = end

    def _insert(self, seq: Sequence, st: ReqState, end: int) -> Node:
        """Insert [0, end); free the request's duplicates of [protected, prefix) and take the tree's pages."""
        table = seq.block_table
        prefix, node = self.tree.insert(st.content, end, table)
        ps = self.block_size
        lo, hi = st.protected // ps, prefix // ps
        if hi > lo:
            self.free_pages += table[lo:hi]
            table[lo:hi] = self.tree.path_pages(node)[lo:hi]
        return node

    # --- decode ------------------------------------------------------------------------------
    def pages_for_next_decode(self, groups: list[SequenceGroup]) -> int:
        """Pages the next decode step takes: one per sequence whose next slot starts a page."""
        if self.block_size == 1:
            return len(groups)
        reqs, ps = self.reqs, self.block_size
        return sum(1 for g in groups if reqs[g.seqs[0].seq_id].allocated % ps == 0)

    def check_decode(self, pages: int) -> bool:
        """SGLang's `check_decode_mem`: evict when free slots are short; whether `pages` fit."""
        if len(self.free_pages) >= pages:
            return True
        self.evict(pages * self.block_size)
        return len(self.free_pages) >= pages

    def can_append_slots(self, group: SequenceGroup) -> bool:
        return self.num_free_gpu_blocks >= 1

    def append_slots(self, seq: Sequence) -> tuple[int, int] | None:
        """The slot for the K/V of token `num_tokens - 1`; a new page at a page boundary."""
        st = self.reqs[seq.seq_id]
        if st.allocated % self.block_size == 0:
            seq.block_table += self._take(1)
        st.allocated += 1
        self.own_tokens += 1
        return None

    def append_decode_slots(self, groups: list[SequenceGroup], start: int, end: int) -> tuple[int, int]:
        ctx = 0
        for i in range(start, end):
            seq = groups[i].seqs[0]
            self.append_slots(seq)
            ctx += seq.num_tokens
        return end, ctx

    def append_decode(self, groups: list[SequenceGroup]) -> int:
        """One decode step of `groups` (one sequence each, in order): a slot each, a new page at a
        page boundary; returns the context tokens. `check_decode` made room first."""
        reqs, ps, free = self.reqs, self.block_size, self.free_pages
        n = len(groups)
        ctx = 0
        if ps == 1 and len(free) >= n:
            pages = free[-n:]
            del free[-n:]
            for g, page in zip(groups, pages):
                seq = g.seqs[0]
                seq.block_table.append(page)
                reqs[seq.seq_id].allocated += 1
                ctx += seq.num_tokens
        else:
            for g in groups:
                seq = g.seqs[0]
                self.append_slots(seq)
                ctx += seq.num_tokens
            return ctx
        self.own_tokens += n
        return ctx

    def append_span_slots(self, seqs: list[Sequence], steps: int, takers: list[int]) -> None:
        """`steps` further decode steps, step by step as a decode step would: evict when the free
        pages are short of the step's new pages, then a new page for each sequence at a page
        boundary (which sequence gets which page is not recorded: plans step one by one)."""
        reqs, ps, free = self.reqs, self.block_size, self.free_pages
        states = [reqs[s.seq_id] for s in seqs]
        n = len(seqs)
        if ps == 1 and 0 < steps * n <= len(free):  # no eviction: step j takes the n pages before those of step j - 1
            m = steps * n
            last = free[-m:]
            del free[-m:]
            for i, s in enumerate(seqs):  # sequence i's pages: last[m - n + i], then n before each
                s.block_table += last[m - n + i::-n]
        elif ps == 1:
            taken: list[int] = []
            for _ in range(steps):
                if len(free) < n:
                    self.evict(n)
                    if len(free) < n:
                        raise BlockError(f"radix pool: {n} slots needed, {len(free)} free and nothing evictable")
                taken += free[-n:]
                del free[-n:]
            for i, s in enumerate(seqs):
                s.block_table += taken[i::n]
        else:
            for _ in range(steps):
                crossing = [i for i in range(n) if states[i].allocated % ps == 0]
                k = len(crossing)
                if k and len(free) < k:
                    self.evict(k * ps)
                for i in crossing:
                    seqs[i].block_table += self._take(1)
                for st in states:
                    st.allocated += 1
            self.own_tokens += n * steps
            return
        for st in states:
            st.allocated += steps
        self.own_tokens += n * steps

    # --- freeing -------------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """A finished (or rejected) sequence: insert its tokens with K/V, free duplicates and the
        unaligned tail, unlock (SGLang's `cache_finished_req`)."""
        self._contents.pop(seq.seq_id, None)
        self._matched.pop(seq.seq_id, None)
        st = self.reqs.pop(seq.seq_id, None)
        if st is None:
            return
        end = st.allocated - st.allocated % self.block_size
        if end > st.protected:
            self._insert(seq, st, end)
        self.free_pages += seq.block_table[max(end, st.protected) // self.block_size:]
        self.own_tokens -= st.allocated - st.protected
        self.tree.dec_lock(st.last_node)
        seq.block_table = []

    def retract(self, seq: Sequence) -> None:
        """SGLang's `retract_decode` for one request: its own slots freed, its prefix unlocked
        (left in the tree, evictable)."""
        st = self.reqs.pop(seq.seq_id)
        ps = self.block_size
        self.free_pages += seq.block_table[st.protected // ps:]
        self.own_tokens -= st.allocated - st.protected
        self.tree.dec_lock(st.last_node)
        seq.block_table = []
        self.retractions += 1

    # --- swapping: none ------------------------------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool:
        return False

    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        raise BlockError("the radix pool does not swap (supports_swap is False)")

    def can_swap_in(self, group: SequenceGroup) -> AllocStatus:
        return AllocStatus.NEVER

    def swap_in(self, group: SequenceGroup) -> dict[int, int]:
        raise BlockError("the radix pool does not swap (supports_swap is False)")

    def clean_takes(self, limit: int) -> int:
        """How many of the next `limit` new pages evict no tree content (spans with tiers): those the
        free list holds."""
        return min(limit, len(self.free_pages))

    # --- accounting ----------------------------------------------------------------------------
    @property
    def num_free_gpu_blocks(self) -> int:
        """Free pages plus pages of evictable tree nodes (reclaimed on demand)."""
        return len(self.free_pages) + self.tree.evictable_tokens // self.block_size

    @property
    def num_gpu_blocks_used(self) -> int:
        return self.num_total_gpu_blocks - self.num_free_gpu_blocks

    @property
    def num_cpu_blocks_used(self) -> int:
        return 0

    def memory_breakdown(self, next_group: SequenceGroup | None, pending_prefill_slots: int) -> MemoryBreakdown:
        ps = self.block_size
        tree = self.tree
        tree_pages = (tree.protected_tokens + tree.evictable_tokens) // ps
        own_pages = self.num_total_gpu_blocks - len(self.free_pages) - tree_pages
        return MemoryBreakdown(tree.protected_tokens + self.own_tokens, 0, own_pages * ps - self.own_tokens, 0,
                               len(self.free_pages) * ps + tree.evictable_tokens)

    def set_clock(self, now_s: float) -> None:
        """No clock: LRU order is the order of tree accesses."""

    def free_extents(self) -> np.ndarray:
        raise BlockError("the radix pool has no address-space extents (has_extents is False)")

    def stats(self) -> dict[str, int]:
        return {"radix_hit_tokens": self.hit_tokens, "radix_query_tokens": self.query_tokens,
                "radix_evicted_tokens": self.tree.evicted_tokens, "radix_evictions": self.tree.evicted_nodes,
                "retractions": self.retractions}

    # --- checks ------------------------------------------------------------------------------
    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """Every page is free, in one tree node, or owned by one live request; lock counts equal
        the live requests' paths; the token counters agree with a recount."""
        ps, tree = self.block_size, self.tree
        owner: dict[int, str] = {}

        def claim(pages, who):
            for p in pages:
                if p in owner:
                    raise BlockError(f"page {p} held twice: by {owner[p]} and {who}")
                owner[p] = who

        claim(self.free_pages, "the free list")
        locks: dict[int, int] = {}
        evictable = protected = 0
        for node in tree.nodes():
            if node is tree.root:
                continue
            if len(node.pages) * ps != node.end - node.start:
                raise BlockError(f"{node}: {len(node.pages)} pages for {node.end - node.start} tokens")
            claim(node.pages, f"tree {node}")
            if node.lock_ref:
                protected += node.end - node.start
            else:
                evictable += node.end - node.start
        own = 0
        live = {s.seq_id for s in live_seqs}
        if live != set(self.reqs):
            raise BlockError(f"requests holding memory {sorted(self.reqs)} != live sequences {sorted(live)}")
        for s in live_seqs:
            st = self.reqs[s.seq_id]
            if len(s.block_table) != cdiv(st.allocated, ps):
                raise BlockError(f"sequence {s.seq_id}: {len(s.block_table)} pages for {st.allocated} tokens")
            path = tree.path_pages(st.last_node)
            if s.block_table[: len(path)] != path or len(path) * ps != st.protected:
                raise BlockError(f"sequence {s.seq_id}: table disagrees with its tree path")
            claim(s.block_table[st.protected // ps:], f"sequence {s.seq_id}")
            own += st.allocated - st.protected
            n = st.last_node
            while n is not tree.root:
                locks[n.id] = locks.get(n.id, 0) + 1
                n = n.parent
        if len(owner) != self.num_total_gpu_blocks:
            raise BlockError(f"{self.num_total_gpu_blocks - len(owner)} pages are neither free nor held")
        for node in tree.nodes():
            if node is not tree.root and node.lock_ref != locks.get(node.id, 0):
                raise BlockError(f"{node}: lock_ref {node.lock_ref}, {locks.get(node.id, 0)} live requests")
        if (evictable, protected, own) != (tree.evictable_tokens, tree.protected_tokens, self.own_tokens):
            raise BlockError(f"token counters (evictable, protected, own) = {(tree.evictable_tokens, tree.protected_tokens, self.own_tokens)}"
                             f", recount {(evictable, protected, own)}")

"""KV tiers below the GPU: pinned host DRAM, then a disk, holding chunks by content key.

A chunk is `chunk_tokens` tokens of one prompt (`chunk_tokens // block_size` consecutive blocks,
starting at a multiple of that count); its key is the content key of its last block, which names
the whole prefix up to it (chained hashes under vLLM V1, the trace's prefix hashes otherwise). A
tier holds at most one copy of a key, at most `capacity` chunks, and evicts by its policy
(`blocksim.memory.eviction`).

The GPU's memory manager reports three events; the tiers react by their write policy
(`TierConfig.host_write` for the first tier below the GPU, `disk_write` for the disk under the host):

* `on_computed(key, blocks)`: a prompt chunk's K/V has just been computed on the GPU (at a step's
  end). write-through stores it in the top tier.
* `on_gpu_hit(key, blocks)`: a request reused the chunk from the GPU's prefix cache.
  write-through-selective stores it at the `write_hits`-th hit (SGLang HiCache's policy).
* `on_gpu_evicted(key, blocks)`: the GPU's prefix cache gives the chunk's last block to another use.
  write-back stores it, and the step that reuses the block waits for the copy (`evict_wait_s`).

Between tiers: a chunk stored in the host goes on to the disk at once under write-through, after
`write_hits` host hits under write-through-selective, and when the host evicts it under write-back.

After the GPU's own prefix match, `match(keys)` counts the following chunk keys that some tier holds
(the leading run; each loads from the highest tier holding it); under vLLM V1, whose chunk keys name
their whole prefix (`chained_keys`), it bisects the keys while the tiers keep every chunk computed.
`plan_onload` decides how many of them to load by the onload mode (wait: all; deadline: those that
land within the deadline; recompute: as many leading chunks, none, all or up to a change of tier, as
make their transfers plus the cost model's prefill of the rest shortest); `commit` touches them,
issues their loads (disk -> host link -> GPU blocks) and returns when the last lands. A load does
not copy the chunk into the host tier.

Every move is an operation (`TierOp`) in `ops`, in issue order, for the engine's step records and
the execution plan; transfer times come from `blocksim.memory.tier_links`. `log`, when enabled,
records the events above for an independent recount of the hits. Runs that record no moves store a
step's computed chunks and compute a lookup's loads with whole-list operations (`batched`; an LRU
tier's dict holds each chunk's landing time and, once the tier evicts, is its recency order; before,
its hits are logged, `blocksim.memory.eviction.LRU`), with the results of one chunk at a time.
An LRU host written through, alone or over an LRU disk written back, holds one-block chunks by
position runs instead while the disk has not had to evict (`_r_start`: a step's new chunks take
consecutive positions, each tier's recency order is a deque of position ranges, a lookup's chunks
are found as runs of positions), with the results of its tables. There, a request's private chunks
(content no other request has, `on_computed`'s `private`) take positions without a key-table entry
until the request is preempted (`on_preempted`): only it can look them up, and only then.

Executed moves (`attach_mover`): in a GPU-in-the-loop replay the executor performs every move as
it is issued, and each transfer lasts what the executor measured for it instead of the link's
price: a load's host-link part (copy and scatter into the GPU blocks) and its disk read, a store's
GPU part (gather and copy out) and its disk write. The channels keep their queues (each serves one
transfer at a time, in issue order) and the engine's waits follow from the measured ends. The
what-ifs of the onload modes (`plan_onload`) still price by the links, as an engine decides
before it moves anything.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from functools import reduce
from itertools import accumulate, compress, count, filterfalse, groupby, islice, repeat
from operator import add, ge, is_, le, ne, not_
from typing import Callable, NamedTuple

from blocksim.config import GiB, SimConfig, TierConfig
from blocksim.memory.eviction import LRU, make_eviction
from blocksim.memory.tier_links import Link

GPU, HOST, DISK = "gpu", "host", "disk"
WRITE_THROUGH, SELECTIVE, WRITE_BACK = "write-through", "write-through-selective", "write-back"
#: (src, dst) of every copy direction, in the order the step and summary columns list them.
DIRECTIONS = ((GPU, HOST), (GPU, DISK), (HOST, DISK), (HOST, GPU), (DISK, GPU))


#: a run position's tiers (1 host, 2 disk, 3 both): without the host; with the disk; the tier a
#: load takes it from (0 host, 1 disk)
_NO_HOST = bytes.maketrans(b"\x01\x03", b"\x00\x02")
_TO_DISK = bytes.maketrans(b"\x00\x01", b"\x02\x03")
_TO_HOST = bytes.maketrans(b"\x00\x02", b"\x01\x03")
_WHERE = bytes.maketrans(b"\x01\x02\x03", b"\x00\x01\x00")
_LACKS = bytes.maketrans(b"\x01\x02\x03", b"\x01\x00\x00")  # a victim of the host the disk lacks


class TierOp(NamedTuple):
    """One chunk move, as the plan's `tier_ops` table records it (`evict`: a drop from `src`)."""

    step: int
    op: str
    src: str
    dst: str
    key: int
    gpu_blocks: tuple
    evict: bool = False


class Tier:
    __slots__ = ("name", "capacity", "cache", "write", "hits", "stored", "evictions", "hit_chunks")

    def __init__(self, name: str, capacity: int, eviction: str, write: str) -> None:
        self.name = name
        self.capacity = capacity
        self.cache = make_eviction(eviction, capacity)  # its `members`: key -> when its copy lands here
        self.write = write
        self.hits: dict[int, int] = {}        # key -> hits here, for a selective tier below
        self.stored = self.evictions = self.hit_chunks = 0


class TierStore:
    def __init__(self, config: TierConfig, block_size: int, chunk_tokens: int, chunk_bytes: int,
                 host_link_gbps: float, link_latency_s: float, log_events: bool = False) -> None:
        self.config = config
        self.chunk_tokens = chunk_tokens
        self.chunk_blocks = chunk_tokens // block_size
        self.chunk_bytes = chunk_bytes
        #: the tiers, top first, however their chunks are held (`levels` reads them out of the
        #: position runs first; the store's own paths that run on the runs read `lv`)
        self.lv: list[Tier] = []
        self._runs = False
        for name in (HOST, DISK):
            gib = getattr(config, f"{name}_gib")
            if gib > 0:
                self.lv.append(Tier(name, int(gib * GiB // chunk_bytes), getattr(config, f"{name}_eviction"),
                                    getattr(config, f"{name}_write")))
        self.h2d = Link("h2d", host_link_gbps, link_latency_s)
        self.d2h = Link("d2h", host_link_gbps, link_latency_s)
        self.disk_read = Link("disk_read", config.disk_read_gbps, config.disk_latency_s)
        self.disk_write = Link("disk_write", config.disk_write_gbps, config.disk_latency_s)
        #: seconds of a disk write into a slot never written before (measured: the file system
        #: allocates its blocks); None: priced as any write
        self.fresh_write_s: float | None = None
        #: the most chunks the disk tier has held at once: its slots written at least once (a store
        #: takes a freed slot before a new one, as the tier executor's file does)
        self.disk_slots = 0
        self.fresh_writes = 0  # writes priced at `fresh_write_s`
        self.write_hits = config.write_hits
        self.onload = config.onload
        self.deadline_s = config.onload_deadline_ms / 1e3
        self.now_s = 0.0
        self.step = 0
        self.ops: list[TierOp] = []
        #: `mover(ops) -> [(link_s, disk_s)]`: performs moves and returns each one's measured parts
        #: (`attach_mover`); None: transfers are priced by the links.
        self.mover: Callable[[list[TierOp]], list[tuple[float, float]]] | None = None
        self._sent = 0  # rows of `ops` the mover has performed
        self.ops_on = False  # record every move in `ops` (for an execution plan and tests)
        #: moves without records go through the whole-list paths (`_store_batch`, ...); False: one
        #: chunk at a time, as with records (tests compare the two)
        self.batched = True
        #: counts the changes of what the tiers hold (stores, evictions): `commit` skips matching again
        #: keys that `match` has just matched
        self.version = 0
        #: each chunk key names its whole prefix (vLLM V1's chained block hashes, set by its memory
        #: manager): a chunk held implies the chunks before it were computed too (`_match`)
        self.chained_keys = False
        self._matched: tuple | None = None
        self._last_ends: tuple | None = None  # the last plan's `_load_ends`, for its commit
        self._totals: tuple = (-1, -1, None)  # (version, lookups, `totals()` then)
        self.log: list[tuple] | None = [] if log_events else None
        self.gpu_hits: dict[int, int] = {}
        self.evict_wait_s = 0.0
        self.load_wait_s = 0.0  # loads a step waits for (engines that load inside the step)
        self.transfer_source = "assumed: host_link_gbps of the catalog, --tier-disk-* options"
        #: `prefill_s(start_tokens, new_tokens)`: the cost model's time to prefill tokens after a prefix
        #: (set by the engine; the recompute mode compares it with the transfer).
        self.prefill_s: Callable[[int, int], float] | None = None
        self.hit_tokens = {GPU: 0, HOST: 0, DISK: 0}
        self.query_tokens = self.skipped_tokens = self.lookups = 0
        self.bytes = {d: 0 for d in DIRECTIONS}
        top = self.lv[0].write
        self.wants_gpu_hits = top == SELECTIVE
        self.wants_gpu_evictions = top == WRITE_BACK
        lv = self.lv
        if (self.runs and self.chunk_blocks == 1 and not log_events and lv[0].name == HOST
                and lv[0].write == WRITE_THROUGH and type(lv[0].cache) is LRU
                and (len(lv) == 1 or (type(lv[1].cache) is LRU and lv[1].write == WRITE_BACK))):
            self._r_start()

    #: hold one-block chunks by position runs where the configuration allows (`_r_start`; a run
    #: of a few chunks of several blocks each costs more than the tables' operations on them);
    #: False: in the tiers' own tables from the start
    runs = True

    @property
    def levels(self) -> list[Tier]:
        """The tiers, top first, each holding its chunks in its own table: while the position runs
        hold the chunks, reading this moves them into the tables first (`_r_materialize`)."""
        if self._runs:
            self._r_materialize()
        return self.lv

    def use_measured(self, per_chunk_s: dict[str, float], source: str) -> None:
        """Price the channels by measured seconds per chunk (`blocksim.cost.tier_transfer`): the
        host link each way, the disk write from the host (into a slot written before, and, where
        measured, into a new one: `_write_s`), and the disk read as the measured disk->GPU move
        less its host->GPU part (a disk load then crosses the host link)."""
        self.d2h.set_chunk_seconds(per_chunk_s["gpu_host"])
        self.h2d.set_chunk_seconds(per_chunk_s["host_gpu"])
        self.disk_write.set_chunk_seconds(per_chunk_s["host_disk"])
        self.fresh_write_s = per_chunk_s.get("host_disk_fresh")
        self.disk_read.set_chunk_seconds(max(per_chunk_s["disk_gpu"] - per_chunk_s["host_gpu"], 1e-9))
        self.transfer_source = source

    def attach_mover(self, mover: Callable[[list[TierOp]], list[tuple[float, float]]]) -> None:
        """Have `mover` perform every move as it is issued and price each transfer by what it
        measured: `mover(rows)` applies the `TierOp` rows in order and returns, per row, the seconds
        of its copy between the GPU and the host (or of its GPU part into or out of the disk tier)
        and of its disk I/O ((0, 0) for a drop)."""
        self.mover = mover
        self.ops_on = True

    def _slots_priced_alike(self) -> float:
        """How many chunks the disk tier may hold with every write priced as any other: all of them
        without a fresh-slot price, else as many as its slots written before."""
        return float("inf") if self.fresh_write_s is None else self.disk_slots

    def _write_s(self, held: int) -> float:
        """Seconds of a disk write that leaves the disk tier holding `held` chunks: a tier holding
        more chunks than ever before writes a slot for the first time, at `fresh_write_s`."""
        if held > self.disk_slots:
            self.disk_slots = held
            if self.fresh_write_s is not None:
                self.fresh_writes += 1
                return self.fresh_write_s
        return self.disk_write.seconds(self.chunk_bytes)

    def _written(self, writes: int, fresh_before: int, free_s: float) -> None:
        """Account `writes` disk writes issued back to back, ending at `free_s`, those priced fresh
        being the writes since `fresh_writes` was `fresh_before` (one sum per batch of stores, the
        same whichever path issued them)."""
        dw = self.disk_write
        t = dw.seconds(self.chunk_bytes)
        fresh = self.fresh_writes - fresh_before
        busy = writes * t + fresh * (self.fresh_write_s - t) if fresh else writes * t
        dw.free_s, dw.busy_s, dw.bytes = free_s, dw.busy_s + busy, dw.bytes + writes * self.chunk_bytes

    def _perform(self) -> list[tuple[float, float]]:
        """Perform the rows issued since the last call (a mover is attached); their measured parts."""
        rows = self.ops[self._sent:]
        self._sent = len(self.ops)
        return self.mover(rows)

    def _measured(self) -> tuple[float, float] | None:
        """Perform the rows issued since the last call; the measured parts of the last of them
        (None when no mover is attached)."""
        return None if self.mover is None else self._perform()[-1]

    # --- events from the GPU -----------------------------------------------------------------
    def on_computed(self, keys: list[int], table: list[int], first_block: int, private: int = 0,
                    owner: int | None = None) -> None:
        """Prompt chunks whose K/V a step has just computed: chunk j is `keys[j]`, in the blocks
        `table[first_block + j * chunk_blocks:]`. write-through stores those the top tier lacks.
        `private`: how many of the last keys no other request has, which request `owner` alone can
        look up, and only after `on_preempted(owner)` (chunks new to the tiers)."""
        if self.log is not None:
            self.log.extend(("computed", k) for k in keys)
        if self._runs and self._r_ok() and self._r_store(keys, private, owner):
            return
        top = self.levels[0]
        if top.write != WRITE_THROUGH:
            return
        if self.batched and not self.ops_on and self._store_batch(keys):
            return
        cache = top.cache
        if self.mover is not None:  # each store performed and measured as it is issued
            cb = self.chunk_blocks
            for j, k in enumerate(keys):
                if k not in cache:
                    b = first_block + j * cb
                    self._store_from_gpu(k, table[b:b + cb], self.step)
            return
        members = cache.members
        for k in keys:
            if k not in members:
                self._store_run(keys, table, first_block)
                return

    def _store_batch(self, keys: list[int]) -> bool:
        """`_store_run` for an LRU host tier without recorded moves, as whole-list operations: the
        chunks the host lacks are copied back to back over the host link, inserted at once, and the
        oldest chunks beyond the capacity leave in order (an LRU evicts the same keys whether the
        inserts come one by one or together), written back to a disk below that has room for them.
        Returns False, having changed nothing, where the result could differ from `_store_run`'s: a
        chunk of `keys` the host holds would leave before its turn, a disk on top, a write-through
        disk below."""
        levels = self.levels
        top = levels[0]
        lru = top.cache.members
        if type(top.cache) is not LRU or top.name == DISK:
            return False
        below = levels[1] if len(levels) > 1 else None
        if below is not None and below.write == WRITE_THROUGH:
            return False
        new = list(filterfalse(lru.__contains__, keys))
        n = len(new)
        if not n:
            return True
        excess = len(lru) + n - top.capacity
        if excess > 0:
            lru = top.cache.ordered()  # it evicts: an OrderedDict in recency order from now on
            if n < len(keys) and not set(keys).isdisjoint(islice(lru, excess)):
                return False
        self.version += 1
        nbytes, now = self.chunk_bytes, self.now_s
        d2h = self.d2h
        t_d2h = d2h.seconds(nbytes)
        ends = list(accumulate(repeat(t_d2h, n), initial=max(now, d2h.free_s)))
        lru.update(zip(new, islice(ends, 1, None)))
        if top.cache.log:
            top.cache.inserted(new)
        top.stored += n
        d2h.free_s, d2h.busy_s, d2h.bytes = ends[-1], d2h.busy_s + n * t_d2h, d2h.bytes + n * nbytes
        self.bytes[(GPU, top.name)] += n * nbytes
        if excess <= 0:
            return True
        victims = list(islice(lru, excess))
        victim_landed = list(map(lru.pop, victims))
        top.evictions += excess
        if top.hits:
            deque(map(top.hits.pop, victims, repeat(None)), 0)
        if below is None or below.write != WRITE_BACK:
            return True
        dw = self.disk_write
        t_dw = dw.seconds(nbytes)
        held = below.cache.members
        f = dw.free_s
        fresh_before = self.fresh_writes
        if type(below.cache) is LRU and len(held) + excess <= min(below.capacity, self._slots_priced_alike()):
            # no disk eviction, and every write into a slot written before (or priced alike)
            # each write starts when the chunk has landed in the host and the disk is free (and not
            # before now: after the first write the disk's free time is past now); `setdefault`
            # stores a victim the disk lacks (returning the new end) and leaves one it holds
            f = f if f > now else now
            put = held.setdefault
            log = below.cache.log
            written = [] if log else None
            m = 0
            for v, x in zip(victims, victim_landed):
                end = (x if x > f else f) + t_dw
                if put(v, end) is end:
                    f = end
                    m += 1
                    if written is not None:
                        written.append(v)
            if not m:
                return True
            if written:
                below.cache.inserted(written)
            below.stored += m
            if len(held) > self.disk_slots:  # (no eviction: the tier holds more chunks than ever)
                self.disk_slots = len(held)
        else:
            m = 0
            step = self.step
            for v, x in zip(victims, victim_landed):
                if v not in below.cache:  # (its `members` may be a new dict after an insert)
                    f = self._put_below(v, max(now, x, f), step, None)
                    m += 1
            if not m:
                return True
        self._written(m, fresh_before, f)
        self.bytes[(HOST, DISK)] += m * nbytes
        return True

    def _store_run(self, keys: list[int], table: list[int], first_block: int) -> None:
        """`_store_from_gpu` for each chunk of `keys` the top tier lacks when its turn comes, issued
        back to back (the same moves, links and records, without a call per chunk and per link)."""
        levels, now, step = self.levels, self.now_s, self.step
        top = levels[0]
        below = levels[1] if len(levels) > 1 else None
        t_d2h, d2h_free, dw_free, fresh_before = self._stores_begin()
        writes = down = 0
        top_disk = top.name == DISK
        wb_below = below is not None and below.write == WRITE_BACK
        wt_below = below is not None and below.write == WRITE_THROUGH
        below_cache = below.cache if below is not None else None
        hits, insert = top.hits, top.cache.insert
        ops = self.ops if self.ops_on else None
        cb = self.chunk_blocks
        cache = top.cache
        lru = cache.members if type(cache) is LRU and cache.log is None else None  # evicting: in order
        cap = top.capacity
        n = 0
        self.version += 1
        for j, key in enumerate(keys):
            if key in cache:  # (an insert may give an LRU a new `members`)
                continue
            n += 1
            d2h_free += t_d2h
            end = d2h_free
            if top_disk:  # the write's price depends on the tier's chunks after the insert
                victims = insert(key, None)
                s = self._write_s(len(cache.members))
                end = dw_free = max(end, dw_free) + s
                cache.members[key] = end
                writes += 1
            elif lru is not None:  # LRU's insert, inlined
                victims = (lru.popitem(last=False),) if len(lru) >= cap else ()
                lru[key] = end
            else:
                victims = insert(key, end)
            for v, v_landed in victims:
                top.evictions += 1
                if hits:
                    hits.pop(v, None)
                if wb_below and v not in below_cache:
                    writes += 1
                    down += 1
                    dw_free = self._put_below(v, max(now, v_landed, dw_free), step,
                                              TierOp(step, "store", top.name, below.name, v, ())
                                              if ops is not None else None)
                if ops is not None:
                    ops.append(TierOp(step, "store", top.name, top.name, v, (), True))
            if ops is not None:  # after the drops that make room: a tier never holds more than its capacity
                b = first_block + j * cb
                ops.append(TierOp(step, "store", GPU, top.name, key, tuple(table[b:b + cb])))
            top.stored += 1
            if wt_below and key not in below_cache:
                writes += 1
                down += 1
                dw_free = self._put_below(key, max(now, end, dw_free), step,
                                          TierOp(step, "store", top.name, below.name, key, ())
                                          if ops is not None else None)
        self._stores_end(top.name, n, t_d2h, d2h_free, writes, fresh_before, dw_free, down)

    def _stores_begin(self) -> tuple[float, float, float, int]:
        """For chunks stored back to back from the GPU: the seconds one takes over the device-to-host
        link, when that link and the disk's writes are free, and `fresh_writes` before them."""
        return (self.d2h.seconds(self.chunk_bytes), max(self.now_s, self.d2h.free_s), self.disk_write.free_s,
                self.fresh_writes)

    def _stores_end(self, top: str, n: int, t_d2h: float, d2h_free: float, writes: int, fresh_before: int,
                    dw_free: float, down: int) -> None:
        """The links and byte counts after `n` chunks stored back to back into tier `top`, `writes`
        of them written to the disk below (`down` moved there)."""
        d2h, nbytes = self.d2h, self.chunk_bytes
        d2h.free_s, d2h.busy_s, d2h.bytes = d2h_free, d2h.busy_s + n * t_d2h, d2h.bytes + n * nbytes
        if writes:
            self._written(writes, fresh_before, dw_free)
        self.bytes[(GPU, top)] += n * nbytes
        if down:
            self.bytes[(HOST, DISK)] += down * nbytes

    def _put_below(self, key: int, start_s: float, step: int, row: TierOp | None) -> float:
        """Insert a chunk into the second (last) tier, the disk, its write starting at `start_s` (the
        caller's queue on the disk's write channel included); returns when the write ends (the
        caller accounts the channel: `_written`). Its evictions are drops, recorded before the
        store's `row`."""
        lv = self.levels[1]
        self.version += 1
        for v, _ in lv.cache.insert(key, None):
            lv.evictions += 1
            lv.hits.pop(v, None)
            if self.ops_on:
                self.ops.append(TierOp(step, "store", lv.name, lv.name, v, (), True))
        if row is not None:
            self.ops.append(row)
        members = lv.cache.members
        end = members[key] = start_s + self._write_s(len(members))
        lv.stored += 1
        return end

    def on_preempted(self, owner: int) -> None:
        """Request `owner` gives its blocks back and may come back: the private chunks it stored
        (`on_computed`) may be looked up from now on."""
        if self._runs:
            ranges = self._rp.pop(owner, None)
            if ranges:
                K, w, R = self._rK, self._rw, self._rR
                for lo, hi in ranges:
                    w.update((K[p], p) for p in range(lo, hi) if K[p] is not None)
                    if R is not None:
                        R[lo:hi] = bytes((1,)) * (hi - lo)
                self.version += 1

    def on_finished(self, owner: int) -> None:
        """Request `owner` has finished: no lookup asks for its private chunks any more."""
        if self._runs:
            self._rp.pop(owner, None)

    def on_gpu_hit(self, key: int, gpu_blocks) -> None:
        """A GPU prefix-cache hit on a whole chunk at admission (its K/V exists since the last step)."""
        top = self.lv[0]
        if top.write != SELECTIVE:
            return
        if self.log is not None:
            self.log.append(("gpu_hit", key))
        if key in top.cache:
            return
        n = self.gpu_hits.get(key, 0) + 1
        if n >= self.write_hits:
            self.gpu_hits.pop(key, None)
            self._store_from_gpu(key, gpu_blocks, self.step - 1)
        else:
            self.gpu_hits[key] = n

    def on_gpu_block_evicted(self, block: int, key: int, chunk, block_of) -> None:
        """The GPU cache evicts `block`, holding the content `key`; `chunk` is the keys of the blocks of
        the chunk `key` ends (None: no chunk ends there) and `block_of(k)` the GPU block still holding
        key `k`, or None. The chunk is written back when every one of its blocks is still cached."""
        if chunk is None:
            return
        if len(chunk) == 1:
            self.on_gpu_evicted(key, (block,))
            return
        blocks = [block if k == key else block_of(k) for k in chunk]
        if None not in blocks:  # a chunk whose other blocks left the GPU already is not stored
            self.on_gpu_evicted(key, blocks)

    def on_gpu_evicted(self, key: int, gpu_blocks) -> None:
        """The GPU cache evicts a whole chunk (its K/V exists since the last step, and is overwritten in
        this one: the step waits for the copy)."""
        top = self.lv[0]
        if top.write != WRITE_BACK:
            return
        if self.log is not None:
            self.log.append(("gpu_evict", key))
        if key in top.cache:
            return
        end = self._store_from_gpu(key, gpu_blocks, self.step - 1)
        if end > self.evict_wait_s:
            self.evict_wait_s = end

    # --- stores --------------------------------------------------------------------------------
    def _store_from_gpu(self, key: int, gpu_blocks, step: int) -> float:
        """Copy a chunk from GPU blocks into the top tier; returns when the GPU copy is done."""
        top = self.levels[0]
        nbytes = self.chunk_bytes
        d2h_end = [0.0]

        def land(parts) -> float:  # the GPU copy on the host link, then the disk write for a disk top tier
            end = d2h_end[0] = self.d2h.transfer(self.now_s, nbytes, parts and parts[0])
            if top.name == DISK:
                end = self.disk_write.transfer(end, nbytes, parts[1] if parts else self._write_s(len(top.cache)))
            return end
        self.bytes[(GPU, top.name)] += nbytes
        row = TierOp(step, "store", GPU, top.name, key, tuple(gpu_blocks)) if self.ops_on else None
        self._insert(0, key, land, step, row)
        return d2h_end[0]

    def _insert(self, i: int, key: int, land: Callable, step: int, row: TierOp | None) -> None:
        """Store `key` in tier i: its evictions first (write-backs below, drops), then the store's
        `row` (performed, when a mover is attached), then its transfers (`land(measured parts)`
        issues them and returns when the chunk has landed), then a write-through below."""
        lv = self.levels[i]
        self.version += 1
        for victim, victim_landed_s in lv.cache.insert(key, None):  # its landing time once issued, below
            self._evicted(i, victim, victim_landed_s, step)
        if row is not None:
            self.ops.append(row)
        landed_s = lv.cache.members[key] = land(self._measured())
        lv.stored += 1
        if i + 1 < len(self.levels):
            below = self.levels[i + 1]
            if below.write == WRITE_THROUGH and key not in below.cache:
                self._store_down(i, key, landed_s, step)

    def _evicted(self, i: int, key: int, landed_s: float, step: int) -> None:
        lv = self.levels[i]
        lv.evictions += 1
        lv.hits.pop(key, None)
        if i + 1 < len(self.levels):
            below = self.levels[i + 1]
            if below.write == WRITE_BACK and key not in below.cache:
                self._store_down(i, key, landed_s, step)
        if self.ops_on:
            self.ops.append(TierOp(step, "store", lv.name, lv.name, key, (), True))

    def _store_down(self, i: int, key: int, landed_s: float, step: int) -> None:
        """Copy a chunk of tier i, landed there at `landed_s`, into tier i + 1."""
        lv, below = self.levels[i], self.levels[i + 1]
        start = max(self.now_s, landed_s)
        nbytes = self.chunk_bytes
        self.bytes[(lv.name, below.name)] += nbytes
        row = TierOp(step, "store", lv.name, below.name, key, ()) if self.ops_on else None
        self._insert(i + 1, key, lambda parts: self.disk_write.transfer(
            start, nbytes, parts[1] if parts else self._write_s(len(below.cache))), step, row)

    # --- lookups and onloads ------------------------------------------------------------------
    def match(self, keys) -> int:
        """How many leading `keys` some tier holds (the run a lookup can load). Changes nothing.
        Keys equal to the last matched, with no tier changed since, have the last answer (a request
        at the head of the queue that waits for blocks is matched again at every step)."""
        last = self._matched
        if last is not None and last[1] == self.version and self.batched and last[0] == keys:
            return last[2]
        n = self._match(keys)
        self._matched = (keys, self.version, n)
        return n

    def _match(self, keys) -> int:
        if self._runs and self._r_ok():
            held = self._rw
            if self.chained_keys and self._keeps_every_store():
                return bisect_left(keys, True, key=lambda k: k not in held)
            return _held_run(held, keys)
        levels = self.levels
        if self.chained_keys and self._keeps_every_store():
            # a chunk some tier holds was computed after the chunks before it in its prompt (each
            # computed, or hit or loaded on the GPU after an earlier computation), and every chunk
            # computed was stored and is held since: the held keys are a leading run
            held = [lv.cache.members for lv in levels]
            return bisect_left(keys, True, key=lambda k: not any(k in m for m in held))
        if len(levels) == 1:
            return _held_run(levels[0].cache.members, keys)
        m0, m1 = levels[0].cache.members, levels[1].cache.members
        if len(m1) < len(m0):  # the larger tier first: a key held there costs one lookup
            m0, m1 = m1, m0
        for n, k in enumerate(keys):
            if k not in m1 and k not in m0:
                return n
        return len(keys)

    def _keeps_every_store(self) -> bool:
        """Whether every chunk computed on the GPU was stored and is still held by some tier: the
        top tier is written through, its victims go to the tier below (written back or through),
        and the last tier has never evicted."""
        levels = self.lv
        top, last = levels[0], levels[-1]
        return top.write == WRITE_THROUGH and not last.evictions and (
            last is top or last.write in (WRITE_THROUGH, WRITE_BACK))

    def _load_ends(self, keys, n: int, commit: bool, last_only: bool = False,
                   measured=None) -> tuple[list[float], list[int]]:
        """When each of the first `n` keys (all held) would land on the GPU, loaded in order from the
        highest tier holding it (disk reads, then the host link), and that tier's index; issued
        (links advanced) when `commit`. `last_only`: where the `n` keys come from one tier, the
        last one's end alone. A commit of keys whose ends a plan has just computed, with nothing
        changed since, takes the plan's (the first `n` of them, where it has them all: each end
        depends only on the chunks before it). `measured`: each load's measured (host link, disk
        read) seconds, instead of the links' prices."""
        if measured is not None:
            self._last_ends = None
            return self._measured_load_ends(keys, n, measured)
        if not n:
            return [], []
        now, h2d, rd = self.now_s, self.h2d, self.disk_read
        state = (keys, self.version, now, h2d.free_s, rd.free_s)
        last = self._last_ends
        if commit and self.batched and last is not None and last[0] == state and (
                n == last[1] or n <= len(last[2]) == last[1]):  # (the plan's keys, or fewer of all its ends)
            _, planned, ends, where, rows, rd_ends = last
            if n < planned:
                ends, where = ends[:n], where[:n]
            reads = bisect_left(rows, n)
            rd_free = rd_ends[-1 if reads == len(rows) else reads - 1] if reads else rd.free_s
        else:
            ends, where, rows, rd_ends = self._ends(keys, n, last_only)
            reads = len(rows)
            rd_free = rd_ends[-1] if reads else rd.free_s
            self._last_ends = None if commit else (state, n, ends, where, rows, rd_ends)
        if commit:
            nbytes = self.chunk_bytes
            t_h2d, t_rd = h2d.seconds(nbytes), rd.seconds(nbytes)
            h2d.free_s, h2d.busy_s, h2d.bytes = ends[-1], h2d.busy_s + n * t_h2d, h2d.bytes + n * nbytes
            if reads:
                rd.free_s, rd.busy_s, rd.bytes = rd_free, rd.busy_s + reads * t_rd, rd.bytes + reads * nbytes
            self._last_ends = None
        return ends, where

    def _ends(self, keys, n: int, last_only: bool = False) -> tuple[list[float], list[int], list[int], list[float]]:
        """`_load_ends` of the first `n` keys, n > 0, computed: (ends, tier indices, the positions
        read from the disk, the disk read ends there; `last_only`, where the keys come from one
        tier: the last of each list of ends)."""
        if self._runs and self._r_ok():
            return self._r_ends(keys, n, last_only)
        now, levels = self.now_s, self.levels
        ks = keys[:n]
        m0 = levels[0].cache.members
        landed = list(map(m0.get, ks))  # None: not in the top tier, so in the one below
        below = landed.count(None) if len(levels) > 1 else 0
        # each channel serves in order, a transfer starting when its chunk is ready, the channel is
        # free and not before now (after the first transfer the channel's free time is past now)
        f = self.disk_read.free_s
        f = f if f > now else now
        # a chunk below has landed by the end of the disk's last write: when that is before the
        # first read can start, no read waits for its chunk, and its landing time is not looked up
        waits = below and self.disk_write.free_s > f
        if below == n:
            if waits:
                landed = list(map(levels[1].cache.members.__getitem__, ks))
            where = [1] * n
            rows = list(range(n))
        elif below:
            m1 = levels[1].cache.members
            where = [0 if x is not None else 1 for x in landed]
            if waits:
                landed = [x if x is not None else m1[k] for x, k in zip(landed, ks)]
            rows = list(compress(range(n), where))
        else:
            where = [0] * n
            rows = list(range(n)) if levels[0].name == DISK else []
        return self._chains(landed, where, rows, below, waits, f, n, last_only)

    def _chains(self, landed: list | None, where: list[int], rows: list[int], below: int, waits, f: float,
                n: int, last_only: bool = False) -> tuple[list[float], list[int], list[int], list[float]]:
        """`_ends` from the chunks' landing times (None where not needed; `landed` None: none is
        needed, every chunk having landed by the time its first channel is free), tiers and disk
        reads: the disk reads queued from `f`, then the host link."""
        last_only = last_only and (not rows or len(rows) == n)
        now, nbytes = self.now_s, self.chunk_bytes
        t_h2d, t_rd = self.h2d.seconds(nbytes), self.disk_read.seconds(nbytes)
        f_h2d = self.h2d.free_s
        f_h2d = f_h2d if f_h2d > now else now
        if len(rows) == n:  # disk reads first, in order on their own channel
            if below and not waits:
                if last_only and t_rd >= t_h2d and f + t_rd > f_h2d:
                    # back-to-back reads that outlast the host link's transfers: each load waits for
                    # its read, and the last ends one transfer after the last read
                    rd_last = reduce(add, repeat(t_rd, n), f)
                    return [rd_last + t_h2d], where, rows, [rd_last]
                ready = rd_ends = _in_turn(f, t_rd, n)
            else:
                ready = rd_ends = _queue(landed, f, t_rd)
        elif below and not waits:
            ready, rd_ends = landed, _in_turn(f, t_rd, len(rows))
            deque(map(ready.__setitem__, rows, rd_ends), 0)
        else:
            ready, rd_ends = landed, []
            for j in rows:
                x = ready[j]
                ready[j] = f = (x if x > f else f) + t_rd
                rd_ends.append(f)
        if ready is None:  # from the host, each transfer after the one before (`_queue`'s sums)
            if last_only:
                return [reduce(add, repeat(t_h2d, n), f_h2d)], where, rows, rd_ends
            return _in_turn(f_h2d, t_h2d, n), where, rows, rd_ends
        if last_only:
            return [_queue_last(ready, f_h2d, t_h2d)], where, rows, rd_ends[-1:]
        return _queue(ready, f_h2d, t_h2d), where, rows, rd_ends

    def _measured_load_ends(self, keys, n: int, measured) -> tuple[list[float], list[int]]:
        """`_load_ends` of issued loads lasting their measured parts."""
        now, nbytes, levels = self.now_s, self.chunk_bytes, self.levels
        m0 = landed0 = levels[0].cache.members
        landed1 = levels[1].cache.members if len(levels) > 1 else None
        ends, where = [], []
        for j in range(n):
            k = keys[j]
            i, ready = (0, landed0[k]) if k in m0 else (1, landed1[k])
            ready = max(ready, now)
            h2d_s, read_s = measured[j]
            if levels[i].name == DISK:
                ready = self.disk_read.transfer(ready, nbytes, read_s)
            ends.append(self.h2d.transfer(ready, nbytes, h2d_s))
            where.append(i)
        return ends, where

    def plan_onload(self, keys, found: int, start_tokens: int) -> int:
        """How many of the `found` leading chunks to load (the rest are recomputed), by the onload
        mode; `start_tokens` precede the first of them."""
        n = found
        if not n or self.onload == "wait":
            return n
        ends, where = self._load_ends(keys, n, commit=False, last_only=self.onload != "deadline")
        if self.onload == "deadline":  # the leading loads that land by the deadline (ends only grow)
            return bisect_right(ends, self.now_s + self.deadline_s, 0, n)
        # recompute: load the first k chunks and prefill the rest, for k = 0, n and each point where the
        # run passes from one tier to another (`ends` has every load's end where there is one, else
        # the last's); the cheapest wins (ties: fewer loads)
        now, ct = self.now_s, self.chunk_tokens
        best_k, best_s = 0, self.prefill_s(start_tokens, n * ct)
        for k in (*compress(range(1, n), map(ne, islice(where, 1, n), where)), n):
            s = (ends[k - 1] if k < n else ends[-1]) - now + (
                self.prefill_s(start_tokens + k * ct, (n - k) * ct) if k < n else 0.0)
            if s < best_s:
                best_k, best_s = k, s
        return best_k

    def count_query(self, gpu_hit_tokens: int, query_tokens: int) -> None:
        """An admission's prefix lookup: its GPU hit and the tokens it asked for."""
        self.hit_tokens[GPU] += gpu_hit_tokens
        self.query_tokens += query_tokens

    def commit(self, keys, found: int, n: int, dest_blocks: list[int]) -> tuple[float, int, int, int]:
        """Load the first `n` of the `found` leading chunks into `dest_blocks` (theirs, in order):
        touch each in its tier, issue the transfers. The keys are matched again first: the GPU
        blocks taken for the loads may have evicted chunks into the tiers (write-back), and GPU hits
        stored chunks (write-through-selective), moving or dropping found ones; only a run still
        held is loaded. Returns (when the last lands, host tokens, disk tokens, chunks loaded)."""
        if (found or self.wants_gpu_evictions or self.wants_gpu_hits) and not (
                self.batched and self._matched == (keys, self.version, found)):
            found = self.match(keys)  # (unless `match` found as many of these keys and no tier changed since)
            n = min(n, found)
        if self.log is not None:
            self.log.append(("lookup", tuple(keys[:found + 1]), found, n))
        self.lookups += 1
        cb, ct, levels = self.chunk_blocks, self.chunk_tokens, self.lv
        if not n:  # nothing to load: only the skipped chunks count
            self.skipped_tokens += found * ct
            return self.now_s, 0, 0, 0
        mover = self.mover
        ends, where = self._load_ends(keys, n, commit=mover is None, last_only=True)
        loads = [0, 0]
        selective = []
        ops = self.ops if self.ops_on else None
        sel = [i + 1 < len(levels) and levels[i + 1].write == SELECTIVE for i in range(len(levels))]
        if self.batched and ops is None and not sel[0] and n:
            # whole lists: each tier's hits touched in order (the tiers' orders are independent)
            loads[1] = sum(where)
            loads[0] = n - loads[1]
            ks = keys[:n]
            if self._runs:
                self._r_touch(keys, n, where)
            elif not loads[1]:
                _touch_all(levels[0].cache, ks)
            elif not loads[0]:
                _touch_all(levels[1].cache, ks)
            else:
                _touch_all(levels[0].cache, compress(ks, map(not_, where)))
                _touch_all(levels[1].cache, compress(ks, where))
            n_touched = n
        else:
            n_touched = 0
        for j in range(n_touched, n):
            i = where[j]
            key = keys[j]
            levels[i].cache.touch(key)
            loads[i] += 1
            if ops is not None:
                ops.append(TierOp(self.step, "load", levels[i].name, GPU, key, tuple(dest_blocks[j * cb:(j + 1) * cb])))
            if sel[i]:
                selective.append((i, key))
        if mover is not None and n:  # performed now, in one batch; they last what was measured
            ends, where = self._load_ends(keys, n, True, measured=self._perform()[-n:])
        for i, key in selective:  # after the loads: a store below must not evict a chunk being loaded
            lv = levels[i]
            if key not in lv.cache.members or key in levels[i + 1].cache.members:
                continue
            h = lv.hits.get(key, 0) + 1
            if h >= self.write_hits:
                lv.hits.pop(key, None)
                self._store_down(i, key, lv.cache.members[key], self.step)
            else:
                lv.hits[key] = h
        tokens = {HOST: 0, DISK: 0}
        for i, lv in enumerate(levels):
            lv.hit_chunks += loads[i]
            tokens[lv.name] += loads[i] * ct
            self.bytes[(lv.name, GPU)] += loads[i] * self.chunk_bytes
        self.hit_tokens[HOST] += tokens[HOST]
        self.hit_tokens[DISK] += tokens[DISK]
        self.skipped_tokens += (found - n) * ct
        return (ends[-1] if ends else self.now_s), tokens[HOST], tokens[DISK], n

    # --- position runs ------------------------------------------------------------------------
    # An LRU host written through, alone or over an LRU disk written back, holds its chunks by
    # position while the disk has not had to evict: each chunk held gets a position when first
    # stored (`_rw`: key -> position), a step's new chunks consecutive ones, and lists by position
    # hold its key, its tiers (`_rT`: 1 host, 2 disk), its landing time in each and the stamp of
    # its last event in each. A tier's recency order is a deque of entries [stamp, first, end):
    # an insert or a touch appends the positions it moves with a new stamp, and a position is in
    # an entry while its stamp there is the entry's. A lookup's keys are mostly a run of
    # consecutive positions (the prefix one request stored), found by one table lookup and a list
    # comparison, so that stores, evictions, write-backs and loads are whole-list operations on
    # runs instead of table operations per chunk. The results are those of the tiers' own tables
    # (`_store_batch`, `_ends`, `_touch_all`), which take over (`_r_materialize`) before the disk
    # would evict, when moves are recorded or performed, a fresh-slot write price is set, or
    # anything reads `levels`.

    def _r_start(self) -> None:
        self._runs = True
        self._rw: dict[int, int] = {}
        self._rK: list[int] = []
        self._rT = bytearray()
        self._rHL: list = []
        self._rDL: list = []
        self._rHS: list[int] = []
        self._rDS: list[int] = []
        self._rH: deque = deque()
        self._rD: deque = deque()
        #: a request -> the position ranges of its private chunks, held without a `_rw` entry until
        #: it is preempted (`on_preempted`); the other requests never ask for them
        self._rp: dict[int, list[list[int]]] = {}
        #: a host alone (its victims leave the tiers): per position, 1 where the key has a `_rw` entry
        self._rR: bytearray | None = bytearray() if len(self.lv) == 1 else None
        self._rs = 0
        self._rhn = self._rdn = 0
        self._r_last: tuple | None = None  # (keys, n, version, their runs) of the last `_r_ends`

    def _r_ok(self) -> bool:
        """Whether the runs may go on holding the chunks; if not, the tiers' tables take over."""
        if self.ops_on or not self.batched or self.fresh_write_s is not None or self.log is not None:
            self._r_materialize()
            return False
        return True

    def _r_materialize(self) -> None:
        """Move the chunks into the tiers' own tables, in each tier's recency order."""
        if not self._runs:
            return
        self._runs = False
        K, T = self._rK, self._rT
        for lv, entries, stamps, landed, bit in ((self.lv[0], self._rH, self._rHS, self._rHL, 1),
                                                 (self.lv[-1], self._rD, self._rDS, self._rDL, 2)):
            if bit == 2 and len(self.lv) == 1:
                break
            members = {}
            for s, lo, hi in entries:
                for p in range(lo, hi):
                    if stamps[p] == s and T[p] & bit:
                        members[K[p]] = landed[p]
            lv.cache.members = members
            lv.cache.log = []
        self._rw = self._rK = self._rT = self._rHL = self._rDL = self._rHS = self._rDS = None
        self._rH = self._rD = self._r_last = self._rp = self._rR = None

    def _r_segs(self, ks: list[int]) -> list[tuple[int, int, int]]:
        """Keys that some tier holds as runs of consecutive positions: (first position, first index
        in `ks`, length)."""
        w = self._rw
        out = []
        i, n = 0, len(ks)
        while i < n:
            g = w[ks[i]]
            m = self._r_run(g, ks, i)
            out.append((g, i, m))
            i += m
        return out

    def _r_run(self, g: int, ks: list[int], i: int, off_host: bool = False) -> int:
        """How many keys of `ks` from index i on, the first held at position g, the tiers hold at
        consecutive positions from g (`off_host`: the disk alone, 0 when the host holds the first)."""
        K, T = self._rK, self._rT
        if off_host and T[g] != 2:
            return 0

        def breaks(m: int) -> bool:
            t = T[g:g + m]
            return K[g:g + m] != ks[i:i + m] or (t.count(2) != m if off_host else 0 in t)
        m = min(len(ks) - i, len(K) - g)
        if m > 1 and breaks(m):
            m = bisect_left(range(2, m + 1), True, key=breaks) + 1
        return m

    def _r_position_runs(self, new: list[int], gids: list) -> list[tuple[int | None, int]]:
        """`_r_insert`'s runs of `new` from their positions `gids` (None: new to the tiers)."""
        K, out, j = self._rK, [], 0
        for fresh, run in groupby(map(is_, gids, repeat(None))):
            c = len(list(run))
            if fresh:
                out.append((None, c))
            elif K[gids[j]:gids[j] + c] == new[j:j + c]:  # at consecutive positions
                out.append((gids[j], c))
            else:
                out.extend(zip(gids[j:j + c], repeat(1)))
            j += c
        return out

    def _r_insert(self, new: list[int], runs: list[tuple[int | None, int]], landed: list[float],
                  placed: bool = False) -> bool:
        """Insert `new` (none in the host) at the end of the host's order, landing at `landed`.
        `runs`: (position, count) of consecutive chunks of `new`, in order: chunks the disk holds at
        consecutive positions from `position`, or, where it is None, chunks new to the tiers, which
        take the next positions (`placed`: the key table maps them to those already). False,
        having changed nothing, for a key given twice."""
        if not placed and len(set(new)) != len(new):
            return False
        K, T, HL, DL, HS, DS, w, H = self._rK, self._rT, self._rHL, self._rDL, self._rHS, self._rDS, self._rw, self._rH
        s = self._rs
        self._rs = s + 1
        j = 0
        whole = len(runs) == 1  # (the lists themselves, not slices of them)
        for g, c in runs:
            k = j + c
            if g is None:  # consecutive new positions
                g = len(K)
                keys = new if whole else new[j:k]
                if not placed:
                    w.update(zip(keys, range(g, g + c)))
                K += keys
                T += bytes((1,)) * c
                if self._rR is not None:
                    self._rR += bytes((1,)) * c
                HL += landed if whole else landed[j:k]
                DL += [None] * c
                HS += [s] * c
                DS += [-1] * c
            else:  # chunks the disk holds, stored in the host again
                T[g:g + c] = T[g:g + c].translate(_TO_HOST)
                HL[g:g + c] = landed if whole else landed[j:k]
                HS[g:g + c] = [s] * c
            _r_enter(H, s, g, g + c)
            j = k
        return True

    def _r_evict(self, need: int, landed: bool = True) -> tuple[list[tuple[int, int]], list, bytearray]:
        """Take the `need` least recent chunks out of the host: their position ranges in order,
        their landing times there (`landed`; else an empty list) and their tiers before (the host's
        count is the caller's)."""
        H, HS, T, HL = self._rH, self._rHS, self._rT, self._rHL
        ranges: list[tuple[int, int]] = []
        while need:
            e = H[0]
            s, lo, hi = e
            c = HS[lo:hi].count(s)
            if c == hi - lo:
                take = c if c <= need else need
                ranges.append((lo, lo + take))
                need -= take
                if take == c:
                    H.popleft()
                else:
                    e[1] = lo + take
            elif not c:
                H.popleft()
            else:
                p = lo
                while p < hi and need:
                    if HS[p] == s and T[p] & 1:
                        if ranges and ranges[-1][1] == p:
                            ranges[-1] = (ranges[-1][0], p + 1)
                        else:
                            ranges.append((p, p + 1))
                        need -= 1
                    p += 1
                if p >= hi:
                    H.popleft()
                else:
                    e[1] = p
        times: list = []
        tiers = bytearray()
        for lo, hi in ranges:
            if landed:
                times += HL[lo:hi]
            tiers += T[lo:hi]
            HL[lo:hi] = [None] * (hi - lo)
            T[lo:hi] = T[lo:hi].translate(_NO_HOST)
        return ranges, times, tiers

    def _r_peek(self, need: int) -> list[int]:
        """The positions of the `need` least recent host chunks (changes nothing)."""
        HS, T, out = self._rHS, self._rT, []
        for s, lo, hi in self._rH:
            for p in range(lo, hi):
                if HS[p] == s and T[p] & 1:
                    out.append(p)
                    if len(out) == need:
                        return out
        return out

    def _r_to_disk(self, ranges: list[tuple[int, int]], ends: list[float]) -> None:
        """Position ranges (in order, none on the disk) written to the disk, landing at `ends`."""
        T, DL, DS, D = self._rT, self._rDL, self._rDS, self._rD
        j = 0
        for lo, hi in ranges:
            k = j + hi - lo
            s = self._rs
            self._rs = s + 1
            DL[lo:hi] = ends[j:k]
            T[lo:hi] = T[lo:hi].translate(_TO_DISK)
            DS[lo:hi] = [s] * (hi - lo)
            D.append([s, lo, hi])
            j = k

    def _r_store(self, keys: list[int], private: int = 0, owner: int | None = None) -> bool:
        """`_store_batch` (else `_store_run`) on the runs; the last `private` keys (new to the tiers)
        take their positions without a `_rw` entry, recorded as `owner`'s. False, having changed
        nothing but handing the chunks to the tiers' tables, where the disk could have to evict."""
        lv = self.lv
        top = lv[0]
        below = lv[1] if len(lv) > 1 else None
        if below is not None and self._rdn + len(keys) > below.capacity:
            self._r_materialize()
            return False
        w, T = self._rw, self._rT
        # a leading run the disk alone holds at consecutive positions (a prefix computed again) goes
        # back into the host where it is; the next positions are offered to every other key: a key
        # held keeps its own
        shared = keys[:len(keys) - private] if private else keys
        g = w.get(shared[0]) if shared else None
        lead = self._r_run(g, shared, 0, off_host=True) if g is not None else 0
        rest = keys[lead:] if lead else keys
        runs = [(g, lead)] if lead else []
        g0, before = len(self._rK), len(w)
        m = len(rest) - private
        offered = rest[:m] if private else rest  # (the private keys follow them, new to the tiers)
        gids = list(map(w.setdefault, offered, range(g0, g0 + m)))
        placed = len(w) == before + m
        if placed:  # every other key new to the tiers, at the next positions
            new = keys
            if rest:
                runs.append((None, len(rest)))
            if private:
                self._r_private(owner, g0 + m, g0 + m + private)
        else:
            deque(map(w.pop, compress(offered, map(ge, gids, repeat(g0))), repeat(None)), 0)  # as it was
            gids = [g if g < g0 else None for g in gids]
            lack = [g is None or not T[g] & 1 for g in gids]
            new = list(compress(offered, lack))
            runs += self._r_position_runs(new, list(compress(gids, lack)))
            if private:  # new too, at the next positions, with `_rw` entries as the others
                new += rest[m:]
                runs.append((None, private))
            if lead:
                new = keys[:lead] + new
        n = len(new)
        if not n:
            return True
        excess = self._rhn + n - top.capacity
        if excess > 0 and n < len(keys) and not {g for g in gids if g is not None and T[g] & 1}.isdisjoint(
                self._r_peek(excess)):
            self._r_store_run(keys)  # a chunk of `keys` the host holds would leave before its turn
            return True
        t_d2h, d2h_free, dw_free, fresh_before = self._stores_begin()
        ends = _in_turn(d2h_free, t_d2h, n)  # (each chunk's landing time)
        if not self._r_insert(new, runs, ends, placed):
            self._r_materialize()
            return False
        if placed and private and self._rR is not None:  # (entered by `_r_insert` as registered)
            self._rR[g0 + m:g0 + m + private] = bytes(private)
        self.version += 1
        self._rhn += n
        top.stored += n
        m = 0
        if excess > 0:
            # the chunks the host held before these landed by `d2h_free` (the host link serves in
            # order); these are among the victims only where they outnumber its capacity
            landed_by = d2h_free if n <= top.capacity else float("inf")
            m, dw_free = self._r_evict_below(excess, below, dw_free, landed_by)
        self._stores_end(top.name, n, t_d2h, ends[-1], m, fresh_before, dw_free, m)
        return True

    def _r_private(self, owner: int, lo: int, hi: int) -> None:
        """Positions [lo, hi) hold private chunks of request `owner` (`on_preempted`)."""
        r = self._rp.get(owner)
        if r is None:
            self._rp[owner] = [[lo, hi]]
        elif r[-1][1] == lo:
            r[-1][1] = hi
        else:
            r.append([lo, hi])

    def _r_evict_below(self, excess: int, below: Tier | None, dw_free: float,
                       landed_by: float = float("inf")) -> tuple[int, float]:
        """The `excess` least recent chunks out of the host, those the disk below lacks written back
        to it once its writes are free at `dw_free` (without a disk the victims leave the tiers):
        (chunks written, when the disk's writes are free after them). `landed_by`: when every
        victim has landed in the host at the latest; where that is before the first write can
        start, each write starts when the one before ends, and no landing time is read."""
        now = self.now_s
        f = dw_free if dw_free > now else now
        aged = landed_by <= f
        ranges, landed, tiers = self._r_evict(excess, below is not None and not aged)
        self._rhn -= excess
        self.lv[0].evictions += excess
        if below is None:  # the victims leave the tiers (private ones have no `_rw` entry)
            K, R, pop = self._rK, self._rR, self._rw.pop
            for lo, hi in ranges:
                deque(map(pop, compress(K[lo:hi], R[lo:hi])), 0)
                K[lo:hi] = [None] * (hi - lo)
            return 0, dw_free
        m = excess
        if 3 in tiers:  # victims the disk holds stay as they are there
            lacks = tiers.translate(_LACKS)
            if aged:
                m = lacks.count(1)
            else:
                landed = list(compress(landed, lacks))
                m = len(landed)
            if not m:
                return 0, dw_free
            written, o = [], 0
            for lo, hi in ranges:
                k = hi - lo
                c = lacks.count(1, o, o + k)
                if c == k:
                    written.append((lo, hi))
                elif c:
                    written += [(p, q) for b, p, q in _runs_of(lacks[o:o + k], lo) if b]
                o += k
            ranges = written
        t = self.disk_write.seconds(self.chunk_bytes)
        out = _in_turn(f, t, m) if aged else _queue(landed, f, t)  # (aged: no landing time waited for)
        self._r_to_disk(ranges, out)
        below.stored += m
        self._rdn += m
        if self._rdn > self.disk_slots:
            self.disk_slots = self._rdn
        return m, out[-1]

    def _r_store_run(self, keys: list[int]) -> None:
        """`_store_run` on the runs: each chunk the host lacks at its turn, one at a time."""
        lv, w, T, K = self.lv, self._rw, self._rT, self._rK
        top = lv[0]
        below = lv[1] if len(lv) > 1 else None
        now = self.now_s
        t_d2h, d2h_free, dw_free, fresh_before = self._stores_begin()
        writes = n = 0
        self.version += 1
        for key in keys:
            g = w.get(key)
            if g is not None and T[g] & 1:
                continue
            n += 1
            d2h_free += t_d2h
            if self._rhn >= top.capacity:
                ranges, landed, tiers = self._r_evict(1)
                self._rhn -= 1
                top.evictions += 1
                v = ranges[0][0]
                if below is None:
                    if self._rR[v]:
                        w.pop(K[v])
                    K[v] = None
                elif not tiers[0] & 2:
                    writes += 1
                    self.version += 1
                    self._rdn += 1
                    dw_free = max(now, landed[0], dw_free) + self._write_s(self._rdn)
                    below.stored += 1
                    self._r_to_disk([(v, v + 1)], [dw_free])
            self._r_insert([key], [(g, 1)], [d2h_free])
            self._rhn += 1
            top.stored += 1
        self._stores_end(top.name, n, t_d2h, d2h_free, writes, fresh_before, dw_free, writes)

    def _r_ends(self, keys, n: int, last_only: bool = False) -> tuple[list[float], list[int], list[int], list[float]]:
        """`_ends` on the runs."""
        now = self.now_s
        ks = keys[:n]
        segs = self._r_segs(ks)
        self._r_last = (keys, n, self.version, segs)
        HL, DL, T = self._rHL, self._rDL, self._rT
        g0 = segs[0][0] if len(segs) == 1 else None
        if g0 is not None:
            tiers = T[g0:g0 + n]
        else:
            tiers = bytearray()
            for g, _, m in segs:
                tiers += T[g:g + m]
        below = tiers.count(2) if len(self.lv) > 1 else 0
        f = self.disk_read.free_s
        f = f if f > now else now
        waits = below and self.disk_write.free_s > f
        landed = None  # (the landing times `_chains` reads: the host's, the disk's where reads wait for them)
        if below == n:
            if waits:
                landed = DL[g0:g0 + n] if g0 is not None else [x for g, _, m in segs for x in DL[g:g + m]]
            where = [1] * n
            rows = list(range(n))
            return self._chains(landed, where, rows, below, waits, f, n, last_only)
        h2d_free = self.h2d.free_s
        if below or self.d2h.free_s > (h2d_free if h2d_free > now else now):
            # (else every chunk the host holds landed by the time its link is free: none is read)
            if g0 is not None:
                landed = HL[g0:g0 + n]
            else:
                landed = []
                for g, _, m in segs:
                    landed += HL[g:g + m]
        if below:
            where = list(tiers.translate(_WHERE))
            if waits:
                dl = [x for g, _, m in segs for x in DL[g:g + m]]
                landed = [x if x is not None else d for x, d in zip(landed, dl)]
            rows = list(compress(range(n), where))
        else:
            where = [0] * n
            rows = []
        return self._chains(landed, where, rows, below, waits, f, n, last_only)

    def _r_touch(self, keys: list[int], n: int, where: list[int]) -> None:
        """`_touch_all` of a commit's hits on the runs: the host's, then the disk's, in order."""
        host, disk = [], []
        last = self._r_last
        if last is not None and last[0] is keys and last[1] >= n and last[2] == self.version:
            segs = last[3]  # the runs `_r_ends` found for these keys (or more of them)
        else:
            segs = self._r_segs(keys[:n])
        for g, i, m in segs:
            if i >= n:
                break
            m = min(m, n - i)
            w = where[i:i + m]
            c = w.count(1)
            if not c:
                host.append((g, g + m))
            elif c == m:
                disk.append((g, g + m))
            else:
                for t, p, q in _runs_of(w, g):
                    (disk if t else host).append((p, q))
        for ranges, stamps, entries in ((host, self._rHS, self._rH), (disk, self._rDS, self._rD)):
            for lo, hi in ranges:
                s = self._rs
                self._rs = s + 1
                stamps[lo:hi] = [s] * (hi - lo)
                entries.append([s, lo, hi])

    def totals(self) -> tuple:
        """Cumulative bytes per direction (`DIRECTIONS` order) and drops per tier (host, disk). They
        change only with what the tiers hold (`version`) or with a lookup's loads (`lookups`): the
        engine asks after every step, most of which change neither."""
        t = self._totals
        if t[0] == self.version and t[1] == self.lookups:
            return t[2]
        b = self.bytes
        ev = {lv.name: lv.evictions for lv in self.lv}
        out = (b[(GPU, HOST)], b[(GPU, DISK)], b[(HOST, DISK)], b[(HOST, GPU)], b[(DISK, GPU)],
               ev.get(HOST, 0), ev.get(DISK, 0))
        self._totals = (self.version, self.lookups, out)
        return out

    def take_ops(self) -> list[TierOp]:
        if self.mover is not None and self._sent < len(self.ops):  # drops issued last
            self._measured()
        ops, self.ops, self._sent = self.ops, [], 0
        return ops

    def take_wait(self, duration_s: float) -> float:
        """Seconds a step of `duration_s` scheduled now waits before its compute: for write-back
        copies of blocks it overwrites, and for loads it needs beyond its own duration (loads
        overlap the step's compute layer by layer, so the step ends when both are done)."""
        wait = max(self.evict_wait_s - self.now_s, self.load_wait_s - self.now_s - duration_s, 0.0)
        self.evict_wait_s = self.load_wait_s = 0.0
        return wait

    # --- summary ------------------------------------------------------------------------------
    def stats(self) -> dict:
        q = self.query_tokens
        out: dict = {"tier_query_tokens": q, "tier_lookups": self.lookups,
                     "tier_onload_skipped_tokens": self.skipped_tokens, "tier_chunk_tokens": self.chunk_tokens,
                     "tier_transfer_source": self.transfer_source}
        for name in (GPU, HOST, DISK):
            out[f"tier_{name}_hit_tokens"] = self.hit_tokens[name]
            out[f"tier_{name}_hit_rate"] = self.hit_tokens[name] / q if q else 0.0
        for src, dst in DIRECTIONS:
            out[f"tier_bytes_{src}_to_{dst}"] = self.bytes[(src, dst)]
        for lv in self.lv:
            out[f"tier_{lv.name}_capacity_chunks"] = lv.capacity
            out[f"tier_{lv.name}_stored_chunks"] = lv.stored
            out[f"tier_{lv.name}_evictions"] = lv.evictions
            out[f"tier_{lv.name}_hit_chunks"] = lv.hit_chunks
        for link in (self.h2d, self.d2h, self.disk_read, self.disk_write):
            out[f"tier_{link.name}_busy_s"] = link.busy_s
        return out

    def check(self) -> None:
        """Every tier within its capacity, each key held once, its landing time known (tests)."""
        for lv in self.levels:
            keys = lv.cache.keys()
            if len(keys) > lv.capacity or len(set(keys)) != len(keys):
                raise AssertionError(f"tier {lv.name}: {len(keys)} chunks ({len(set(keys))} distinct) in "
                                     f"{lv.capacity} slots")
            if set(keys) != set(lv.cache.members) or None in lv.cache.members.values():
                raise AssertionError(f"tier {lv.name}: landing times disagree with the held chunks")


def _r_enter(entries: deque, s: int, lo: int, hi: int) -> None:
    """Positions [lo, hi) enter a recency order at stamp `s`: the last entry grows where it is of
    the same stamp and ends at `lo`, else a new entry."""
    last = entries[-1] if entries else None
    if last is not None and last[0] == s and last[2] == lo:
        last[2] = hi
    else:
        entries.append([s, lo, hi])


def _runs_of(values, lo: int) -> list[tuple[int, int, int]]:
    """(value, first, end) of each run of equal `values`, their positions counted from `lo`."""
    out, p = [], lo
    for v, run in groupby(values):
        q = p + len(list(run))
        out.append((v, p, q))
        p = q
    return out


def _in_turn(f: float, t: float, n: int) -> list[float]:
    """The ends of `n` transfers of `t` seconds each, one after another on a channel free from `f`
    (`_queue` where every transfer waits for the channel: the same sums)."""
    ends = list(accumulate(repeat(t, n), initial=f))
    del ends[0]
    return ends


def _queue(ready: list[float], f: float, t: float) -> list[float]:
    """The ends of transfers of `t` seconds each, in order on one channel free from `f`, the j-th
    starting once `ready[j]` and the one before are done: `[f := max(x, f) + t for x in ready]`,
    the same floats, by whole-list operations where every transfer waits for the channel or
    every one for its chunk (checked), else chunk by chunk."""
    if len(ready) < 16:
        return [f := (x if x > f else f) + t for x in ready]
    if ready[0] > f:
        ends = list(map(add, ready, repeat(t)))
        if all(map(ge, islice(ready, 1, None), ends)):  # each ready after the one before is done
            return ends
        return [f := (x if x > f else f) + t for x in ready]
    ends = list(accumulate(repeat(t, len(ready)), initial=f))
    if all(map(le, ready, ends)):  # each ready by the time the one before is done
        del ends[0]
        return ends
    return [f := (x if x > f else f) + t for x in ready]


def _held_run(held, keys) -> int:
    """How many leading `keys` are in `held`."""
    return next(compress(count(), map(not_, map(held.__contains__, keys))), len(keys))


def _queue_last(ready: list[float], f: float, t: float) -> float:
    """The last of `_queue(ready, f, t)`, without the list."""
    if ready[0] > f:
        if all(map(ge, islice(ready, 1, None), map(add, ready, repeat(t)))):
            return ready[-1] + t
    else:
        ends = accumulate(repeat(t, len(ready)), initial=f)
        if all(map(le, ready, ends)):  # (the n ends before the last)
            return next(ends)
    for x in ready:
        f = (x if x > f else f) + t
    return f


def _touch_all(cache, keys) -> None:
    """`cache.touch` of each of `keys`, in order (an LRU's in one call)."""
    if type(cache) is LRU:
        if cache.log is not None:
            cache.logged(keys)
        else:
            deque(map(cache.members.move_to_end, keys), 0)
    else:
        deque(map(cache.touch, keys), 0)


def make_tier_store(config: SimConfig, log_events: bool = False) -> TierStore:
    """The tiers of a configuration (`config.tiers` must be set): chunks of `tier_chunk_tokens`,
    their bytes from the model's K/V per token, the host link of the GPU."""
    chunk = config.tier_chunk_tokens
    return TierStore(config.tiers, config.cache.block_size, chunk, chunk * config.kv_bytes_per_token,
                     config.gpu.host_link_gbps, config.gpu.transfer_latency_s, log_events)

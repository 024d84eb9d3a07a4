"""The tier store's chunk-table work of one run, replayed through dicts and through numpy arrays.

    python benchmarks/tier_tables_replay.py [--config wait|recompute|host] [--repeats 3]

Runs the Mooncake synthetic trace as benchmarks/tiers_speed.py does (vllm-v1, one-block chunks,
host 256 GiB written through, disk 2 TiB written back, LRU), its chunks in the tiers' own tables
(`TierStore.runs` off), and records the batched tier store's table operations in order: each
store of a step's computed chunks (`TierStore._store_batch`), each match of a lookup's keys
(`_match`), each computation of load ends (`_ends`) and each touch of a lookup's hits
(`_touch_all`). It then replays them, alternating, best of `--repeats`, timed per kind:

* dicts: the operations as the tier store performs them (an OrderedDict in recency order for the
  host, a dict for the disk with its touches logged, membership by `in`, a `setdefault` per
  written-back victim, landing and write times chained in Python);
* arrays: per tier a numpy table of slots (slot = multiplicative hash of the key, 4 slots per
  chunk), a recency stamp and a landing time per slot, a log of (slot, stamp) touches from which
  the LRU victims are the oldest entries whose stamp is still current; a step's keys go through a
  few numpy calls per table; the landing and write times stay chained in Python (numpy's
  vectorised max-plus would not give the same floats).

The arrays' replay omits work a complete table needs (a key whose slot another key holds
overwrites it, counted as "collisions", where a complete table would probe further or keep it
aside), so its time is a lower bound of that design's table work. Neither replay includes the
tier store's other work (counters, onload plans, commits' bookkeeping).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict, defaultdict, deque
from itertools import accumulate, filterfalse, islice, repeat
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tiers_speed  # noqa: E402

import blocksim.memory.tiers as tiers  # noqa: E402
from blocksim.engine import Engine  # noqa: E402
from blocksim.experiments.runner import build_config, load_trace  # noqa: E402
from blocksim.policies import make_cost_model  # noqa: E402

CONFIGS = {"wait": "gpu + host 256 GiB + disk 2 TiB, wait",
           "recompute": "gpu + host 256 GiB + disk 2 TiB, recompute",
           "host": "gpu + host 256 GiB"}
T_D2H_S, T_DISK_WRITE_S, T_H2D_S = 1e-4, 3e-4, 1e-4  # transfer prices (they do not change the work)
HASH = np.uint64(0x9E3779B97F4A7C15)


def record(name: str) -> tuple[list[int], list[tuple]]:
    """The tiers' capacities (chunks) and the table operations of one run of `name`, in order."""
    policy, options = tiers_speed.CONFIGS[name]
    base = build_config("vllm-v1", cost_profile=tiers_speed.PROFILE)
    trace = load_trace(str(tiers_speed.TRACE), clip_max_len=base.model.max_model_len)
    cfg = build_config(policy, cost_profile=tiers_speed.PROFILE, **options)
    events: list[tuple] = []
    stores = []
    store_cls = tiers.TierStore
    originals = (store_cls.__init__, store_cls._store_batch, store_cls._match, store_cls._ends, tiers._touch_all)
    init, store_batch, match, ends, touch_all = originals

    def rec_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        stores.append(self)

    def rec_store(self, keys):
        events.append(("store", -1, list(keys)))
        return store_batch(self, keys)

    def rec_match(self, keys):
        events.append(("match", -1, list(keys)))
        return match(self, keys)

    def rec_ends(self, keys, n):
        events.append(("ends", -1, list(keys[:n])))
        return ends(self, keys, n)

    def rec_touch(cache, keys):
        keys = list(keys)
        events.append(("touch", 0 if cache is stores[-1].levels[0].cache else 1, keys))
        return touch_all(cache, keys)

    store_cls.__init__, store_cls._store_batch, store_cls._match, store_cls._ends = rec_init, rec_store, rec_match, rec_ends
    tiers._touch_all = rec_touch
    store_cls.runs = False  # the tiers' tables from the start (not the position runs), so that their operations show
    try:
        Engine(cfg, trace, make_cost_model(cfg, tiers_speed.PROFILE)).run()
    finally:
        store_cls.__init__, store_cls._store_batch, store_cls._match, store_cls._ends, tiers._touch_all = originals
        store_cls.runs = True
    return [lv.capacity for lv in stores[-1].levels], events


def replay_dicts(caps: list[int], events: list[tuple], spent: dict) -> int:
    host: OrderedDict = OrderedDict()
    disk: dict = {}
    disk_log: list = []
    host_cap = caps[0]
    has_disk = len(caps) > 1
    disk_free_s = 0.0
    clock = time.perf_counter
    for kind, tier, keys in events:
        t0 = clock()
        if kind == "store":
            new = list(filterfalse(host.__contains__, keys))
            if new:
                host.update(zip(new, accumulate(repeat(T_D2H_S, len(new)))))
                excess = len(host) - host_cap
                if excess > 0:
                    victims = list(islice(host, excess))
                    landed = list(map(host.pop, victims))
                    if has_disk:
                        put, f = disk.setdefault, disk_free_s
                        for v, x in zip(victims, landed):
                            end = (x if x > f else f) + T_DISK_WRITE_S
                            if put(v, end) is end:
                                f = end
                        disk_free_s = f
        elif kind == "match":
            for k in keys:
                if k not in disk and k not in host:
                    break
        elif kind == "ends":
            landed = list(map(host.get, keys))
            landed = [x if x is not None else disk[k] for x, k in zip(landed, keys)]
            f = 0.0
            [f := (x if x > f else f) + T_H2D_S for x in landed]
        elif tier == 0:
            deque(map(host.move_to_end, keys), 0)
        else:  # a disk below capacity logs its touches (`blocksim.memory.eviction.LRU`)
            disk_log.extend(keys)
        spent[kind] += clock() - t0
    return 0


class ArrayTier:
    """One tier's chunks in numpy arrays: key, recency stamp and landing time per slot, and a log
    of (slot, stamp) touches, oldest first, whose entries with a current stamp give the LRU order."""

    def __init__(self, capacity: int, slots_per_chunk: int = 4) -> None:
        bits = (capacity * slots_per_chunk - 1).bit_length()
        self.shift = np.uint64(64 - bits)
        self.keys = np.zeros(1 << bits, np.int64)
        self.stamps = np.zeros(1 << bits, np.int64)
        self.landed_s = np.zeros(1 << bits, np.float64)
        self.capacity, self.count = capacity, 0
        self.log_slots = np.zeros(8 * capacity + 1024, np.intp)
        self.log_stamps = np.zeros(8 * capacity + 1024, np.int64)
        self.head = self.tail = 0

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.view(np.uint64) * HASH) >> self.shift).astype(np.intp)

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        slots = self.slots(keys)
        return slots, self.keys[slots] == keys

    def log(self, slots: np.ndarray, stamps: np.ndarray) -> None:
        n = len(slots)
        if self.tail + n > len(self.log_slots):  # keep the current entries only
            live = slice(self.head, self.tail)
            ok = self.stamps[self.log_slots[live]] == self.log_stamps[live]
            kept_slots, kept_stamps = self.log_slots[live][ok], self.log_stamps[live][ok]
            self.head, self.tail = 0, len(kept_slots)
            self.log_slots[:self.tail], self.log_stamps[:self.tail] = kept_slots, kept_stamps
        self.log_slots[self.tail:self.tail + n] = slots
        self.log_stamps[self.tail:self.tail + n] = stamps
        self.tail += n

    def insert(self, keys: np.ndarray, slots: np.ndarray, landed_s, stamp: int) -> tuple[int, int]:
        """Store `keys` at `slots` (stamps from `stamp` on); returns the next stamp and how many
        slots were taken by another key."""
        stamps = np.arange(stamp, stamp + len(keys))
        collisions = len(keys) - int(np.count_nonzero(self.keys[slots] == 0))
        self.keys[slots], self.stamps[slots], self.landed_s[slots] = keys, stamps, landed_s
        self.count += len(keys)
        self.log(slots, stamps)
        return stamp + len(keys), collisions

    def touch(self, keys: np.ndarray, stamp: int) -> int:
        slots = self.slots(keys)
        stamps = np.arange(stamp, stamp + len(keys))
        self.stamps[slots] = stamps
        self.log(slots, stamps)
        return stamp + len(keys)

    def evict(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Drop the `n` least recently used chunks; their keys and landing times, oldest first."""
        found, need, pos = [], n, self.head
        while need:
            seg = slice(pos, min(pos + 2 * need + 64, self.tail))
            slots = self.log_slots[seg]
            live = np.flatnonzero(self.stamps[slots] == self.log_stamps[seg])[:need]
            found.append(slots[live])
            need -= len(live)
            pos = seg.start + int(live[-1]) + 1 if not need else seg.stop
        self.head = pos
        slots = np.concatenate(found) if len(found) > 1 else found[0]
        keys, landed = self.keys[slots], self.landed_s[slots]
        self.keys[slots] = 0
        self.stamps[slots] = 0
        self.count -= n
        return keys, landed


def replay_arrays(caps: list[int], events: list[tuple], spent: dict) -> int:
    host = ArrayTier(caps[0])
    disk = ArrayTier(caps[1]) if len(caps) > 1 else None
    stamp, disk_free_s, collisions = 1, 0.0, 0
    clock = time.perf_counter
    for kind, tier, key_list in events:
        t0 = clock()
        keys = np.array(key_list, np.int64)
        if kind == "store":
            slots, held = host.find(keys)
            if not held.all():
                new = ~held
                landed = np.cumsum(np.full(int(np.count_nonzero(new)), T_D2H_S))
                stamp, c = host.insert(keys[new], slots[new], landed, stamp)
                collisions += c
                excess = host.count - host.capacity
                if excess > 0:
                    victims, victim_landed = host.evict(excess)
                    if disk is not None:
                        disk_slots, on_disk = disk.find(victims)
                        if not on_disk.all():
                            write = ~on_disk
                            f, ends = disk_free_s, []
                            for x in victim_landed[write].tolist():
                                f = (x if x > f else f) + T_DISK_WRITE_S
                                ends.append(f)
                            disk_free_s = f
                            stamp, c = disk.insert(victims[write], disk_slots[write], ends, stamp)
                            collisions += c
        elif kind == "match":
            held = host.find(keys)[1]
            if disk is not None:
                held |= disk.find(keys)[1]
            len(keys) if held.all() else int(held.argmin())
        elif kind == "ends":
            slots, held = host.find(keys)
            landed = host.landed_s[slots]
            if disk is not None and not held.all():
                landed = np.where(held, landed, disk.landed_s[disk.slots(keys)])
            f = 0.0
            [f := (x if x > f else f) + T_H2D_S for x in landed.tolist()]
        else:
            stamp = (host if tier == 0 else disk).touch(keys, stamp)
        spent[kind] += clock() - t0
    return collisions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="wait")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    caps, events = record(CONFIGS[a.config])
    counts: dict = defaultdict(lambda: [0, 0])
    for kind, _, keys in events:
        counts[kind][0] += 1
        counts[kind][1] += len(keys)
    print(f"{CONFIGS[a.config]}: capacities {caps} chunks; "
          + ", ".join(f"{k} {n:,} calls / {m:,} keys" for k, (n, m) in counts.items()))
    best: dict = {}
    for _ in range(a.repeats):
        for replay in (replay_dicts, replay_arrays):
            spent: dict = defaultdict(float)
            t0 = time.perf_counter()
            collisions = replay(caps, events, spent)
            total = time.perf_counter() - t0
            if total < best.get(replay.__name__, (float("inf"),))[0]:
                best[replay.__name__] = (total, dict(spent), collisions)
    for name, (total, spent, collisions) in best.items():
        parts = ", ".join(f"{k} {v:.3f} s ({v / counts[k][0] * 1e6:.0f} us/call)" for k, v in spent.items())
        extra = f"; collisions {collisions:,}" if name == "replay_arrays" else ""
        print(f"{name:<14} {total:.3f} s: {parts}{extra}")


if __name__ == "__main__":
    main()

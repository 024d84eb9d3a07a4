"""An independent recount of the KV tiers' hits: plain-list LRU, LFU and ARC and the three write
policies, replayed over the events a run logged (`Engine(..., log_tier_events=True)`).

Written from the policies' definitions, sharing no code with `blocksim.memory`: each policy keeps
its keys in plain lists and scans them (slow, and obviously right on small runs).
"""

from __future__ import annotations


class ListLRU:
    def __init__(self, capacity):
        self.capacity, self.order = capacity, []  # least recent first

    def has(self, k):
        return k in self.order

    def hit(self, k):
        self.order.remove(k)
        self.order.append(k)

    def put(self, k):
        out = []
        while len(self.order) >= self.capacity:
            out.append(self.order.pop(0))
        self.order.append(k)
        return out

    def held(self):
        return list(self.order)


class ListLFU:
    """Evicts the fewest accesses; among equals, the key whose count last changed earliest."""

    def __init__(self, capacity):
        self.capacity, self.count, self.changed, self.clock = capacity, {}, {}, 0

    def has(self, k):
        return k in self.count

    def _tick(self, k):
        self.clock += 1
        self.changed[k] = self.clock

    def hit(self, k):
        self.count[k] += 1
        self._tick(k)

    def put(self, k):
        out = []
        while len(self.count) >= self.capacity:
            victim = min(self.count, key=lambda x: (self.count[x], self.changed[x]))
            del self.count[victim], self.changed[victim]
            out.append(victim)
        self.count[k] = 1
        self._tick(k)
        return out

    def held(self):
        return list(self.count)


class ListARC:
    """ARC as in Megiddo and Modha's Fig. 4, with a store (not a lookup miss) as the request that
    enters a key; lists hold the least recent key first."""

    def __init__(self, c):
        self.c, self.p = c, 0.0
        self.T1, self.T2, self.B1, self.B2 = [], [], [], []

    def has(self, k):
        return k in self.T1 or k in self.T2

    def hit(self, k):
        (self.T1 if k in self.T1 else self.T2).remove(k)
        self.T2.append(k)

    def _replace(self, k_in_b2, out):
        if len(self.T1) + len(self.T2) < self.c:
            return
        if len(self.T1) >= 1 and ((k_in_b2 and len(self.T1) == self.p) or len(self.T1) > self.p):
            v = self.T1.pop(0)
            self.B1.append(v)
        else:
            v = self.T2.pop(0)
            self.B2.append(v)
        out.append(v)

    def put(self, k):
        out = []
        if k in self.B1:
            self.p = min(self.c, self.p + max(len(self.B2) / len(self.B1), 1))
            self._replace(False, out)
            self.B1.remove(k)
            self.T2.append(k)
        elif k in self.B2:
            self.p = max(0, self.p - max(len(self.B1) / len(self.B2), 1))
            self._replace(True, out)
            self.B2.remove(k)
            self.T2.append(k)
        else:
            if len(self.T1) + len(self.B1) == self.c:
                if len(self.T1) < self.c:
                    self.B1.pop(0)
                    self._replace(False, out)
                else:
                    out.append(self.T1.pop(0))
            elif len(self.T1) + len(self.B1) < self.c:
                n = len(self.T1) + len(self.T2) + len(self.B1) + len(self.B2)
                if n >= self.c:
                    if n == 2 * self.c:
                        self.B2.pop(0)
                    self._replace(False, out)
            self.T1.append(k)
        return out

    def held(self):
        return self.T1 + self.T2


POLICIES = {"lru": ListLRU, "lfu": ListLFU, "arc": ListARC}


class Recount:
    """Tiers (host then disk, those present) replaying the logged events; counts hits, stores and
    evictions per tier."""

    def __init__(self, tiers: list[tuple[str, int, str, str]], write_hits: int):
        """`tiers`: (name, capacity in chunks, eviction, write policy), top first."""
        self.names = [t[0] for t in tiers]
        self.caches = [POLICIES[t[2]](t[1]) for t in tiers]
        self.writes = [t[3] for t in tiers]
        self.n = write_hits
        self.gpu_count: dict = {}
        self.counts: list[dict] = [{} for _ in tiers]
        self.hits = [0] * len(tiers)
        self.stores = [0] * len(tiers)
        self.evictions = [0] * len(tiers)
        self.capacities = [t[1] for t in tiers]

    def _store(self, i, k):
        for v in self.caches[i].put(k):
            self.evictions[i] += 1
            self.counts[i].pop(v, None)
            if i + 1 < len(self.caches) and self.writes[i + 1] == "write-back" and not self.caches[i + 1].has(v):
                self._store(i + 1, v)
        self.stores[i] += 1
        if i + 1 < len(self.caches) and self.writes[i + 1] == "write-through" and not self.caches[i + 1].has(k):
            self._store(i + 1, k)
        assert len(self.caches[i].held()) <= self.capacities[i]

    def replay(self, events):
        top = self.writes[0]
        for e in events:
            kind, k = e[0], e[1]
            if kind == "computed":
                if top == "write-through" and not self.caches[0].has(k):
                    self._store(0, k)
            elif kind == "gpu_hit":
                if not self.caches[0].has(k):
                    self.gpu_count[k] = self.gpu_count.get(k, 0) + 1
                    if self.gpu_count[k] >= self.n:
                        del self.gpu_count[k]
                        self._store(0, k)
            elif kind == "gpu_evict":
                if not self.caches[0].has(k):
                    self._store(0, k)
            else:  # ("lookup", keys, found by the run, loaded by the run)
                keys, found, used = k, e[2], e[3]
                where = []
                for key in keys:
                    tier = next((i for i, c in enumerate(self.caches) if c.has(key)), None)
                    if tier is None:
                        break
                    where.append(tier)
                assert len(where) == found, f"lookup of {len(keys)} keys: recount finds {len(where)}, run {found}"
                later = []
                for key, i in zip(keys[:used], where):
                    self.caches[i].hit(key)
                    self.hits[i] += 1
                    if i + 1 < len(self.caches) and self.writes[i + 1] == "write-through-selective":
                        later.append((i, key))
                for i, key in later:
                    if self.caches[i].has(key) and not self.caches[i + 1].has(key):
                        c = self.counts[i][key] = self.counts[i].get(key, 0) + 1
                        if c >= self.n:
                            del self.counts[i][key]
                            self._store(i + 1, key)
        return self

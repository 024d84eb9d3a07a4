"""Eviction policies of a KV tier: which chunk key leaves a full tier.

Each policy holds at most `capacity` keys, each with a value (a tier keeps the time the chunk's
copy lands), and sees two events: `insert(key, value)` (a chunk is stored; returns the (key, value)
pairs evicted to make room, in eviction order) and `touch(key)` (a stored chunk is hit).

* `LRU`: the least recently inserted or hit key leaves first.
* `LFU`: the key with the fewest accesses (insert counts one, each hit one more) leaves first;
  among equals, the one whose count changed least recently.
* `ARC` (Megiddo and Modha, FAST 2003): a recency list T1 (keys seen once since they entered) and a
  frequency list T2 (keys hit again), with ghost lists B1 and B2 of keys recently evicted from
  each; the target size `p` of T1 grows when a key evicted from T1 is stored again and shrinks when
  one from T2 is. A tier's lookups do not insert on a miss (the chunk is stored later, when it is
  computed or evicted above), so a ghost hit happens at `insert`.

Invariant after every call: `len(self) <= capacity`; a key is held at most once; `members` (a
dict, for fast membership tests and the values) maps exactly the keys held to their values. An
LRU's `members` is its recency order itself (least recent first, an OrderedDict) once it has
evicted, so that a tier can insert and evict a batch of keys with whole-dict operations; until then
it is a plain dict, its touches are logged (`LRU.log`) and `LRU.order()` applies them.
"""

from __future__ import annotations

from collections import OrderedDict


class LRU:
    """Until the tier first has to evict, its recency order is not kept at each event: `members`
    is a plain dict (key -> value, in insertion order) and `log` lists the keys touched since, and
    the keys inserted after a touch, in order; `order()` replays the log (each key moved to the end
    at its events, so its last event decides its place). At the first eviction (`ordered()`),
    `members` becomes an OrderedDict in recency order and stays one: each touch moves the key to
    its end. A tier below capacity, a disk tier mostly, pays one list append per touch and a plain
    dict's insert per store. (Callers re-read `members` after an insert: it may be a new dict.)"""

    LOG_PER_SLOT = 4

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.members: dict[int, object] = {}
        #: the keys touched since the last `order()` and those inserted after a touch, in order;
        #: None once the tier has evicted
        self.log: list[int] | None = []
        self._log_limit = self.LOG_PER_SLOT * capacity + 64

    def __contains__(self, key: int) -> bool:
        return key in self.members

    def __len__(self) -> int:
        return len(self.members)

    def order(self) -> dict:
        """`members` in recency order, least recent first (the log replayed)."""
        log, m = self.log, self.members
        if log:
            m.update(zip(log, map(m.pop, log)))  # each logged key re-inserted at the end, in order
            log.clear()
        return m

    def ordered(self) -> OrderedDict:
        """`members` as an OrderedDict in recency order, kept so from now on (the tier evicts)."""
        if self.log is not None:
            self.members = OrderedDict(self.order())
            self.log = None
        return self.members

    def logged(self, keys) -> None:
        """Record touches of `keys` (in order) while the order is logged."""
        log = self.log
        log.extend(keys)
        if len(log) > self._log_limit:
            self.order()

    def inserted(self, keys) -> None:
        """Record inserts of `keys` (in order, just inserted at the end of `members`) while the order
        is logged: needed only after a logged touch, which they must follow."""
        if self.log:
            self.logged(keys)

    def keys(self) -> list[int]:
        return list(self.order())

    def touch(self, key: int) -> None:
        log = self.log
        if log is None:
            self.members.move_to_end(key)
        else:
            log.append(key)
            if len(log) > self._log_limit:
                self.order()

    def insert(self, key: int, value=None) -> list[tuple]:
        out = []
        if len(self.members) >= self.capacity:
            m = self.ordered()
            while len(m) >= self.capacity:
                out.append(m.popitem(last=False))
        self.members[key] = value
        if self.log:  # after a logged touch (`inserted`)
            self.logged((key,))
        return out


class LFU:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._freq: dict[int, int] = {}
        self.members: dict[int, object] = {}
        self._buckets: dict[int, OrderedDict[int, None]] = {}  # access count -> keys, least recent first
        self._min = 0

    def __contains__(self, key: int) -> bool:
        return key in self._freq

    def __len__(self) -> int:
        return len(self._freq)

    def keys(self) -> list[int]:
        return list(self._freq)

    def _bucket(self, f: int) -> OrderedDict:
        b = self._buckets.get(f)
        if b is None:
            b = self._buckets[f] = OrderedDict()
        return b

    def touch(self, key: int) -> None:
        f = self._freq[key]
        b = self._buckets[f]
        del b[key]
        if not b:
            del self._buckets[f]
            if self._min == f:
                self._min = f + 1
        self._freq[key] = f + 1
        self._bucket(f + 1)[key] = None

    def insert(self, key: int, value=None) -> list[tuple]:
        out = []
        while len(self._freq) >= self.capacity:
            b = self._buckets[self._min]
            victim = b.popitem(last=False)[0]
            if not b:
                del self._buckets[self._min]
            del self._freq[victim]
            out.append((victim, self.members.pop(victim)))
            if self._freq and self._min not in self._buckets:
                self._min = min(self._buckets)
        self._freq[key] = 1
        self.members[key] = value
        self._bucket(1)[key] = None
        self._min = 1
        return out


class ARC:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.members: dict[int, object] = {}

    def __contains__(self, key: int) -> bool:
        return key in self.members

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def keys(self) -> list[int]:
        return [*self.t1, *self.t2]

    def touch(self, key: int) -> None:
        if key in self.t1:
            del self.t1[key]
        else:
            del self.t2[key]
        self.t2[key] = None

    def _replace(self, in_b2: bool, out: list[tuple]) -> None:
        """Evict one key from T1 or T2 (to its ghost list) when the cache is full."""
        if len(self.t1) + len(self.t2) < self.capacity:
            return
        if self.t1 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p)):
            victim = self.t1.popitem(last=False)[0]
            self.b1[victim] = None
        else:
            victim = self.t2.popitem(last=False)[0]
            self.b2[victim] = None
        out.append((victim, self.members.pop(victim)))

    def insert(self, key: int, value=None) -> list[tuple]:
        c, out = self.capacity, []
        if key in self.b1:
            self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            self._replace(False, out)
            del self.b1[key]
            self.t2[key] = None
            self.members[key] = value
            return out
        if key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            self._replace(True, out)
            del self.b2[key]
            self.t2[key] = None
            self.members[key] = value
            return out
        l1 = len(self.t1) + len(self.b1)
        if l1 >= c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                self._replace(False, out)
            else:
                victim = self.t1.popitem(last=False)[0]
                out.append((victim, self.members.pop(victim)))
        else:
            total = l1 + len(self.t2) + len(self.b2)
            if total >= c:
                if total >= 2 * c:
                    self.b2.popitem(last=False)
                self._replace(False, out)
        self.t1[key] = None
        self.members[key] = value
        return out


EVICTION = {"lru": LRU, "lfu": LFU, "arc": ARC}


def make_eviction(name: str, capacity: int):
    return EVICTION[name](capacity)

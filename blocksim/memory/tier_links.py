"""The transfer channels of the KV tiers: the host link each way and the disk, read and write.

A `Link` serves one transfer at a time in the order they are issued (a first-come-first-served
server of capacity one, as a `simpy.Resource(capacity=1)` whose holders each hold it for their
transfer time): a transfer of `nbytes` that may start at `ready_s` starts when the link is free,
and takes `latency_s + nbytes / (gbps * 1e9)`. The ends are known when a transfer is issued, so
the channels are kept as the time each becomes free rather than as SimPy processes: the engine
never has to wake for a transfer, only for a request whose chunks have landed.

In a run whose moves are executed (`TierStore.attach_mover`), each transfer's duration is the
executor's measurement of that move; the queue discipline is the same.
"""

from __future__ import annotations


class Link:
    __slots__ = ("name", "bytes_per_s", "latency_s", "free_s", "busy_s", "bytes")

    def __init__(self, name: str, gbps: float, latency_s: float) -> None:
        self.name = name
        self.bytes_per_s = gbps * 1e9
        self.latency_s = latency_s
        self.free_s = 0.0  # when the last transfer issued ends
        self.busy_s = 0.0
        self.bytes = 0

    def set_chunk_seconds(self, seconds: float) -> None:
        """Price every transfer at `seconds` (measured per chunk: all chunks have one size)."""
        self.latency_s = seconds
        self.bytes_per_s = float("inf")

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def end_s(self, ready_s: float, nbytes: int, free_s: float | None = None) -> float:
        """When a transfer that may start at `ready_s` would end (the link's queue included);
        `free_s` stands for the link's own free time in a what-if."""
        start = max(ready_s, self.free_s if free_s is None else free_s)
        return start + self.seconds(nbytes)

    def transfer(self, ready_s: float, nbytes: int, seconds: float | None = None) -> float:
        """Issue a transfer; returns its end. `seconds`: its measured duration (an executed run's
        move), instead of the link's price."""
        if seconds is None:
            seconds = self.seconds(nbytes)
        end = max(ready_s, self.free_s) + seconds
        self.free_s = end
        self.busy_s += seconds
        self.bytes += nbytes
        return end

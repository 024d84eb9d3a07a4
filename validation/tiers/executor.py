"""`TierExecutor`: moves chunks of a paged KV cache between the GPU, a host-memory tier and a disk tier.

A chunk is ``chunk_blocks`` GPU blocks of one sequence, in order; its bytes are those blocks'
rows in every cache tensor of every layer (K and V), laid out ``[cache tensor, block, block
bytes]`` in one contiguous row of ``chunk_bytes``. Any cache layout whose first dimension is the
block works: the vLLM layout's separate K and V caches, or the fast layout's K / V views of one
storage per layer (the storage is what gets copied, K and V together).

The tiers:

* host: ``host_chunks`` slots of one buffer, page-locked on CUDA (plain memory on the CPU, where
  torch cannot pin);
* disk: ``disk_chunks`` slots of one file (`validation.tiers.disk.DiskTier`: direct I/O where the
  file system allows, else buffered with fdatasync and DONTNEED; `disk_mode` says which).

The moves (`validation.tiers.ops.MOVES`), each on a batch of chunks:

* store gpu->host: the chunks' blocks are gathered from every cache tensor into a GPU staging
  buffer (one ``index_select`` per cache tensor for the whole batch), then one device-to-host copy
  per chunk into its host slot;
* store gpu->disk: the same into a page-locked bounce row, then the file write;
* store host->disk: the file write straight from the host slot;
* load host->gpu: one host-to-device copy per chunk into the staging, then a scatter into the
  chunks' GPU blocks (one ``index_copy_`` per cache tensor for the whole batch);
* load disk->gpu: the file read into a bounce row, then as from the host;
* drop: the key's slot is freed (a GPU drop has nothing to free).

On CUDA the copies run on a side stream: a store first waits for the work queued on the caller's
stream (the blocks hold the step's data), and the caller's stream waits for the gather before it
can overwrite the blocks; after a load the caller's stream waits for the scatter, so the step's
attention reads the restored blocks. The host waits for the side stream before it touches a
page-locked row (a file write from a slot the GPU is still filling, a file read into a bounce row
still being copied).

Checksums (`validation.tiers.checksum`): each chunk stored from the GPU gets a checksum of its
staged bytes, computed on the GPU; it moves with the chunk between tiers. Each load gathers the
restored blocks back out of the caches and checksums them again; `mismatches()` counts the loads
whose checksum differs from the stored one (`mismatched` names them). The checks run on the side
stream after each move's timed copies.

Timing, per batch (`records()`): CUDA events around the gather, the copy and the scatter on the
side stream (with ``lead=True`` a sleep queued first keeps the host's launch path out of them:
GPU time); ``perf_counter`` around the file reads and writes; ``wall_s`` the host's time for the
whole call including the waits. On the CPU every part is ``perf_counter`` time.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from validation.tiers.checksum import Checksum
from validation.tiers.disk import DiskTier, aligned_empty, round_up
from validation.tiers.ops import MOVES, TierOpError

LEAD_S_PER_LAUNCH = 50e-6
CLOCK_HZ = 2.0e9


def block_tensors(caches) -> list:
    """The distinct contiguous tensors holding the blocks of ``caches`` (each cache, or the
    storage a non-contiguous cache is a view of), in first-seen order."""
    out, seen = [], set()
    for c in caches:
        t = c if c.is_contiguous() else c._base
        if t is None or not t.is_contiguous() or t.shape[0] != c.shape[0]:
            raise ValueError(f"a cache of shape {tuple(c.shape)} is neither contiguous nor a view of a contiguous "
                             f"storage with blocks first")
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)
    return out


class _Slots:
    """key -> slot of one tier, with its free slots (free + used == capacity after every call)."""

    def __init__(self, tier: str, capacity: int) -> None:
        self.tier, self.capacity = tier, capacity
        self.slot: dict[int, int] = {}
        self.free = list(range(capacity - 1, -1, -1))

    def take(self, key: int) -> int:
        if key in self.slot:
            raise TierOpError(f"{self.tier} tier: key {key} is already stored there; a tier holds one copy per key")
        if not self.free:
            raise TierOpError(f"{self.tier} tier: full ({self.capacity} chunks) storing key {key}; drop a chunk first")
        s = self.slot[key] = self.free.pop()
        return s

    def find(self, key: int) -> int:
        s = self.slot.get(key)
        if s is None:
            raise TierOpError(f"{self.tier} tier: holds no copy of key {key}; store it there first")
        return s

    def drop(self, key: int) -> None:
        self.free.append(self.find(key))
        del self.slot[key]


class TierExecutor:
    """Host and disk tiers for the paged caches ``key_caches`` / ``value_caches`` (one per layer)."""

    def __init__(self, key_caches, value_caches, *, chunk_blocks: int, host_chunks: int, disk_chunks: int = 0,
                 disk_path: str | Path | None = None, direct_io: bool = True, io_threads: int = 4,
                 staging_chunks: int = 8, verify: bool = True, lead: bool = False) -> None:
        import torch
        self.torch = torch
        self.tensors = [t.view(torch.uint8).view(t.shape[0], -1) for t in block_tensors([*key_caches, *value_caches])]
        self.device = self.tensors[0].device
        self.cuda = self.device.type == "cuda"
        self.num_gpu_blocks = min(t.shape[0] for t in self.tensors)
        sizes = {t.shape[1] for t in self.tensors}
        if len(sizes) != 1:
            raise ValueError(f"cache tensors hold blocks of different sizes {sorted(sizes)} bytes")
        self.block_bytes = sizes.pop()
        self.chunk_blocks = int(chunk_blocks)
        self.chunk_bytes = len(self.tensors) * self.chunk_blocks * self.block_bytes
        self.slot_bytes = round_up(self.chunk_bytes)
        self.staging_chunks = int(staging_chunks)
        self.verify, self.lead = verify, lead and self.cuda
        pin = self.cuda
        self.host = aligned_empty(torch, max(1, host_chunks), self.slot_bytes, pin=pin)
        self.bounce = aligned_empty(torch, self.staging_chunks, self.slot_bytes, pin=pin)
        self.staging = torch.empty(self.staging_chunks * self.chunk_bytes, dtype=torch.uint8, device=self.device)
        self.slots = {"host": _Slots("host", host_chunks), "disk": _Slots("disk", disk_chunks)}
        self.disk = None
        if disk_chunks:
            if disk_path is None:
                raise ValueError("a disk tier needs disk_path")
            self.disk = DiskTier(disk_path, disk_chunks, self.slot_bytes, direct=direct_io, io_threads=io_threads,
                                 probe_buffer=self.bounce[0])
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.checksum = Checksum(torch, self.chunk_bytes)
        self.sums: dict[str, dict[int, object]] = {"host": {}, "disk": {}}
        self._checks: list[tuple] = []   # (step, key, src, restored checksum, stored checksum)
        self._pending: list[dict] = []
        self._done: list[dict] = []
        self._mismatched: list[dict] = []
        self.checked_loads = 0
        self.step = -1

    # --- properties ---------------------------------------------------------------------------------
    @property
    def disk_mode(self) -> str:
        return self.disk.mode if self.disk else "none"

    @property
    def disk_reason(self) -> str:
        return self.disk.reason if self.disk else "no disk tier"

    def held(self, tier: str) -> set[int]:
        return set(self.slots[tier].slot)

    # --- timing helpers -----------------------------------------------------------------------------
    def _event(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record(self.stream)
            return e
        return time.perf_counter()

    def _lead_sleep(self, launches: int) -> None:
        if self.lead:
            with self.torch.cuda.stream(self.stream):
                self.torch.cuda._sleep(int(launches * LEAD_S_PER_LAUNCH * CLOCK_HZ))

    def _side(self):
        if self.cuda:
            return self.torch.cuda.stream(self.stream)
        import contextlib
        return contextlib.nullcontext()

    def _host_wait(self) -> None:
        """The host waits for the side stream before touching a page-locked row."""
        if self.cuda:
            self.stream.synchronize()

    def _staged(self, n: int):
        """The staging of a batch of ``n`` chunks, cache-major: ``[cache tensor, chunk, block, bytes]``
        (one gather or scatter kernel per cache tensor); chunk ``i`` is ``[:, i]``, laid out as its
        host row."""
        return self.staging[:n * self.chunk_bytes].view(len(self.tensors), n, self.chunk_blocks, self.block_bytes)

    def _row(self, buf, i: int):
        """Row ``i`` of a host or bounce buffer, shaped as a chunk ``[cache tensor, block, bytes]``."""
        return buf[i, :self.chunk_bytes].view(len(self.tensors), self.chunk_blocks, self.block_bytes)

    def _index(self, gpu_blocks):
        ids = np.asarray(gpu_blocks, dtype=np.int64).reshape(-1, self.chunk_blocks)
        return self.torch.as_tensor(ids, device=self.device)

    def _gather(self, ids) -> None:
        st, flat = self._staged(len(ids)), ids.view(-1)
        for j, t in enumerate(self.tensors):
            self.torch.index_select(t, 0, flat, out=st[j].view(-1, self.block_bytes))

    def _scatter(self, ids) -> None:
        st, flat = self._staged(len(ids)), ids.view(-1)
        for j, t in enumerate(self.tensors):
            t.index_copy_(0, flat, st[j].view(-1, self.block_bytes))

    # --- moves --------------------------------------------------------------------------------------
    def apply(self, op: str, src: str, dst: str, keys, gpu_blocks=None) -> None:
        """Apply one move to a batch of chunks (`keys`, and their GPU blocks for moves from or to the GPU)."""
        if (op, src, dst) not in MOVES:
            raise TierOpError(f"{op} {src}->{dst} is not a tier move")
        keys = [int(k) for k in keys]
        for lo in range(0, len(keys), self.staging_chunks):
            part = keys[lo:lo + self.staging_chunks]
            blocks = None if gpu_blocks is None else gpu_blocks[lo:lo + self.staging_chunks]
            if src == "gpu":
                self._store_from_gpu(part, blocks, dst)
            elif op == "store":
                self._store_host_to_disk(part)
            else:
                self._load_to_gpu(part, blocks, src)

    def drop(self, key: int, tier: str) -> None:
        """Free ``key``'s slot in ``tier`` (nothing to free on the GPU)."""
        if tier != "gpu":
            self.slots[tier].drop(int(key))
            self.sums[tier].pop(int(key), None)

    def _record(self, move: str, keys, t: dict, disk_s: float, wall0: float, disk_bytes: int = 0) -> None:
        self._pending.append({"step": self.step, "move": move, "chunks": len(keys), "bytes": len(keys) * self.chunk_bytes,
                              "disk_bytes": disk_bytes, "events": t, "disk_s": disk_s,
                              "wall_s": time.perf_counter() - wall0})

    def _store_from_gpu(self, keys, blocks, dst: str) -> None:
        wall0 = time.perf_counter()
        n = len(keys)
        if self.cuda:
            self.stream.wait_stream(self.torch.cuda.current_stream(self.device))
        slots = [self.slots[dst].take(k) for k in keys]
        ids = self._index(blocks)
        target = self.host if dst == "host" else self.bounce
        if dst == "disk":
            self._host_wait()  # the bounce rows may still feed an earlier copy
        self._lead_sleep(2 * len(self.tensors) + n)
        with self._side():
            e0 = self._event()
            self._gather(ids)
            e1 = self._event()
            st = self._staged(n)
            for i in range(n):
                self._row(target, slots[i] if dst == "host" else i).copy_(st[:, i], non_blocking=True)
            e2 = self._event()
            if self.verify:
                for i, k in enumerate(keys):
                    self.sums[dst][k] = self.checksum.of(st[:, i])
        if self.cuda:
            self.torch.cuda.current_stream(self.device).wait_event(e1)  # the blocks may be overwritten after the gather
        disk_s, disk_bytes = 0.0, 0
        if dst == "disk":
            self._host_wait()
            d0 = time.perf_counter()
            disk_bytes = self.disk.write(slots, [self.bounce[i] for i in range(n)])
            disk_s = time.perf_counter() - d0
        self._record(f"gpu->{dst}", keys, {"gather_s": (e0, e1), "copy_s": (e1, e2)}, disk_s, wall0, disk_bytes)

    def _store_host_to_disk(self, keys) -> None:
        wall0 = time.perf_counter()
        src = [self.slots["host"].find(k) for k in keys]
        slots = [self.slots["disk"].take(k) for k in keys]
        self._host_wait()  # the host slots may still be filling
        d0 = time.perf_counter()
        n = self.disk.write(slots, [self.host[s] for s in src])
        disk_s = time.perf_counter() - d0
        for k in keys:
            if k in self.sums["host"]:
                self.sums["disk"][k] = self.sums["host"][k]
        self._record("host->disk", keys, {}, disk_s, wall0, n)

    def _load_to_gpu(self, keys, blocks, src: str) -> None:
        wall0 = time.perf_counter()
        n = len(keys)
        slots = [self.slots[src].find(k) for k in keys]
        ids = self._index(blocks)
        disk_s, disk_bytes = 0.0, 0
        if src == "disk":
            self._host_wait()  # the bounce rows may still feed an earlier copy
            d0 = time.perf_counter()
            disk_bytes = self.disk.read(slots, [self.bounce[i] for i in range(n)])
            disk_s = time.perf_counter() - d0
        source = self.host if src == "host" else self.bounce
        if self.cuda:
            self.stream.wait_stream(self.torch.cuda.current_stream(self.device))  # blocks free to overwrite
        self._lead_sleep(2 * len(self.tensors) + n)
        with self._side():
            e0 = self._event()
            st = self._staged(n)
            for i in range(n):
                st[:, i].copy_(self._row(source, slots[i] if src == "host" else i), non_blocking=True)
            e1 = self._event()
            self._scatter(ids)
            e2 = self._event()
            if self.verify:
                self._gather(ids)  # the restored blocks, read back out of the caches
                for i, k in enumerate(keys):
                    stored = self.sums[src].get(k)
                    if stored is not None:
                        self._checks.append((self.step, k, src, self.checksum.of(st[:, i]),
                                             stored))
            done = self._event()
        if self.cuda:
            self.torch.cuda.current_stream(self.device).wait_event(done)
        self._record(f"{src}->gpu", keys, {"copy_s": (e0, e1), "scatter_s": (e1, e2)}, disk_s, wall0, disk_bytes)

    # --- results ------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        if self.cuda:
            self.stream.synchronize()
            self.torch.cuda.synchronize(self.device)

    def _resolve(self) -> None:
        self.synchronize()
        for r in self._pending:
            ev = r.pop("events")
            for name, (a, b) in ev.items():
                r[name] = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            r["seconds"] = sum(r.get(p, 0.0) for p in ("gather_s", "copy_s", "scatter_s")) + r["disk_s"]
            self._done.append(r)
        self._pending = []
        for step, key, src, got, want in self._checks:
            self.checked_loads += 1
            if int(got) != int(want):
                self._mismatched.append({"step": step, "key": key, "src": src, "restored": int(got),
                                         "stored": int(want)})
        self._checks = []

    def records(self, since: int = 0) -> list[dict]:
        """Every batch moved so far (from the `since`-th on): step, move, chunks, bytes, the timed
        parts (seconds) and wall_s."""
        self._resolve()
        return self._done[since:]

    @property
    def batches(self) -> int:
        """Batches moved so far (resolved or not)."""
        return len(self._done) + len(self._pending)

    def mismatches(self) -> int:
        """Loads whose restored blocks' checksum differs from the chunk's stored one (synchronizes)."""
        self._resolve()
        return len(self._mismatched)

    @property
    def mismatched(self) -> list[dict]:
        self._resolve()
        return list(self._mismatched)

    def close(self) -> None:
        self.synchronize()
        if self.disk:
            self.disk.close()

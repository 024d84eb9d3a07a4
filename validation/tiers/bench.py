"""Transfer times of the five tier moves, by chunk size and chunks per batch, on one device.

For each chunk size (tokens; bytes = tokens x KV bytes per token of the model's layers, K and V)
and each batch (chunks moved by one call), a `TierExecutor` over fast-layout caches of the
model's shape moves the batch, in turn, gpu->host, host->disk, host->gpu, disk->gpu and
gpu->disk, the device drained between moves; one warm-up round, then ``reps`` timed rounds, and
the median of each move is kept. A move's ``seconds`` is its GPU time (CUDA events around the
gather, copy and scatter, with a sleep queued first so the host's launches stay out) plus its
file I/O time (the host waits for the file before going on, so the two add up); ``wall_s`` is the
host's time for the call. Checksums run on every load (outside the timed parts); the result
counts their mismatches.

The disk moves above reuse the same few slots of the file, so their writes land on blocks the
file system has allocated before. A disk tier's file is sparse until written, and each slot's
first write also allocates its blocks, which costs more, and a run writes most of its slots for
the first time until its tier fills. `fresh_writes` measures
host->disk writes into slots of a file never written before (a new file per chunk size, each
timed batch on slots of its own, removed after), the same file I/O as the tier's host->disk
move: the table ``tier_host_disk_fresh``.

The tables (`components`) are cost-profile components ("blocksim-profile/1"): one per move,
``tier_<src>_<dst>``, axes ``["chunk_bytes", "chunks"]``, the seconds of the whole batch.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from validation.tiers.disk import DiskTier, aligned_empty, round_up
from validation.tiers.executor import TierExecutor

MOVES = (("store", "gpu", "host"), ("store", "host", "disk"), ("load", "host", "gpu"), ("load", "disk", "gpu"),
         ("store", "gpu", "disk"))
FRESH = "tier_host_disk_fresh"
CHUNK_TOKENS = (16, 64, 256, 1024)
CHUNKS = (1, 4, 16)


def component_name(src: str, dst: str) -> str:
    return f"tier_{src}_{dst}"


def measure_tiers(*, num_layers: int, num_kv_heads: int, head_size: int, block_size: int = 16,
                  dtype: str = "float16", device: str = "cuda", disk_dir: str | Path = ".",
                  chunk_tokens=CHUNK_TOKENS, chunks=CHUNKS, reps: int = 5, direct_io: bool = True,
                  io_threads: int = 4, progress=None) -> dict:
    import torch

    import kernels
    dt, dev = getattr(torch, dtype), torch.device(device)
    cuda = dev.type == "cuda"
    kv_bytes_per_token = 2 * num_layers * num_kv_heads * head_size * torch.finfo(dt).bits // 8
    max_chunks = max(chunks)
    raw, tables = [], {component_name(s, d): np.zeros((len(chunk_tokens), len(chunks))) for _, s, d in MOVES}
    tables[FRESH] = np.zeros((len(chunk_tokens), len(chunks)))
    mismatches, checked, mode, reason = 0, 0, "none", ""
    for ci, ct in enumerate(chunk_tokens):
        if ct % block_size:
            raise ValueError(f"chunk of {ct} tokens is not a multiple of the block size {block_size}")
        cb = ct // block_size
        num_blocks = max_chunks * cb + 1
        ks, vs = [], []
        for _ in range(num_layers):
            k, v = kernels.allocate_fast_kv_cache(num_blocks, block_size, num_kv_heads, head_size, dt, dev)
            k.normal_()
            v.normal_()
            ks.append(k)
            vs.append(v)
        ex = TierExecutor(ks, vs, chunk_blocks=cb, host_chunks=max_chunks, disk_chunks=max_chunks,
                          disk_path=Path(disk_dir) / "tier_bench.kv", direct_io=direct_io, io_threads=io_threads,
                          staging_chunks=max_chunks, lead=cuda)
        mode, reason = ex.disk_mode, ex.disk_reason
        for ni, n in enumerate(chunks):
            keys = list(range(n))
            # each chunk's blocks: consecutive within the chunk, chunks spread over the cache
            blocks = [np.arange(i * cb, (i + 1) * cb) for i in range(n)]
            back = [np.arange((n - 1 - i) * cb, (n - i) * cb) for i in range(n)]  # restored elsewhere
            per = {m: [] for m in MOVES}
            for rep in range(reps + 1):
                for m in MOVES:
                    op, src, dst = m
                    if m == ("store", "gpu", "disk"):
                        for k in keys:
                            ex.drop(k, "disk")
                    ex.synchronize()
                    start = len(ex.records())
                    ex.apply(op, src, dst, keys, None if "gpu" not in (src, dst) else (blocks if src == "gpu" else back))
                    recs = ex.records()[start:]
                    if rep:
                        per[m].append({p: sum(r.get(p, 0.0) or 0.0 for r in recs)
                                       for p in ("seconds", "gather_s", "copy_s", "scatter_s", "disk_s", "wall_s")})
                for k in keys:
                    ex.drop(k, "host")
                    ex.drop(k, "disk")
            for m in MOVES:
                med = {p: float(np.median([x[p] for x in per[m]])) for p in per[m][0]}
                nbytes = n * ex.chunk_bytes
                row = {"move": f"{m[1]}->{m[2]}", "chunk_tokens": ct, "chunk_bytes": ex.chunk_bytes, "chunks": n,
                       "bytes": nbytes, **med, "gbps": nbytes / med["seconds"] / 1e9,
                       "wall_gbps": nbytes / med["wall_s"] / 1e9}
                raw.append(row)
                tables[component_name(m[1], m[2])][ci, ni] = med["seconds"]
                if progress:
                    progress(f"{row['move']:>10} {ct:5d} tokens x {n:2d}: {med['seconds'] * 1e3:8.3f} ms "
                             f"{row['gbps']:7.2f} GB/s (wall {med['wall_s'] * 1e3:8.3f} ms)")
        mismatches += ex.mismatches()
        checked += ex.checked_loads
        slot_bytes = ex.slot_bytes
        ex.close()
        del ks, vs, ex
        for ni, secs in enumerate(fresh_writes(torch, Path(disk_dir) / "tier_bench_fresh.kv", slot_bytes, chunks,
                                               reps=reps, direct_io=direct_io, io_threads=io_threads, pin=cuda)):
            n = chunks[ni]
            tables[FRESH][ci, ni] = secs
            raw.append({"move": "host->disk (new slots)", "chunk_tokens": ct, "chunk_bytes": slot_bytes, "chunks": n,
                        "bytes": n * slot_bytes, "seconds": secs, "disk_s": secs, "wall_s": secs,
                        "gbps": n * slot_bytes / secs / 1e9, "wall_gbps": n * slot_bytes / secs / 1e9})
            if progress:
                progress(f"{'host->disk':>10} {ct:5d} tokens x {n:2d}: {secs * 1e3:8.3f} ms "
                         f"{n * slot_bytes / secs / 1e9:7.2f} GB/s (new slots)")
        if cuda:
            torch.cuda.empty_cache()
    chunk_bytes = [ct * kv_bytes_per_token for ct in chunk_tokens]
    components = {name: {"axes": ["chunk_bytes", "chunks"], "grid": {"chunk_bytes": chunk_bytes,
                                                                     "chunks": list(chunks)},
                         "seconds": secs.tolist(), "chunk_tokens": list(chunk_tokens)}
                  for name, secs in tables.items()}
    return {"components": components, "raw": raw, "mismatches": mismatches, "checked_loads": checked,
            "disk_mode": mode, "disk_reason": reason, "kv_bytes_per_token": kv_bytes_per_token,
            "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def fresh_writes(torch, path: Path, slot_bytes: int, chunks, *, reps: int = 5, direct_io: bool = True,
                 io_threads: int = 4, pin: bool = True) -> list[float]:
    """Median seconds to write a batch of `n` slots (each of `chunks`) from page-locked host rows
    into slots of a new file never written before: one warm-up round, then `reps` timed rounds,
    every batch on slots of its own. The file is removed after."""
    slot_bytes = round_up(slot_bytes)
    rows = aligned_empty(torch, max(chunks), slot_bytes, pin=pin)
    rows.random_(0, 256)
    path.unlink(missing_ok=True)
    # slot 0 takes the direct-I/O probe's write (as the tier's own file does); the batches start after it
    disk = DiskTier(path, 1 + (reps + 1) * sum(chunks), slot_bytes, direct=direct_io, io_threads=io_threads,
                    probe_buffer=rows[0])
    try:
        times = {n: [] for n in chunks}
        nxt = 1
        for rep in range(reps + 1):
            for n in chunks:
                slots = list(range(nxt, nxt + n))
                nxt += n
                t0 = time.perf_counter()
                disk.write(slots, [rows[i] for i in range(n)])
                if rep:
                    times[n].append(time.perf_counter() - t0)
        return [float(np.median(times[n])) for n in chunks]
    finally:
        disk.close()
        path.unlink(missing_ok=True)

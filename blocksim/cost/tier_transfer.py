"""Seconds per chunk of the KV tiers' moves, from the tier tables of a measured cost profile.

`blocksim profile --tier-dir` (and `benchmarks/tier_bandwidth_merge.py`) add five tables to a profile,
`tier_<src>_<dst>`: the seconds to move `chunks` chunks of `chunk_bytes` in one batch, as the GPU
tier executor moves them (`docs/tier_executor.md`). A simulated tier serves one chunk at a time per
channel. The engine stores chunk by chunk (each store is its own move: a computed chunk, a
write-back, a copy down to the disk), so a store is priced at the table's single-chunk batch; it
loads a request's chunks together, so a load is priced at its per-chunk time in the largest batch
measured (the channel busy with back-to-back chunks). Both are interpolated linearly in
`chunk_bytes` and extrapolated from the nearest two sizes beyond the grid.

An optional sixth table, `tier_host_disk_fresh`, is the host->disk write into slots of the disk
tier's file never written before, which costs the file system's block allocation besides the
write; the disk tier prices a write that takes a new slot by it, and the others by `tier_host_disk`.
"""

from __future__ import annotations

import numpy as np

from blocksim.cost.profile_file import TIER_COMPONENTS, TIER_FRESH, Profile

#: moves the engine issues one chunk at a time: priced at the single-chunk batch
STORES = ("tier_gpu_host", "tier_gpu_disk", "tier_host_disk", TIER_FRESH)


def tier_chunk_seconds(profile: Profile, chunk_bytes: int) -> dict[str, float] | None:
    """`{"gpu_host": s, "host_gpu": s, "host_disk": s, "gpu_disk": s, "disk_gpu": s}` per chunk of
    `chunk_bytes` (and `"host_disk_fresh"` where the profile has its table), or None when the
    profile lacks any of the five tier tables."""
    if not all(name in profile.tables for name in TIER_COMPONENTS):
        return None
    out = {}
    for name in (*TIER_COMPONENTS, TIER_FRESH):
        if name not in profile.tables:
            continue
        g = profile.tables[name]
        sizes, batches = (np.asarray(x, np.float64) for x in g.grids)
        col = 0 if name in STORES else -1
        per_chunk = np.asarray(g.seconds, np.float64)[:, col] / batches[col]
        x = float(chunk_bytes)
        if len(sizes) == 1:
            s = per_chunk[0] * x / sizes[0]
        elif x <= sizes[0] or x >= sizes[-1]:
            i = 0 if x <= sizes[0] else len(sizes) - 2
            slope = (per_chunk[i + 1] - per_chunk[i]) / (sizes[i + 1] - sizes[i])
            s = per_chunk[i] + slope * (x - sizes[i])
        else:
            s = float(np.interp(x, sizes, per_chunk))
        out[name.removeprefix("tier_")] = max(float(s), 1e-9)
    return out

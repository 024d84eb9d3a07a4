"""Writes into new slots of the disk tier's file: the tier tables' method against a stream.

    OUT=DIR python benchmarks/disk_fresh_writes.py      # DIR/fresh_cmp.json

The tables' method is `validation.tiers.bench.fresh_writes` (the table `tier_host_disk_fresh`):
batches of 1, 4 and 16 new 32 MiB slots of a new file, one warm-up round and 5 timed, the median
per batch size. The stream is 300 single-chunk writes, one after another, into the new slots of
another new file (what a GPU-in-the-loop run does while its disk tier fills): the median, mean,
p90 and the medians of its quarters, every write's milliseconds kept. Both in turn, twice, from
page-locked host rows with direct I/O, the files in runs/disk (the repository's volume) and
removed after.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHUNK_BYTES = 32 << 20
BATCHES = (1, 4, 16)
STREAM_WRITES = 300


def table(torch, d: Path) -> dict:
    from validation.tiers.bench import fresh_writes
    secs = fresh_writes(torch, d / "fresh_tab.kv", CHUNK_BYTES, BATCHES, reps=5)
    return {"chunks": list(BATCHES), "batch_s": secs, "per_chunk_ms": [s / n * 1e3 for s, n in zip(secs, BATCHES)]}


def stream(torch, d: Path, n: int = STREAM_WRITES) -> dict:
    from validation.tiers.disk import DiskTier, aligned_empty
    rows = aligned_empty(torch, 4, CHUNK_BYTES, pin=True)
    rows.random_(0, 256)
    p = d / "fresh_stream.kv"
    p.unlink(missing_ok=True)
    disk = DiskTier(p, n + 1, CHUNK_BYTES, probe_buffer=rows[0])  # slot 0 takes the direct-I/O probe
    ts = []
    try:
        for i in range(1, n + 1):
            a = time.perf_counter()
            disk.write([i], [rows[i % 4]])
            ts.append(time.perf_counter() - a)
    finally:
        disk.close()
        p.unlink(missing_ok=True)
    q = np.asarray(ts) * 1e3
    return {"n": n, "median_ms": float(np.median(q)), "mean_ms": float(q.mean()), "p90_ms": float(np.percentile(q, 90)),
            "quarter_medians_ms": [float(np.median(x)) for x in np.array_split(q, 4)], "times_ms": q.tolist()}


def main() -> None:
    import torch
    out = Path(os.environ.get("OUT", "."))
    d = ROOT / "runs" / "disk"
    d.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "chunk_bytes": CHUNK_BYTES}
    for r in (1, 2):
        res[f"table_{r}"] = t = table(torch, d)
        print(f"table_{r}", [round(x, 2) for x in t["per_chunk_ms"]], flush=True)
        res[f"stream_{r}"] = s = stream(torch, d)
        print(f"stream_{r}", f"median {s['median_ms']:.2f} mean {s['mean_ms']:.2f} p90 {s['p90_ms']:.2f} quarters",
              [round(x, 2) for x in s["quarter_medians_ms"]], flush=True)
    (out / "fresh_cmp.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()

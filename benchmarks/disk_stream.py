"""The disk tier's file I/O over time: 32 MiB chunks written and read one at a time, back to back or
paced, from page-locked host rows with direct I/O (`validation.tiers.disk.DiskTier`).

    OUT=DIR python benchmarks/disk_stream.py [DISK_DIR]      # DIR/disk_stream.json

Phases, in this order, with 10 s of rest before each phase paced at 100 ms: writes into slots of
a new file never written (12 s back to back), writes 100 ms apart into slots written before (6 s),
the same back to back (25 s), 100 ms apart again (6 s), 10 ms apart (15 s), reads 100 ms apart (6 s)
and back to back (15 s). Per phase: the median, the medians of its first and last quarters, the
mean, and each I/O's seconds with when it started (every k-th, k = n // 400 or 1). The file (600
slots, 18.75 GiB) lives in DISK_DIR (default runs/disk, the repository's volume, where
benchmarks/tier_fidelity.sh keeps the tier's file) and is removed after. A GPU-in-the-loop run
writes most of its disk tier's slots for the first time, one chunk after another, which the tier
tables' `tier_host_disk_fresh` measures in short batches (benchmarks/TIERS.md, "Fidelity").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHUNK_BYTES = 32 << 20  # a 256-token chunk of llama-3-8b's K/V (the tier fidelity runs' chunk)
SLOTS = 600             # 600 chunks: 18.75 GiB
#: (name, "w" or "r", seconds, pause after each I/O, slots cycled through, rest before the phase)
PHASES = (("fresh writes back to back", "w", 12, 0.0, range(1, SLOTS), 0),
          ("writes, 100 ms apart", "w", 6, 0.1, range(1, 200), 10),
          ("writes back to back", "w", 25, 0.0, range(1, 400), 0),
          ("writes, 100 ms apart (after rest)", "w", 6, 0.1, range(1, 200), 10),
          ("writes, 10 ms apart", "w", 15, 0.01, range(1, 400), 0),
          ("reads, 100 ms apart", "r", 6, 0.1, range(1, 400, 3), 10),
          ("reads back to back", "r", 15, 0.0, range(1, 400), 0))
KEEP = 400  # times kept per phase in the JSON (every k-th)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("disk_dir", nargs="?", default="runs/disk")
    a = ap.parse_args()
    import torch

    from validation.tiers.disk import DiskTier, aligned_empty
    os.makedirs(a.disk_dir, exist_ok=True)
    rows = aligned_empty(torch, 4, CHUNK_BYTES, pin=torch.cuda.is_available())
    rows.random_(0, 256)
    path = os.path.join(a.disk_dir, "disk_stream.kv")
    disk = DiskTier(path, SLOTS, CHUNK_BYTES, probe_buffer=rows[0])
    res = {"mode": disk.mode, "chunk_bytes": CHUNK_BYTES, "phases": []}
    t0 = time.time()
    try:
        for name, op, secs, pause, slots, rest in PHASES:
            time.sleep(rest)
            io = disk.write if op == "w" else disk.read
            slots = list(slots)
            times, starts, i, w0 = [], [], 0, time.time()
            while time.time() - w0 < secs:
                s = slots[i % len(slots)]
                i += 1
                c0 = time.perf_counter()
                io([s], [rows[i % 4]])
                times.append(time.perf_counter() - c0)
                starts.append(time.time() - t0)
                if pause:
                    time.sleep(pause)
            q, k = np.asarray(times), len(times)
            quarter, every = max(1, k // 4), max(1, k // KEEP)
            row = {"phase": name, "n": k, "median_s": float(np.median(q)),
                   "first_quarter_median_s": float(np.median(q[:quarter])),
                   "last_quarter_median_s": float(np.median(q[-quarter:])), "mean_s": float(q.mean()),
                   "at_s": starts[::every], "times_s": times[::every]}
            res["phases"].append(row)
            print(f"{name:34s} n={k:5d} median {row['median_s'] * 1e3:6.2f} ms  first quarter "
                  f"{row['first_quarter_median_s'] * 1e3:6.2f}  last quarter {row['last_quarter_median_s'] * 1e3:6.2f}"
                  f"  mean {row['mean_s'] * 1e3:6.2f}", flush=True)
    finally:
        disk.close()
        os.unlink(path)
    out = Path(os.environ.get("OUT", "."))
    (out / "disk_stream.json").write_text(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()

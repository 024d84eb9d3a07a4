"""The disk tier's file I/O over time: 32 MiB chunks written and read one at a time, back to back or
paced, from page-locked host rows with direct I/O (`validation.tiers.disk.DiskTier`).

    OUT=DIR python benchmarks/disk_stream.py [DISK_DIR]      # DIR/disk_stream.json

Phases, in this order, with 10 s of rest before each paced phase: writes into slots of a new file
never written (12 s back to back), writes 100 ms apart into slots written before (6 s), the same
back to back (25 s), 100 ms apart again (6 s), 10 ms apart (15 s), reads 100 ms apart (6 s) and back
to back (15 s). Per phase: the median, the medians of its first and last quarters, and (at most 400
of) the times with when each started. The file (600 slots, 19 GiB) lives in DISK_DIR (default
runs/disk, the repository's volume, where benchmarks/tier_fidelity.sh keeps the tier's file) and is
removed after. A GPU-in-the-loop run writes most of its disk tier's slots for the first time, one
chunk after another, which the tier tables' `tier_host_disk_fresh` measures in short batches
(benchmarks/TIERS.md, "Fidelity").
"""
import json, os, sys, time
import numpy as np
import torch
sys.path.insert(0, ".")
from validation.tiers.disk import DiskTier, aligned_empty
out = os.environ.get("OUT", "/tmp")
d = sys.argv[1] if len(sys.argv) > 1 else "runs/disk"
os.makedirs(d, exist_ok=True)
slot = 32 << 20
n_slots = 600                      # 19 GiB file, as a 32 GiB tier would hold
rows = aligned_empty(torch, 4, slot, pin=torch.cuda.is_available())
rows.random_(0, 256)
path = os.path.join(d, "sustain.kv")
disk = DiskTier(path, n_slots, slot, probe_buffer=rows[0])
res = {"mode": disk.mode, "phases": []}
t0 = time.time()
def phase(name, op, secs, pause, slots):
    ts, at, i, w0 = [], [], 0, time.time()
    while time.time() - w0 < secs:
        s = slots[i % len(slots)]; i += 1
        a = time.perf_counter()
        (disk.write if op == "w" else disk.read)([s], [rows[i % 4]])
        ts.append(time.perf_counter() - a); at.append(time.time() - t0)
        if pause: time.sleep(pause)
    q = np.asarray(ts)
    k = len(q)
    res["phases"].append({"phase": name, "n": k, "median_s": float(np.median(q)),
                          "first_quarter_median_s": float(np.median(q[: max(1, k // 4)])),
                          "last_quarter_median_s": float(np.median(q[-max(1, k // 4):])),
                          "mean_s": float(q.mean()), "at_s": at[:: max(1, k // 400)], "times_s": ts[:: max(1, k // 400)]})
    print(f"{name:32s} n={k:5d} median {np.median(q)*1e3:6.2f} ms  first quarter {np.median(q[:max(1,k//4)])*1e3:6.2f}"
          f"  last quarter {np.median(q[-max(1,k//4):])*1e3:6.2f}  mean {q.mean()*1e3:6.2f}", flush=True)
phase("fresh writes back to back", "w", 12, 0, list(range(1, n_slots)))
time.sleep(10)
phase("writes, 100 ms apart", "w", 6, 0.1, list(range(1, 200)))
phase("writes back to back", "w", 25, 0, list(range(1, 400)))
time.sleep(10)
phase("writes, 100 ms apart (after rest)", "w", 6, 0.1, list(range(1, 200)))
phase("writes, 10 ms apart", "w", 15, 0.01, list(range(1, 400)))
time.sleep(10)
phase("reads, 100 ms apart", "r", 6, 0.1, list(range(1, 400, 3)))
phase("reads back to back", "r", 15, 0, list(range(1, 400)))
disk.close(); os.unlink(path)
json.dump(res, open(f"{out}/disk_stream.json", "w"))

"""A valid tier_ops table from a random workload, for tests and benchmarks (not a simulator's plan).

Each step stores a few new chunks from the GPU to the host (write-back: a chunk evicted from a
full host tier is first stored host->disk unless the disk holds it, the disk evicting its least
recently used chunk when full), stores some straight to the disk, and loads chunks the host or
the disk holds back into random GPU blocks; both tiers evict least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


def synthetic_tier_ops(steps: int, *, chunk_blocks: int, num_gpu_blocks: int, host_chunks: int, disk_chunks: int,
                       seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    cols = {c: [] for c in ("step", "op", "src", "dst", "key", "gpu_blocks", "evict")}
    held = {"host": OrderedDict(), "disk": OrderedDict()}
    next_key = 1

    def row(step, op, src, dst, key, blocks=(), evict=False):
        for c, v in zip(cols, (step, op, src, dst, key, list(map(int, blocks)), evict)):
            cols[c].append(v)

    free: list[int] = []

    def blocks():  # distinct blocks within a step
        return [free.pop() for _ in range(chunk_blocks)]

    def make_room(step, tier):
        if len(held[tier]) < (host_chunks if tier == "host" else disk_chunks):
            return
        key, _ = held[tier].popitem(last=False)
        if tier == "host" and key not in held["disk"] and disk_chunks:
            make_room(step, "disk")
            row(step, "store", "host", "disk", key)
            held["disk"][key] = True
        row(step, "store", tier, tier, key, evict=True)

    for step in range(steps):
        free[:] = rng.permutation(num_gpu_blocks).tolist()
        for _ in range(int(rng.integers(1, 4))):
            if len(free) < chunk_blocks:
                break
            key, next_key = next_key, next_key + 1
            to = "disk" if disk_chunks and rng.random() < 0.25 else "host"
            make_room(step, to)
            row(step, "store", "gpu", to, key, blocks())
            held[to][key] = True
        for _ in range(int(rng.integers(0, 3))):
            if len(free) < chunk_blocks:
                break
            tier = "host" if held["host"] and (rng.random() < 0.6 or not held["disk"]) else "disk"
            if not held[tier]:
                continue
            key = list(held[tier])[int(rng.integers(len(held[tier])))]
            held[tier].move_to_end(key)
            row(step, "load", tier, "gpu", key, blocks())
    return {"step": np.asarray(cols["step"], np.int64), "op": cols["op"], "src": cols["src"], "dst": cols["dst"],
            "key": np.asarray(cols["key"], np.int64), "gpu_blocks": cols["gpu_blocks"],
            "evict": np.asarray(cols["evict"], bool)}

"""Replays a plan's ``tier_ops`` table against a `TierExecutor`, step by step, with timing.

    ex = TierExecutor(key_caches, value_caches, chunk_blocks=16, host_chunks=64, disk_chunks=256,
                      disk_path="/nvme/kv.bin")
    replay = TierReplay(ex, "runs/plan")       # reads and checks the whole table first
    for step in steps:                         # a step executor calls this before the step's attention
        replay.step(step)
    result = replay.finish()                   # per-step timings, checksum mismatches, disk mode

Within a step the rows run in table order; consecutive rows of one move (op, src, dst) run as one
batch, and drops free their slot at once. Loads into the GPU are complete on the caller's stream
when `step` returns (the step's attention may read them); stores from the GPU have gathered their
blocks (the step may overwrite them) and finish their copies in the background (a caller that
reads their times, as the GPU-in-the-loop executor does, waits for them).
"""

from __future__ import annotations

import numpy as np

from validation.tiers.ops import TierOps, check_tier_ops, read_tier_ops


class TierReplay:
    """One tier_ops table applied to one executor; the table is checked whole on construction."""

    def __init__(self, executor, table, *, source: str | None = None) -> None:
        self.ex = executor
        self.ops: TierOps = table if isinstance(table, TierOps) else read_tier_ops(table, source)
        check_tier_ops(self.ops, chunk_blocks=executor.chunk_blocks, num_gpu_blocks=executor.num_gpu_blocks,
                       host_chunks=executor.slots["host"].capacity, disk_chunks=executor.slots["disk"].capacity,
                       host_keys=executor.held("host"), disk_keys=executor.held("disk"))
        steps = self.ops.step
        self._bounds = {}
        if len(steps):
            uniq, first = np.unique(steps, return_index=True)
            last = np.r_[first[1:], len(steps)]
            self._bounds = {int(s): (int(a), int(b)) for s, a, b in zip(uniq, first, last)}

    @property
    def steps(self) -> list[int]:
        return sorted(self._bounds)

    def step(self, step: int) -> int:
        """Apply the rows of ``step`` (none is fine); returns how many rows ran."""
        lo, hi = self._bounds.get(int(step), (0, 0))
        ops, ex = self.ops, self.ex
        ex.step = int(step)
        i = lo
        while i < hi:
            if ops.evict[i]:
                ex.drop(int(ops.key[i]), ops.src[i])
                i += 1
                continue
            move = (ops.op[i], ops.src[i], ops.dst[i])
            j = i + 1
            while j < hi and not ops.evict[j] and (ops.op[j], ops.src[j], ops.dst[j]) == move:
                j += 1
            blocks = None if "gpu" not in move[1:] else [ops.gpu_blocks[r] for r in range(i, j)]
            ex.apply(*move, ops.key[i:j], blocks)
            i = j
        return hi - lo

    def run(self) -> dict:
        """Every step of the table, then `finish`."""
        for s in self.steps:
            self.step(s)
        return self.finish()

    def finish(self) -> dict:
        """Per-batch and per-step timings, the checksum mismatches and the disk tier's I/O mode."""
        import pandas as pd
        recs = pd.DataFrame(self.ex.records())
        if len(recs):
            per_step = recs.pivot_table(index="step", columns="move", values=["chunks", "bytes", "seconds"],
                                        aggfunc="sum", fill_value=0)
            per_step.columns = [f"{m}_{v}" for v, m in per_step.columns]
            per_step = per_step.reset_index()
        else:
            per_step = pd.DataFrame({"step": []})
        return {"batches": recs, "steps": per_step, "mismatches": self.ex.mismatches(),
                "mismatched": self.ex.mismatched, "checked_loads": self.ex.checked_loads,
                "disk_mode": self.ex.disk_mode, "disk_reason": self.ex.disk_reason}


def replay_tier_ops(executor, table, *, source: str | None = None) -> dict:
    """Check and apply a whole tier_ops table (see `TierReplay.finish` for the result)."""
    return TierReplay(executor, table, source=source).run()

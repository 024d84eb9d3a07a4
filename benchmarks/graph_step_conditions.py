"""Diagnose the gap between a graph-replayed decode step timed as the profile times it and as it
runs in an executed replay (on a GPU): the same captured step, timed under the conditions a run
adds.

    PYTHONPATH=. python benchmarks/graph_step_conditions.py --model llama-2-7b --out OUT.json

Each repetition is timed with the profile's clock (`validation.profile._Clock.once`: a drain, the
executor's sleep before a graph replay, CUDA events around it), in rounds that alternate the
conditions, so that a drift of the machine weighs on all of them alike:

  gaps    the host idle for 0, 0.5, 2, 5 or 20 ms after the drain (an executed run's host works
          between steps while the GPU waits), with or without the step's inputs copied into the
          graph's buffers before it (`load_decode`, as the executor does every step);
  tables  the rows' block tables contiguous (as the profile lays them out), scattered at random over
          the first 900 blocks (the fidelity slices' cache) or over the whole cache.

Writes each condition's median, 10th and 90th percentile and its ratio to the first condition of
its shape.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from blocksim.catalog import MODELS
from validation.profile import Profiler, _graph, retable

GAPS_S = (0.0, 0.5e-3, 2e-3, 5e-3, 20e-3)
GAP_SHAPES = ((1, 1024), (32, 1024))                                  # (batch, context)
TABLE_SHAPES = ((1, 1024), (1, 4096), (2, 4096), (8, 2048), (32, 1024))
SLICE_BLOCKS = 900                                                    # the fidelity slices' GPU blocks


def rows(shape, times: dict) -> list[dict]:
    first = float(np.median(next(iter(times.values()))))
    out = []
    for name, ts in times.items():
        med = float(np.median(ts))
        out.append({"batch": shape[0], "context": shape[1], "condition": name, "n": len(ts), "median_s": med,
                    "p10_s": float(np.percentile(ts, 10)), "p90_s": float(np.percentile(ts, 90)),
                    "ratio": med / first})
        print(f"b={shape[0]:3d} ctx={shape[1]:5d} {name:26s} median {med * 1e3:.4f} ms  x{med / first:.4f}",
              flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    prof = Profiler(MODELS[a.model], progress=False)
    r, clock, bs = prof.runner, prof.clock, prof.bs
    r.capture_decode_graphs(max(b for b, _ in GAP_SHAPES + TABLE_SHAPES))
    res = {"model": a.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "num_blocks": prof.num_blocks, "block_size": bs, "rounds": a.rounds, "gaps": [], "tables": []}
    for b, ctx in GAP_SHAPES:
        batch = prof.batch(decodes=[ctx] * b)
        r.load_decode(batch, b)
        fn = _graph(r, b)
        for _ in range(20):
            clock.once(fn)
        times: dict[str, list[float]] = {}
        for _ in range(a.rounds):
            for gap in GAPS_S:
                for upload in (False, True):
                    torch.cuda.synchronize()
                    if gap:
                        time.sleep(gap)
                    if upload:
                        r.load_decode(batch, b)
                    times.setdefault(f"gap {gap * 1e3:g} ms, upload {'yes' if upload else 'no'}", []).append(
                        clock.once(fn))
        res["gaps"] += rows((b, ctx), times)
    rng = np.random.default_rng(1)
    for b, ctx in TABLE_SHAPES:
        base = prof.batch(decodes=[ctx] * b)
        n = -(-ctx // bs)
        variants = {"contiguous": base}
        for name, pool in ((f"scattered over {SLICE_BLOCKS}", min(SLICE_BLOCKS, prof.num_blocks)),
                           ("scattered over the cache", prof.num_blocks)):
            if b * n <= pool:  # distinct blocks for every row
                perm = rng.permutation(pool)
                variants[name] = retable(base, [perm[i * n:(i + 1) * n].astype(np.int64) for i in range(b)], bs)
        fn = _graph(r, b)
        for v in variants.values():
            r.load_decode(v, b)
            for _ in range(5):
                clock.once(fn)
        times = {k: [] for k in variants}
        for _ in range(a.rounds):
            for k, v in variants.items():
                r.load_decode(v, b)
                times[k].append(clock.once(fn))
        res["tables"] += rows((b, ctx), times)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

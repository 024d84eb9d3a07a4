"""The prefill dispatch's row thresholds measured: on shapes of ``--rows`` packed rows per sequence
(``new tokens * query heads / KV heads``; 32, 64 and 96 by default, around ``WS_MIN_ROWS``),
the mma.sync kernel (the configuration ``choose_prefill_config`` picks without the warpgroup
kernels), the warpgroup kernel (config 6) and the warp-specialized one (config 7), timed in turn
``--rounds`` times, the order rotating each round (CUDA graphs, 30 replays after 10), medians. One
line a shape on stdout and every time in ``--json``; ``picked`` is the choice of the
``choose_prefill_config`` of the sources that ran.

    PYTHONPATH=. python kernels/bench/dispatch_rows.py --json kernels/results/h100-dispatch-rows.json
    PYTHONPATH=. python kernels/bench/dispatch_rows.py --rows 4 8 16 --json kernels/results/h100-dispatch-rows-small.json
"""
import argparse
import statistics
import sys

import torch

sys.path.insert(0, ".")
from kernels.bench.output import refuse_unwritable, write_json
from kernels.bench.prefill import PREFILL_HEADS, PrefillCase
from kernels.bench.timing import graph_ms
from kernels.fast import prefill as fp

ROWS = (32, 64, 96)  # the default --rows
#: (batch, cached tokens) of each shape; the new tokens follow from the rows and the heads' group
BATCH_CACHED = ((64, 1024), (16, 4096), (4, 8192))


def time_shape(model: str, heads: int, kv_heads: int, batch: int, cached: int, rows: int, rounds: int) -> dict:
    group = heads // kv_heads
    new = rows // group
    c = PrefillCase(batch, cached, new, heads, kv_heads)
    mma = fp.choose_prefill_config(batch, new, heads, kv_heads, 128, wgmma=False)
    configs = [mma, fp.WGMMA_CONFIG, fp.WS_CONFIG]
    picked = fp.choose_prefill_config(batch, new, heads, kv_heads, 128, wgmma=True)
    times = {k: [] for k in configs}
    for r in range(rounds):
        order = configs[r % 3:] + configs[:r % 3]
        for k in order:
            times[k].append(graph_ms([lambda k=k: c.paged(config=k)], 10, 30))
    med = {k: statistics.median(v) for k, v in times.items()}
    best = min(med, key=med.get)
    row = {"model": model, "heads": heads, "kv_heads": kv_heads, "batch": batch, "cached": cached, "new": new,
           "packed_rows": rows, "mma_config": mma, "picked": picked, "best": best,
           "ms": {str(k): v for k, v in med.items()}, "times_ms": {str(k): v for k, v in times.items()}}
    print(f"{model:11s} {batch:3d} x {cached:5d} + {new:3d} ({rows:3d} rows)  "
          + "  ".join(f"{k}: {med[k]:.4f}" for k in configs)
          + f"  picked {picked} ({med[picked] / med[best]:.3f}x the best, {best})", flush=True)
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="where to write every time")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of the three kernels in turn (default 6)")
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS),
                    help="packed rows per sequence, each a multiple of 4 (default 32 64 96)")
    ap.add_argument("--batch-cached", nargs="+", default=[f"{b}:{c}" for b, c in BATCH_CACHED], metavar="B:C",
                    help="sequences and cached tokens of each shape (default 64:1024 16:4096 4:8192)")
    a = ap.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in x.split(":")) for x in a.batch_cached]
        if any(len(t) != 2 or t[0] < 1 or t[1] < 0 for t in shapes):
            raise ValueError
    except ValueError:
        print(f"dispatch_rows.py: --batch-cached {' '.join(a.batch_cached)}: give SEQUENCES:CACHED pairs, e.g. 4:8192",
              file=sys.stderr)
        return 2
    if a.rounds < 1:
        print(f"dispatch_rows.py: --rounds {a.rounds}: give at least 1", file=sys.stderr)
        return 2
    if any(r < 4 or r % 4 for r in a.rows):
        print(f"dispatch_rows.py: --rows {' '.join(map(str, a.rows))}: give multiples of 4 (llama-3-8b's GQA group), "
              "at least 4", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("dispatch_rows.py: needs a Hopper GPU (compute capability 9.0), where configs 6 and 7 run",
              file=sys.stderr)
        return 2
    if refuse_unwritable(a.json, "dispatch_rows.py: --json"):
        return 2
    rows = [time_shape(model, heads, kv, b, cached, r, a.rounds)
            for model, heads, kv in PREFILL_HEADS for b, cached in shapes for r in a.rows]
    write_json(a.json, {"device": torch.cuda.get_device_name(), "rounds": a.rounds, "packed_rows": a.rows,
                        "command": "python kernels/bench/dispatch_rows.py --rows " + " ".join(map(str, a.rows))
                        + " --batch-cached " + " ".join(a.batch_cached),
                        "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

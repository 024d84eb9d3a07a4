"""Decode-attention benchmark: ``python -m kernels.bench``.

Head size 128, float16, 32 query heads; in one run:

1. the copy floor: a 2 GiB device-to-device copy, bandwidth = bytes read + written / time;
2. the headline shapes (batch, heads, kv heads, context), block size 16: the fast kernel
   (``impl="fast"``, NHD and the default H2ND storage; H2ND also with block tables in order),
   the vLLM-layout kernels v1 and v2 (and the one the automatic rule picks), torch SDPA on
   contiguous ``[batch, kv_heads, context, head]`` K/V (the best fused backend; compared with the
   fast kernel by medians of ``--repeats`` alternating measurements, and by the median of their
   paired time ratios with a distribution-free confidence interval), and gather-then-SDPA (copy
   the blocks to contiguous K/V, then SDPA);
3. the fast kernel's split length on the headline shapes (the automatic rule and fixed lengths),
   per load path (register loads, cp.async rings of 2-4 shared-memory stages), and per occupancy
   (resident blocks per SM x ring depth, against SDPA: the measurements behind ``choose_launch``);
4. the fast kernel at block sizes 8 to 256;
5. fp8 (e4m3) caches with per-tensor scales: time, and accuracy against float16;
6. a sweep of batch 1-256 x context 512-131072 (32 heads on 8 KV heads; points whose KV exceeds
   ``--max-kv-gb`` are left out) over the same implementations, written to ``--json`` and
   plotted (effective bandwidth vs context) to ``--plot`` when matplotlib is installed
   (``python -m kernels.bench --plot-from results.json --plot out.png`` plots a saved run).

The ``--json`` file holds every measurement (cost profiles come from ``blocksim profile``,
which times whole model steps).

Every sequence has the full context; block tables are random permutations of the cache's blocks.
Times are medians over ``--iters`` replays of a CUDA graph that calls the implementation once on
each of ``--sets`` input sets (queries, block tables, outputs), divided by the number of sets,
after ``--warmup`` replays: the graph removes the host's launch overhead, which would otherwise
dominate the microsecond-scale shapes. gather+SDPA is timed eagerly (milliseconds per call).
Effective bandwidth = KV bytes of the contexts (read once) / time.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from .cases import DTYPE, HEAD_SIZE, STORE
from .output import write_json
from .plot import plot
from .sections import SECTIONS
from .timing import copy_bandwidth_gbs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--sets", type=int, default=4, help="input sets cycled through (queries, block tables)")
    ap.add_argument("--repeats", type=int, default=9,
                    help="headline and sweep: alternating measurements of the fast kernel (default storage) and "
                         "SDPA, medians compared (9 pairs give a 96%% interval for the median time ratio)")
    ap.add_argument("--sections", default="headline,backends,splits,stages,occupancy,blocks,fp8,sweep",
                    help="comma-separated: headline, backends, splits, stages, occupancy, blocks, fp8, sweep, prefill, "
                         "prefill_tiles (the paged prefill kernel and its tile configurations, kernels/bench/prefill.py; "
                         "not in the default list)")
    ap.add_argument("--prefill-shapes", default=None,
                    help="prefill and prefill_tiles sections: only these (batch, cached c, new p) shapes, as "
                         "'b,c,p;b,c,p' (default: every shape of kernels/bench/prefill.py)")
    ap.add_argument("--depths", default="0,2,3,4", help="stages section: load paths (0 = registers, 2-4 = ring)")
    ap.add_argument("--max-kv-gb", type=float, default=4.3, help="largest KV (GB) of a sweep point")
    ap.add_argument("--json", default=None, help="write every number to this JSON file")
    ap.add_argument("--plot", default=None, help="PNG of the sweep (needs matplotlib)")
    ap.add_argument("--plot-from", default=None, help="plot a saved --json file and exit (no GPU needed)")
    args = ap.parse_args(argv)
    if args.prefill_shapes is not None:
        try:
            args.prefill_shapes = [tuple(int(x) for x in shape.split(",")) for shape in args.prefill_shapes.split(";")]
        except ValueError:
            ap.error(f"--prefill-shapes: expected 'batch,cached,new;...' integers, got {args.prefill_shapes!r}")
        if any(len(shape) != 3 or min(shape) < 0 or shape[0] == 0 or shape[2] == 0 for shape in args.prefill_shapes):
            ap.error(f"--prefill-shapes: each shape is batch,cached,new with batch and new >= 1, got "
                     f"{args.prefill_shapes!r}")
    unknown = [name for name in args.sections.split(",") if name not in SECTIONS]
    if unknown:
        ap.error(f"--sections: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(SECTIONS)}")
    if args.plot_from:
        with open(args.plot_from) as f:
            plot(json.load(f), args.plot or "bench.png")
        return 0
    if not torch.cuda.is_available():
        print("kernels.bench needs a CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    copy_gbs = copy_bandwidth_gbs()
    device = f"{props.name} ({props.multi_processor_count} SMs)"
    print(f"device: {device}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"head_size {HEAD_SIZE}, {str(DTYPE).replace('torch.', '')}; median of {args.iters} graph replays after "
          f"{args.warmup}, {args.sets} input sets per replay")
    print(f"device copy bandwidth (read + write): {copy_gbs:.0f} GB/s")
    results = {"device": device, "torch": torch.__version__, "copy_gbs": copy_gbs, "fast_storage": STORE,
               **{name: [] for name in ("headline", "backends", "splits", "stages", "occupancy", "block_sizes", "fp8",
                                        "sweep", "prefill", "prefill_tiles")}}
    for name in args.sections.split(","):
        SECTIONS[name](args, copy_gbs, results)
        if args.json:  # after each section, whole: an interrupt keeps the sections before it
            write_json(args.json, results)
    print(f"\ndevice copy bandwidth after the run: {copy_bandwidth_gbs():.0f} GB/s")
    if args.plot and results["sweep"]:
        try:
            plot(results, args.plot)
        except ImportError:
            print("matplotlib not installed: no plot (use --plot-from on the --json file)")
    return 0

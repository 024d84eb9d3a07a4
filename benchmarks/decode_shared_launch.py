"""Shared-block decode batches against the decode kernel's launch: own-blocks and paired batches
(rows in pairs sharing all their blocks but the last, as ``decode_step_shared`` builds them) of
llama-3-8b's heads (32 query / 8 KV, head 128, block 16), the decode attention alone, under the
kernel's default launch and with warp items forced on and off (`kernels.fast.launch.choose_launch`
runs whole contexts as warp items at 64 and 128 rows of these heads). Each cell: 3 pairs of
CUDA-graph timings in alternating order (medians). Two caches: "wrap", the profiler's 20,480
blocks (a step that needs more reads it again, later passes shuffled, as
`validation.profile.Profiler` does), and "fresh", large enough that nothing is read twice.

    PYTHONPATH=. python benchmarks/decode_shared_launch.py --out benchmarks/results/decode-shared-launch-h100.json
"""
import argparse
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from kernels.bench.output import refuse_unwritable, write_json
from kernels.bench.stats import alternate
from kernels.bench.timing import graph_ms
from kernels.fast.launch import choose_launch
from kernels.fast.ops import paged_attention
from validation.profile import pass_blocks

H, KV, D, BS = 32, 8, 128, 16
CACHE = 20480
ROWS = (64, 96, 128, 192)
CTX = (2048, 4096, 8192)


def tables(rows, ctx, n, paired):
    span = ctx // BS
    t = pass_blocks(np.arange(rows * span, dtype=np.int64), n).reshape(rows, span)
    if paired:
        t[1::2, :-1] = t[0::2, :-1]
    return torch.tensor(t, dtype=torch.int32, device="cuda")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON to write (rows: cache, rows, ctx, warp_items, ms, ratio)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_shared_launch.py: needs a CUDA device", file=sys.stderr)
        return 2
    if refuse_unwritable(a.out, "decode_shared_launch.py: --out"):
        return 2
    need = max(ROWS) * max(CTX) // BS
    big = need + 64
    kc = torch.randn(big, BS, KV, D, dtype=torch.float16, device="cuda")
    vc = torch.randn_like(kc)
    res = []
    for cache_name, n in (("wrap", CACHE), ("fresh", big)):
        for rows in ROWS:
            q = torch.randn(rows, H, D, dtype=torch.float16, device="cuda")
            o = torch.empty_like(q)
            for ctx in CTX:
                lens = torch.full((rows,), ctx, dtype=torch.int32, device="cuda")
                default = choose_launch(rows, H, KV, D, torch.float16, ctx).warp_items
                for wi in (None, False, True):
                    def run(paired, wi=wi, rows=rows, ctx=ctx, n=n, q=q, o=o, lens=lens):
                        tb = tables(rows, ctx, n, paired)
                        return lambda: graph_ms([lambda: paged_attention(o, q, kc, vc, KV, D ** -0.5, tb, lens, BS, ctx,
                                                                         warp_items=wi, validate=False)], 10, 30)
                    try:
                        own, pair = alternate(run(False), run(True), 3)
                    except (RuntimeError, ValueError) as e:
                        print(cache_name, rows, ctx, wi, "refused:", e, flush=True)
                        continue
                    r = {"cache": cache_name, "rows": rows, "ctx": ctx, "warp_items": wi, "default_warp_items": default,
                         "own_ms": statistics.median(own), "paired_ms": statistics.median(pair)}
                    r["ratio"] = r["paired_ms"] / r["own_ms"]
                    res.append(r)
                    print(f"{cache_name:5s} {rows:4d} x {ctx:5d} warp_items={wi!s:5s} (default {default!s:5s}) "
                          f"own {r['own_ms']:.4f} ms paired {r['paired_ms']:.4f} ms ratio {r['ratio']:.3f}", flush=True)
    write_json(a.out, {"device": torch.cuda.get_device_name(), "command": "python benchmarks/decode_shared_launch.py",
                       "rows": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where config 7's time goes per work item: the kernel built with clock64 stamps (one thread per
warpgroup writes 8 stamps an item into a device array), on a GPU. Used on an H100 with the
sources of commit e1448dc and `kernels/results/ws-variants/ws-trace.patch` applied, in a copy of
the repository:

    git archive e1448dc | tar -x -C /tmp/trace && cd /tmp/trace && patch -p1 < ws-trace.patch
    PYTHONPATH=. BLOCKSIM_KERNELS_CACHE=/tmp/tracecache python kernels/bench/ws_trace.py

Prints, per shape, each interval's mean over the consumers' items (us, at the clock rate the
stamps' span over the kernel's time gives) and the producer's. The array is not cleared between
shapes and clock64 counts per SM, so a shape after the first reads the earlier shapes' stamps
where its blocks take fewer items (kernels/results/ws-variants/h100-ws-trace.txt: only the two
32 x 512 shapes, which take the same item counts, are valid there).
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from kernels._build import extension
from kernels.bench.prefill import BLOCK, PrefillCase
from kernels.bench.timing import graph_ms
from kernels.fast import prefill as fp

SHAPES = (("llama-2-7b", 32, 32, (32, 0, 512)), ("llama-3-8b", 32, 8, (32, 0, 512)),
          ("llama-3-8b", 32, 8, (8, 0, 1024)), ("llama-3-8b", 32, 8, (1, 0, 2048)),
          ("llama-2-7b", 32, 32, (1, 8192, 512)))
CONSUMER = ["q_wait", "k0_wait", "turn0_wait", "s0", "softmax0_and_middle_tiles", "last_pv", "store_and_dead_turns"]
PRODUCER = ["next_and_ids", "k0_empty_wait_and_copy", "rest_of_tiles", "copy_next_q"]


def items_of(t):
    """A role's stamps of this launch: item k while its start stamp follows item 0's."""
    k = 1
    while k < 64 and t[k, 0] >= t[0, 0] and t[k, 0] != 0:
        k += 1
    return t[:k]


def main():
    ext = extension()
    res = {}
    buf = torch.zeros(132 * 3 * 64 * 8, dtype=torch.int64, device="cuda")
    for name, heads, kvh, shape in SHAPES:
        c = PrefillCase(*shape, heads, kvh)

        def run(c=c):
            fp.paged_prefill_attention(c.out, c.query, c.kc, c.vc, c.kv_heads, c.scale, c.tables, c.loc, c.lens,
                                       BLOCK, max_query_len=c.new, max_context_len=c.ctx, config=7, validate=False)

        ms = graph_ms([run], 10, 30)
        run()
        torch.cuda.synchronize()
        ext.ws_trace(buf)
        tr = buf.view(132, 3, 64, 8).cpu().numpy().astype(np.int64)
        cons, prod, gaps, spans = [], [], [], []
        for b in range(132):
            for role in (1, 2):
                items = items_of(tr[b, role])
                cons.append(np.diff(items[:, :8], axis=1))  # 7 intervals per item
                gaps.append(items[1:, 0] - items[:-1, 7])
                spans.append(items[-1, 7] - items[0, 0])
            prod.append(np.diff(items_of(tr[b, 0])[:, :5], axis=1))
        cons, prod, gaps = np.concatenate(cons), np.concatenate(prod), np.concatenate(gaps)
        cyc_per_ms = np.mean(spans) / ms
        to_us = 1e3 / cyc_per_ms
        rows = {"ms": ms, "items_per_consumer": len(cons) / 264, "cycles_per_us_est": cyc_per_ms / 1e3,
                "consumer": {n: float(cons[:, i].mean() * to_us) for i, n in enumerate(CONSUMER)},
                "producer": {n: float(prod[:, i].mean() * to_us) for i, n in enumerate(PRODUCER)}}
        rows["consumer"]["gap_to_next_item"] = float(gaps.mean() * to_us) if len(gaps) else 0.0
        key = f"{name} {shape}"
        res[key] = rows
        print(key, f"{ms:.4f} ms", f"items/consumer {rows['items_per_consumer']:.1f}",
              "consumer us:", {k: round(v, 2) for k, v in rows["consumer"].items()},
              "producer us:", {k: round(v, 2) for k, v in rows["producer"].items()}, flush=True)
        del c
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "ws-trace.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

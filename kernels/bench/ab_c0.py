"""Config 7 (the warp-specialized prefill kernel) of whichever build ``kernels`` loads, on the
prefill section's c = 0 shapes, every key through the block table and with the new tokens' keys
and values given, against the fastest SDPA backend: three measurements each a shape, in rotating
order (CUDA graphs, 30 replays after 10), medians. One line a shape
on stdout and ``ab-TAG.json`` under ``$OUT`` (``TAG``: the build's name).
``kernels/bench/ab_builds.sh`` runs it on patched builds in turn; correctness is the GPU tests'
(tests/kernels/test_paged_prefill.py).

    PYTHONPATH=. TAG=name python kernels/bench/ab_c0.py
"""
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, ".")
from kernels.bench.prefill import (
    BLOCK,
    PREFILL_HEADS,
    PREFILL_SHAPES,
    PrefillCase,
    best_backend,
    causal_sdpa,
)
from kernels.bench.stats import rotate
from kernels.bench.timing import graph_ms
from kernels.fast import prefill as fp


def time_shape(tag: str, model: str, shape: tuple, heads: int, kv_heads: int) -> dict:
    """Config 7 and the fastest SDPA backend on one c = 0 shape: medians of three measurements each,
    the pair's order alternating."""
    c = PrefillCase(*shape, heads, kv_heads)

    def paged():
        fp.paged_prefill_attention(c.out, c.query, c.kc, c.vc, c.kv_heads, c.scale, c.tables, c.loc, c.lens, BLOCK,
                                   max_query_len=c.new, max_context_len=c.ctx, config=7, validate=False)

    def paged_new():
        c.paged(config=7, new_kv=True)

    q = c.sdpa_query()
    k, v = c.contiguous()
    label, backend, _ = best_backend(c, q, k, v, 10, 30)

    def sdpa():
        causal_sdpa(q, k, v, c.cached, backend)

    t7, t7n, ts = rotate([lambda: graph_ms([paged], 10, 30), lambda: graph_ms([paged_new], 10, 30),
                          lambda: graph_ms([sdpa], 10, 30)], 3)
    row = {"tag": tag, "model": model, "shape": list(shape), "backend": label, "ms7": statistics.median(t7),
           "ms7_new_kv": statistics.median(t7n), "ms_sdpa": statistics.median(ts)}
    row["r7"] = row["ms7"] / row["ms_sdpa"]
    row["r7_new_kv"] = row["ms7_new_kv"] / row["ms_sdpa"]
    print(f"{tag:8s} {model:11s} {shape!s:16s} 7 {row['ms7']:.4f} 7+new {row['ms7_new_kv']:.4f} "
          f"sdpa {row['ms_sdpa']:.4f} ({label}) {row['r7']:.3f} {row['r7_new_kv']:.3f}", flush=True)
    return row


def main() -> None:
    tag = os.environ.get("TAG", "build")
    rows = []
    for model, heads, kv_heads in PREFILL_HEADS:
        for shape in PREFILL_SHAPES:
            if shape[1] == 0:
                rows.append(time_shape(tag, model, shape, heads, kv_heads))
                torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), f"ab-{tag}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

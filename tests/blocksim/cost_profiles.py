"""A synthetic "blocksim-profile/1" profile: formulas with launch floors on the producer's grids.

Not a measurement: tables a GPU could plausibly give (a fixed cost per call plus bandwidth or
FLOP terms), so the profiled model and the roofline fit have something of the right shape to read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from blocksim.catalog import GPUS, MODELS

GRAPH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256]


def synthetic_profile(model: str = "llama-2-7b", gpu: str = "h100-80gb", *, tensor_parallel: int = 1,
                      block_size: int = 16, dtype: str = "float16", decode_step: bool | str = False,
                      allreduce: bool = False, shared: float | None = None, padded: float | None = None) -> dict:
    """`decode_step`: True adds the table of whole graph steps, "longest" the longest-row table too;
    `shared` (with "longest"): a ``decode_step_shared`` table whose paired steps last `shared` times
    their own-blocks twins, at a shared fraction of 0.45; `padded` (with "longest"): a
    ``decode_step_padded`` table whose padded steps last `padded` times their spread twins."""
    m, g = MODELS[model], GPUS[gpu]
    flops, bw = g.fp16_tflops * 1e12 * 0.6, g.hbm_bw_gbps * 1e9 * 0.8
    kvb = 2 * m.num_layers * max(1, m.num_kv_heads // tensor_parallel) * m.head_size * 2
    weights = m.weight_bytes / tensor_parallel
    per_tok = 2 * m.num_params / tensor_parallel
    layers = m.num_layers
    attn_coef = 4.0 * layers * (m.num_heads // tensor_parallel) * m.head_size

    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    lin = [max(t * per_tok / flops, weights / bw) + 60e-6 for t in tokens]
    graph = [0.93 * max(b * per_tok / flops, weights / bw) + 10e-6 for b in GRAPH_SIZES]
    batch_p, new, cached = [1, 2, 4, 8], [16, 64, 256, 1024, 4096], [0, 512, 2048, 8192]
    pre = [[[layers * 8e-6 + b * attn_coef * p * (c + p / 2) / flops for c in cached] for p in new] for b in batch_p]
    batch_d, ctx = [1, 2, 4, 8, 16, 32, 64, 128, 256], [16, 64, 256, 1024, 4096, 16384]
    dec = [[layers * 4e-6 + b * x * kvb / bw for x in ctx] for b in batch_d]
    cw = [layers * 2e-6 + t * kvb / bw for t in tokens]
    seqs = [1, 4, 16, 64, 256]
    sample = [80e-6 + s * m.hidden_size * m.vocab_size * 2 / flops + m.vocab_size * m.hidden_size * 2 / bw for s in seqs]
    block_bytes = kvb * block_size
    blocks = [1, 4, 16, 64, 256, 1024]
    swap = [30e-6 + b * block_bytes / 45e9 for b in blocks]
    copy = [40e-6 + b * block_bytes * 2 / bw for b in blocks]
    comps = {
        "linear": {"axes": ["tokens"], "grid": {"tokens": tokens, "graph_tokens": GRAPH_SIZES},
                   "seconds": lin, "graph_seconds": graph},
        "attn_prefill": {"axes": ["batch", "new_tokens", "cached_tokens"],
                         "grid": {"batch": batch_p, "new_tokens": new, "cached_tokens": cached}, "seconds": pre},
        "attn_decode": {"axes": ["batch", "context"], "grid": {"batch": batch_d, "context": ctx}, "seconds": dec},
        "cache_write": {"axes": ["tokens"], "grid": {"tokens": tokens}, "seconds": cw},
        "sample": {"axes": ["sequences"], "grid": {"sequences": seqs}, "seconds": sample},
        "swap_out": {"axes": ["blocks"], "grid": {"blocks": blocks}, "seconds": swap},
        "swap_in": {"axes": ["blocks"], "grid": {"blocks": blocks}, "seconds": [1.05 * s for s in swap]},
        "copy": {"axes": ["blocks"], "grid": {"blocks": blocks}, "seconds": copy},
        "overhead": {"eager_s": 2.0e-3, "graph_s": 0.4e-3},
    }
    n = tensor_parallel
    ring = (lambda nbytes: 8e-6 + 2 * (n - 1) / n * nbytes / 360e9)  # a latency plus the ring's traffic at 360 GB/s
    comm = (lambda b: 2 * layers * ring(b * m.hidden_size * 2) if n > 1 else 0.0)  # a step's all-reduces
    longest = [1.0, 2.0, 4.0, 8.0]

    def step(i: int, b: int, x: int, r: float) -> float:  # the longest row adds a critical path
        return 0.9 * (graph[i] + cw[0] + sample[0] + layers * 4e-6 + (b + 0.5 * (r - 1.0)) * x * kvb / bw) + comm(b)
    if decode_step:
        comps["decode_step"] = {
            "axes": ["batch", "context"], "grid": {"batch": GRAPH_SIZES, "context": ctx},
            "seconds": [[step(i, b, x, 1.0) for x in ctx] for i, b in enumerate(GRAPH_SIZES)]}
    if decode_step == "longest":
        comps["decode_step_longest"] = {
            "axes": ["batch", "context", "longest"], "grid": {"batch": GRAPH_SIZES, "context": ctx, "longest": longest},
            "seconds": [[[step(i, b, x, r) for r in longest] for x in ctx] for i, b in enumerate(GRAPH_SIZES)]}
    if shared is not None:
        pairs = [b for b in GRAPH_SIZES if b % 2 == 0]
        own = [[step(GRAPH_SIZES.index(b), b, x, 1.0) for x in ctx] for b in pairs]
        comps["decode_step_shared"] = {
            "axes": ["batch", "context"], "grid": {"batch": pairs, "context": ctx},
            "seconds": [[shared * t for t in row] for row in own], "own_seconds": own,
            "shared_fraction": [[0.45] * len(ctx) for _ in pairs]}
    if padded is not None:
        sizes, real, pctx = [4, 8, 16, 32, 64, 128, 256], [0.5, 0.75], [16, 64, 256, 1024, 2048]
        spread = [[[step(GRAPH_SIZES.index(b), b, x, 1.0 / f) for x in pctx] for f in real] for b in sizes]
        comps["decode_step_padded"] = {
            "axes": ["batch", "real", "context"], "grid": {"batch": sizes, "real": real, "context": pctx},
            "seconds": [[[padded * t for t in row] for row in plane] for plane in spread], "spread_seconds": spread}
    if allreduce:  # one all-reduce by message bytes
        nbytes = [2 ** k for k in range(10, 31, 2)]
        comps["allreduce"] = {"axes": ["bytes"], "grid": {"bytes": nbytes}, "seconds": [ring(b) for b in nbytes]}
    return {"format": "blocksim-profile/1", "model": model, "gpu": gpu, "dtype": dtype, "kv_dtype": dtype,
            "tensor_parallel": tensor_parallel, "block_size": block_size, "device": "synthetic",
            "torch": "none", "command": "tests/blocksim/cost_profiles.py", "created_utc": "2026-11-24T00:00:00Z",
            "cuda_graph_batch_sizes": GRAPH_SIZES, "components": comps}


def write_profile(path: str | Path, **kw) -> Path:
    p = Path(path)
    p.write_text(json.dumps(synthetic_profile(**kw)))
    return p


if __name__ == "__main__":  # python tests/blocksim/cost_profiles.py OUT.json [model gpu]
    import sys
    args = sys.argv[1:]
    write_profile(args[0], **dict(zip(("model", "gpu"), args[1:3])))
    _ = np  # numpy is imported for callers that build arrays from the tables

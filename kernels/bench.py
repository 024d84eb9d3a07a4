"""Decode-attention benchmark: ``python -m kernels.bench``.

For each shape (batch, heads, kv heads, context), head size 128, float16, block size 16, times
in one run:

* the paged kernels v1 and v2 (and marks the one the automatic rule picks),
* torch SDPA on contiguous ``[batch, kv_heads, context, head]`` K/V (the best of the fused
  backends that accept the shape),
* gather-then-SDPA: copy each sequence's blocks into contiguous K/V, then SDPA,

and a large device-to-device copy, whose bandwidth (bytes read + written / time) is the floor
reference. Times are medians over ``--iters`` calls, each between two CUDA events, after
``--warmup`` calls, cycling through ``--sets`` input sets (queries, block tables, outputs). Block
tables are random permutations of the cache's blocks. Effective bandwidth = KV bytes of the
contexts (read once) / time. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

from . import ops
from .layout import allocate_kv_cache

SHAPES = ((64, 32, 32, 1024), (32, 32, 32, 4096), (8, 32, 8, 16384), (128, 32, 8, 2048))
HEAD_SIZE = 128
BLOCK_SIZE = 16
DTYPE = torch.float16


def median_ms(fns, warmup: int, iters: int) -> float:
    """Median time of one call, cycling through ``fns`` (one closure per input set)."""
    for i in range(warmup):
        fns[i % len(fns)]()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth_gbs(nbytes: int = 2 << 30, warmup: int = 3, iters: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty_like(src)
    ms = median_ms([lambda: dst.copy_(src)], warmup, iters)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _sdpa_backends():
    from torch.nn.attention import SDPBackend

    return [(name, getattr(SDPBackend, name)) for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
            if hasattr(SDPBackend, name)]


def _sdpa(q, k, v, backend):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


def best_sdpa(q_sets, k, v, warmup, iters):
    """(name, ms) of the fastest fused SDPA backend that runs this shape."""
    best = ("none", float("nan"))
    for name, backend in _sdpa_backends():
        try:
            with warnings.catch_warnings():  # a backend that refuses the shape explains why at length
                warnings.simplefilter("ignore")
                _sdpa(q_sets[0], k, v, backend)
            torch.cuda.synchronize()
        except RuntimeError:
            continue
        ms = median_ms([lambda q=q: _sdpa(q, k, v, backend) for q in q_sets], warmup, iters)
        if not ms >= best[1]:
            best = (name.split("_")[0].lower(), ms)
    return best


def gather_contiguous(key_cache, value_cache, block_tables, ctx):
    """[B, kv_heads, ctx, head] K and V gathered from the paged caches."""
    b, nblk = block_tables.shape
    _, kvh, hx, bs, x = key_cache.shape
    k = key_cache[block_tables]                                   # [B, nblk, kvh, hs/x, bs, x]
    k = k.permute(0, 2, 1, 4, 3, 5).reshape(b, kvh, nblk * bs, hx * x)
    v = value_cache[block_tables]                                 # [B, nblk, kvh, hs, bs]
    v = v.permute(0, 2, 1, 4, 3).reshape(b, kvh, nblk * bs, hx * x)
    return k[:, :, :ctx], v[:, :, :ctx]


def bench_shape(batch, heads, kv_heads, ctx, *, sets, warmup, iters):
    gen = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx)
    nblk = -(-ctx // BLOCK_SIZE)
    num_blocks = batch * nblk
    key_cache, value_cache = allocate_kv_cache(num_blocks, kv_heads, HEAD_SIZE, BLOCK_SIZE, DTYPE, "cuda")
    key_cache.normal_(generator=gen)
    value_cache.normal_(generator=gen)
    scale = HEAD_SIZE ** -0.5
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    inputs = []
    for _ in range(sets):
        q = torch.randn(batch, heads, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
        perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
        inputs.append((q, perm.view(batch, nblk), torch.empty_like(q)))

    def paged(version):
        def make(q, table, out):
            return lambda: ops.paged_attention(out, q, key_cache, value_cache, kv_heads, scale, table, lens,
                                               BLOCK_SIZE, ctx, version=version, validate=False)
        # Check once (validated call), then time unvalidated calls.
        ops.paged_attention(inputs[0][2], inputs[0][0], key_cache, value_cache, kv_heads, scale, inputs[0][1],
                            lens, BLOCK_SIZE, ctx, version=version)
        return median_ms([make(*s) for s in inputs], warmup, iters)

    row = {"v1": paged("v1"), "v2": paged("v2"), "auto": ops.choose_version(batch, heads, ctx)}

    # Contiguous K/V (one copy, gathered from the cache so the values match), SDPA on it.
    k_c, v_c = gather_contiguous(key_cache, value_cache, inputs[0][1].long(), ctx)
    k_c, v_c = k_c.contiguous(), v_c.contiguous()
    q4 = [s[0].unsqueeze(2) for s in inputs]                       # [B, H, 1, D]
    row["sdpa_backend"], row["sdpa"] = best_sdpa(q4, k_c, v_c, warmup, iters)
    backend = dict(_sdpa_backends())
    name = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}.get(
        row["sdpa_backend"], "EFFICIENT_ATTENTION")
    if row["sdpa_backend"] != "none":
        # Agreement of the paged kernel with SDPA on the same data (a sanity check, not the test).
        ref = _sdpa(q4[0], k_c, v_c, backend[name]).squeeze(2).float()
        out = ops.paged_attention(None, inputs[0][0], key_cache, value_cache, kv_heads, scale, inputs[0][1], lens,
                                  BLOCK_SIZE, ctx)
        row["max_abs_diff"] = (out.float() - ref).abs().max().item()
    del k_c, v_c

    def gather_sdpa(q, table):
        k, v = gather_contiguous(key_cache, value_cache, table, ctx)
        return _sdpa(q.unsqueeze(2), k, v, backend[name])

    tables_long = [s[1].long() for s in inputs]
    row["gather_sdpa"] = float("nan")
    if row["sdpa_backend"] != "none":
        row["gather_sdpa"] = median_ms([lambda q=s[0], t=t: gather_sdpa(q, t) for s, t in zip(inputs, tables_long)],
                                       warmup, iters)
    row["kv_bytes"] = 2 * batch * ctx * kv_heads * HEAD_SIZE * torch.empty((), dtype=DTYPE).element_size()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--sets", type=int, default=4, help="input sets cycled through (queries, block tables)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels.bench needs a CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    copy_gbs = copy_bandwidth_gbs()
    print(f"device: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}")
    print(f"head_size {HEAD_SIZE}, {str(DTYPE).replace('torch.', '')}, block_size {BLOCK_SIZE}; median of "
          f"{args.iters} calls after {args.warmup} warm-up calls, {args.sets} rotating input sets")
    print(f"device copy bandwidth (read + write): {copy_gbs:.0f} GB/s\n")
    print("| batch, heads, kv heads, context | KV MB | v1 ms | v2 ms | auto | auto GB/s | % of copy BW "
          "| SDPA contiguous ms (backend) | SDPA GB/s | gather+SDPA ms | max abs diff vs SDPA |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        r = bench_shape(*shape, sets=args.sets, warmup=args.warmup, iters=args.iters)
        torch.cuda.empty_cache()  # the shape's caches are gone: give the memory back before the next
        gbs = r["kv_bytes"] / (r[r["auto"]] * 1e-3) / 1e9
        sdpa_gbs = r["kv_bytes"] / (r["sdpa"] * 1e-3) / 1e9
        print(f"| {', '.join(map(str, shape))} | {r['kv_bytes'] / 1e6:.0f} | {r['v1']:.3f} | {r['v2']:.3f} | "
              f"{r['auto']} | {gbs:.0f} | {100 * gbs / copy_gbs:.0f}% | {r['sdpa']:.3f} ({r['sdpa_backend']}) | "
              f"{sdpa_gbs:.0f} | {r['gather_sdpa']:.3f} | {r.get('max_abs_diff', float('nan')):.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import math
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

from . import fast, ops
from .reference_fast import FP8

SHAPES = ((64, 32, 32, 1024), (32, 32, 32, 4096), (8, 32, 8, 16384), (128, 32, 8, 2048), (1, 32, 8, 32768),
          (256, 32, 8, 512))
SWEEP_BATCH = (1, 4, 16, 64, 256)
SWEEP_CONTEXT = (512, 2048, 8192, 32768, 131072)
SPLITS = (256, 512, 1024, 2048)
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
HEAD_SIZE = 128
BLOCK_SIZE = 16
DTYPE = torch.float16
STORE = fast.DEFAULT_STORAGE  # the storage of the fast kernel's caches in every section but the headline's "fast" column


def median_ms(fns, warmup: int, iters: int) -> float:
    """Median time of one call, cycling through ``fns`` (one closure per input set), each call
    between two CUDA events (eager launches)."""
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


def graph_ms(fns, warmup: int, iters: int) -> float:
    """Median time of one call: a CUDA graph calls every closure of ``fns`` once; the median
    replay time is divided by ``len(fns)``."""
    for f in fns:  # eager first: builds, handles, lazy initialisation stay out of the capture
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(warmup):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / len(fns)
    del graph
    return ms


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


def backend_label(name: str) -> str:
    """"flash", "cudnn", "efficient", "math" for an ``SDPBackend`` member name."""
    return name.split("_")[0].lower()


def sdpa_runs(q, k, v, backend) -> bool:
    """Whether the SDPA ``backend`` runs these inputs (a backend that refuses a shape raises)."""
    try:
        with warnings.catch_warnings():  # a backend that refuses the shape explains why at length
            warnings.simplefilter("ignore")
            _sdpa(q, k, v, backend)
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return True


def best_sdpa(q_sets, k, v, warmup, iters):
    """(name, backend, ms) of the fastest fused SDPA backend that runs this shape."""
    best = ("none", None, float("nan"))
    for name, backend in _sdpa_backends():
        if not sdpa_runs(q_sets[0], k, v, backend):
            continue
        try:
            ms = graph_ms([lambda q=q: _sdpa(q, k, v, backend) for q in q_sets], warmup, iters)
        except RuntimeError:
            continue
        if not ms >= best[2]:
            best = (backend_label(name), backend, ms)
    return best


def gather_contiguous(key_cache, value_cache, block_tables, ctx):
    """[B, kv_heads, ctx, head] K and V gathered from fast-layout caches
    ([num_blocks, block_size, kv_heads, head])."""
    b, nblk = block_tables.shape
    _, bs, kvh, hs = key_cache.shape
    k = key_cache[block_tables].reshape(b, nblk * bs, kvh, hs)[:, :ctx].transpose(1, 2)
    v = value_cache[block_tables].reshape(b, nblk * bs, kvh, hs)[:, :ctx].transpose(1, 2)
    return k, v


class Case:
    """One shape's data: a fast-layout cache (random normal values), random block tables, query
    sets, and on demand the same tokens in the vLLM layout and contiguous."""

    def __init__(self, batch, heads, kv_heads, ctx, *, sets, block_size=BLOCK_SIZE, storage="NHD"):
        self.shape = (batch, heads, kv_heads, ctx)
        self.batch, self.heads, self.kv_heads, self.ctx, self.block_size = batch, heads, kv_heads, ctx, block_size
        gen = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx + block_size)
        self.nblk = -(-ctx // block_size)
        self.num_blocks = batch * self.nblk
        self.kc, self.vc = fast.allocate_fast_kv_cache(self.num_blocks, block_size, kv_heads, HEAD_SIZE, DTYPE,
                                                       "cuda", storage=storage)
        self.kc.normal_(generator=gen)
        self.vc.normal_(generator=gen)
        self.scale = HEAD_SIZE ** -0.5
        self.lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        self.sets = []
        for _ in range(sets):
            q = torch.randn(batch, heads, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
            perm = torch.randperm(self.num_blocks, device="cuda", generator=gen).to(torch.int32)
            self.sets.append((q, perm.view(batch, self.nblk), torch.empty_like(q)))
        self.kv_bytes = 2 * batch * ctx * kv_heads * HEAD_SIZE * 2

    def fast_ms(self, warmup, iters, *, kc=None, vc=None, **kw):
        kc = self.kc if kc is None else kc
        vc = self.vc if vc is None else vc
        q, t, o = self.sets[0]
        fast.paged_attention(o, q, kc, vc, self.kv_heads, self.scale, t, self.lens, self.block_size, self.ctx, **kw)
        return graph_ms([lambda q=q, t=t, o=o: fast.paged_attention(o, q, kc, vc, self.kv_heads, self.scale, t,
                                                                     self.lens, self.block_size, self.ctx,
                                                                     validate=False, **kw)
                         for q, t, o in self.sets], warmup, iters)

    def fast_ms_in_order(self, warmup, iters, **kw):
        """``fast_ms`` with every sequence's blocks consecutive in the cache (block tables in order)
        instead of random: what paging costs in DRAM and TLB locality."""
        random_sets = self.sets
        in_order = torch.arange(self.num_blocks, dtype=torch.int32, device="cuda").view(self.batch, self.nblk)
        self.sets = [(q, in_order, o) for q, _, o in random_sets]
        try:
            return self.fast_ms(warmup, iters, **kw)
        finally:
            self.sets = random_sets

    def fast_out(self, kc=None, vc=None, **kw):
        q, t, _ = self.sets[0]
        return fast.paged_attention(None, q, self.kc if kc is None else kc, self.vc if vc is None else vc,
                                    self.kv_heads, self.scale, t, self.lens, self.block_size, self.ctx, **kw)

    def vllm_caches(self):
        from .layout import allocate_kv_cache

        vk, vv = allocate_kv_cache(self.num_blocks, self.kv_heads, HEAD_SIZE, self.block_size, DTYPE, "cuda")
        slots = torch.arange(self.num_blocks * self.block_size, device="cuda")
        ops.reshape_and_cache(self.kc.flatten(0, 1), self.vc.flatten(0, 1), vk, vv, slots, validate=False)
        return vk, vv

    def vllm_ms(self, vk, vv, version, warmup, iters):
        q, t, o = self.sets[0]
        ops.paged_attention(o, q, vk, vv, self.kv_heads, self.scale, t, self.lens, self.block_size, self.ctx,
                            version=version)
        return graph_ms([lambda q=q, t=t, o=o: ops.paged_attention(o, q, vk, vv, self.kv_heads, self.scale, t,
                                                                    self.lens, self.block_size, self.ctx,
                                                                    version=version, validate=False)
                         for q, t, o in self.sets], warmup, iters)

    def contiguous(self):
        k, v = gather_contiguous(self.kc, self.vc, self.sets[0][1].long(), self.ctx)
        return k.contiguous(), v.contiguous()

    def gather_sdpa_ms(self, backend, warmup, iters):
        """Gather (torch indexing) then SDPA, always from NHD caches (contiguous copies of other
        storages): one contiguous row per token, the layout torch's gather handles best."""
        tables = [s[1].long() for s in self.sets]
        kc, vc = self.kc.contiguous(), self.vc.contiguous()

        def run(q, table):
            k, v = gather_contiguous(kc, vc, table, self.ctx)
            return _sdpa(q.unsqueeze(2), k, v, backend)
        return median_ms([lambda q=s[0], t=t: run(q, t) for s, t in zip(self.sets, tables)], min(warmup, 3), iters)


def gbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def alternating_runs(c, backend, args):
    """The fast kernel on case ``c`` and SDPA (``backend``) on the same tokens, measured in turn
    ``args.repeats`` times: lists of times (ms), so that medians compare the two under the same
    drift of the device's speed. The pair's order alternates (fast first, then SDPA first), so
    that whatever the first of two measurements gains or loses falls on both sides."""
    k, v = c.contiguous()
    q4 = [s[0].unsqueeze(2) for s in c.sets]
    fast_runs, sdpa_runs = [], []
    for i in range(args.repeats):
        pair = [lambda: fast_runs.append(c.fast_ms(args.warmup, args.iters)),
                lambda: sdpa_runs.append(graph_ms([lambda q=q: _sdpa(q, k, v, backend) for q in q4],
                                                  args.warmup, args.iters))]
        for measure in (pair if i % 2 == 0 else pair[::-1]):
            measure()
    del k, v
    return fast_runs, sdpa_runs


def alternate_with_sdpa(c, backend, args) -> dict:
    """``alternating_runs`` on case ``c``: both lists of times, their medians ("fast", "sdpa") and
    the paired ``ratio_interval``."""
    fast_runs, sdpa_runs = alternating_runs(c, backend, args)
    return {"fast_runs": fast_runs, "sdpa_runs": sdpa_runs, "fast": statistics.median(fast_runs),
            "sdpa": statistics.median(sdpa_runs), "ratio_interval": ratio_interval(fast_runs, sdpa_runs)}


def ratio_interval(fast_runs, sdpa_runs, confidence: float = 0.95) -> dict:
    """The fast / SDPA time ratios of paired alternating measurements: their median and a
    distribution-free confidence interval for it (order statistics of the ratios: the narrowest
    pair ``(k-th smallest, k-th largest)`` whose coverage, ``1 - 2 P(Binomial(n, 1/2) < k)``, is
    at least ``confidence``; min and max with their lower coverage when there are too few pairs).
    An interval below 1 says the kernel is faster, above 1 slower, across 1 that the run cannot
    tell them apart."""
    if len(fast_runs) != len(sdpa_runs):
        raise ValueError(f"ratio_interval pairs the runs: {len(fast_runs)} fast and {len(sdpa_runs)} SDPA times")
    ratios = sorted(f / s for f, s in zip(fast_runs, sdpa_runs))
    n = len(ratios)
    if n == 0:
        raise ValueError("ratio_interval needs at least one pair of measurements")

    def coverage(k):  # of (k-th smallest, k-th largest), k >= 1
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return {"median": statistics.median(ratios), "low": ratios[k - 1], "high": ratios[n - k],
            "coverage": coverage(k), "pairs": n}


def interval_label(iv: dict) -> str:
    """``median [low, high] verdict``, with the interval's coverage appended when under 95%."""
    verdict = "faster" if iv["high"] < 1 else "slower" if iv["low"] > 1 else "same"
    label = f"{iv['median']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}] {verdict}"
    return label if iv["coverage"] >= 0.95 else f"{label} ({100 * iv['coverage']:.0f}% interval)"


def run_shape(shape, args, copy_gbs, *, gather=True, storage="NHD", alternate=False):
    """Every implementation on one shape: a dict of times (ms) and checks ("fast": the fast
    kernel on caches stored ``storage``; with ``alternate``, "fast" and "sdpa" are medians of
    ``alternate_with_sdpa``), and the fastest SDPA backend (None if none runs the shape)."""
    c = Case(*shape, sets=args.sets, storage=storage)
    w, n = args.warmup, args.iters
    r = {"shape": list(shape), "kv_bytes": c.kv_bytes, "copy_gbs": copy_gbs}
    r["fast"] = c.fast_ms(w, n)
    launch = fast.choose_launch(c.batch, c.heads, c.kv_heads, HEAD_SIZE, DTYPE, c.ctx,
                                torch.cuda.get_device_properties(0).multi_processor_count, tuning=fast.device_tuning(0))
    r["split_tokens"], r["load_path"], r["max_ctas_per_sm"], r["warp_items"] = launch
    out_fast = c.fast_out().float()
    vk, vv = c.vllm_caches()
    r["auto"] = ops.choose_version(c.batch, c.heads, c.ctx)
    r["v1"] = c.vllm_ms(vk, vv, "v1", w, n) if c.ctx <= ops.v1_max_context_len(0, BLOCK_SIZE) else float("nan")
    r["v2"] = c.vllm_ms(vk, vv, "v2", w, n)
    del vk, vv
    torch.cuda.empty_cache()
    k, v = c.contiguous()
    q4 = [s[0].unsqueeze(2) for s in c.sets]
    r["sdpa_backend"], backend, r["sdpa"] = best_sdpa(q4, k, v, w, n)
    if backend is not None:
        ref = _sdpa(q4[0], k, v, backend).squeeze(2).float()
        r["max_abs_diff"] = (out_fast - ref).abs().max().item()
    del k, v
    torch.cuda.empty_cache()
    r["gather_sdpa"] = c.gather_sdpa_ms(backend, w, max(5, n // 5)) if gather and backend is not None else float("nan")
    if alternate and backend is not None:
        r.update(alternate_with_sdpa(c, backend, args))
    return r, backend


def headline(args, copy_gbs, results):
    print("\n## Headline shapes (block size 16)\n")
    print(f"fast ms, GB/s, % of copy and fast, prefetch: NHD storage; fast {STORE} and fast, no PDL: the default "
          f"storage. fast {STORE} and SDPA: medians of {args.repeats} alternating measurements; paired: the median "
          f"of their {args.repeats} time ratios with a distribution-free interval of at least 95% coverage where "
          f"there are 6 or more pairs (faster / slower: the interval lies below / above 1; same: it contains 1)\n")
    print(f"| batch, heads, kv heads, context | KV MB | fast ms | fast GB/s | fast % of copy | fast {STORE} ms | "
          f"fast {STORE} % of copy | "
          f"fast {STORE}, blocks in order ms | fast, no PDL ms | load path | fast, prefetch ms | v1 ms | v2 ms | auto | SDPA contiguous ms (backend) | SDPA % of copy | "
          f"fast {STORE} / SDPA time | paired fast / SDPA [interval] | gather+SDPA ms | max abs diff fast vs SDPA |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---|---:|---:|")
    for shape in SHAPES:
        r, backend = run_shape(shape, args, copy_gbs)
        c = Case(*shape, sets=args.sets, storage=STORE)
        # the comparison with SDPA: medians of alternating measurements, so that a drift of the
        # device's speed during the run does not favour either side
        if backend is not None:
            paired = alternate_with_sdpa(c, backend, args)
            r["fast_default_runs"] = paired["fast_runs"]
            r["sdpa_runs"], r["sdpa"], r["ratio_interval"] = paired["sdpa_runs"], paired["sdpa"], paired["ratio_interval"]
        else:
            r["fast_default_runs"] = [c.fast_ms(args.warmup, args.iters)]
        r["fast_default"] = statistics.median(r["fast_default_runs"])
        r["fast_default_no_pdl"] = (c.fast_ms(args.warmup, args.iters, pdl=False) if r["split_tokens"] < c.ctx
                                else float("nan"))
        r["fast_default_in_order"] = c.fast_ms_in_order(args.warmup, args.iters)
        del c
        c = Case(*shape, sets=args.sets)
        r["fast_prefetch"] = c.fast_ms(args.warmup, args.iters, prefetch=True, stages=0)
        r["fast_no_prefetch"] = c.fast_ms(args.warmup, args.iters, prefetch=False, stages=0)
        del c
        torch.cuda.empty_cache()
        results["headline"].append(r)
        fg = gbs(r["kv_bytes"], r["fast"])
        print(f"| {', '.join(map(str, shape))} | {r['kv_bytes'] / 1e6:.0f} | {r['fast']:.4f} | {fg:.0f} | "
              f"{100 * fg / copy_gbs:.0f}% | {r['fast_default']:.4f} | {100 * gbs(r['kv_bytes'], r['fast_default']) / copy_gbs:.1f}% | "
              f"{r['fast_default_in_order']:.4f} | "
              f"{'-' if r['fast_default_no_pdl'] != r['fast_default_no_pdl'] else format(r['fast_default_no_pdl'], '.4f')} | "
              f"{load_path_label(r['load_path'], r['max_ctas_per_sm'], r['warp_items'])} | "
              f"{r['fast_prefetch']:.4f} | {r['v1']:.4f} | {r['v2']:.4f} | {r['auto']} | "
              f"{r['sdpa']:.4f} ({r['sdpa_backend']}) | {100 * gbs(r['kv_bytes'], r['sdpa']) / copy_gbs:.0f}% | "
              f"{r['fast_default'] / r['sdpa']:.3f} | "
              f"{interval_label(r['ratio_interval']) if 'ratio_interval' in r else '-'} | "
              f"{r['gather_sdpa']:.3f} | {r.get('max_abs_diff', float('nan')):.1e} |",
              flush=True)


def default_sdpa_backend(q, k, v) -> str:
    """The backend torch's SDPA dispatch picks for these inputs without an ``sdpa_kernel`` context,
    named as ``best_sdpa`` names them ("flash", "cudnn", "efficient", "math"); "unknown" where this
    torch does not say."""
    from torch.nn.attention import SDPBackend

    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None:
        return "unknown"
    try:
        return backend_label(SDPBackend(choice(q, k, v, enable_gqa=q.shape[1] != k.shape[1])).name)
    except (RuntimeError, TypeError, ValueError):
        return "unknown"


def backends(args, copy_gbs, results):
    """The headline shapes against every fused SDPA backend that runs them, each paired with the
    fast kernel (default storage) in its own alternating measurements."""
    names = [(backend_label(name), backend) for name, backend in _sdpa_backends()]
    print("\n## Headline shapes against each SDPA backend (block size 16)\n")
    print(f"fast: the default storage ({STORE}); each backend on contiguous K/V, paired with the fast kernel in "
          f"{args.repeats} alternating measurements of its own (median ms; paired: the median time ratio with its "
          f"interval, as in the headline); default: the backend torch's SDPA picks without an sdpa_kernel "
          f"context; -: the backend does not run the shape\n")
    print("| batch, heads, kv heads, context | default | "
          + " | ".join(f"{n} ms | {n} % of copy | paired fast / {n} [interval]" for n, _ in names) + " |")
    print("|---|---|" + "---:|---:|---|" * len(names))
    for shape in SHAPES:
        c = Case(*shape, sets=args.sets, storage=STORE)
        k, v = c.contiguous()
        q = c.sets[0][0].unsqueeze(2)
        r = {"shape": list(shape), "kv_bytes": c.kv_bytes, "default_backend": default_sdpa_backend(q, k, v),
             "backends": {}}
        runs = {name: backend for name, backend in names if sdpa_runs(q, k, v, backend)}
        del k, v, q
        torch.cuda.empty_cache()
        cells = []
        for name, _ in names:
            if name not in runs:
                cells.append("- | - | -")
                continue
            paired = alternate_with_sdpa(c, runs[name], args)
            r["backends"][name] = paired
            cells.append(f"{paired['sdpa']:.4f} | {100 * gbs(c.kv_bytes, paired['sdpa']) / copy_gbs:.0f}% | "
                         f"{interval_label(paired['ratio_interval'])}")
        del c
        torch.cuda.empty_cache()
        results["backends"].append(r)
        print(f"| {', '.join(map(str, shape))} | {r['default_backend']} | " + " | ".join(cells) + " |", flush=True)


def load_path_label(stages: int, max_ctas_per_sm: int | None, warp_items: bool = False) -> str:
    path = f"ring {stages}" if stages else "registers"
    path = path if max_ctas_per_sm is None else f"{path}, <= {max_ctas_per_sm}/SM"
    return f"{path}, warp items" if warp_items else path


def splits(args, copy_gbs, results):
    print("\n## Split length (fast kernel, block size 16, the chosen load path and occupancy): % of copy bandwidth\n")
    print("| batch, heads, kv heads, context | auto (tokens) | whole context | "
          + " | ".join(f"{s} tokens" for s in SPLITS) + " |")
    print("|---|---:|---:|" + "---:|" * len(SPLITS))
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    for shape in SHAPES:
        c = Case(*shape, sets=args.sets, storage=STORE)
        auto, st, cap, wi = fast.choose_launch(c.batch, c.heads, c.kv_heads, HEAD_SIZE, DTYPE, c.ctx, nsm,
                                               tuning=fast.device_tuning(0))
        kw = {"stages": st, "max_ctas_per_sm": cap}  # splits: a block per item (warp items lose with splits)
        row = {"shape": list(shape), "auto_tokens": auto, "auto": c.fast_ms(args.warmup, args.iters),
               "whole": c.fast_ms(args.warmup, args.iters, split_tokens=-(-c.ctx // 16) * 16, warp_items=wi, **kw)}
        for s in SPLITS:
            row[str(s)] = c.fast_ms(args.warmup, args.iters, split_tokens=s, **kw) if s < c.ctx else float("nan")
        results["splits"].append(row)
        kv = c.kv_bytes

        def pct(ms, kv=kv):
            return "-" if ms != ms else f"{100 * gbs(kv, ms) / copy_gbs:.0f}%"
        print(f"| {', '.join(map(str, shape))} | {pct(row['auto'])} ({auto}) | {pct(row['whole'])} | "
              + " | ".join(pct(row[str(s)]) for s in SPLITS) + " |", flush=True)
        del c
        torch.cuda.empty_cache()


def stages(args, copy_gbs, results):
    """The load paths (register loads, cp.async rings of 2-4 stages) by split length, default storage."""
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    depths = tuple(int(d) for d in args.depths.split(","))
    cols = ("auto", *SPLITS, "whole")
    table = {d: [] for d in depths}
    for shape in SHAPES:
        c = Case(*shape, sets=args.sets, storage=STORE)
        for d in depths:
            auto = fast.choose_split_tokens(c.batch, c.heads, c.kv_heads, c.ctx, nsm)  # the plain rule
            row = {"shape": list(shape), "stages": d, "auto_tokens": auto}
            for col in cols:
                split = auto if col == "auto" else -(-c.ctx // 16) * 16 if col == "whole" else col
                if col not in ("auto", "whole") and col >= c.ctx:
                    row[str(col)] = float("nan")
                    continue
                row[str(col)] = c.fast_ms(args.warmup, args.iters, split_tokens=split, stages=d)
            row["kv_bytes"] = c.kv_bytes
            table[d].append(row)
            results["stages"].append(row)
        del c
        torch.cuda.empty_cache()
    from ._build import extension

    occ = {d: extension().fast_decode_ctas_per_sm(HEAD_SIZE, "float16", d, False, 0) for d in depths}
    occ_prefetch = extension().fast_decode_ctas_per_sm(HEAD_SIZE, "float16", 0, True, 0)
    print(f"\nthread blocks per SM (occupancy API): prefetch {occ_prefetch}, "
          + ", ".join(f"{d} stages {occ[d]}" for d in depths))
    results["ctas_per_sm"] = {"prefetch": occ_prefetch, **{str(d): occ[d] for d in depths}}
    for d in depths:
        name = "register loads (stages=0, prefetch by choose_prefetch)" if d == 0 else f"cp.async ring, {d} stages"
        print(f"\n## Load path: {name}, {STORE} storage, block size 16: % of copy bandwidth (auto: ms)\n")
        print("| batch, heads, kv heads, context | auto (tokens) | auto ms | " + " | ".join(f"{s} tokens" for s in SPLITS)
              + " | whole context |")
        print("|---|---:|---:|" + "---:|" * (len(SPLITS) + 1))
        for row in table[d]:
            def pct(ms, kv=row["kv_bytes"]):
                return "-" if ms != ms else f"{100 * gbs(kv, ms) / copy_gbs:.1f}%"
            print(f"| {', '.join(map(str, row['shape']))} | {pct(row['auto'])} ({row['auto_tokens']}) | "
                  f"{row['auto']:.4f} | " + " | ".join(pct(row[str(s)]) for s in SPLITS) + f" | {pct(row['whole'])} |",
                  flush=True)


OCCUPANCY_SHAPES = SHAPES + ((16, 32, 8, 8192), (4, 32, 8, 32768), (1, 32, 8, 131072), (64, 32, 8, 8192),
                             (16, 32, 8, 32768), (1, 32, 8, 2048), (4, 32, 8, 512), (16, 32, 8, 512),
                             # around the warp-items rule: 480, 768, 1536 and 2048 items; short contexts
                             (60, 32, 8, 4096), (96, 32, 8, 2048), (48, 32, 32, 2048), (256, 32, 8, 2048),
                             (32, 32, 32, 1024), (64, 32, 8, 1024), (64, 32, 8, 512))
# (thread blocks per SM the split aims at, ring stages, cap passed as max_ctas_per_sm)
OCCUPANCY_CONFIGS = ((1, 4, None), (1, 3, 1), (1, 2, 1), (2, 2, 2), (2, 3, None), (3, 2, None))


def occupancy(args, copy_gbs, results):
    """Resident blocks per SM x ring depth, each with the split of one wave at that occupancy, as
    time relative to SDPA on contiguous K/V (default storage): the measurements behind choose_launch."""
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    labels = [f"{n}/SM, {st} stages" + (f", cap {cap}" if cap else "") for n, st, cap in OCCUPANCY_CONFIGS]
    print("\n## Occupancy and ring depth (one wave of blocks at that occupancy): fast / SDPA time\n")
    print("warp items: whole contexts, each warp a whole (sequence, KV head) item, 2 stages, at most 2 blocks per "
          "SM\n")
    print("| batch, heads, kv heads, context | SDPA ms | auto (split, path) | " + " | ".join(labels)
          + " | warp items (blocks) |")
    print("|---|---:|---|" + "---:|" * (len(labels) + 1))
    for shape in OCCUPANCY_SHAPES:
        c = Case(*shape, sets=args.sets, storage=STORE)
        k, v = c.contiguous()
        _, _, sdpa_ms = best_sdpa([s[0].unsqueeze(2) for s in c.sets], k, v, args.warmup, args.iters)
        del k, v
        torch.cuda.empty_cache()
        launch = fast.choose_launch(c.batch, c.heads, c.kv_heads, HEAD_SIZE, DTYPE, c.ctx, nsm,
                                    tuning=fast.device_tuning(0))
        items = fast.work_items(c.batch, c.heads, c.kv_heads)
        row = {"shape": list(shape), "sdpa": sdpa_ms, "auto": c.fast_ms(args.warmup, args.iters),
               "auto_launch": list(launch)}
        for label, (n, st, cap) in zip(labels, OCCUPANCY_CONFIGS):
            split = fast.one_wave_split(items, c.ctx, n, nsm)
            row[label] = c.fast_ms(args.warmup, args.iters, split_tokens=split, stages=st, max_ctas_per_sm=cap)
            row[label + " split"] = split
        blocks = c.batch * -(-fast.work_items(1, c.heads, c.kv_heads) // fast.WARPS)  # of warp items
        row["warp items"] = c.fast_ms(args.warmup, args.iters, split_tokens=-(-c.ctx // 16) * 16, stages=2,
                                      max_ctas_per_sm=2, warp_items=True)
        results["occupancy"].append(row)
        print(f"| {', '.join(map(str, shape))} | {sdpa_ms:.4f} | {row['auto'] / sdpa_ms:.3f} ({launch.split_tokens}, "
              f"{load_path_label(launch.stages, launch.max_ctas_per_sm, launch.warp_items)}) | "
              + " | ".join(f"{row[lb] / sdpa_ms:.3f} ({row[lb + ' split']})" for lb in labels)
              + f" | {row['warp items'] / sdpa_ms:.3f} ({blocks}) |", flush=True)
        del c
        torch.cuda.empty_cache()


def block_sizes(args, copy_gbs, results):
    print("\n## Block size (fast kernel): ms (% of copy bandwidth)\n")
    print("| batch, heads, kv heads, context | " + " | ".join(f"block {b}" for b in BLOCK_SIZES)
          + " | worst vs block 16 |")
    print("|---|" + "---:|" * (len(BLOCK_SIZES) + 1))
    for shape in ((8, 32, 8, 16384), (128, 32, 8, 2048), (1, 32, 8, 32768), (64, 32, 32, 1024)):
        row = {"shape": list(shape)}
        for b in BLOCK_SIZES:
            c = Case(*shape, sets=args.sets, block_size=b, storage=STORE)
            row[str(b)] = c.fast_ms(args.warmup, args.iters)
            kv = c.kv_bytes
            del c
            torch.cuda.empty_cache()
        results["block_sizes"].append(row)
        worst = max(row[str(b)] for b in BLOCK_SIZES) / row["16"] - 1
        print(f"| {', '.join(map(str, shape))} | "
              + " | ".join(f"{row[str(b)]:.4f} ({100 * gbs(kv, row[str(b)]) / copy_gbs:.0f}%)" for b in BLOCK_SIZES)
              + f" | {100 * worst:+.1f}% |", flush=True)


def fp8(args, copy_gbs, results):
    print("\n## fp8 (e4m3) caches, per-tensor scales (block size 16)\n")
    print("| batch, heads, kv heads, context | fp16 ms | fp8 ms | fp8 speed-up | fp8 GB/s (fp8 bytes) | "
          "fp16 rel. error | fp8 rel. error | fp8 max abs error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        c = Case(*shape, sets=args.sets, storage=STORE)
        ks, vs = fast.fp8_scale(c.kc), fast.fp8_scale(c.vc)
        k8, v8 = fast.allocate_fast_kv_cache(c.num_blocks, BLOCK_SIZE, c.kv_heads, HEAD_SIZE, FP8, "cuda", storage=STORE)
        fast.reshape_and_cache_fast(c.kc.flatten(0, 1), c.vc.flatten(0, 1), k8, v8,
                                    torch.arange(c.num_blocks * BLOCK_SIZE, device="cuda"), k_scale=ks, v_scale=vs,
                                    validate=False)
        t16 = c.fast_ms(args.warmup, args.iters)
        t8 = c.fast_ms(args.warmup, args.iters, kc=k8, vc=v8, k_scale=ks, v_scale=vs)
        o16 = c.fast_out().float()
        o8 = c.fast_out(k8, v8, k_scale=ks, v_scale=vs).float()
        del k8, v8
        # float32 reference on the unquantised float16 values, one sequence group at a time
        q, table, _ = c.sets[0]
        ref = torch.empty(o16.shape, device="cuda")
        step = max(1, (1 << 27) // (c.ctx * c.kv_heads * HEAD_SIZE))
        for s0 in range(0, c.batch, step):
            k, v = gather_contiguous(c.kc, c.vc, table[s0:s0 + step].long(), c.ctx)
            ref[s0:s0 + step] = F.scaled_dot_product_attention(q[s0:s0 + step].unsqueeze(2).float(), k.float(),
                                                               v.float(), enable_gqa=c.heads != c.kv_heads).squeeze(2)
        rel = lambda o: ((o - ref).norm() / ref.norm()).item()  # noqa: E731
        row = {"shape": list(shape), "fp16": t16, "fp8": t8, "rel_fp16": rel(o16), "rel_fp8": rel(o8),
               "max_abs_fp8": (o8 - ref).abs().max().item(), "k_scale": ks, "v_scale": vs}
        results["fp8"].append(row)
        print(f"| {', '.join(map(str, shape))} | {t16:.4f} | {t8:.4f} | {t16 / t8:.2f}x | "
              f"{gbs(c.kv_bytes / 2, t8):.0f} | {row['rel_fp16']:.1e} | {row['rel_fp8']:.1e} | "
              f"{row['max_abs_fp8']:.1e} |", flush=True)
        del c
        torch.cuda.empty_cache()


def sweep(args, copy_gbs, results):
    print(f"\n## Sweep: 32 heads on 8 KV heads, block size 16 (fast: {STORE} storage), KV <= {args.max_kv_gb} GB: "
          f"effective GB/s (fast and SDPA: medians of {args.repeats} alternating measurements)\n")
    print("| batch | context | KV MB | fast | v1/v2 (auto) | SDPA contiguous | gather+SDPA | fast % of copy | "
          "fast / SDPA time | paired fast / SDPA [interval] |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for b in SWEEP_BATCH:
        for ctx in SWEEP_CONTEXT:
            kv = 2 * b * ctx * 8 * HEAD_SIZE * 2
            if kv > args.max_kv_gb * 1e9:
                continue
            r, _ = run_shape((b, 32, 8, ctx), args, copy_gbs, gather=kv <= args.max_kv_gb * 1e9 / 2, storage=STORE,
                             alternate=True)
            auto = r["v1"] if r["auto"] == "v1" else r["v2"]
            results["sweep"].append(r)
            print(f"| {b} | {ctx} | {kv / 1e6:.0f} | {gbs(kv, r['fast']):.0f} | {gbs(kv, auto):.0f} ({r['auto']}) | "
                  f"{gbs(kv, r['sdpa']):.0f} | {gbs(kv, r['gather_sdpa']):.0f} | "
                  f"{100 * gbs(kv, r['fast']) / copy_gbs:.0f}% | {r['fast'] / r['sdpa']:.2f} | "
                  f"{interval_label(r['ratio_interval']) if 'ratio_interval' in r else '-'} |", flush=True)
            torch.cuda.empty_cache()


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["sweep"]
    batches = sorted({r["shape"][0] for r in rows})
    impls = (("fast", "fast (impl='fast')", "-"), ("vllm", "vLLM layout v1/v2 (auto)", ":"),
             ("sdpa", "SDPA, contiguous K/V", "--"), ("gather_sdpa", "gather + SDPA", "-."))
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 4), sharey=True)
    for ax, b in zip(axes, batches):
        pts = sorted((r for r in rows if r["shape"][0] == b), key=lambda r: r["shape"][3])
        ctx = [r["shape"][3] for r in pts]
        for key, label, style in impls:
            ms = [r["v1"] if key == "vllm" and r["auto"] == "v1" else r["v2"] if key == "vllm" else r[key]
                  for r in pts]
            ax.plot(ctx, [r["kv_bytes"] / (t * 1e-3) / 1e9 for r, t in zip(pts, ms)], style, marker="o", label=label)
        ax.axhline(rows[0]["copy_gbs"], color="grey", lw=0.8, label="copy bandwidth (read + write)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"batch {b}")
        ax.set_xlabel("context (tokens)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("effective KV bandwidth (GB/s)")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Decode attention, 32 heads / 8 KV heads, head 128, float16, block 16 ({results['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# The simulator's GPU specs (blocksim/catalog.py) and its default bandwidth efficiency
# (blocksim/cost.py CostParams.bw_efficiency), copied so that this module needs no blocksim import.
CATALOG_HBM_GBS = {"H200": ("h200-141gb", 4800.0), "H100": ("h100-80gb", 3350.0)}
COST_BW_EFFICIENCY = 0.8


def write_profile(results, path) -> dict | None:
    """A cost profile for ``blocksim replay --cost-profile``: ``scale_attn_decode`` = measured time
    of the fast kernel / the cost model's predicted time (KV bytes / (hbm_bw * bw_efficiency)),
    over all headline shapes together (total KV bytes / total time)."""
    rows = results["headline"]
    gpu = next((v for k, v in CATALOG_HBM_GBS.items() if k in results["device"]), None)
    if not rows or gpu is None:
        return None
    total_bytes = sum(r["kv_bytes"] for r in rows)
    total_ms = sum(r["fast_default"] for r in rows)
    measured = total_bytes / (total_ms * 1e-3) / 1e9
    predicted = gpu[1] * COST_BW_EFFICIENCY
    profile = {"params": {"scale_attn_decode": round(predicted / measured, 4)},
               "source": (f"python -m kernels.bench --profile (kernels/bench.py) on {results['device']}, torch "
                          f"{results['torch']}: fast decode kernel (impl='fast', float16, head 128, block 16, {STORE} storage) over "
                          f"the {len(rows)} headline shapes, {total_bytes / 1e9:.2f} GB of KV in {total_ms:.3f} ms = "
                          f"{measured:.0f} GB/s effective; the cost model assumes {gpu[0]} hbm_bw {gpu[1]:.0f} GB/s x "
                          f"bw_efficiency {COST_BW_EFFICIENCY} = {predicted:.0f} GB/s; scale = predicted / measured "
                          f"bandwidth = measured / predicted time. Copy bandwidth in the same run: "
                          f"{results['copy_gbs']:.0f} GB/s.")}
    with open(path, "w") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")
    return profile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--sets", type=int, default=4, help="input sets cycled through (queries, block tables)")
    ap.add_argument("--repeats", type=int, default=9,
                    help="headline and sweep: alternating measurements of the fast kernel (default storage) and "
                         "SDPA, medians compared (9 pairs give a 96%% interval for the median time ratio)")
    ap.add_argument("--sections", default="headline,backends,splits,stages,occupancy,blocks,fp8,sweep",
                    help="comma-separated: headline, backends, splits, stages, occupancy, blocks, fp8, sweep")
    ap.add_argument("--depths", default="0,2,3,4", help="stages section: load paths (0 = registers, 2-4 = ring)")
    ap.add_argument("--max-kv-gb", type=float, default=4.3, help="largest KV (GB) of a sweep point")
    ap.add_argument("--json", default=None, help="write every number to this JSON file")
    ap.add_argument("--plot", default=None, help="PNG of the sweep (needs matplotlib)")
    ap.add_argument("--profile", default=None, help="write the cost profile JSON (needs the headline section)")
    ap.add_argument("--plot-from", default=None, help="plot a saved --json file and exit (no GPU needed)")
    args = ap.parse_args(argv)
    sections = {"headline": headline, "backends": backends, "splits": splits, "stages": stages,
                "occupancy": occupancy, "blocks": block_sizes, "fp8": fp8, "sweep": sweep}
    unknown = [name for name in args.sections.split(",") if name not in sections]
    if unknown:
        ap.error(f"--sections: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(sections)}")
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
    results = {"device": device, "torch": torch.__version__, "copy_gbs": copy_gbs,
               **{name: [] for name in ("headline", "backends", "splits", "stages", "occupancy", "block_sizes", "fp8",
                                        "sweep")}}
    for name in args.sections.split(","):
        sections[name](args, copy_gbs, results)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    print(f"\ndevice copy bandwidth after the run: {copy_bandwidth_gbs():.0f} GB/s")
    if args.profile:
        print(f"cost profile: {write_profile(results, args.profile)}")
    if args.plot and results["sweep"]:
        try:
            plot(results, args.plot)
        except ImportError:
            print("matplotlib not installed: no plot (use --plot-from on the --json file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

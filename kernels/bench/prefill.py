"""The ``prefill`` section: the paged prefill kernel (``kernels.paged_prefill_attention``) against
the fastest fused SDPA backend on contiguous K/V of the same shapes (the causal mask aligned to
the bottom right when there is a cached prefix), and against gather + SDPA (the cached blocks
copied to contiguous K/V, then SDPA).

Shapes are (batch, cached tokens c, new tokens p) per sequence, for llama-3-8b's heads (32 query,
8 KV, head 128) and llama-2-7b's (32 / 32), float16, block size 16, the default storage, random
block tables. The kernel and SDPA are compared by medians of ``--repeats`` alternating
measurements and the paired time ratio's interval (``stats.ratio_interval``), as the decode
headline; the contiguous K/V of SDPA are prepared outside the timing. TFLOP/s counts the causal
products only: ``4 * head * heads * batch * (p * c + p * (p + 1) / 2)``.
"""

from __future__ import annotations

import functools
import statistics
import warnings

import torch
import torch.nn.functional as F

from ..fast import layout as fast_layout
from ..fast import prefill as fast_prefill
from .cases import gather_contiguous
from .stats import interval_label, ratio_interval, rotate
from .timing import backend_label, graph_ms, median_ms, sdpa_backends

PREFILL_SHAPES = ((1, 0, 2048), (1, 0, 8192), (8, 0, 1024), (32, 0, 512), (1, 8192, 512), (4, 4096, 1024),
                  (16, 2048, 256), (1, 32768, 2048), (64, 1024, 64))
PREFILL_HEADS = (("llama-3-8b", 32, 8), ("llama-2-7b", 32, 32))
HEAD = 128
BLOCK = 16
DTYPE = torch.float16


def shapes(args):
    """The shapes a run measures: ``--prefill-shapes`` where given, else ``PREFILL_SHAPES``."""
    return getattr(args, "prefill_shapes", None) or PREFILL_SHAPES


def causal_sdpa(q, k, v, cached: int, backend):
    """SDPA on contiguous ``[batch, heads, tokens, head]`` tensors with the causal mask of new
    tokens after ``cached`` ones: ``is_causal`` when there are none, else the bottom-right-aligned
    mask (``causal_lower_right``, which the flash and efficient backends run without a mask tensor;
    others get it as a boolean mask)."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    gqa = q.shape[1] != k.shape[1]
    with sdpa_kernel([backend]):
        if cached == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                              enable_gqa=gqa)


class PrefillCase:
    """One prefill shape's data: a paged cache holding every sequence's c + p tokens (random
    values, random block tables), the new tokens' queries, and the same K/V contiguous."""

    def __init__(self, batch, cached, new, heads, kv_heads):
        self.batch, self.cached, self.new, self.heads, self.kv_heads = batch, cached, new, heads, kv_heads
        self.ctx = cached + new
        gen = torch.Generator(device="cuda").manual_seed(batch * 131 + cached + new + kv_heads)
        self.nblk = -(-self.ctx // BLOCK)
        num_blocks = batch * self.nblk
        self.kc, self.vc = fast_layout.allocate_fast_kv_cache(num_blocks, BLOCK, kv_heads, HEAD, DTYPE, "cuda")
        self.kc.normal_(generator=gen)
        self.vc.normal_(generator=gen)
        self.tables = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32).view(batch, self.nblk)
        self.query = torch.randn(batch * new, heads, HEAD, dtype=DTYPE, device="cuda", generator=gen)
        self.out = torch.empty_like(self.query)
        self.loc = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
        self.lens = torch.full((batch,), self.ctx, dtype=torch.int32, device="cuda")
        self.scale = HEAD ** -0.5
        self.flops = 4 * HEAD * heads * batch * (new * cached + new * (new + 1) / 2)

    @functools.cached_property
    def new_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The new tokens' keys and values as the cache holds them, ``[batch * new, kv_heads,
        head]`` (gathered from the blocks that hold new tokens, on first use)."""
        first = self.cached // BLOCK
        k, v = gather_contiguous(self.kc, self.vc, self.tables[:, first:].long(), self.ctx - first * BLOCK)
        skip = self.cached - first * BLOCK
        return tuple(t[:, :, skip:].transpose(1, 2).reshape(self.batch * self.new, self.kv_heads, HEAD).contiguous()
                     for t in (k, v))

    def paged(self, validate=False, config=None, new_kv=False):
        """The paged kernel on this case, into ``out``: ``config`` as ``paged_prefill_attention``'s
        (None: the configuration ``choose_prefill_config`` picks); ``new_kv``: the new tokens' keys
        and values given (``key=``, ``value=``), as a model's step has them."""
        extra = dict(zip(("key", "value"), self.new_kv)) if new_kv else {}
        return fast_prefill.paged_prefill_attention(
            self.out, self.query, self.kc, self.vc, self.kv_heads, self.scale, self.tables, self.loc, self.lens,
            BLOCK, max_query_len=self.new, max_context_len=self.ctx, config=config, validate=validate, **extra)

    def sdpa_query(self):
        return self.query.view(self.batch, self.new, self.heads, HEAD).transpose(1, 2).contiguous()

    def contiguous(self):
        k, v = gather_contiguous(self.kc, self.vc, self.tables.long(), self.ctx)
        return k.contiguous(), v.contiguous()

    def gather_sdpa(self, q, backend):
        k, v = gather_contiguous(self.kc, self.vc, self.tables.long(), self.ctx)
        return causal_sdpa(q, k, v, self.cached, backend)


def best_backend(c: PrefillCase, q, k, v, warmup, iters):
    """(label, backend, ms) of the fastest fused SDPA backend that runs the shape with its mask."""
    best = ("none", None, float("nan"))
    for name, backend in sdpa_backends():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                causal_sdpa(q, k, v, c.cached, backend)
                torch.cuda.synchronize()
                ms = graph_ms([lambda: causal_sdpa(q, k, v, c.cached, backend)], warmup, iters)
        except RuntimeError:
            continue
        if not ms >= best[2]:
            best = (backend_label(name), backend, ms)
    return best


def prefill(args, copy_gbs, results):
    print("\n## Paged prefill attention (float16, head 128, block size 16, default storage, random block tables)\n")
    print(f"paged: the kernel given the new tokens' keys and values (key=, value=: the tiles of new keys by TMA from "
          f"them, the cached ones through the block table), as a model's step calls it; table only: every key "
          f"through the block table; both and SDPA: medians of {args.repeats} measurements in rotating order "
          f"(CUDA graphs); SDPA: the fastest fused "
          f"backend on contiguous K/V of the same c + p keys with the matching causal mask (bottom-right aligned "
          f"when c > 0), its K/V prepared outside the timing; paired: the median kernel / SDPA time ratio with its "
          f"distribution-free interval; gather+SDPA: the cached blocks copied to contiguous K/V, then SDPA "
          f"(eager); '3x gather needs': the TFLOP/s a kernel must reach to take a third of gather+SDPA's time\n")
    print("| model heads | batch, cached c, new p | paged ms | paged TFLOP/s | table only ms | SDPA ms (backend) | "
          "SDPA TFLOP/s | paired paged / SDPA [interval] | paired table only / SDPA [interval] | gather+SDPA ms | "
          "gather+SDPA / paged | 3x gather needs TFLOP/s | max abs diff |")
    print("|---|---|---:|---:|---:|---|---:|---|---|---:|---:|---:|---:|")
    for model, heads, kv_heads in PREFILL_HEADS:
        for shape in shapes(args):
            c = PrefillCase(*shape, heads, kv_heads)
            c.paged(validate=True)
            q = c.sdpa_query()
            k, v = c.contiguous()
            label, backend, _ = best_backend(c, q, k, v, args.warmup, args.iters)
            r = {"model": model, "heads": heads, "kv_heads": kv_heads, "shape": list(shape), "flops": c.flops,
                 "sdpa_backend": label, "config": fast_prefill.choose_prefill_config(
                     c.batch, c.new, heads, kv_heads, HEAD, torch.cuda.get_device_properties(0).multi_processor_count,
                     wgmma=fast_prefill.wgmma_runs(DTYPE, DTYPE, HEAD, False, fast_prefill.device_capability(0)))}

            def paged_ms():
                return graph_ms([c.paged], args.warmup, args.iters)

            def paged_new_ms():
                return graph_ms([lambda: c.paged(new_kv=True)], args.warmup, args.iters)

            def sdpa_ms():
                return graph_ms([lambda: causal_sdpa(q, k, v, c.cached, backend)], args.warmup, args.iters)

            measures = [paged_new_ms, paged_ms] + ([sdpa_ms] if backend is not None else [])
            runs = rotate(measures, args.repeats)
            paged_new_runs, paged_runs = runs[0], runs[1]
            r["paged_runs"], r["paged"] = paged_runs, statistics.median(paged_runs)
            r["paged_new_kv_runs"], r["paged_new_kv"] = paged_new_runs, statistics.median(paged_new_runs)
            if backend is not None:
                sdpa_runs = runs[2]
                r["sdpa_runs"], r["sdpa"] = sdpa_runs, statistics.median(sdpa_runs)
                r["ratio_interval"] = ratio_interval(paged_runs, sdpa_runs)
                r["ratio_interval_new_kv"] = ratio_interval(paged_new_runs, sdpa_runs)
                ref = causal_sdpa(q, k, v, c.cached, backend).transpose(1, 2).reshape(c.query.shape)
                r["max_abs_diff"] = (c.paged().float() - ref.float()).abs().max().item()
                r["max_abs_diff_new_kv"] = (c.paged(new_kv=True).float() - ref.float()).abs().max().item()
                del k, v
                torch.cuda.empty_cache()
                r["gather_sdpa"] = median_ms([lambda: c.gather_sdpa(q, backend)], 3, max(5, args.iters // 3))
            else:
                r["sdpa"] = r["gather_sdpa"] = r["max_abs_diff"] = r["max_abs_diff_new_kv"] = float("nan")
            results["prefill"].append(r)
            tf = lambda ms: c.flops / (ms * 1e-3) / 1e12  # noqa: E731
            print(f"| {model} ({heads}/{kv_heads}) | {', '.join(map(str, shape))} | {r['paged_new_kv']:.4f} | "
                  f"{tf(r['paged_new_kv']):.0f} | {r['paged']:.4f} | {r['sdpa']:.4f} ({label}) | "
                  f"{tf(r['sdpa']):.0f} | "
                  f"{interval_label(r['ratio_interval_new_kv']) if 'ratio_interval' in r else '-'} | "
                  f"{interval_label(r['ratio_interval']) if 'ratio_interval' in r else '-'} | "
                  f"{r['gather_sdpa']:.3f} | {r['gather_sdpa'] / r['paged_new_kv']:.1f}x | "
                  f"{tf(r['gather_sdpa'] / 3):.0f} | {max(r['max_abs_diff'], r['max_abs_diff_new_kv']):.1e} |",
                  flush=True)
            c = q = None  # free the shape's caches before the next one
            torch.cuda.empty_cache()


def prefill_tiles(args, copy_gbs, results):
    """Each tile configuration of the kernel (``PREFILL_CONFIGS``; float16, head 128) and, on Hopper,
    the warpgroup kernels (``WARPGROUP_CONFIGS``) on the prefill shapes, against the default: the
    measurements behind ``choose_prefill_config``."""
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    wgmma = fast_prefill.wgmma_runs(DTYPE, DTYPE, HEAD, False, fast_prefill.device_capability(0))
    configs = sorted(fast_prefill.PREFILL_CONFIGS) + (list(fast_prefill.WARPGROUP_CONFIGS) if wgmma else [])
    label = lambda k: fast_prefill.PREFILL_CONFIGS.get(k, "ws" if k == fast_prefill.WS_CONFIG else "wgmma")  # noqa: E731
    print("\n## Paged prefill tile configurations (16-row tiles per warp, keys per tile, ring stages; "
          f"{fast_prefill.WGMMA_CONFIG} and {fast_prefill.WS_CONFIG}: the warpgroup kernels, on Hopper): ms\n")
    print("default: the configuration choose_prefill_config picks\n")
    print("| model heads | batch, cached c, new p | default (config) | "
          + " | ".join(f"{k}: {label(k)}" for k in configs) + " | best |")
    print("|---|---|---:|" + "---:|" * len(configs) + "---|")
    for model, heads, kv_heads in PREFILL_HEADS:
        for shape in shapes(args):
            c = PrefillCase(*shape, heads, kv_heads)
            row = {"model": model, "shape": list(shape), "default": graph_ms([c.paged], args.warmup, args.iters),
                   "config": fast_prefill.choose_prefill_config(c.batch, c.new, heads, kv_heads, HEAD, nsm,
                                                                wgmma=wgmma)}
            for k in configs:
                row[str(k)] = graph_ms([lambda k=k: c.paged(config=k)], args.warmup, args.iters)
            best = min(["default", *map(str, configs)], key=lambda n: row[n])
            results["prefill_tiles"].append(row)
            print(f"| {model} | {', '.join(map(str, shape))} | {row['default']:.4f} ({row['config']}) | "
                  + " | ".join(f"{row[str(k)]:.4f}" for k in configs) + f" | {best} |", flush=True)
            c = None
            torch.cuda.empty_cache()

"""The benchmark's sections, each a function ``(args, copy_gbs, results)`` that measures, prints
a Markdown table and appends its rows to ``results[name]``: headline, backends, splits, stages,
occupancy, blocks, fp8, sweep, and prefill (``prefill.py``) (``SECTIONS``)."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from .._build import extension
from ..fast import launch as fast_launch
from ..fast import layout as fast_layout
from ..fast import ops as fast_ops
from ..vllm import launch as vllm_launch
from .prefill import prefill, prefill_tiles
from .cases import BLOCK_SIZE, DTYPE, HEAD_SIZE, STORE, Case, gather_contiguous
from .stats import alternate_with_sdpa, interval_label
from .timing import backend_label, best_sdpa, default_sdpa_backend, gbs, sdpa, sdpa_backends, sdpa_runs

SHAPES = ((64, 32, 32, 1024), (32, 32, 32, 4096), (8, 32, 8, 16384), (128, 32, 8, 2048), (1, 32, 8, 32768),
          (256, 32, 8, 512))
SWEEP_BATCH = (1, 4, 16, 64, 256)
SWEEP_CONTEXT = (512, 2048, 8192, 32768, 131072)
SPLITS = (256, 512, 1024, 2048)
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
OCCUPANCY_SHAPES = SHAPES + ((16, 32, 8, 8192), (4, 32, 8, 32768), (1, 32, 8, 131072), (64, 32, 8, 8192),
                             (16, 32, 8, 32768), (1, 32, 8, 2048), (4, 32, 8, 512), (16, 32, 8, 512),
                             # around the warp-items rule: 480, 768, 1536 and 2048 items; short contexts
                             (60, 32, 8, 4096), (96, 32, 8, 2048), (48, 32, 32, 2048), (256, 32, 8, 2048),
                             (32, 32, 32, 1024), (64, 32, 8, 1024), (64, 32, 8, 512))
# (thread blocks per SM the split aims at, ring stages, cap passed as max_ctas_per_sm)
OCCUPANCY_CONFIGS = ((1, 4, None), (1, 3, 1), (1, 2, 1), (2, 2, 2), (2, 3, None), (3, 2, None))


def run_shape(shape, args, copy_gbs, *, gather=True, storage="NHD", alternate=False):
    """Every implementation on one shape: a dict of times (ms) and checks ("fast": the fast
    kernel on caches stored ``storage``; with ``alternate``, "fast" and "sdpa" are medians of
    ``alternate_with_sdpa``), and the fastest SDPA backend (None if none runs the shape)."""
    c = Case(*shape, sets=args.sets, storage=storage)
    w, n = args.warmup, args.iters
    r = {"shape": list(shape), "kv_bytes": c.kv_bytes, "copy_gbs": copy_gbs}
    r["fast"] = c.fast_ms(w, n)
    launch = fast_launch.choose_launch(c.batch, c.heads, c.kv_heads, HEAD_SIZE, DTYPE, c.ctx,
                                       torch.cuda.get_device_properties(0).multi_processor_count,
                                       tuning=fast_launch.device_tuning(0))
    r["split_tokens"], r["load_path"], r["max_ctas_per_sm"], r["warp_items"] = launch
    out_fast = c.fast_out().float()
    vk, vv = c.vllm_caches()
    r["auto"] = vllm_launch.choose_version(c.batch, c.heads, c.ctx)
    r["v1"] = c.vllm_ms(vk, vv, "v1", w, n) if c.ctx <= vllm_launch.v1_max_context_len(0, BLOCK_SIZE) else float("nan")
    r["v2"] = c.vllm_ms(vk, vv, "v2", w, n)
    del vk, vv
    torch.cuda.empty_cache()
    k, v = c.contiguous()
    q4 = [s[0].unsqueeze(2) for s in c.sets]
    r["sdpa_backend"], backend, r["sdpa"] = best_sdpa(q4, k, v, w, n)
    if backend is not None:
        ref = sdpa(q4[0], k, v, backend).squeeze(2).float()
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


def backends(args, copy_gbs, results):
    """The headline shapes against every fused SDPA backend that runs them, each paired with the
    fast kernel (default storage) in its own alternating measurements."""
    names = [(backend_label(name), backend) for name, backend in sdpa_backends()]
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
        auto, st, cap, wi = fast_launch.choose_launch(c.batch, c.heads, c.kv_heads, HEAD_SIZE, DTYPE, c.ctx, nsm,
                                                      tuning=fast_launch.device_tuning(0))
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
            auto = fast_launch.choose_split_tokens(c.batch, c.heads, c.kv_heads, c.ctx, nsm)  # the plain rule
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
        launch = fast_launch.choose_launch(c.batch, c.heads, c.kv_heads, HEAD_SIZE, DTYPE, c.ctx, nsm,
                                           tuning=fast_launch.device_tuning(0))
        items = fast_launch.work_items(c.batch, c.heads, c.kv_heads)
        row = {"shape": list(shape), "sdpa": sdpa_ms, "auto": c.fast_ms(args.warmup, args.iters),
               "auto_launch": list(launch)}
        for label, (n, st, cap) in zip(labels, OCCUPANCY_CONFIGS):
            split = fast_launch.one_wave_split(items, c.ctx, n, nsm)
            row[label] = c.fast_ms(args.warmup, args.iters, split_tokens=split, stages=st, max_ctas_per_sm=cap)
            row[label + " split"] = split
        blocks = c.batch * -(-fast_launch.work_items(1, c.heads, c.kv_heads) // fast_launch.WARPS)  # of warp items
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
        ks, vs = fast_layout.fp8_scale(c.kc), fast_layout.fp8_scale(c.vc)
        k8, v8 = fast_layout.allocate_fast_kv_cache(c.num_blocks, BLOCK_SIZE, c.kv_heads, HEAD_SIZE, fast_layout.FP8,
                                                    "cuda", storage=STORE)
        fast_ops.reshape_and_cache_fast(c.kc.flatten(0, 1), c.vc.flatten(0, 1), k8, v8,
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


SECTIONS = {"headline": headline, "backends": backends, "splits": splits, "stages": stages,
            "occupancy": occupancy, "blocks": block_sizes, "fp8": fp8, "sweep": sweep, "prefill": prefill,
            "prefill_tiles": prefill_tiles}

"""The warp-specialized prefill kernel (config 7) on a GPU: ``smoke`` checks configs 6 and 7 against
the CPU reference on a few varlen batches (printing each one's largest error); ``time`` times both
against the fastest SDPA backend on the prefill section's shapes, ``time7`` config 7 alone (one
build per variant, chosen with ``BLOCKSIM_NVCC_FLAGS``; ``TAG`` names the output). Three
alternating measurements per shape, medians; JSON under ``$OUT``.

    PYTHONPATH=. python kernels/bench/ws_variants.py smoke|time|time7
"""
import json
import os
import statistics
import sys

import torch
sys.path.insert(0, ".")
import kernels
from kernels.fast import prefill as fp
from kernels.fast import reference as fref
from kernels.bench.prefill import PrefillCase, PREFILL_SHAPES, PREFILL_HEADS, best_backend, causal_sdpa, BLOCK
from kernels.bench.timing import graph_ms

mode = sys.argv[1]
out_dir = os.environ.get("OUT", ".")
if mode == "smoke":
    torch.manual_seed(0)
    for (cached, new, h, kvh, bs) in [([0], [256], 8, 8, 16), ([0, 0, 0], [1, 200, 77], 8, 2, 16),
                                      ([16, 37, 300, 5], [64, 91, 1, 130], 32, 8, 16),
                                      ([1000, 5, 33], [1, 1, 1], 4, 1, 8), ([1500, 0, 700, 3], [600, 2000, 1, 130], 32, 8, 256)]:
        lens = [c + p for c, p in zip(cached, new)]
        nb = sum(-(-n // bs) for n in lens) + 3
        kc, vc = kernels.allocate_fast_kv_cache(nb, bs, kvh, 128, torch.float16, "cuda")
        kc.normal_(); vc.normal_()
        width = max(-(-n // bs) for n in lens)
        perm = torch.randperm(nb, device="cuda").int()
        tables = torch.zeros(len(lens), width, dtype=torch.int32, device="cuda"); u = 0
        for s, n in enumerate(lens):
            m = -(-n // bs); tables[s, :m] = perm[u:u + m]; u += m
        q = torch.randn(sum(new), h, 128, dtype=torch.float16, device="cuda")
        loc = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        ln = torch.tensor(lens, dtype=torch.int32, device="cuda")
        res = {}
        for cfg in (6, 7):
            o = torch.full_like(q, float("nan"))
            kernels.paged_prefill_attention(o, q, kc, vc, kvh, 128 ** -0.5, tables, loc, ln, bs, config=cfg)
            torch.cuda.synchronize()
            res[cfg] = o
        want = fref.paged_prefill_attention(None, q.float(), kc, vc, kvh, 128 ** -0.5, tables, loc, ln, None)
        print(cached, new, h, kvh, bs, {c: ((o.float() - want).abs().max().item()) for c, o in res.items()}, flush=True)
else:
    cfgs = (6, 7) if mode == "time" else (7,)
    tag = os.environ.get("TAG", "")
    rows = []
    for model, heads, kvh in PREFILL_HEADS:
        for shape in PREFILL_SHAPES:
            c = PrefillCase(*shape, heads, kvh)
            def run(cfg):
                return lambda: fp.paged_prefill_attention(c.out, c.query, c.kc, c.vc, c.kv_heads, c.scale, c.tables, c.loc,
                                                          c.lens, BLOCK, max_query_len=c.new, max_context_len=c.ctx,
                                                          config=cfg, validate=False)
            q = c.sdpa_query(); k, v = c.contiguous()
            label, backend, sd = best_backend(c, q, k, v, 10, 30)
            t = {}
            for rep in range(3):
                for cfg in cfgs:
                    t.setdefault(cfg, []).append(graph_ms([run(cfg)], 10, 30))
                t.setdefault("sdpa", []).append(graph_ms([lambda: causal_sdpa(q, k, v, c.cached, backend)], 10, 30))
            c.out.fill_(float("nan")); run(7)(); o7 = c.out.clone(); run(6)(); o6 = c.out.clone()
            r = {"model": model, "shape": shape, "backend": label, **{str(kk): statistics.median(vv) for kk, vv in t.items()},
                 "diff76": (o7.float() - o6.float()).abs().max().item()}
            line = f"{tag} {model:11s} {str(shape):18s} sdpa {r['sdpa']:.4f} ({label}) "
            for cfg in cfgs:
                r[f"r{cfg}"] = r[str(cfg)] / r["sdpa"]
                line += f"{cfg}: {r[str(cfg)]:.4f} {r[f'r{cfg}']:.3f}  "
            rows.append(r)
            print(line + f"diff {r['diff76']:.1e}", flush=True)
            del c, q, k, v
            torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(out_dir, f"ws_times{tag}.json"), "w"), indent=1)

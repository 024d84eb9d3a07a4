"""The warpgroup prefill kernels on a GPU, each build a variant (chosen with ``BLOCKSIM_NVCC_FLAGS``;
``TAG`` names the output): ``time`` times configs 6 and 7, ``time7`` config 7 alone, against the
fastest SDPA backend on the prefill section's shapes, three alternating measurements per shape,
medians, and the largest difference between the two configs' outputs; JSON under ``$OUT``.
Correctness is the GPU tests' (tests/kernels/test_paged_prefill.py).

    PYTHONPATH=. python kernels/bench/ws_variants.py time|time7
"""
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, ".")
from kernels.bench.prefill import PREFILL_HEADS, PREFILL_SHAPES, PrefillCase, best_backend, causal_sdpa  # noqa: E402
from kernels.bench.timing import graph_ms  # noqa: E402

cfgs = (6, 7) if sys.argv[1] == "time" else (7,)
tag = os.environ.get("TAG", "")
rows = []
for model, heads, kvh in PREFILL_HEADS:
    for shape in PREFILL_SHAPES:
        c = PrefillCase(*shape, heads, kvh)
        q = c.sdpa_query()
        k, v = c.contiguous()
        label, backend, _ = best_backend(c, q, k, v, 10, 30)
        t = {}
        for _ in range(3):
            for cfg in cfgs:
                t.setdefault(cfg, []).append(graph_ms([lambda cfg=cfg: c.paged(config=cfg)], 10, 30))
            t.setdefault("sdpa", []).append(graph_ms([lambda: causal_sdpa(q, k, v, c.cached, backend)], 10, 30))
        c.out.fill_(float("nan"))
        o7 = c.paged(config=7).clone()
        o6 = c.paged(config=6).clone()
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
with open(os.path.join(os.environ.get("OUT", "."), f"ws_times{tag}.json"), "w") as f:
    json.dump(rows, f, indent=1)

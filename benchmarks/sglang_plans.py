"""Record execution plans of the sglang preset for `blocksim validate`: pages of 16 and 8 tokens on
the Mooncake trace's first N requests (prefix hits, evictions, chunked prefill) and on a synthetic
workload of prompt families with long outputs on a small pool (prefix hits and retractions).

    python benchmarks/sglang_plans.py OUT_DIR [N]        # OUT_DIR/{sg16,sg8,syn16,syn8}
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import traces
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config, load_trace

out = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 120
MOONCAKE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/synthetic_trace.jsonl"
tr = load_trace(MOONCAKE, clip_max_len=2048, max_requests=n, rate_scale=1.0)
for ps, pages in ((16, 450), (8, 900)):
    cfg = build_config("sglang", model="llama-2-7b", gpu="h100-80gb", page_size=ps, num_gpu_blocks=pages,
                       chunked_prefill_size=1024, init_new_token_ratio=0.2)
    res = Engine(cfg, tr, plan_dir=out / f"sg{ps}").run()
    s = res.summary
    print(ps, {k: s[k] for k in ("finished", "steps", "radix_hit_tokens", "radix_query_tokens", "retractions", "radix_evictions")})

# A synthetic workload of prompt families (shared hash blocks) and long outputs on a small pool: retractions
rng = np.random.default_rng(0)
k = 60
prompts = rng.integers(50, 400, k)
fam = rng.integers(0, 4, k)
df = pd.DataFrame({"arrival_s": np.arange(k) * 0.05, "prompt_tokens": prompts, "output_tokens": rng.integers(50, 200, k),
                   "prefix_hashes": [[f * 1000 + j for j in range(-(-p // 32))] for p, f in zip(prompts, fam)]})
syn = traces.Trace(df, hash_block_tokens=32)
for ps in (16, 8):
    cfg = build_config("sglang", model="llama-2-7b", gpu="h100-80gb", page_size=ps, num_gpu_blocks=4000 // ps,
                       chunked_prefill_size=256, init_new_token_ratio=0.05, schedule_policy="lpm")
    res = Engine(cfg, syn, plan_dir=out / f"syn{ps}").run()
    s = res.summary
    print("syn", ps, {k: s[k] for k in ("finished", "steps", "radix_hit_tokens", "radix_query_tokens", "retractions", "radix_evictions")})

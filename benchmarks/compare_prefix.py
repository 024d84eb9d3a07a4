"""Prefix caching compared across engines on one trace and one KV capacity: vLLM v0's automatic
prefix caching (vllm-prefix), vLLM V1 (vllm-v1) and SGLang's radix cache (sglang).

    python benchmarks/compare_prefix.py [TRACE] [--tokens N] [--max-requests N] [--rate-scale X]

Every engine gets the same KV capacity in tokens (`--tokens`; default: what vllm-prefix computes
for the model and GPU), as blocks of 16 tokens for vLLM and pages of 1 token for SGLang. Prints
one Markdown row per engine: prompt tokens served from the cache (hit rate = saved / prompt tokens
admitted, re-admissions included), TTFT, throughput, evictions, preemptions or retractions.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from blocksim.engine import Engine
from blocksim.experiments.runner import build_config, load_trace

MOONCAKE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/synthetic_trace.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", default=str(MOONCAKE))
    p.add_argument("--model", default="llama-2-7b")
    p.add_argument("--gpu", default="h100-80gb")
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--rate-scale", type=float, default=1.0)
    a = p.parse_args()
    base = build_config("vllm-prefix", model=a.model, gpu=a.gpu)
    tokens = a.tokens or base.num_gpu_blocks * base.cache.block_size
    tr = load_trace(a.trace, rate_scale=a.rate_scale, max_requests=a.max_requests, clip_max_len=base.model.max_model_len)
    print(f"{Path(a.trace).name}: {len(tr)} requests, {a.model} / {a.gpu}, KV capacity {tokens} tokens\n")
    print("| engine | finished | prompt tokens admitted | saved by the cache | hit rate | TTFT mean / p90 (s) "
          "| throughput (prompt + output tok/s) | evicted cached tokens | preemptions (retractions) | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for policy, bs in (("vllm-prefix", 16), ("vllm-v1", 16), ("sglang", 1)):
        knobs = {"block_size": 16} if policy != "sglang" else {}
        cfg = build_config(policy, model=a.model, gpu=a.gpu, num_gpu_blocks=tokens // bs, **knobs)
        t = time.perf_counter()
        eng = Engine(cfg, tr)
        res = eng.run()
        wall = time.perf_counter() - t
        s = res.summary
        saved = sum(g.prefix_hit_tokens for g in eng.groups)
        admitted = sum(g.prompt_tokens * (1 + g.preemptions) for g in eng.groups if g.status != "rejected")
        # evicted cached tokens: blocks x 16 for vLLM, tokens for SGLang
        ev = s["radix_evicted_tokens"] if "radix_evicted_tokens" in s else s.get("prefix_cache_evictions", 0) * bs
        pre = f"{s['preemptions']} ({s['retractions']})" if "retractions" in s else f"{s['preemptions']}"
        print(f"| {policy} | {s['finished']} | {admitted:,} | {saved:,} | {saved / max(admitted, 1):.1%} | "
              f"{s['ttft_mean_s']:.2f} / {s['ttft_p90_s']:.2f} | {s['total_tokens_per_s']:,.0f} | {ev:,} | {pre} | {wall:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()

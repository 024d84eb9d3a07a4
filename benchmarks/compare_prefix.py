"""Prefix caching compared across engines on one trace and equal KV memory: vLLM v0's automatic
prefix caching (vllm-prefix), vLLM V1 (vllm-v1) and SGLang's radix cache (sglang).

    python benchmarks/compare_prefix.py [TRACE] [--model M] [--gpu G] [--blocks N] [--clip T] [--rate-scale X]

Every engine gets the same KV memory: `--blocks` blocks of 16 tokens for vLLM (default: what
vllm-prefix derives for the model and GPU), the same tokens as pages of 1 token for SGLang; each
keeps its own batch defaults. The trace is clipped to `--clip` tokens (default the model's length).
Prints one Markdown row per engine: prompt tokens served from the cache (saved: not prefilled; hit
rate: saved / prompt tokens admitted, re-admissions after preemption included), TTFT, TPOT,
throughput (prompt and output tokens per simulated second), cached tokens evicted (vLLM: blocks x
16), preemptions (SGLang: retractions).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import traces
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config

MOONCAKE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/synthetic_trace.jsonl"
ENGINES = (("vllm-prefix", 16), ("vllm-v1", 16), ("sglang", 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", default=str(MOONCAKE))
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--gpu", default="h100-80gb")
    p.add_argument("--blocks", type=int, default=None, help="GPU blocks of 16 tokens (SGLang: x16 one-token pages)")
    p.add_argument("--clip", type=int, default=None)
    p.add_argument("--rate-scale", type=float, default=1.0)
    a = p.parse_args()
    base = build_config("vllm-prefix", model=a.model, gpu=a.gpu)
    blocks = a.blocks or base.num_gpu_blocks
    tr = traces.read_trace(a.trace)
    tr, clipped = traces.clip_to_max_len(tr, a.clip or base.model.max_model_len)
    if a.rate_scale != 1.0:
        tr = traces.scale_rate(tr, a.rate_scale)
    print(f"{Path(a.trace).name}: {len(tr)} requests ({clipped} clipped), {a.model} / {a.gpu}, {blocks} blocks "
          f"of 16 tokens ({blocks * 16} tokens), rate x{a.rate_scale:g}\n")
    print("| engine | hit rate | prompt tokens saved | TTFT p50 / p99 (s) | TPOT p50 (ms) | throughput (tok/s) "
          "| cached tokens evicted | preemptions |")
    print("|---|---|---|---|---|---|---|---|")
    for policy, bs in ENGINES:
        cfg = build_config(policy, model=a.model, gpu=a.gpu, num_gpu_blocks=blocks * 16 // bs)
        t = time.perf_counter()
        eng = Engine(cfg, tr)
        res = eng.run()
        wall = time.perf_counter() - t
        s, r = res.summary, res.requests
        saved = sum(g.prefix_hit_tokens for g in eng.groups)
        admitted = sum(g.prompt_tokens * (1 + g.preemptions) for g in eng.groups if g.status != "rejected")
        evicted = s["radix_evicted_tokens"] if "radix_evicted_tokens" in s else s.get("prefix_cache_evictions", 0) * 16
        fin = r[r.status == "finished"]
        print(f"| `{policy}` | {saved / max(admitted, 1):.2%} | {saved:,} | {fin.ttft_s.quantile(0.5):.3f} / "
              f"{fin.ttft_s.quantile(0.99):.3f} | {fin.tpot_s.quantile(0.5) * 1e3:.2f} | "
              f"{s['total_tokens_per_s']:,.0f} | {evicted:,} | {s['preemptions']} | <!-- wall {wall:.1f} s -->",
              flush=True)


if __name__ == "__main__":
    main()

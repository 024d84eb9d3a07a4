"""Wall time of the Mooncake synthetic trace with KV tiers against the same run without.

    python benchmarks/tiers_speed.py [--repeats 3] [--json benchmarks/results/tiers_speed.json]

llama-2-7b on h100-80gb, the built-in roofline (benchmarks/roofline_defaults.json), prompts clipped to
the model's 4,096 tokens. Each configuration runs `--repeats` times in this process (the trace read
once); the best wall time of the engine's run counts. The JSON records the machine's load average
before and after. Needs ../shared/traces beside the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blocksim.engine import Engine  # noqa: E402
from blocksim.experiments.runner import build_config, load_trace  # noqa: E402
from blocksim.policies import make_cost_model  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
PROFILE = str(ROOT / "benchmarks" / "roofline_defaults.json")
THREE = {"tier_host_gib": 256.0, "tier_disk_gib": 2048.0}
#: name -> (policy, tier options); each policy's "gpu only" row is its reference.
CONFIGS = {
    "gpu only": ("vllm-v1", {}),
    "gpu + host 256 GiB": ("vllm-v1", {"tier_host_gib": 256.0}),
    "gpu + host 256 GiB + disk 2 TiB, wait": ("vllm-v1", THREE),
    "gpu + host 256 GiB + disk 2 TiB, recompute": ("vllm-v1", {**THREE, "tier_onload": "recompute"}),
    "gpu + host 256 GiB + disk 2 TiB, 256-token chunks, wait": ("vllm-v1", {**THREE, "tier_chunk_tokens": 256}),
    "gpu + host 256 GiB + disk 2 TiB, 256-token chunks, recompute": (
        "vllm-v1", {**THREE, "tier_onload": "recompute", "tier_chunk_tokens": 256}),
    "vllm-prefix: gpu only": ("vllm-prefix", {}),
    "vllm-prefix: gpu + host 256 GiB + disk 2 TiB, wait": ("vllm-prefix", THREE),
    "vllm-prefix: gpu + host 256 GiB + disk 2 TiB, 256-token chunks, wait": (
        "vllm-prefix", {**THREE, "tier_chunk_tokens": 256}),
    "sglang: gpu only": ("sglang", {}),
    "sglang: gpu + host 256 GiB + disk 2 TiB (64-token chunks), wait": ("sglang", THREE),
    "sglang: gpu + host 256 GiB + disk 2 TiB (64-token chunks), recompute": (
        "sglang", {**THREE, "tier_onload": "recompute"}),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "tiers_speed.json"))
    a = p.parse_args()
    base = build_config("vllm-v1", cost_profile=PROFILE)
    trace = load_trace(str(TRACE), clip_max_len=base.model.max_model_len)
    rows = []
    refs = {}
    load_before = os.getloadavg()
    for name, (policy, options) in CONFIGS.items():
        cfg = build_config(policy, cost_profile=PROFILE, **options)
        best, summary = float("inf"), None
        for _ in range(a.repeats):
            engine = Engine(cfg, trace, make_cost_model(cfg, PROFILE))
            t0 = time.perf_counter()
            res = engine.run()
            best = min(best, time.perf_counter() - t0)
            summary = res.summary
        refs.setdefault(policy, best)
        rows.append({"config": name, "policy": policy, "options": options, "wall_s": best,
                     "ratio_to_gpu_only": best / refs[policy], "steps": summary["steps"],
                     "ttft_mean_s": summary["ttft_mean_s"],
                     **{k: summary[k] for k in ("tier_host_hit_rate", "tier_disk_hit_rate") if k in summary}})
        print(f"{name:<72} {best:6.2f} s  x{best / refs[policy]:.2f}  {summary['steps']:>7} steps  "
              f"TTFT mean {summary['ttft_mean_s']:.3f} s")
    out = {"trace": "mooncake/synthetic_trace.jsonl", "model": base.model.name,
           "gpu": base.gpu.name, "python": platform.python_version(), "machine": platform.machine(),
           "repeats": a.repeats, "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()},
           "runs": rows}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()

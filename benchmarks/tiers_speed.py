"""Wall time of the Mooncake synthetic trace under vllm-v1 with KV tiers against the same run without.

    python benchmarks/tiers_speed.py [--repeats 3] [--json benchmarks/results/tiers_speed.json]

llama-2-7b on h100-80gb, the built-in roofline (benchmarks/roofline_defaults.json), prompts clipped to
the model's 4,096 tokens. Each configuration runs `--repeats` times in this process (the trace read
once); the best wall time of the engine's run counts. Needs ../shared/traces beside the repository.
"""

from __future__ import annotations

import argparse
import json
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
#: name -> tier options; "gpu only" is the reference.
CONFIGS = {
    "gpu only": {},
    "gpu + host 256 GiB": {"tier_host_gib": 256.0},
    "gpu + host 256 GiB + disk 2 TiB, wait": {"tier_host_gib": 256.0, "tier_disk_gib": 2048.0},
    "gpu + host 256 GiB + disk 2 TiB, recompute": {"tier_host_gib": 256.0, "tier_disk_gib": 2048.0,
                                                   "tier_onload": "recompute"},
    "gpu + host 256 GiB + disk 2 TiB, 256-token chunks, recompute": {
        "tier_host_gib": 256.0, "tier_disk_gib": 2048.0, "tier_onload": "recompute", "tier_chunk_tokens": 256},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "tiers_speed.json"))
    a = p.parse_args()
    base = build_config("vllm-v1", cost_profile=PROFILE)
    trace = load_trace(str(TRACE), clip_max_len=base.model.max_model_len)
    rows = []
    for name, options in CONFIGS.items():
        cfg = build_config("vllm-v1", cost_profile=PROFILE, **options)
        best, summary = float("inf"), None
        for _ in range(a.repeats):
            engine = Engine(cfg, trace, make_cost_model(cfg, PROFILE))
            t0 = time.perf_counter()
            res = engine.run()
            best = min(best, time.perf_counter() - t0)
            summary = res.summary
        rows.append({"config": name, "options": options, "wall_s": best, "steps": summary["steps"],
                     "ttft_mean_s": summary["ttft_mean_s"],
                     **{k: summary[k] for k in ("tier_host_hit_rate", "tier_disk_hit_rate") if k in summary}})
        print(f"{name:<62} {best:6.2f} s  {summary['steps']:>7} steps  TTFT mean {summary['ttft_mean_s']:.3f} s")
    ref = rows[0]["wall_s"]
    for r in rows:
        r["ratio_to_gpu_only"] = r["wall_s"] / ref
    out = {"trace": "mooncake/synthetic_trace.jsonl", "policy": "vllm-v1", "model": base.model.name,
           "gpu": base.gpu.name, "python": platform.python_version(), "machine": platform.machine(),
           "repeats": a.repeats, "runs": rows}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()

"""Sweep of KV tiers on the Mooncake synthetic trace: host capacity x eviction x write policy, and
disk configurations under a host tier.

    python benchmarks/tiers_sweep.py [--out benchmarks/results/tiers_sweep]

vllm-v1, llama-2-7b on h100-80gb (7,518 GPU blocks of 16 tokens: 120k tokens), the built-in roofline,
prompts clipped to 4,096 tokens, one-block chunks, onload `wait` unless named. Writes
`tiers_sweep.json` (one row per configuration) and `tiers_sweep.png` (host hit rate and mean TTFT
against host capacity, per eviction and write policy). Needs ../shared/traces beside the repository.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blocksim.engine import Engine  # noqa: E402
from blocksim.experiments.runner import build_config, load_trace  # noqa: E402
from blocksim.policies import make_cost_model  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
PROFILE = str(ROOT / "benchmarks" / "roofline_defaults.json")
HOST_GIB = (32.0, 128.0, 512.0)
EVICTIONS = ("lru", "lfu", "arc")
WRITES = ("write-through", "write-through-selective", "write-back")
DISK = [dict(tier_host_gib=128.0, tier_disk_gib=2048.0, tier_disk_write=w, tier_onload=o)
        for w in ("write-back", "write-through") for o in ("wait", "recompute")]


def grid():
    yield {}
    for gib, ev, wr in itertools.product(HOST_GIB, EVICTIONS, WRITES):
        yield dict(tier_host_gib=gib, tier_host_eviction=ev, tier_host_write=wr)
    yield from DISK


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tiers_sweep"))
    a = p.parse_args()
    base = build_config("vllm-v1", cost_profile=PROFILE)
    trace = load_trace(str(TRACE), clip_max_len=base.model.max_model_len)
    rows = []
    for opts in grid():
        cfg = build_config("vllm-v1", cost_profile=PROFILE, **opts)
        s = Engine(cfg, trace, make_cost_model(cfg, PROFILE)).run().summary
        row = {"host_gib": opts.get("tier_host_gib", 0.0), "disk_gib": opts.get("tier_disk_gib", 0.0),
               "host_eviction": opts.get("tier_host_eviction", "lru" if opts else ""),
               "host_write": opts.get("tier_host_write", "write-through" if opts else ""),
               "disk_write": opts.get("tier_disk_write", ""), "onload": opts.get("tier_onload", "wait" if opts else ""),
               "ttft_mean_s": s["ttft_mean_s"], "ttft_p90_s": s["ttft_p90_s"], "e2e_mean_s": s["e2e_mean_s"],
               "gpu_hit_rate": s.get("tier_gpu_hit_rate", s["prefix_saved_tokens"] / max(1, s["v1_prefix_cache_query_tokens"])),
               **{k: s.get(k, 0) for k in ("tier_host_hit_rate", "tier_disk_hit_rate", "tier_bytes_gpu_to_host",
                                           "tier_bytes_host_to_gpu", "tier_bytes_host_to_disk", "tier_bytes_disk_to_gpu",
                                           "tier_onload_skipped_tokens", "tier_onload_wait_mean_s")},
               "wall_s": s["wall_s"]}
        rows.append(row)
        print(f"host {row['host_gib']:>5g} GiB {row['host_eviction']:<4} {row['host_write']:<24} disk {row['disk_gib']:>5g} "
              f"{row['disk_write']:<13} {row['onload']:<9} host hit {row['tier_host_hit_rate']:.3f} "
              f"disk hit {row['tier_disk_hit_rate']:.3f} TTFT mean {row['ttft_mean_s']:.3f} s p90 {row['ttft_p90_s']:.3f} s")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"trace": "mooncake/synthetic_trace.jsonl (clipped to 4,096 tokens)", "policy": "vllm-v1",
            "model": base.model.name, "gpu": base.gpu.name, "gpu_blocks": base.num_gpu_blocks,
            "cost_model": "roofline (benchmarks/roofline_defaults.json)", "command": "python benchmarks/tiers_sweep.py"}
    (out / "tiers_sweep.json").write_text(json.dumps({**meta, "runs": rows}, indent=2) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    df = pd.DataFrame(rows)
    ref = df.iloc[0]
    host = df[(df.host_gib > 0) & (df.disk_gib == 0)]
    fig, axes = plt.subplots(2, len(WRITES), figsize=(4.2 * len(WRITES), 6.4), sharex=True, sharey="row")
    for j, wr in enumerate(WRITES):
        for ev in EVICTIONS:
            d = host[(host.host_write == wr) & (host.host_eviction == ev)].sort_values("host_gib")
            axes[0, j].plot(d.host_gib, d.tier_host_hit_rate, marker="o", label=ev)
            axes[1, j].plot(d.host_gib, d.ttft_mean_s * 1e3, marker="o", label=ev)
        axes[1, j].axhline(ref.ttft_mean_s * 1e3, color="gray", ls="--", label="GPU only")
        axes[0, j].set_title(wr)
        axes[1, j].set_xlabel("host tier (GiB)")
        axes[1, j].set_xscale("log", base=2)
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("host token hit rate")
    axes[1, 0].set_ylabel("mean TTFT (ms)")
    axes[1, 0].legend(title="eviction")
    fig.suptitle(f"Mooncake synthetic trace, vllm-v1, {base.model.name} on {base.gpu.name} (simulated)")
    fig.tight_layout()
    fig.savefig(out / "tiers_sweep.png", dpi=110)
    print(f"wrote {out}/tiers_sweep.json, .png")


if __name__ == "__main__":
    main()

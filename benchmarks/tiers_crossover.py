"""The crossover chart: TTFT of a prefix hit served by each tier against recomputing it, by prefix
length and load.

    python benchmarks/tiers_crossover.py [--out benchmarks/results/tiers_crossover]
    python benchmarks/tiers_crossover.py --measured     # H200: measured step costs and tier moves

Writes `tiers_crossover.json` (one row per tier, prefix length and rate) and `tiers_crossover.png`.

Workload: `--pairs` prefixes, each sent twice: every prefix once (the seeds), then every prefix again
(the probes), at `rate` requests per second; a prompt is its prefix plus 32 tokens of its own, and
produces 8 tokens. The probes' TTFT is measured. Between a seed and its probe the other prefixes pass
through a GPU cache that holds about four of them, so the probe finds its prefix where the case puts
it: `gpu` (a GPU cache large enough for every prefix), `host` (a host tier, written through),
`disk` (a disk tier alone, written through from the GPU), `recompute` (no tier: the prefix is
prefilled again). Onload mode `wait`: a probe waits for its chunks, then prefills its own 32 tokens.
By default llama-3-8b on h100-80gb, the built-in roofline; host link from the catalog, disk at the
`--tier-disk-*` defaults (assumed, not measured). With `--measured`: llama-3-8b on h200-141gb, its
shipped profile (step costs measured on an H200) with the tier tables the GPU tier executor measured
on an H200 (`benchmarks/results/tier-h200.json`, docs/tier_executor.md) merged in, so every step and
every chunk move is priced by measurements; written to `results/tiers_crossover_h200_measured/`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import traces  # noqa: E402
from blocksim.engine import Engine  # noqa: E402
from blocksim.experiments.runner import build_config  # noqa: E402
from blocksim.policies import make_cost_model  # noqa: E402

PROFILE = str(ROOT / "benchmarks" / "roofline_defaults.json")
H = 16  # tokens per prefix hash (= the block size)
MODEL, GPU = "llama-3-8b", "h100-80gb"
TIERS = ("gpu", "host", "disk", "recompute")


def workload(prefix_tokens: int, pairs: int, rate_per_s: float) -> traces.Trace:
    own = 32
    n = 2 * pairs
    fam = [i % pairs for i in range(n)]
    blocks = prefix_tokens // H
    hashes = [[f * 100_000 + j for j in range(blocks)] + [10**9 + i * 10 + j for j in range(own // H)]
              for i, f in enumerate(fam)]
    df = pd.DataFrame({"arrival_s": np.arange(n) / rate_per_s, "prompt_tokens": prefix_tokens + own,
                       "output_tokens": 8, "prefix_hashes": hashes})
    return traces.Trace(df, hash_block_tokens=H)


def options(tier: str, prefix_tokens: int, pairs: int, chunk_tokens: int | None = None) -> dict:
    small = 4 * (prefix_tokens // H + 4) + 64  # about four prompts' blocks, plus room for a batch
    big = 2 * pairs * (prefix_tokens // H + 4) + 64
    tier_gib = 2 * pairs * prefix_tokens * 131072 / 1024**3 + 1  # every prefix (llama-3-8b: 128 KiB a token)
    chunk = {"tier_chunk_tokens": chunk_tokens} if chunk_tokens else {}
    return {
        "gpu": {"num_gpu_blocks": big},
        "host": {"num_gpu_blocks": small, "tier_host_gib": tier_gib, **chunk},
        "disk": {"num_gpu_blocks": small, "tier_disk_gib": tier_gib, "tier_disk_write": "write-through", **chunk},
        "recompute": {"num_gpu_blocks": small},
    }[tier]


def measured_profile(directory: Path) -> str:
    """The shipped llama-3-8b H200 profile with the measured tier tables merged in, written to `directory`."""
    prof = json.loads((ROOT / "blocksim/profiles/llama-3-8b__h200-141gb__float16__tp1.json").read_text())
    tiers = json.loads((ROOT / "benchmarks/results/tier-h200.json").read_text())
    prof["components"] = {**prof["components"], **{k: v for k, v in tiers["components"].items() if k.startswith("tier_")}}
    path = directory / "llama-3-8b__h200-141gb__tiers.json"
    path.write_text(json.dumps(prof))
    return str(path)


def run_case(tier: str, prefix_tokens: int, rate: float, pairs: int, gpu: str = GPU, profile: str = PROFILE,
             chunk_tokens: int | None = None) -> dict:
    cfg = build_config("vllm-v1", model=MODEL, gpu=gpu, cost_profile=profile,
                       **options(tier, prefix_tokens, pairs, chunk_tokens))
    res = Engine(cfg, workload(prefix_tokens, pairs, rate), make_cost_model(cfg, profile)).run()
    probes = res.requests.iloc[pairs:]
    row = {"tier": tier, "prefix_tokens": prefix_tokens, "rate_per_s": rate,
           "ttft_mean_s": float(probes.ttft_s.mean()), "ttft_p90_s": float(probes.ttft_s.quantile(0.9))}
    if res.tier_requests is not None:
        t = res.tier_requests.iloc[pairs:]
        row.update(onload_wait_mean_s=float(t.onload_wait_s.mean()),
                   hit_tokens={k: int(t[f"{k}_hit_tokens"].sum()) for k in ("gpu", "host", "disk")})
    else:
        row["hit_tokens"] = {"gpu": int(res.summary.get("prefix_saved_tokens", 0))}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tiers_crossover"))
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--prefix-tokens", default="512,1024,2048,4096,7680")
    p.add_argument("--rates", default="1,4,16")
    p.add_argument("--measured", action="store_true", help="H200: measured step costs and tier moves")
    p.add_argument("--chunk-tokens", type=int, default=None,
                   help="tier chunk size (default: one block; 256 with --measured, LMCache's chunk)")
    a = p.parse_args()
    gpu, profile, cost = GPU, PROFILE, "roofline (benchmarks/roofline_defaults.json)"
    if a.measured:
        import tempfile
        gpu, profile = "h200-141gb", measured_profile(Path(tempfile.mkdtemp()))
        cost = ("profiled: blocksim/profiles/llama-3-8b__h200-141gb__float16__tp1.json with the tier tables of "
                "benchmarks/results/tier-h200.json")
        a.chunk_tokens = a.chunk_tokens or 256
        if a.out == p.get_default("out"):
            a.out = str(ROOT / "benchmarks" / "results" / "tiers_crossover_h200_measured")
    lengths = [int(x) for x in a.prefix_tokens.split(",")]
    rates = [float(x) for x in a.rates.split(",")]
    rows = [run_case(t, n, r, a.pairs, gpu, profile, a.chunk_tokens) for r in rates for n in lengths for t in TIERS]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": MODEL, "gpu": gpu, "policy": "vllm-v1", "cost_model": cost, "pairs": a.pairs, "onload": "wait",
            "chunk_tokens": a.chunk_tokens or 16,
            "command": "python benchmarks/tiers_crossover.py" + (" --measured" if a.measured else "")}
    (out / "tiers_crossover.json").write_text(json.dumps({**meta, "runs": rows}, indent=2) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(rates), figsize=(4.2 * len(rates), 3.6), sharey=True)
    df = pd.DataFrame(rows)
    for ax, r in zip(np.atleast_1d(axes), rates):
        for t in TIERS:
            d = df[(df.tier == t) & (df.rate_per_s == r)]
            ax.plot(d.prefix_tokens, d.ttft_mean_s * 1e3, marker="o", label=t)
        ax.set_title(f"{r:g} req/s")
        ax.set_xlabel("prefix tokens")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("mean TTFT of a prefix hit (ms)")
    np.atleast_1d(axes)[0].legend(title="prefix served by")
    how = "measured step and transfer costs" if a.measured else "roofline, assumed disk"
    fig.suptitle(f"{MODEL} on {gpu}, vllm-v1: a hit per tier against recomputing (simulated; {how})")
    fig.tight_layout()
    fig.savefig(out / "tiers_crossover.png", dpi=110)
    for row in rows:
        print(f"{row['rate_per_s']:>4g} req/s {row['prefix_tokens']:>5} tok {row['tier']:<10} "
              f"TTFT mean {row['ttft_mean_s'] * 1e3:8.1f} ms")
    print(f"wrote {out}/tiers_crossover.json, .png")


if __name__ == "__main__":
    main()

"""Sweep throughput: a 1,000-point grid over the bundled sample traces, then the same sweep resumed.

    python benchmarks/sweep.py [--max-requests N] [--workers W] [--backend local|ray] [--out DIR]

The grid: 2 traces (azure-conv, azure-code) x block_size (5) x watermark (5) x rate_scale (5) x
max_num_seqs (4) = 1,000 points, each replaying the trace's first ``--max-requests`` requests.
Prints points per second for the fresh sweep (simulation, run directories, sweep.parquet; no
report), the share of worker time spent in the engine's step loop (the runs' ``wall_s``; the rest
is building and writing records, reading them back for metrics, and scheduling), and the time of a
rerun that finds every point complete. Steps are priced by the roofline with its built-in constants
(`roofline_defaults.json`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from analysis.sweep_report import write_sweep_report
from blocksim.experiments.spec import parse_spec
from blocksim.experiments.sweep import run_sweep

GRID = {
    "block_size": [8, 16, 32, 64, 128],
    "watermark": [0.0, 0.01, 0.02, 0.05, 0.1],
    "rate_scale": [0.5, 1, 2, 4, 8],
    "max_num_seqs": [8, 32, 128, 256],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-requests", type=int, default=100)
    p.add_argument("--workers", type=int, default=None, help="default: local cores")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    p.add_argument("--report", action="store_true", help="also time the report")
    a = p.parse_args()
    spec = parse_spec({"name": "benchmark", "trace": ["bundled:azure-conv", "bundled:azure-code"],
                       "base": {"max_requests": a.max_requests,
                                "cost_profile": str(Path(__file__).resolve().parent / "roofline_defaults.json")}, "axes": GRID, "slo": "ttft=2s,tpot=100ms"})
    points = len(spec.points())
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or os.path.join(tmp, "sweep")
        t = time.perf_counter()
        df = run_sweep(spec, out, backend=a.backend, workers=a.workers, report=False)
        fresh = time.perf_counter() - t
        t = time.perf_counter()
        again = run_sweep(spec, out, backend=a.backend, workers=a.workers, report=False)
        rerun = time.perf_counter() - t
        if a.report:
            t = time.perf_counter()
            write_sweep_report(out, df, {**spec.to_dict(), "axes": GRID})
            print(f"report: {time.perf_counter() - t:.1f} s")
    workers = a.workers or os.cpu_count()
    failed = int((df["status"] != "ok").sum())
    sim = float(df["wall_s"].sum())
    print(f"{points} points ({failed} failed), {a.max_requests} requests each, backend {a.backend}, "
          f"{workers} workers, {df['steps'].sum():,} engine steps in all")
    print(f"fresh sweep: {fresh:.1f} s, {points / fresh:.1f} points/s "
          f"({fresh * workers / points * 1e3:.0f} ms of worker time per point, of which the engine's "
          f"step loop {sim / points * 1e3:.0f} ms)")
    print(f"rerun, every point complete: {rerun:.1f} s ({int((again['attempts'] == 0).sum())} reused)")


if __name__ == "__main__":
    main()

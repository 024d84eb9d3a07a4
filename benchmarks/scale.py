"""Replay time and peak memory against trace length: a trace tiled 1, 2, 5 and 10 times in time.

    python benchmarks/scale.py [TRACE] [--times 1 2 5 10] [--policy vllm] [--repeat 1] [--tree DIR]
                               [--write FILE --key KEY]

Each tiling is written as a canonical CSV (``arrival_s, prompt_tokens, output_tokens``; copy i
shifted by i periods, a period being the trace's span plus its mean gap between arrivals) and
replayed by the whole command-line process, as a user runs it:
``blocksim replay FILE --out DIR --quiet --no-report`` (llama-2-7b / h100-80gb / block 16). Prints
each run's wall seconds, CPU seconds (user + system; on a shared machine they vary less) and peak
RSS (medians over ``--repeat``), and wall seconds and RSS per 1,000 requests: flat
figures per request mean time and memory linear in the trace's length. The trace defaults to
../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv beside the repository.
``--tree`` replays with another checkout's code (default: this one); ``--write`` stores the
figures in a JSON file under ``--key`` (default "scale"), keeping its other keys.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

import traces

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT.parent / "shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def tiled(trace: traces.Trace, times: int) -> pd.DataFrame:
    """The trace `times` times over, each copy after the previous one by the trace's span plus its mean gap."""
    df = trace.df
    arrival = df["arrival_s"].to_numpy()
    span = float(arrival[-1] - arrival[0])
    period = span + (span / (len(arrival) - 1) if len(arrival) > 1 else 1.0)
    return pd.DataFrame({
        "arrival_s": np.concatenate([arrival + i * period for i in range(times)]),
        "prompt_tokens": np.tile(df["prompt_tokens"].to_numpy(), times),
        "output_tokens": np.tile(df["output_tokens"].to_numpy(), times),
    })


def replay_process(path: Path, out: Path, policy: str, tree: Path = ROOT) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MB) and CPU seconds of one `blocksim replay` process of `tree`'s code."""
    cmd = [sys.executable, "-m", "blocksim", "replay", str(path),
           "--out", str(out), "--policy", policy, "--quiet", "--no-report",
           "--cost-profile", str(ROOT / "benchmarks" / "roofline_defaults.json")]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"replay of {path} failed (exit {os.waitstatus_to_exitcode(status)})")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime  # ru_maxrss is in KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", default=str(FULL) if FULL.exists() else str(traces.bundled("azure-conv")))
    p.add_argument("--times", type=int, nargs="+", default=[1, 2, 5, 10])
    p.add_argument("--policy", default="vllm")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--tree", default=str(ROOT), help="the checkout whose code replays (default: this one)")
    p.add_argument("--write", metavar="FILE", help="store the figures in this JSON file")
    p.add_argument("--key", default="scale", help="the key of the figures in --write's file")
    a = p.parse_args()
    tree = Path(a.tree).resolve()
    rows = []
    trace = traces.read_trace(a.trace)
    print(f"trace {Path(a.trace).name}: {len(trace)} requests; policy {a.policy}; median of {a.repeat}")
    print(f"{'tiles':>5} {'requests':>9} {'wall s':>7} {'CPU s':>7} {'peak MB':>8} {'s / 1k req':>10} {'MB / 1k req':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for times in a.times:
            df = tiled(trace, times)
            path = Path(tmp) / f"tiled_{times}.csv"
            df.to_csv(path, index=False)
            runs = [replay_process(path, Path(tmp) / f"run_{times}_{i}", a.policy, tree) for i in range(a.repeat)]
            wall = statistics.median(r[0] for r in runs)
            rss = statistics.median(r[1] for r in runs)
            cpu = statistics.median(r[2] for r in runs)
            print(f"{times:>5} {len(df):>9,} {wall:>7.2f} {cpu:>7.2f} {rss:>8.0f} {wall / len(df) * 1e3:>10.3f} "
                  f"{rss / len(df) * 1e3:>11.2f}", flush=True)
            rows.append({"tiles": times, "requests": len(df), "wall_s": [round(r[0], 3) for r in runs],
                         "cpu_s": [round(r[2], 3) for r in runs], "peak_rss_mb": [round(r[1], 1) for r in runs]})
    if a.write:
        path = Path(a.write)
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc[a.key] = {"trace": Path(a.trace).name, "policy": a.policy, "tree": str(tree),
                      "load_average_1min": round(os.getloadavg()[0], 2), "tilings": rows}
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path} [{a.key!r}]")


if __name__ == "__main__":
    main()

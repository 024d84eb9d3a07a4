"""CPU seconds and memory of the same replay run many times in one process, trees side by side.

    python benchmarks/repeated_runs.py [--tree before=DIR --tree after=DIR] [--policies vllm-v1 sglang ...]
                                       [--runs 8] [--rounds 2] [--json benchmarks/results/repeated_runs.json]

As a sweep's worker or a notebook runs replays: one process calls
`blocksim.experiments.runner.replay` `--runs` times on the Mooncake synthetic trace (read once;
prompts clipped to llama-2-7b's 4,096 tokens, h100-80gb, the built-in roofline
`benchmarks/roofline_defaults.json`), each run writing the same run directory again, the cyclic
garbage collector as Python leaves it. Per run: the CPU seconds of the call (user + system,
`time.process_time`), the process's peak RSS so far (`resource.getrusage` ru_maxrss) and its RSS
after the call (/proc/self/statm). After the last run: how many objects one `gc.collect()` finds
(what the runs left in reference cycles) and its seconds, and the collections Python made of each
generation (`gc.get_stats`). The JSON's `summary` gives per tree and policy the first run's CPU
seconds, the median and maximum of the later runs', and the peak RSS after the first and last run. A policy may carry replay options: `sglang:tier_host_gib=256,tier_disk_gib=2048`.

Each (tree, policy) is a fresh process importing blocksim from its tree (PYTHONPATH); each round
runs every policy in every tree, the trees alternating, so that the machine's load weighs on both
alike. The JSON records the 1-, 5- and 15-minute load averages before and after. Without `--tree`,
this tree runs as "this". Needs ../shared/traces beside the repository (or `--trace`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from replay_process import commit_of  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
PROFILE = ROOT / "benchmarks" / "roofline_defaults.json"


def policy_options(spec: str) -> tuple[str, dict]:
    """`POLICY[:NAME=VALUE,...]` -> (policy, options); values read as int, then float, else kept as text."""
    policy, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        name, value = item.split("=", 1)
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except ValueError:
                pass
        options[name] = value
    return policy, options


def child(spec: str, runs: int, trace: str) -> dict:
    """`runs` replays of `trace` under `spec` (`policy_options`) in this process (blocksim from PYTHONPATH)."""
    import gc
    import resource
    import time

    from blocksim.experiments.runner import load_trace, replay

    page = os.sysconf("SC_PAGE_SIZE")

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page / 2**20

    policy, options = policy_options(spec)
    tr = load_trace(trace)
    cpu, maxrss, rss = [], [], []
    with tempfile.TemporaryDirectory(prefix="repeated-runs-") as tmp:
        for _ in range(runs):
            c0 = time.process_time()
            replay(tr, Path(tmp) / "run", policy=policy, overwrite=True,
                   overrides={"cost_profile": str(PROFILE), "clip_to_model": True, **options})
            cpu.append(round(time.process_time() - c0, 3))
            maxrss.append(round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
            rss.append(round(rss_mib(), 1))
    collections = [s["collections"] for s in gc.get_stats()]
    t0 = time.perf_counter()
    found = gc.collect()
    return {"cpu_s": cpu, "peak_rss_mib": maxrss, "rss_mib": rss, "gc_collections_per_generation": collections,
            "final_collect": {"objects": found, "s": round(time.perf_counter() - t0, 3)}}


def run_child(tree: Path, policy: str, runs: int, trace: str) -> dict:
    cmd = [sys.executable, __file__, "--child", policy, "--runs", str(runs), "--trace", trace]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {policy} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="a source tree to run (repeatable); default: this tree as 'this'")
    p.add_argument("--policies", nargs="+", default=["vllm-v1", "sglang"])
    p.add_argument("--runs", type=int, default=8, help="replays per process")
    p.add_argument("--rounds", type=int, default=2, help="processes per tree and policy, the trees alternating")
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "repeated_runs.json"))
    p.add_argument("--child", metavar="POLICY", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.runs < 2:
        p.error(f"--runs {a.runs}: at least 2 (the summary sets the first run against the later ones)")
    if a.child:
        print(json.dumps(child(a.child, a.runs, a.trace)))
        return
    trees = dict(t.split("=", 1) for t in a.tree) or {"this": str(ROOT)}
    trees = {name: Path(d).resolve() for name, d in trees.items()}
    commits = {name: commit_of(tree, ("blocksim", "traces")) for name, tree in trees.items()}
    load_before = os.getloadavg()
    rows = []
    for r in range(a.rounds):
        for policy in a.policies:
            for name, tree in trees.items():
                out = run_child(tree, policy, a.runs, a.trace)
                cpu = out["cpu_s"]
                rows.append({"tree": name, "commit": commits[name], "policy": policy, "round": r, **out})
                print(f"{name:<6} {policy:<20} round {r}: CPU s per run {' '.join(f'{c:.2f}' for c in cpu)}  "
                      f"(first {cpu[0]:.2f}, median of the rest {statistics.median(cpu[1:] or cpu):.2f}, "
                      f"max {max(cpu):.2f})  peak RSS {out['peak_rss_mib'][0]:.0f} -> {out['peak_rss_mib'][-1]:.0f} "
                      f"MiB  final gc.collect() {out['final_collect']['objects']} objects in "
                      f"{out['final_collect']['s']:.2f} s", flush=True)
    summary = []
    for policy in a.policies:
        for name in trees:
            mine = [row for row in rows if row["tree"] == name and row["policy"] == policy]
            later = [c for row in mine for c in row["cpu_s"][1:]]
            summary.append({"tree": name, "policy": policy, "first_run_cpu_s": [row["cpu_s"][0] for row in mine],
                            "later_runs_cpu_s_median": statistics.median(later), "later_runs_cpu_s_max": max(later),
                            "peak_rss_mib_first_run": [row["peak_rss_mib"][0] for row in mine],
                            "peak_rss_mib_last_run": [row["peak_rss_mib"][-1] for row in mine],
                            "final_collect_objects": [row["final_collect"]["objects"] for row in mine],
                            "final_collect_s": [row["final_collect"]["s"] for row in mine]})
    result = {"trace": Path(a.trace).name, "runs_per_process": a.runs, "rounds": a.rounds,
              "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()},
              "trees": commits, "summary": summary,
              "processes": rows}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()

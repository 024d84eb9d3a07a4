"""The whole `blocksim replay` process on the full conversation trace, trees side by side: wall
seconds, CPU seconds and peak RSS.

    python benchmarks/replay_process.py --tree before=DIR --tree after=DIR [--policies vllm vllm-v1 ...]
                                        [--rounds 3] [--bytecode] [--write FILE --key KEY]

Each round runs every policy in every tree, the trees alternating, one process each, as a user
runs it: `python -m blocksim replay TRACE --out TMP --overwrite --policy P --quiet --no-report
--cost-profile benchmarks/roofline_defaults.json`, with PYTHONPATH set to the tree. CPU seconds
are the process's user + system time and peak RSS its ru_maxrss (`os.wait4`). Without `--bytecode`
no bytecode cache is read or written (PYTHONDONTWRITEBYTECODE=1, every process compiles the
project's modules); with it each tree gets a bytecode cache of its own (PYTHONPYCACHEPREFIX),
filled by one run before the rounds, as an installed package has one. Prints each policy's
medians per tree and the 1-minute load average before and after; `--write` stores the figures
in the JSON file under `--key` (default "process"), keeping its other keys.
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

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT.parent / "shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
POLICIES = ("vllm", "vllm-prefix", "vllm-chunked", "vllm-v1", "sglang")


def run_once(tree: Path, trace: Path, policy: str, out: Path, cache: Path | None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one replay process of `tree`."""
    cmd = [sys.executable, "-m", "blocksim", "replay", str(trace), "--out", str(out), "--overwrite",
           "--policy", policy, "--quiet", "--no-report",
           "--cost-profile", str(tree / "benchmarks" / "roofline_defaults.json")]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{tree}: replay --policy {policy} failed (exit {os.waitstatus_to_exitcode(status)}); "
                         f"run the command by hand: {' '.join(cmd)}")
    return round(wall, 3), round(usage.ru_utime + usage.ru_stime, 3), round(usage.ru_maxrss / 1024, 1)


def commit_of(tree: Path, sources: tuple[str, ...] = ()) -> str | None:
    """The short commit `tree` holds (None outside git), marked "with uncommitted changes" where any
    of the paths `sources` has some."""
    found = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = found.stdout.strip() or None if found.returncode == 0 else None
    if commit is None or not sources:
        return commit
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", *sources],
                           capture_output=True, text=True).stdout.strip()
    return commit + (" with uncommitted changes" if dirty else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, metavar="LABEL=DIR",
                   help="a tree to run (repeat: the trees alternate within each round)")
    p.add_argument("--trace", default=str(FULL))
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bytecode", action="store_true", help="each tree with a warm bytecode cache of its own")
    p.add_argument("--commit", action="append", default=[], metavar="LABEL=COMMIT",
                   help="the commit a tree holds, recorded with the figures (default: git rev-parse of the tree)")
    p.add_argument("--write", metavar="FILE", help="store the figures in this JSON file")
    p.add_argument("--key", default="process", help="the key of the figures in --write's file")
    a = p.parse_args()
    trees = {}
    for spec in a.tree:
        label, _, path = spec.partition("=")
        if not path or not Path(path, "blocksim").is_dir():
            raise SystemExit(f"--tree {spec}: expected LABEL=DIR, DIR a checkout holding blocksim/")
        trees[label] = Path(path).resolve()
    commits = {label: commit_of(tree) for label, tree in trees.items()}
    commits.update(dict(c.split("=", 1) for c in a.commit))
    trace = Path(a.trace).resolve()
    runs = {pol: {label: [] for label in trees} for pol in a.policies}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        caches = {label: Path(tmp, f"pycache-{label}") if a.bytecode else None for label in trees}
        if a.bytecode:  # fill each tree's cache
            for label, tree in trees.items():
                run_once(tree, trace, a.policies[0], Path(tmp, "warm"), caches[label])
        for r in range(a.rounds):
            for pol in a.policies:
                for label, tree in trees.items():
                    runs[pol][label].append(run_once(tree, trace, pol, Path(tmp, "run"), caches[label]))
            print(f"round {r + 1} of {a.rounds} done (load {os.getloadavg()[0]:.2f})", flush=True)
    load_after = os.getloadavg()[0]
    print(f"{trace.name}; bytecode cache: {'yes' if a.bytecode else 'no'}; load average (1 min) "
          f"{load_before:.2f} before, {load_after:.2f} after; medians of {a.rounds}")
    print(f"{'policy':<14}" + "".join(f"{label + ' wall / CPU s / MB':>34}" for label in trees))
    figures = {}
    for pol in a.policies:
        figures[pol] = {}
        cells = []
        for label in trees:
            wall, cpu, rss = zip(*runs[pol][label])
            figures[pol][label] = {"wall_s": list(wall), "cpu_s": list(cpu), "peak_rss_mb": list(rss)}
            cells.append(f"{statistics.median(wall):.2f} / {statistics.median(cpu):.2f} / {statistics.median(rss):.0f}")
        print(f"{pol:<14}" + "".join(f"{c:>34}" for c in cells))
    if a.write:
        path = Path(a.write)
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc[a.key] = {
            "command": "python -m blocksim replay TRACE --out DIR --overwrite --policy P --quiet --no-report "
                       "--cost-profile benchmarks/roofline_defaults.json, PYTHONPATH set to each tree; "
                       "cpu_s = user + system (os.wait4); trees alternate within each round "
                       "(benchmarks/replay_process.py)",
            "trace": trace.name, "rounds": a.rounds, "bytecode_cache": a.bytecode,
            "load_average_1min": [round(load_before, 2), round(load_after, 2)],
            "trees": {label: commits[label] for label in trees},
            "policies": figures,
        }
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path} [{a.key!r}]")


if __name__ == "__main__":
    main()

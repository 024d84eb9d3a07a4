"""KV tier fidelity: simulated TTFT against GPU-executed runs whose tier moves are real transfers.

    # on the GPU: every configuration executed (`--executor cuda`), each tier move performed and timed
    python benchmarks/tier_fidelity.py execute --out runs/tier_fidelity/exec --disk-dir DIR
    # on any machine: the same configurations simulated (the profile of the model and GPU with the
    # tier executor's measured tables merged in)
    python benchmarks/tier_fidelity.py simulate --exec runs/tier_fidelity/exec --out runs/tier_fidelity/sim
    # errors, ranking, beats-recompute agreement: JSON and the table in benchmarks/TIERS.md
    python benchmarks/tier_fidelity.py results --exec runs/tier_fidelity/exec --sim runs/tier_fidelity/sim \\
        --json benchmarks/results/tier-fidelity-h200.json --markdown benchmarks/TIERS.md

The slice (`benchmarks/results/tier-fidelity/slice.parquet`, written from the Mooncake synthetic
trace when absent): arrivals in [SLICE_S) of `../shared/traces/mooncake/synthetic_trace.jsonl`
(prefix hashes of 512 tokens), at RATE times its rate, prompts clipped to CLIP_TOKENS. The engine:
vllm-v1 with 256-token tier chunks on a GPU cache of GPU_BLOCKS blocks, small enough that the
prefixes the slice re-sends leave the GPU before they come back, and at most BATCHED_TOKENS tokens
per step (prefill chunks inside the profile's measured attention grid). The configurations (`CONFIGS`):
no tier; a host tier of two sizes x LRU or ARC x write-through or write-back; host and disk,
loaded on a hit (wait) or loaded only where the profile says it beats recomputing (recompute); a
disk alone.

An executed run is `blocksim replay --executor cuda`: every step runs the model and lasts its
measured GPU time, every tier move is performed by the tier executor as the engine issues it, and
the clock takes each move's measured time (docs/tier_executor.md). Its simulated twin is the same
replay priced by the profile (`--cost-profile`); the tier moves by the profile's tier tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL, GPU, POLICY = "llama-3-8b", "h200-141gb", "vllm-v1"
SOURCE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
SLICE = ROOT / "benchmarks" / "results" / "tier-fidelity" / "slice.parquet"
SLICE_S, RATE, CLIP_TOKENS = (960.0, 975.0), 0.75, 8192
GPU_BLOCKS, CHUNK_TOKENS = 800, 256
#: tokens per step: prefill chunks within the profile's measured attention grid (4,096 new tokens)
BATCHED_TOKENS = 4096
TIER_TABLES = ROOT / "benchmarks" / "results" / "tier-h200.json"
SHIPPED = ROOT / "blocksim" / "profiles" / f"{MODEL}__{GPU}__float16__tp1.json"
#: The file in an executed runs' directory holding the profile they were executed with (`--base-profile`).
BASE_PROFILE = "base-profile.json"

#: name -> replay flags
CONFIGS: dict[str, list[str]] = {"none": []}
for gib in (8, 16):
    for ev in ("lru", "arc"):
        for wr in ("write-through", "write-back"):
            CONFIGS[f"host{gib}-{ev}-{wr}"] = ["--tier-host-gib", str(gib), "--tier-host-eviction", ev,
                                               "--tier-host-write", wr]
for onload in ("wait", "recompute"):
    CONFIGS[f"host8-disk32-{onload}"] = ["--tier-host-gib", "8", "--tier-disk-gib", "32", "--tier-disk-write",
                                         "write-back", "--tier-onload", onload]
CONFIGS["disk32-wait"] = ["--tier-disk-gib", "32", "--tier-disk-write", "write-through"]


#: the prefix-caching presets a run may take (`--policy`)
POLICIES = ("vllm-v1", "vllm-prefix", "sglang")


def use_policy(name: str) -> None:
    """Run under preset `name`."""
    global POLICY
    POLICY = name


def engine_flags() -> list[str]:
    """The engine's size flags under POLICY: SGLang names its pages and prefill budget its own way."""
    if POLICY == "sglang":
        return ["--page-size", "16", "--num-gpu-blocks", str(GPU_BLOCKS), "--chunked-prefill-size", str(BATCHED_TOKENS)]
    # vLLM v0 without chunked prefill runs a prompt in one step: the budget holds the longest one
    budget = CLIP_TOKENS if POLICY == "vllm-prefix" else BATCHED_TOKENS
    return ["--num-gpu-blocks", str(GPU_BLOCKS), "--max-num-batched-tokens", str(budget)]


def use_gpu(name: str) -> None:
    """Run on catalog GPU `name` (its shipped profile of MODEL)."""
    global GPU, SHIPPED
    GPU = name
    SHIPPED = ROOT / "blocksim" / "profiles" / f"{MODEL}__{GPU}__float16__tp1.json"


def write_slice(path: Path | None = None) -> Path:
    """The trace slice as canonical Parquet (kept: the executed and simulated runs read the same file)."""
    path = path or SLICE
    if path.exists():
        return path
    import traces
    from traces.trace import Trace
    t = traces.window(traces.read_trace(SOURCE), *SLICE_S)
    t = traces.scale_rate(t, RATE)
    t, _ = traces.clip_to_max_len(t, CLIP_TOKENS)
    path.parent.mkdir(parents=True, exist_ok=True)
    Trace(df=t.df.reset_index(drop=True), hash_block_tokens=t.hash_block_tokens, name="mooncake-tier-slice").to_parquet(path)
    return path


def replay_args(name: str, out: Path, disk_dir: Path | None, model: str = MODEL, catalog: str | None = None) -> list[str]:
    flags = list(CONFIGS[name])
    if flags:
        flags += ["--tier-chunk-tokens", str(CHUNK_TOKENS)]
        if disk_dir is not None and "--tier-disk-gib" in flags:
            flags += ["--tier-disk-path", str(disk_dir)]
    if catalog:
        flags += ["--catalog", catalog]
    return ["replay", str(write_slice()), "--model", model, "--gpu", GPU, "--policy", POLICY, *engine_flags(),
            *flags, "--quiet", "--no-report", "--out", str(out)]


def blocksim(args: list[str], log) -> int:
    cmd = [sys.executable, "-c", "from blocksim.cli import main; import sys; sys.exit(main())", *args]
    t0 = time.perf_counter()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH")) if x)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log.write(f"$ blocksim {' '.join(args)}\n{p.stdout}{p.stderr}(rc {p.returncode}, {time.perf_counter() - t0:.1f} s)\n")
    log.flush()
    return p.returncode


def shared_executor(kind: str):
    """A `config -> StepExecutor` factory building the model once: later runs reuse its weights,
    caches and CUDA graphs (`ModelStepExecutor.new_run`)."""
    from validation.step_executor import make_executor
    build, held = make_executor(kind), []

    def factory(config):
        if not held:
            held.append(build(config))
        else:
            held[0].new_run(config)
        return held[0]
    return factory


def execute_in_process(args: list[str], factory, log) -> int:
    """`blocksim replay ARGS` in this process, with the executor of `factory`."""
    import contextlib
    import io

    import blocksim.cli as cli
    t0 = time.perf_counter()
    out, err = io.StringIO(), io.StringIO()
    before = cli.executor_from_args
    cli.executor_from_args = lambda _args: factory
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(args)
    finally:
        cli.executor_from_args = before
    log.write(f"$ blocksim {' '.join(args)}\n{out.getvalue()}{err.getvalue()}(rc {rc}, "
              f"{time.perf_counter() - t0:.1f} s)\n")
    log.flush()
    return rc


def cmd_execute(a) -> int:
    global SLICE
    SLICE = Path(a.slice) if a.slice else SLICE
    use_gpu(a.gpu)
    use_policy(a.policy)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    disk = Path(a.disk_dir) if a.disk_dir else out / "disk"
    disk.mkdir(parents=True, exist_ok=True)
    # the profile prices what the engine decides before moving (the recompute mode's what-ifs) as the
    # simulated twin does; the clock takes the measured steps and moves
    base = None
    if a.base_profile:  # kept beside the runs: their simulated twins are priced by it too
        base = out / BASE_PROFILE
        if not Path(a.base_profile).is_file():
            raise UsageError(f"--base-profile {a.base_profile}: no such file; give a blocksim profile output")
        if Path(a.base_profile).resolve() != base.resolve():
            shutil.copyfile(a.base_profile, base)
    profile = ["--cost-profile", str(merged_profile(out, Path(a.tier_tables), base=base))] if a.model == MODEL else []
    start = time.perf_counter()
    factory = None if a.process_per_run else shared_executor(a.executor)
    with open(out / "execute.log", "a") as log:
        for name in a.configs:
            if (out / name / "executor.json").exists():
                continue
            if a.budget_s and time.perf_counter() - start > a.budget_s:
                print(f"execute {name}: skipped (past --budget-s {a.budget_s:.0f})", flush=True)
                continue
            t0 = time.perf_counter()
            args = replay_args(name, out / name, disk, a.model, a.catalog) + profile + ["--executor", a.executor]
            rc = blocksim(args, log) if a.process_per_run else execute_in_process(args, factory, log)
            for f in disk.glob("blocksim-kv-*.bin"):  # the disk tier's file of the run
                f.unlink()
            print(f"execute {name}: rc {rc}, {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


class UsageError(Exception):
    """Bad input to this script: one line naming the option and the fix."""


def merged_profile(out: Path, tables: Path, name: str = "profile.json", base: Path | None = None) -> Path:
    """The shipped profile (or `base`, a profile of MODEL on GPU) with the tier executor's measured
    tables (`tables`) merged in."""
    from benchmarks.tier_bandwidth_merge import merge
    if base is not None:
        try:
            prof = json.loads(base.read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"--base-profile {base}: not a readable profile ({e}); give a blocksim profile output")
        if (prof.get("model"), prof.get("gpu")) != (MODEL, GPU):
            raise UsageError(f"--base-profile {base}: a profile of {prof.get('model')} on {prof.get('gpu')}, not of "
                             f"{MODEL} on {GPU}; profile {MODEL} on this GPU")
    elif not SHIPPED.is_file():
        have = sorted(p.name.split("__")[1] for p in SHIPPED.parent.glob(f"{MODEL}__*__float16__tp1.json"))
        raise UsageError(f"--gpu {GPU}: no shipped profile of {MODEL} for it ({SHIPPED}); "
                         f"choose one of {', '.join(have)}")
    else:
        prof = json.loads(SHIPPED.read_text())
    if not tables.is_file():
        raise UsageError(f"--tier-tables {tables}: no such file; give a benchmarks/tier_bandwidth.py result")
    path = out / name
    path.write_text(json.dumps(merge(json.loads(tables.read_text()), prof), indent=1))
    return path


MOVES = {"gpu->host": "tier_gpu_host", "gpu->disk": "tier_gpu_disk", "host->disk": "tier_host_disk",
         "host->gpu": "tier_host_gpu", "disk->gpu": "tier_disk_gpu"}


def in_run_tables(tables: dict, run: Path) -> dict:
    """`tables` with the chunk size of this benchmark priced at the executed `run`'s mean measured
    time per chunk of each move it made (a diagnosis: the run's own rates, not a prediction)."""
    import copy

    import pandas as pd
    out = copy.deepcopy(tables)
    moves = pd.read_parquet(run / "executor_tier_moves.parquet")
    for move, g in moves.groupby("move"):
        comp = out["components"][MOVES[move]]
        if CHUNK_TOKENS not in comp["chunk_tokens"]:
            raise UsageError(f"--tier-tables: {MOVES[move]} has no {CHUNK_TOKENS}-token chunks "
                             f"(it has {comp['chunk_tokens']}); measure them with benchmarks/tier_bandwidth.py")
        row = comp["chunk_tokens"].index(CHUNK_TOKENS)
        per_chunk = float(g.seconds.sum() / g.chunks.sum())
        comp["seconds"][row] = [per_chunk * n for n in comp["grid"]["chunks"]]
    return out


def cmd_simulate(a) -> int:
    exec_dir, out = Path(a.exec), Path(a.out)
    runs = sorted(exec_dir.glob("*/summary.json"))
    if runs:  # the executed runs' GPU and engine
        cfg = json.loads(runs[0].read_text())["config"]
        use_gpu(cfg["gpu"]["name"])
        if a.policy not in (None, cfg["policy"]):
            raise UsageError(f"--policy {a.policy}: the runs of {exec_dir} were executed under {cfg['policy']}; "
                             f"drop --policy or give theirs")
        use_policy(cfg["policy"])
    else:
        use_policy(a.policy or POLICIES[0])
    out.mkdir(parents=True, exist_ok=True)
    base = Path(a.base_profile) if a.base_profile else exec_dir / BASE_PROFILE
    base = base if base.is_file() or a.base_profile else None  # the executed runs' own profile, when they had one
    if base is not None:
        print(f"simulate: priced by {base} with the tier tables merged in", flush=True)
    profile = merged_profile(out, Path(a.tier_tables), base=base) if a.model == MODEL else None
    names = sorted(p.parent.name for p in exec_dir.glob("*/executor.json")) if not a.configs else a.configs
    with open(out / "simulate.log", "a") as log:
        for name in names:
            if a.in_run_rates and CONFIGS[name]:
                tables = out / f"{name}.tables.json"
                tables.write_text(json.dumps(in_run_tables(json.loads(Path(a.tier_tables).read_text()), exec_dir / name)))
                profile = merged_profile(out, tables, f"{name}.profile.json", base=base)
            shutil.rmtree(out / name, ignore_errors=True)  # a replay refuses a run directory that exists
            args = replay_args(name, out / name, None, a.model, a.catalog)
            if profile is not None:
                args += ["--cost-model", "profiled", "--cost-profile", str(profile)]
            rc = blocksim(args, log)
            print(f"simulate {name}: rc {rc}", flush=True)
    return 0


def run_figures(run: Path) -> dict:
    """Mean and p90 TTFT, the TTFT split, per-tier hit rates of one run directory."""
    import pandas as pd
    req = pd.read_parquet(run / "requests.parquet")
    s = json.loads((run / "summary.json").read_text())
    ttft = req.ttft_s.dropna().to_numpy()
    out = {"requests": int(len(ttft)), "ttft_mean_s": float(ttft.mean()), "ttft_p90_s": float(np.percentile(ttft, 90))}
    tr = run / "tier_requests.parquet"
    if tr.exists():
        t = pd.read_parquet(tr)
        out.update({f"{c}_mean_s": float(t[c].mean()) for c in ("ttft_queue_s", "ttft_onload_s", "ttft_prefill_s")})
    for k in ("tier_gpu_hit_rate", "tier_host_hit_rate", "tier_disk_hit_rate", "tier_onload_skipped_tokens"):
        if k in s:
            out[k] = s[k]
    return out


#: a configuration against no tier (every prefix the GPU lacks recomputed), by mean TTFT
WORD = {-1: "faster", 0: "level", 1: "slower"}
#: two mean TTFTs within this fraction of each other are a tie (configurations that schedule alike)
TIE = 0.01


def order(u: float, v: float, tie: float) -> int:
    """-1, 0 or 1: `u` below, level with (within `tie` of the larger) or above `v`."""
    return 0 if abs(u - v) <= tie * max(abs(u), abs(v)) else (1 if u > v else -1)


def pairwise(a: dict, b: dict, tie: float = TIE) -> tuple[int, int]:
    """Pairs of configurations ordered alike by mean TTFT in `a` and `b` (a tie agrees only with a
    tie), and the pairs compared."""
    names = sorted(a)
    ok = n = 0
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            n += 1
            ok += order(a[x], a[y], tie) == order(b[x], b[y], tie)
    return int(ok), n


def cmd_results(a) -> int:
    exec_dir, sim_dir = Path(a.exec), Path(a.sim)
    runs = sorted(exec_dir.glob("*/summary.json"))
    if runs:
        cfg = json.loads(runs[0].read_text())["config"]
        use_gpu(cfg["gpu"]["name"])
        use_policy(cfg["policy"])
    rows = []
    for run in sorted(p.parent for p in exec_dir.glob("*/executor.json")):
        sim = sim_dir / run.name
        if not (sim / "summary.json").exists():
            continue
        e, s = run_figures(run), run_figures(sim)
        ex = json.loads((run / "executor.json").read_text())
        moves = {}
        if (run / "executor_tier_moves.parquet").exists():  # per move: chunks, measured and link-priced seconds
            import pandas as pd
            m = pd.read_parquet(run / "executor_tier_moves.parquet")
            for move, g in m.groupby("move"):
                moves[move] = {"chunks": int(g.chunks.sum()), "measured_s": float(g.seconds.sum()),
                               "disk_s": float(g.disk_s.sum()),
                               "priced_s": float(g.priced_s.sum()) if "priced_s" in g else None}
        rows.append({"config": run.name, "flags": " ".join(CONFIGS.get(run.name, [])),
                     "ttft_mean_err": (s["ttft_mean_s"] - e["ttft_mean_s"]) / e["ttft_mean_s"],
                     "ttft_p90_err": (s["ttft_p90_s"] - e["ttft_p90_s"]) / e["ttft_p90_s"],
                     "executed": e, "simulated": s, "moves": moves,
                     "tier_moves": ex.get("tier_moves", 0), "tier_checked_loads": ex.get("tier_checked_loads", 0),
                     "tier_checksum_mismatches": ex.get("tier_checksum_mismatches", 0),
                     "tier_move_s": ex.get("tier_move_s", 0.0), "tier_disk_io": ex.get("tier_disk_io"),
                     "device": ex.get("device"), "torch": ex.get("torch")})
    mean_e = {r["config"]: r["executed"]["ttft_mean_s"] for r in rows}
    mean_s = {r["config"]: r["simulated"]["ttft_mean_s"] for r in rows}
    ok, n = pairwise(mean_e, mean_s)
    strict_ok, _ = pairwise(mean_e, mean_s, 0.0)
    beats = {}
    if "none" in mean_e:
        p90_e = {r["config"]: r["executed"]["ttft_p90_s"] for r in rows}
        p90_s = {r["config"]: r["simulated"]["ttft_p90_s"] for r in rows}
        for r in rows:  # the error beyond the run without tiers': what the tier model adds
            c = r["config"]
            r["ttft_mean_err_vs_none"] = (mean_s[c] / mean_s["none"]) / (mean_e[c] / mean_e["none"]) - 1
            r["ttft_p90_err_vs_none"] = (p90_s[c] / p90_s["none"]) / (p90_e[c] / p90_e["none"]) - 1
        for r in rows:
            if r["config"] != "none":
                be, bs = (WORD[order(m[r["config"]], m["none"], TIE)] for m in (mean_e, mean_s))
                r["beats_recompute"] = {"executed": be, "simulated": bs}
                beats[r["config"]] = be == bs
    result = {"commands": [f"KERNELS=DIR GPU={GPU.split('-')[0]} bash benchmarks/tier_fidelity.sh (the executed runs, on the GPU)",
                           f"python benchmarks/tier_fidelity.py simulate --exec {a.exec} --out {a.sim}"
                           + (f" --policy {POLICY}" if POLICY != POLICIES[0] else "")
                           + (" --in-run-rates" if "in-run" in a.json else ""),
                           f"python benchmarks/tier_fidelity.py results --exec {a.exec} --sim {a.sim} --json {a.json}"],
              "model": MODEL, "gpu": GPU, "policy": POLICY, "batched_tokens": BATCHED_TOKENS, "gpu_blocks": GPU_BLOCKS, "chunk_tokens": CHUNK_TOKENS,
              "slice": {"source": "mooncake synthetic_trace.jsonl", "window_s": list(SLICE_S), "rate": RATE,
                        "clip_tokens": CLIP_TOKENS},
              "configs": rows, "pairwise_correct": ok, "pairs": n, "pairwise_accuracy": ok / n if n else None,
              "pairwise_tie": TIE, "pairwise_correct_no_ties": strict_ok,
              "beats_recompute_agree": int(sum(beats.values())), "beats_recompute_of": len(beats),
              "within": {"ttft_mean_3pct": sum(abs(r["ttft_mean_err"]) <= 0.03 for r in rows),
                         "ttft_p90_5pct": sum(abs(r["ttft_p90_err"]) <= 0.05 for r in rows), "of": len(rows)},
              "checksum_mismatches": sum(r["tier_checksum_mismatches"] for r in rows),
              "checked_loads": sum(r["tier_checked_loads"] for r in rows)}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(markdown_table(result))
    if a.markdown:
        replace_section(Path(a.markdown), markdown_table(result))
    return 0


def pct(x) -> str:
    return f"{100 * x:+.1f}%"


def markdown_table(r: dict) -> str:
    lines = ["| config | exec mean | sim mean | mean err | exec p90 | sim p90 | p90 err | mean / p90 err vs no tier "
             "| host / disk hit (exec) | queue / onload / prefill (exec / sim, ms) | against no tier (exec / sim) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["configs"]:
        e, s = c["executed"], c["simulated"]
        hits = f"{100 * e.get('tier_host_hit_rate', 0):.1f}% / {100 * e.get('tier_disk_hit_rate', 0):.1f}%" \
            if "tier_host_hit_rate" in e else ""
        keys = ("ttft_queue_s_mean_s", "ttft_onload_s_mean_s", "ttft_prefill_s_mean_s")
        split = " / ".join(f"{1e3 * e[k]:.0f}" for k in keys) + " vs " + " / ".join(f"{1e3 * s[k]:.0f}" for k in keys) \
            if "ttft_queue_s_mean_s" in e else ""
        rel = f"{pct(c['ttft_mean_err_vs_none'])} / {pct(c['ttft_p90_err_vs_none'])}" if "ttft_mean_err_vs_none" in c else ""
        b = c.get("beats_recompute")
        beats = f"{b['executed']} / {b['simulated']}" if b else ""
        lines.append(f"| {c['config']} | {1e3 * e['ttft_mean_s']:.1f} ms | {1e3 * s['ttft_mean_s']:.1f} ms | "
                     f"{pct(c['ttft_mean_err'])} | {1e3 * e['ttft_p90_s']:.1f} ms | {1e3 * s['ttft_p90_s']:.1f} ms | "
                     f"{pct(c['ttft_p90_err'])} | {rel} | {hits} | {split} | {beats} |")
    w = r["within"]
    lines += ["", f"Mean TTFT within 3%: {w['ttft_mean_3pct']} of {w['of']}; p90 TTFT within 5%: {w['ttft_p90_5pct']} "
              f"of {w['of']}; ranking by mean TTFT: {r['pairwise_correct']} of {r['pairs']} pairs in the same order "
              f"({100 * (r['pairwise_accuracy'] or 0):.1f}%; means within {100 * r['pairwise_tie']:.0f}% are a tie; "
              f"{r['pairwise_correct_no_ties']} of {r['pairs']} without ties); beats no tier: {r['beats_recompute_agree']} of "
              f"{r['beats_recompute_of']} agree; checksum mismatches: {r['checksum_mismatches']} over "
              f"{r['checked_loads']} checked loads."]
    return "\n".join(lines) + "\n"


def markers() -> tuple[str, str]:
    """The generated table's markers in the markdown file: one pair per engine."""
    tag = "tier-fidelity" if POLICY == POLICIES[0] else f"tier-fidelity-{POLICY}"
    return f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"


def replace_section(path: Path, table: str) -> None:
    """Put the generated table between the markers of `path` (appended with them when absent)."""
    begin, end = markers()
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/tier_fidelity.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("execute")
    e.add_argument("--out", required=True)
    e.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    e.add_argument("--disk-dir", default=None, help="directory of the disk tier's file (default OUT/disk)")
    e.add_argument("--executor", default="cuda", choices=["cuda", "cpu"])
    e.add_argument("--gpu", default=GPU, help=f"catalog GPU (default {GPU}): its shipped profile of {MODEL}")
    e.add_argument("--policy", default=POLICY, choices=POLICIES, help=f"the engine (default {POLICY})")
    for p in (e, s := sub.add_parser("simulate")):
        p.add_argument("--model", default=MODEL, help=f"model (default {MODEL}; another is for trying the script)")
        p.add_argument("--catalog", default=None, help="a catalog file defining --model")
        p.add_argument("--tier-tables", default=str(TIER_TABLES),
                       help="a tier_bandwidth.py result: its measured tables are merged into the shipped profile")
        p.add_argument("--base-profile", default=None, metavar="FILE",
                       help="the profile of the model on this GPU the tables are merged into (default: the shipped "
                            f"one; simulate: EXEC/{BASE_PROFILE} when the runs were executed with one)")
    e.add_argument("--budget-s", type=float, default=None, help="start no run after this many seconds")
    e.add_argument("--process-per-run", action="store_true",
                   help="one `blocksim replay` process per configuration (default: all in this process, the model "
                        "built once)")
    e.add_argument("--slice", default=None, help=argparse.SUPPRESS)  # another trace, for trying the script
    e.set_defaults(func=cmd_execute)
    s.add_argument("--exec", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--policy", default=None, choices=POLICIES, help="the engine (default: the executed runs')")
    s.add_argument("--configs", nargs="+", default=None, choices=list(CONFIGS),
                   help="configurations to simulate (default: those executed)")
    s.add_argument("--in-run-rates", action="store_true",
                   help="a diagnosis: price each configuration's tier moves at its executed run's mean measured "
                        "time per chunk and move, instead of the tier tables")
    s.set_defaults(func=cmd_simulate)
    r = sub.add_parser("results")
    r.add_argument("--exec", required=True)
    r.add_argument("--sim", required=True)
    r.add_argument("--json", required=True)
    r.add_argument("--markdown", default=None)
    r.set_defaults(func=cmd_results)
    a = ap.parse_args(argv)
    try:
        return a.func(a)
    except UsageError as e:
        print(f"tier_fidelity: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Fidelity runs: the executed (GPU-in-the-loop) replays and their simulated twins, and the errors.

    # on the GPU: executed runs (every step run by the model, `--executor cuda`)
    python benchmarks/fidelity_runs.py execute --models llama-2-7b --out runs/fidelity/exec
    # on any machine: the same runs simulated with the profiled and the roofline cost models
    python benchmarks/fidelity_runs.py simulate --exec runs/fidelity/exec --out runs/fidelity/sim
    # the errors (signed fractions), as JSON and as a Markdown table
    python benchmarks/fidelity_runs.py results --exec runs/fidelity/exec --sim runs/fidelity/sim \\
        --json benchmarks/results/fidelity-h200.json --markdown runs/fidelity/table.md

``execute --tensor-parallel N`` splits each model over N GPUs (run names end in ``__tpN``; the
twins and the profiles follow the executed run's degree); ``results --merge`` adds the rows to an
existing JSON instead of replacing it.

Slices: fixed windows of the bundled traces (`traces/data`; mooncake-prefix and mooncake-prefix-60:
`benchmarks/slices`), prompts clipped to 4096 tokens
(llama-2-7b's length), never the profiler's synthetic grid. Presets: vllm, vllm-prefix,
vllm-chunked on a cache of `BLOCKS` GPU blocks (memory under pressure: requests wait for blocks
or are preempted), and a swapping configuration (n = 2 samples per request, `SWAP_BLOCKS` blocks,
preemption by swap). The simulated twin of an executed run uses the executed run's configuration
(its summary.json) and trace slice.

``estimate`` gives the device seconds each executed run is expected to take (its simulated twin's
steps, the executor's sleeps, a start: ``expected_exec_s``), to plan a lease; ``execute
--budget-s`` starts no run expected to end past its budget, at the pace of the runs it has
finished on the machine (``machine_pace``).

``moves --before REV`` simulates every slice and preset with the shipped profiles as of a git
revision and with the working tree's, and gives how far each figure moves (a table measured again).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.bench.output import write_json  # noqa: E402  (the repository on the path first)

#: name -> (trace file from the repository root, window [start, end) s, rate scale). mooncake-prefix
#: is a window of the whole Mooncake synthetic trace (benchmarks/slices/README.md) where prompts send
#: again, within a few requests, the 512-token blocks of prompts before them, so that the prefix cache
#: of ``BLOCKS`` blocks serves some (the bundled sample's windows send few blocks again, and those
#: only after the cache has evicted them).
SLICES = {
    "azure-conv": ("traces/data/azure_conv_2023_sample.csv", (140.0, 160.0), 1.0),
    "azure-code": ("traces/data/azure_code_2023_sample.csv", (200.0, 220.0), 2.0),
    "mooncake": ("traces/data/mooncake_sample.jsonl", (380.0, 395.0), 1.0),
    # the file holds [1005 s, 1020 s) of the trace; a trace's arrivals count from its first request
    "mooncake-prefix": ("benchmarks/slices/mooncake_synthetic_1005_1020.jsonl", (0.0, 15.0), 2.0),
    # a minute of the same trace, [960 s, 1020 s), at 1.5 times its rate (at twice it, the queue
    # grows for the whole minute): 240 requests, for percentiles steadier than the 15 s windows'
    "mooncake-prefix-60": ("benchmarks/slices/mooncake_synthetic_960_1020.jsonl", (0.0, 60.0), 1.5),
    # one-minute windows of the bundled samples, at rates where few requests wait but in bursts (the
    # code window ends with one); at the 15 s slices' rates, the Azure windows' queues grow to tens
    # of requests by their last arrival
    "azure-conv-60": ("traces/data/azure_conv_2023_sample.csv", (120.0, 180.0), 0.6),
    "azure-code-60": ("traces/data/azure_code_2023_sample.csv", (180.0, 240.0), 0.75),
    "mooncake-60": ("traces/data/mooncake_sample.jsonl", (360.0, 420.0), 1.5),
}
#: the slices every full set of runs executes (fidelity_device.sh's default); a report counts the
#: runs of these and of any other slice it finds executed
STANDARD_SLICES = ("azure-conv", "azure-code", "mooncake", "mooncake-prefix")
CLIP_TOKENS = 4096
BLOCKS = 900
SWAP_BLOCKS = 700
#: preset name -> (policy, extra replay flags, samples per request)
PRESETS = {
    "vllm": ("vllm", ["--num-gpu-blocks", str(BLOCKS)], 1),
    "vllm-prefix": ("vllm-prefix", ["--num-gpu-blocks", str(BLOCKS)], 1),
    "vllm-chunked": ("vllm-chunked", ["--num-gpu-blocks", str(BLOCKS)], 1),
    "swap-n2": ("vllm", ["--num-gpu-blocks", str(SWAP_BLOCKS), "--preemption", "swap"], 2),
}
MODELS = ("llama-2-7b", "llama-3-8b")


def slice_file(name: str, n: int, out_dir: Path) -> Path:
    """Write the trace slice `name` with `n` samples per request as canonical Parquet; its path."""
    import traces
    from traces.trace import Trace
    path = out_dir / f"{name}_n{n}.parquet"
    if path.exists():
        return path
    file, (lo, hi), rate = SLICES[name]
    t = traces.window(traces.read_trace(ROOT / file), lo, hi)
    if len(t) == 0:
        raise ValueError(f"slice {name}: no request of {file} arrives in [{lo} s, {hi} s); fix its window in SLICES")
    if rate != 1.0:
        t = traces.scale_rate(t, rate)
    t, _ = traces.clip_to_max_len(t, CLIP_TOKENS)
    df = t.df.copy()
    hashes = t.hash_block_tokens
    if n != 1:
        df["n"] = n
        if "prefix_hashes" in df:  # the swapping configuration runs without prefix caching
            df = df.drop(columns=["prefix_hashes"])
            hashes = None
    out_dir.mkdir(parents=True, exist_ok=True)
    t2 = Trace(df=df.reset_index(drop=True), hash_block_tokens=hashes, name=f"{name}_n{n}")
    t2.to_parquet(path)
    return path


def run_name(trace: str, preset: str, model: str, tensor_parallel: int = 1) -> str:
    """TRACE__PRESET__MODEL, with __tpN for N > 1 GPUs."""
    return f"{trace}__{preset}__{model}" + (f"__tp{tensor_parallel}" if tensor_parallel > 1 else "")


def parse_name(name: str) -> tuple[str, str, str, int]:
    """(trace, preset, model, tensor_parallel) of a run directory's name."""
    parts = name.split("__")
    tp = int(parts[3][2:]) if len(parts) > 3 and parts[3].startswith("tp") else 1
    return parts[0], parts[1], parts[2], tp


def replay_args(trace_path: Path, preset: str, model: str, gpu: str, out: Path, tensor_parallel: int = 1) -> list[str]:
    policy, extra, _ = PRESETS[preset]
    tp = ["--tensor-parallel", str(tensor_parallel)] if tensor_parallel > 1 else []
    return ["replay", str(trace_path), "--model", model, "--gpu", gpu, "--policy", policy, *extra, *tp,
            "--quiet", "--no-report", "--out", str(out)]


def blocksim(args: list[str], log, root: Path = ROOT) -> int:
    """`blocksim ARGS` in a fresh process, from the tree at `root` (this repository's by default)."""
    cmd = [sys.executable, "-c", "from blocksim.cli import main; import sys; sys.exit(main())", *args]
    t0 = time.perf_counter()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(root), env.get("PYTHONPATH")) if x)
    if "--tensor-parallel" in args:  # NVLink multicast off in every process of a tensor-parallel run
        from validation.sharded import NO_MULTICAST_ENV
        env.update(NO_MULTICAST_ENV)
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    log.write(f"$ blocksim {' '.join(args)}\n{p.stdout}{p.stderr}(rc {p.returncode}, {time.perf_counter() - t0:.1f} s)\n")
    log.flush()
    return p.returncode


#: An executed run's wall seconds beyond its steps' GPU time, from the lease-5 H100 runs of
#: llama-3-8b (benchmarks/results/fidelity-h100-lease5/exec, one GPU): a start of 8.6-11.9 s (13.2 s
#: in the repeat), and per eager step 42-44 ms of host time beyond its GPU time at the median,
#: most of it the 34 x 1.2 ms of sleeps queued before its segments (`validation.sleeps`). The
#: sleeps count 1.3 times: the eager steps timed again take 4 times the sleeps (109 of the
#: vllm-chunked run's 1,861 eager steps, 212 in its repeat; none or 2 in the other runs), and the
#: host adds its own time. Priced by the shipped H100 profile, those four runs are expected to take
#: 147 s (vllm-chunked; executed in 149 s, and in 170 s on another lease) and 58-62 s (vllm, swap-n2,
#: vllm-prefix; executed in 55-60 s). Not calibrated on tensor-parallel runs, whose start is longer.
EXEC_START_S = 12.0
EXEC_EAGER_EXTRA = 1.3
#: `execute --budget-s` starts a run only if this many times its expected seconds fit in what is
#: left: the same run took 13% longer than expected on one lease
EXEC_MARGIN = 1.2


def machine_pace(done: list[tuple[float, float]]) -> float:
    """How many times its expected seconds a run takes on this machine, from the (expected, taken)
    seconds of the runs `execute` has finished here: the largest ratio, never below 1. A host slower
    than the lease the constants above come from falls behind the executor's sleeps at nearly every
    step (the lease-8 and lease-9 sets: 1.4-1.7 times `expected_exec_s`), and the later runs of
    the same call are expected to take as long."""
    return max([1.0] + [taken / expected for expected, taken in done if expected > 0])


def expected_exec_s(sim_steps, num_layers: int) -> float:
    """Seconds an executed run of a simulated run's steps (its steps.parquet) is expected to take:
    its steps' priced time, the sleeps the step executor queues before each segment of an eager
    step (embedding, each layer, sampling), and a start. A pure-decode step replays a CUDA graph
    after a short sleep; a step with a prompt or with block moves runs eagerly."""
    from validation.sleeps import GRAPH_LEAD_S, LEAD_S
    moves = sim_steps[["blocks_swapped_in", "blocks_swapped_out", "blocks_copied"]].sum(axis=1)
    eager = (sim_steps["num_prefill_seqs"] > 0) | (moves > 0)
    graph = ~eager & (sim_steps["num_decode_seqs"] > 0)
    sleeps = int(eager.sum()) * (num_layers + 2) * LEAD_S * EXEC_EAGER_EXTRA + int(graph.sum()) * GRAPH_LEAD_S
    return EXEC_START_S + float(sim_steps["duration_s"].sum()) + sleeps


def _expected(path: Path, preset: str, model: str, gpu: str, tp: int) -> tuple[float | None, str]:
    """(`expected_exec_s` of the run from its simulated twin, priced by the shipped profile or by
    the roofline where none is shipped; what `blocksim` said of a failed simulation). The twin goes
    to a temporary directory and its output to no log: (None, the failure's last line) when it
    fails."""
    import tempfile

    import pandas as pd

    from blocksim.catalog import MODELS as CATALOG
    with tempfile.TemporaryDirectory(prefix="blocksim-expected-") as work, io.StringIO() as log:
        dest = Path(work) / "run"
        if blocksim(replay_args(path, preset, model, gpu, dest, tp), log) != 0:
            lines = [x for x in log.getvalue().splitlines() if x.strip() and not x.startswith(("$ ", "(rc "))]
            said = [x for x in lines if "error" in x.lower()] or lines
            return None, said[-1] if said else "`blocksim replay` failed"
        return expected_exec_s(pd.read_parquet(dest / "steps.parquet"), CATALOG[model].num_layers), ""


#: Seconds `blocksim profile` takes a point of the linear table up to 4,096 tokens: on an H100,
#: llama-3-8b's 449 points every 8 tokens from 512 to 4,096 took 194 s
#: (benchmarks/results/linear_grid/linear-grid-step8-h100-80gb-llama-3-8b.json, `measure_s`).
LINEAR_POINT_S = 0.43


def profile_seconds(model: str, gpu: str, tensor_parallel: int = 1) -> tuple[float | None, str]:
    """(seconds, what they cover) that measuring the shipped profile of `model` on `gpu` took, as the
    profile records them (`measure_s`, and each table added later under its `measured` key), and
    `LINEAR_POINT_S` for each point of today's linear grid (`validation.profile.LINEAR_TOKENS`) the
    profile lacks, and for each of today's decode contexts (`DECODE_CONTEXT`, up to its largest) it
    lacks, the seconds a context of its decode tables took, and the graph-step tables' seconds scaled
    to today's ``DECODE_PASSES`` where the profile measured them in fewer passes; None where there
    is no such profile or it records no seconds."""
    f = ROOT / "blocksim" / "profiles" / f"{model}__{gpu}__float16__tp{tensor_parallel}.json"
    if not f.is_file():
        return None, f"no shipped profile {f.name}"
    prof = json.loads(f.read_text())
    if not isinstance(prof.get("measure_s"), dict):
        return None, f"{f.name} records no measure_s"
    secs, added = float(sum(prof["measure_s"].values())), []
    for name, c in prof.get("components", {}).items():
        m = c.get("measured") if isinstance(c, dict) else None
        if isinstance(m, dict) and isinstance(m.get("measure_s"), (int, float)):
            secs += float(m["measure_s"])
            added.append(name)
    from validation.profile import DECODE_CONTEXT, DECODE_PASSES, LINEAR_TOKENS
    comps = prof.get("components", {})
    # the graph-step tables (decode_step, decode_step_longest) measured in fewer passes than today's
    # DECODE_PASSES: their seconds scaled to today's passes
    step = comps.get("decode_step") if isinstance(comps.get("decode_step"), dict) else {}
    passes = step.get("passes", 1)
    scale = DECODE_PASSES / passes if passes < DECODE_PASSES else 1.0
    names = {k: set(k.split(", ")) for k in prof["measure_s"]}  # tables measured together share an entry
    step_s = sum(v for k, v in prof["measure_s"].items() if "decode_step" in names[k])  # with the profile
    attn_s = sum(v for k, v in prof["measure_s"].items() if "attn_decode" in names[k] and "decode_step" not in names[k])
    m = step.get("measured")
    added_step_s = float(m["measure_s"]) if isinstance(m, dict) and isinstance(m.get("measure_s"), (int, float)) else 0.0
    passes_s = (step_s + added_step_s) * (scale - 1)
    held = set(comps.get("linear", {}).get("grid", {}).get("tokens", []))
    more = sum(1 for t in LINEAR_TOKENS if t not in held)
    # today's decode contexts the profile lacks, each at the seconds a context of its own decode
    # tables took (attn_decode, decode_step and decode_step_longest measured with the profile)
    ctx = comps.get("attn_decode", {}).get("grid", {}).get("context", [])
    decode_s = attn_s + step_s * scale
    ctx_more = sum(1 for c in DECODE_CONTEXT if c not in ctx and c <= max(ctx, default=0))
    ctx_s = ctx_more * decode_s / len(ctx) if ctx else 0.0
    return secs + more * LINEAR_POINT_S + ctx_s + passes_s, "as measured" + (
        f", {', '.join(added)} added later" if added else "") + (
        f", {more} linear points more at {LINEAR_POINT_S} s" if more else "") + (
        f", {ctx_more} decode contexts more at {ctx_s / ctx_more:.1f} s" if ctx_more else "") + (
        f", decode_step in {DECODE_PASSES} passes (+{passes_s:.0f} s)" if passes_s else "")


def cmd_estimate(a) -> int:
    """The device seconds each run of `execute` with these arguments is expected to take
    (`expected_exec_s`, from its simulated twin), and their sum: to plan a lease. With `--profiles`,
    each model's profile too, at the seconds its shipped profile took (`profile_seconds`)."""
    import tempfile
    total, rows = 0.0, []
    for model in (a.models if getattr(a, "profiles", False) else []):
        secs, said = profile_seconds(model, a.gpu, a.tensor_parallel)
        if secs is None:
            print(f"fidelity_runs.py estimate: profile {model}: its time unknown ({said}); leave out --profiles "
                  f"or measure it once", file=sys.stderr)
            return 2
        total += secs
        rows.append((f"profile {model} ({said})", secs))
    with tempfile.TemporaryDirectory(prefix="blocksim-estimate-") as work:
        for model in a.models:
            for trace in a.traces:
                for preset in a.presets:
                    name = run_name(trace, preset, model, a.tensor_parallel)
                    path = slice_file(trace, PRESETS[preset][2], Path(work) / "traces")
                    need, said = _expected(path, preset, model, a.gpu, a.tensor_parallel)
                    if need is None:
                        print(f"fidelity_runs.py estimate: {name}: its simulation failed: {said}", file=sys.stderr)
                        return 2
                    total += need
                    rows.append((name, need))
    width = max(len(n) for n, _ in rows)
    for name, need in rows:
        print(f"{name:<{width}}  {need:6.0f} s")
    print(f"{'total (' + a.gpu + ')':<{width}}  {total:6.0f} s")
    return 0


def cmd_execute(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tdir = out / "traces"
    start = time.perf_counter()
    done = []  # (expected, taken) seconds of the runs finished in this call
    with open(out / "execute.log", "a") as log:
        for model in a.models:
            for trace in a.traces:
                for preset in a.presets:
                    name = run_name(trace, preset, model, a.tensor_parallel)
                    if (out / name / "executor.json").exists():
                        print(f"execute {name}: kept (already in {out})", flush=True)
                        continue
                    path = slice_file(trace, PRESETS[preset][2], tdir)
                    if a.budget_s is not None:
                        if time.perf_counter() - start >= a.budget_s:
                            print(f"execute {name}: skipped (past --budget-s {a.budget_s:.0f})", flush=True)
                            continue
                        need, said = _expected(path, preset, model, a.gpu, a.tensor_parallel)
                        left = a.budget_s - (time.perf_counter() - start)
                        pace = machine_pace(done)
                        paced = "" if pace == 1.0 else f", {pace:.2f} times that at this machine's pace so far"
                        if need is None:
                            print(f"execute {name}: its time unknown (its simulation failed: {said})", flush=True)
                        elif EXEC_MARGIN * pace * need > left:
                            print(f"execute {name}: skipped ({need:.0f} s expected{paced}, {EXEC_MARGIN:g} times "
                                  f"that past the {max(left, 0):.0f} s left of --budget-s {a.budget_s:.0f})",
                                  flush=True)
                            continue
                        else:
                            print(f"execute {name}: {need:.0f} s expected{paced}", flush=True)
                    else:
                        need = None
                    t0 = time.perf_counter()
                    rc = blocksim(replay_args(path, preset, model, a.gpu, out / name, a.tensor_parallel)
                                  + ["--executor", "cuda", "--record-plan"]
                                  + (["--executor-prefill", a.executor_prefill] if a.executor_prefill else []), log)
                    taken = time.perf_counter() - t0
                    if rc == 0 and need:
                        done.append((need, taken))
                    print(f"execute {name}: rc {rc}, {taken:.1f} s", flush=True)
    return 0


def cmd_simulate(a) -> int:
    exec_dir, out = Path(a.exec), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "simulate.log", "a") as log:
        for run in sorted(p.parent for p in exec_dir.glob("*/executor.json")):
            trace, preset, model, tp = parse_name(run.name)
            summary = json.loads((run / "summary.json").read_text())
            gpu = summary["config"]["gpu"]["name"]
            path = slice_file(trace, PRESETS[preset][2], exec_dir / "traces")
            for cost in a.cost_models:
                dest = out / cost / run.name
                extra = ["--cost-model", cost]
                if a.profile_dir:  # the profiled model reads it; the roofline fits its constants on it
                    from validation.profile import shipped_name
                    extra += ["--cost-profile", str(Path(a.profile_dir) / shipped_name(model, gpu, "float16", tp))]
                rc = blocksim(replay_args(path, preset, model, gpu, dest, tp) + extra, log)
                print(f"simulate {cost} {run.name}: rc {rc}", flush=True)
    return 0


def cmd_results(a) -> int:
    from analysis.fidelity import compare, errors, merged_rows  # the fidelity report's library
    exec_dir, sim_dir = Path(a.exec), Path(a.sim)
    if a.added_tables_lease and a.same_lease:
        print("fidelity_runs.py results: --added-tables-lease and --same-lease say different things; give one",
              file=sys.stderr)
        return 2
    measured = measured_tables(exec_dir, sim_dir) if a.added_tables_lease and a.markdown else None
    added = None if measured is None else added_tables(measured)
    if added is not None and not added:
        print(f"fidelity_runs.py results: --added-tables-lease: the profiles pricing the twins in {a.sim} hold no "
              f"table measured by `blocksim profile --add-table` (a `measured` key); leave the flag out",
              file=sys.stderr)
        return 2
    if a.repeat_sim and not (a.repeat and (Path(a.repeat_sim) / "profiled").is_dir()):
        why = "give --repeat too" if not a.repeat else "no profiled/ twins there; give the directory " \
              "`fidelity_runs.py simulate --exec REPEAT --out` wrote"
        print(f"fidelity_runs.py results: --repeat-sim {a.repeat_sim}: {why}", file=sys.stderr)
        return 2
    if a.repeat and (not a.markdown or not Path(a.repeat).is_dir()):
        why = "no such directory" if a.markdown else "its table goes into --markdown: give one"
        print(f"fidelity_runs.py results: --repeat {a.repeat}: {why}", file=sys.stderr)
        return 2
    moved = ""
    if a.sensitivity:
        try:
            moved = sensitivity_table(a.sensitivity)
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = f"no key {e}" if isinstance(e, KeyError) else str(e)
            print(f"fidelity_runs.py results: --sensitivity {a.sensitivity}: {why}; give the JSON that "
                  f"`fidelity_runs.py sensitivity` wrote", file=sys.stderr)
            return 2
    rows, priced = [], {}  # priced: run -> the profiled twin's price of each executed step
    for run in sorted(p.parent for p in exec_dir.glob("*/executor.json")):
        trace, preset, model, _ = parse_name(run.name)
        summary = json.loads((run / "summary.json").read_text())
        for cost in a.cost_models:
            sim = sim_dir / cost / run.name
            if not (sim / "summary.json").exists():
                continue
            f = compare(sim, run)
            if cost == "profiled":
                priced[run.name] = f.predicted_s
            e = errors(f)
            rows.append({"trace": trace, "preset": preset, "model": model,
                         "gpu": summary["config"]["gpu"]["name"], "tensor_parallel": summary["config"]["tensor_parallel"],
                         "cost_model": cost, **e})
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    if a.merge and Path(a.json).is_file():  # keep the file's rows of other runs
        rows = merged_rows(json.loads(Path(a.json).read_text()), rows,
                           ("trace", "preset", "model", "gpu", "tensor_parallel", "cost_model"))
    write_json(a.json, rows)
    if a.markdown:
        moves = repeat_moves(a.repeat, exec_dir)
        again = ""
        if a.repeat and a.repeat_sim:  # the same profiles pricing the steps of the runs executed again
            again_priced = {run.name: compare(Path(a.repeat_sim) / "profiled" / run.name, run).predicted_s
                            for run in sorted(p.parent for p in Path(a.repeat).glob("*/executor.json"))
                            if (Path(a.repeat_sim) / "profiled" / run.name / "summary.json").exists()}
            again = kind_errors(exec_dir, priced, Path(a.repeat), again_priced)
        twice = repeats(moves, earlier=a.added_tables_lease)
        Path(a.markdown).write_text(markdown_doc(rows, exec_dir, priced, twice + again if twice else "", moved, a,
                                                 moves, added, None if measured is None else added_commands(measured)))
    print(f"{len(rows)} comparisons written to {a.json}")
    return 0


def scaled_profile(src: Path, factor: float, dst: Path) -> Path:
    """A copy of the profile `src` with every measured time multiplied by `factor` (the tables'
    seconds, graph seconds and own-blocks seconds, the eager-step differences), at `dst`."""
    prof = json.loads(src.read_text())

    def scale(v):
        return [scale(x) for x in v] if isinstance(v, list) else v * factor
    for name, tab in prof["components"].items():
        for key in ("seconds", "graph_seconds", "own_seconds", "eager_s", "graph_s", "eager_cases_s"):
            if key in tab:
                tab[key] = scale(tab[key])
    prof["scaled"] = factor
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(prof))
    return dst


def twin_profile(base: Path, default: Path) -> Path:
    """The profile file the simulated run `base` was priced by (its summary.json's cost model), or
    `default` where the summary names none."""
    from blocksim.cost.profile_file import resolve_path
    rec = json.loads((base / "summary.json").read_text()).get("cost_model") or {}
    if rec.get("name") != "profiled" or not rec.get("profile"):
        return default
    path = resolve_path(rec["profile"])
    return path if path.is_absolute() else ROOT / path  # as the simulation, run from ROOT, read it


LATENCY = ("ttft_p50_err", "ttft_p99_err", "tpot_p50_err", "tpot_p99_err", "e2e_p50_err", "e2e_p99_err",
           "throughput_err")


def cmd_sensitivity(a) -> int:
    """Each executed run's slice simulated by its profile with every measured time scaled by
    1 - STEP and 1 + STEP: how far each latency figure moves per unit of step time (1.0: in
    proportion; 5.0: five times as far), around the unscaled simulated run in --sim. With --at F,
    also the errors against the executed run of the slice simulated by the profile scaled by F: what
    the latency errors would be with every step priced F times (a profile whose steps come out 3%
    long, as a run on another lease may find them, at F = 0.97)."""
    from analysis.fidelity import compare, errors
    from validation.profile import shipped_name
    exec_dir, sim_dir, out = Path(a.exec), Path(a.sim), Path(a.out)
    if not 0 < a.step < 0.5:
        print(f"fidelity_runs.py sensitivity: --step {a.step}: give a scale between 0 and 0.5, e.g. 0.01",
              file=sys.stderr)
        return 2
    bad = [f for f in a.at if not 0.5 <= f <= 1.5]
    if bad:
        print(f"fidelity_runs.py sensitivity: --at {bad[0]}: give scales between 0.5 and 1.5, e.g. 0.97",
              file=sys.stderr)
        return 2
    if not any(exec_dir.glob("*/executor.json")):
        print(f"fidelity_runs.py sensitivity: --exec {a.exec}: no executed runs (*/executor.json) there; give "
              f"the directory `fidelity_runs.py execute --out` wrote", file=sys.stderr)
        return 2
    if not (sim_dir / "profiled").is_dir():
        print(f"fidelity_runs.py sensitivity: --sim {a.sim}: no profiled/ twins there; give the directory "
              f"`fidelity_runs.py simulate --out` wrote", file=sys.stderr)
        return 2
    rows, at = [], []
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sensitivity.log", "a") as log:
        for run in sorted(p.parent for p in exec_dir.glob("*/executor.json")):
            trace, preset, model, tp = parse_name(run.name)
            base = sim_dir / "profiled" / run.name
            if not (base / "summary.json").exists():
                print(f"sensitivity {run.name}: no profiled twin in {sim_dir}", flush=True)
                continue
            gpu = json.loads((run / "summary.json").read_text())["config"]["gpu"]["name"]
            src = twin_profile(base, ROOT / "blocksim" / "profiles" / shipped_name(model, gpu, "float16", tp))
            if not src.is_file():
                print(f"sensitivity {run.name}: its twin's profile {src} is not readable", flush=True)
                continue
            path = slice_file(trace, PRESETS[preset][2], exec_dir / "traces")

            def scaled(f: float) -> Path | None:
                """The slice simulated by the profile scaled by `f`: its run directory (None if it failed)."""
                prof = scaled_profile(src, f, out / "profiles" / f"{f:.3f}" / src.name)
                dest = out / f"{f:.3f}" / run.name
                rc = blocksim(replay_args(path, preset, model, gpu, dest, tp)
                              + ["--cost-model", "profiled", "--cost-profile", str(prof), "--overwrite"], log)
                if rc:
                    print(f"sensitivity {run.name}: simulation at {f:.3f} failed (rc {rc}); see {out}/sensitivity.log")
                    return None
                return dest
            moved = {}
            for sign in (-1, 1):
                dest = scaled(1.0 + sign * a.step)
                if dest is None:
                    break
                moved[sign] = errors(compare(dest, base))
            if len(moved) == 2:
                rows.append({"run": run.name, "step": a.step,
                             **{k: (moved[1][k] - moved[-1][k]) / (2 * a.step) for k in LATENCY}})
                print(f"sensitivity {run.name}: TTFT p50 x{rows[-1]['ttft_p50_err']:.1f} per unit of step time",
                      flush=True)
            for f in a.at:  # against the executed run: what the errors would be with steps priced f times
                dest = scaled(f)
                if dest is not None:
                    e = errors(compare(dest, run))
                    hits = json.loads((dest / "summary.json").read_text()).get("prefix_cache_hits")
                    at.append({"run": run.name, "scale": f, **{k: e[k] for k in LATENCY}, "prefix_cache_hits": hits})
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    write_json(a.json, {"command": " ".join(sys.argv), "rows": rows, **({"at": at} if a.at else {})})
    print(f"{len(rows)} runs written to {a.json}")
    return 0


def sensitivity_table(path) -> str:
    """The markdown table of a `sensitivity` results file, or "" without one."""
    if not path:
        return ""
    data = json.loads(Path(path).read_text())
    step = data["rows"][0]["step"] if data["rows"] else 0.01
    lines = ["### How far the latencies move with the step times\n",
             f"Each slice simulated by its profile with every measured time scaled by {1 - step:.2f} and "
             f"{1 + step:.2f} (`fidelity_runs.py sensitivity`): how far each figure moves per unit of step "
             "time (1.0: in proportion). A figure that moves five times as far as the steps needs its steps "
             "priced within a fifth of its target.\n",
             "| run | " + " | ".join(k[:-4] for k in LATENCY) + " |", "|---|" + "---:|" * len(LATENCY)]
    for r in data["rows"]:
        lines.append(f"| {r['run']} | " + " | ".join(f"{r[k]:+.1f}" for k in LATENCY) + " |")
    if data.get("at"):
        lines += ["", "The errors against the executed runs with every step of the profile scaled (`fidelity_runs.py "
                  "sensitivity --at`): what each figure would be with the steps priced that much shorter or "
                  "longer, as a profile of the runs' own lease might price them. A diagnosis, not a result: the "
                  "scale is chosen after seeing the runs.", "",
                  "| run | scale | " + " | ".join(LATENCY) + " | prefix blocks hit |",
                  "|---|---:|" + "---:|" * (len(LATENCY) + 1)]
        for r in data["at"]:
            hits = r.get("prefix_cache_hits")
            lines.append(f"| {r['run']} | {r['scale']:.2f} | " + " | ".join(f"{100 * r[k]:+.1f}%" for k in LATENCY)
                         + f" | {'n/a' if hits is None else hits} |")
    return "\n".join(lines) + "\n"


ERRORS = ("step_mape", "ttft_p50_err", "ttft_p99_err", "tpot_p50_err", "tpot_p99_err", "e2e_p50_err",
          "e2e_p99_err", "throughput_err")


TARGETS = {"step_mape": 0.03, "ttft_p50_err": 0.03, "ttft_p99_err": 0.05, "tpot_p50_err": 0.03, "tpot_p99_err": 0.03,
           "e2e_p50_err": 0.03, "e2e_p99_err": 0.03, "throughput_err": 0.02}


def met(rows: list[dict], key: str) -> str:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return f"{sum(abs(v) <= TARGETS[key] for v in vals)}/{len(vals)}"


def cached_prompts(run_dir: Path, steps: int):
    """Per executed step, how many of its prompts (chunks) run over cached keys (an earlier chunk or a
    prefix hit), from the run's recorded plan (`--record-plan`); None where the run has no plan or
    its plan does not hold those steps."""
    import numpy as np

    from blocksim.records.plan import PlanError, read_plan
    try:
        _, plan_steps, seqs, _ = read_plan(run_dir)
    except (FileNotFoundError, PlanError):
        return None
    if len(plan_steps) != steps:
        return None
    p = seqs[seqs.is_prefill].drop_duplicates(["step", "request_id"])  # a prompt of n samples: one row each
    out = np.zeros(steps, np.int64)
    np.add.at(out, p.step.to_numpy()[p.new_start.to_numpy() > 0], 1)
    return out


def priced_steps(exec_dir: Path, priced: dict):
    """The executed steps of every run in `exec_dir` that `priced` (run -> seconds per executed step)
    prices one for one, with their model, run, kind and signed error (a DataFrame; None if none)."""
    import numpy as np
    import pandas as pd
    frames = []
    for p in sorted(exec_dir.glob("*/executor_steps.parquet")):
        pred = priced.get(p.parent.name)
        x = pd.read_parquet(p)
        if pred is None or len(pred) != len(x):
            continue
        x["predicted_s"] = pred
        x["over_cached"] = cached_prompts(p.parent, len(x))
        x["model"] = p.parent.name.split("__")[2] + "".join(f" {t}" for t in p.parent.name.split("__")[3:])
        x["run"] = p.parent.name
        frames.append(x)
    if not frames:
        return None
    x = pd.concat(frames, ignore_index=True)
    moves = (x.m_swap_s > 0) | (x.m_copy_s > 0)
    x["kind"] = np.where(x.graph, "decode, CUDA graph", np.where(moves, "eager, block moves",
                         np.where(x.num_prefills > 0, "eager, with a prompt", "eager, decode only")))
    x["err"] = (x.predicted_s - x.measured_s) / x.measured_s
    return x


def kind_errors(exec_dir: Path, priced: dict, again_dir: Path, again_priced: dict) -> str:
    """The profiled model's mean per-step error by model and kind of step against the runs of
    `exec_dir` and against the same slices executed again (`again_dir`, priced by their own twins'
    profile): what the lease of each execution adds to every step of a kind."""
    x, y = priced_steps(exec_dir, priced), priced_steps(again_dir, again_priced)
    if x is None or y is None:
        return ""
    lines = ["", "The profiled model's mean per-step error against each execution (each run's steps priced by "
             "its twin, `fidelity_runs.py simulate`), by kind of step:", "",
             "| model | step kind | steps | mean error | other execution: steps | other execution: mean error |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    a, b = dict(iter(x.groupby(["model", "kind"]))), dict(iter(y.groupby(["model", "kind"])))

    def cells(g) -> str:
        return f"{len(g)} | {100 * g.err.mean():+.1f}%" if g is not None else "0 | n/a"
    for key in sorted(set(a) | set(b)):
        lines.append(f"| {key[0]} | {key[1]} | {cells(a.get(key))} | {cells(b.get(key))} |")
    return "\n".join(lines) + "\n"


def request_table(rows: list[dict]) -> str:
    """Each run's median over its requests of each request's own error (`analysis.fidelity.
    request_errors`), beside its p50 error: where the two part, the percentile moved further than
    the requests around it did. '' when the rows hold none."""
    keys = [m for m in ("ttft", "tpot", "e2e") if any(f"{m}_request_median_err" in r for r in rows)]
    if not keys:
        return ""

    def pct(v) -> str:
        return "n/a" if v is None else f"{100 * v:+.1f}%"
    counted = all("tpot_requests" in r for r in rows)  # rows of older results lack the counts
    lines = ["Request by request: the median over a run's requests of each request's own error, beside the "
             "p50 error over the same requests" + (", and how many requests have a TPOT (more than one output "
                                                   "token): its percentiles are over those alone" if counted else "")
             + ".", "",
             "| trace | preset | model | " + " | ".join(f"{m} p50 | {m} by request" for m in keys)
             + (" | requests | with a TPOT" if counted else "") + " |",
             "|---|---|---|" + "---:|---:|" * len(keys) + "---:|---:|" * counted]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['preset']} | {r['model']} | "
                     + " | ".join(f"{pct(r.get(f'{m}_p50_err'))} | {pct(r.get(f'{m}_request_median_err'))}"
                                  for m in keys)
                     + (f" | {r.get('ttft_requests')} | {r['tpot_requests']}" if counted else "") + " |")
    return "\n".join(lines) + "\n"


def step_kinds(exec_dir: Path, priced: dict) -> str:
    """Per model and kind of step, the profiled model of the simulated twin pricing each executed
    step (`priced`: run -> seconds per executed step) against its measured time
    (executor_steps.parquet): where the per-step error comes from. Runs without a profiled twin,
    or whose steps it cannot price one for one, are left out."""
    import pandas as pd
    x = priced_steps(exec_dir, priced)
    if x is None:
        return ""
    lines = ["### Where the per-step error comes from (profiled model, all executed steps)\n",
             "| model | step kind | steps | share of measured time | mean error | MAPE |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for (model, kind), g in x.groupby(["model", "kind"]):
        share = g.measured_s.sum() / x[x.model == model].measured_s.sum()
        lines.append(f"| {model} | {kind} | {len(g)} | {100 * share:.1f}% | {100 * g.err.mean():+.1f}% | "
                     f"{100 * g.err.abs().mean():.1f}% |")
    g = x[x.kind == "decode, CUDA graph"]
    lines += ["", "Graph-replayed decode steps by run (the pricing of uneven, padded and shared batches: "
              "docs/cost_models.md), those of one or two rows alone (little more than the weights' read, "
              "a shape the profile measures as the run executes it), and those of more rows by how full their "
              "padded batch is (all rows real, or a quarter of the graph's batch or more padding):", "",
              "| run | steps | mean error | MAPE | 1-2 rows: steps | 1-2 rows: mean error "
              "| full: steps | full: mean error | padded a quarter or more: steps | padded a quarter or more: mean error |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def part(rows) -> str:
        return f"{len(rows)} | " + (f"{100 * rows.err.mean():+.1f}%" if len(rows) else "n/a")

    for run, r in g.groupby("run"):
        more = r[r.padded_batch > 2]
        lines.append(f"| {run} | {len(r)} | {100 * r.err.mean():+.1f}% | {100 * r.err.abs().mean():.1f}% | "
                     f"{part(r[r.padded_batch <= 2])} | {part(more[more.num_decodes == more.padded_batch])} | "
                     f"{part(more[4 * more.num_decodes <= 3 * more.padded_batch])} |")
    e = x[x.kind == "eager, with a prompt"].copy()
    e["again"] = e.groupby("run").num_tokens.transform(lambda t: t.duplicated())
    e["tokens"] = pd.cut(e.num_tokens, [0, 256, 1024, 2048, 4096, 1 << 20],
                         labels=["1-256", "257-1024", "1025-2048", "2049-4096", "> 4096"])
    lines += ["", "Eager steps with a prompt, by tokens, the first step of a run with its token count "
              "against later ones (the host's first calls of a shape):", "",
              "| tokens | first: steps | first: mean error | later: steps | later: mean error |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for tok, g in e.groupby("tokens", observed=True):
        first, later = g[~g.again], g[g.again]
        f = f"{100 * first.err.mean():+.1f}%" if len(first) else "n/a"
        la = f"{100 * later.err.mean():+.1f}%" if len(later) else "n/a"
        lines.append(f"| {tok} | {len(first)} | {f} | {len(later)} | {la} |")
    return "\n".join(lines + prompt_counts(e) + far_steps(x)) + "\n"


def prompt_counts(e) -> list[str]:
    """The eager steps with a prompt (`step_kinds`'s frame, its `tokens` bands) by how many prompts
    or chunks they hold: a step of several prompts is priced by the linear layers at their summed
    tokens and its prefill attention by the batch rule (docs/cost_models.md), neither of which a
    step of one prompt exercises."""
    if not len(e):
        return []
    e = e.assign(prompts=e.num_prefills.clip(upper=3).map({1: "1", 2: "2", 3: "3 or more"}))
    lines = ["", "Eager steps with a prompt, by the prompts (or chunks) they hold and their tokens:", "",
             "| prompts | tokens | steps | runs | mean error | MAPE |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for (prompts, tok), g in e.groupby(["prompts", "tokens"], observed=True):
        lines.append(f"| {prompts} | {tok} | {len(g)} | {g.run.nunique()} | {100 * g.err.mean():+.1f}% | "
                     f"{100 * g.err.abs().mean():.1f}% |")
    planned = e.over_cached.notna() if "over_cached" in e.columns else None
    if planned is None or not planned.any():
        return lines
    # runs with a recorded plan: also how many of the step's prompts run over cached keys
    e = e[planned]
    e = e.assign(cached=e.over_cached.astype(int).clip(upper=2).map({0: "none", 1: "one", 2: "two or more"}))
    lines += ["", "The same steps by how many of their prompts (or chunks) run over cached "
              "keys (an earlier chunk or a prefix hit), from the runs' recorded plans (runs without one left out):", "",
              "| prompts | over cached keys | tokens | steps | runs | mean error | MAPE |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for (prompts, cached, tok), g in e.groupby(["prompts", "cached", "tokens"], observed=True):
        lines.append(f"| {prompts} | {cached} | {tok} | {len(g)} | {g.run.nunique()} | {100 * g.err.mean():+.1f}% | "
                     f"{100 * g.err.abs().mean():.1f}% |")
    return lines


#: A step measured beyond this many times its price is counted in `far_steps`.
FAR = 1.25


def far_steps(x) -> list[str]:
    """Lines of the per-run table of steps measured beyond `FAR` times their price (`priced_steps`'
    frame), and, for runs that record them, the steps with late segments (the host behind the
    executor's sleeps) and those timed again; none where no run has either."""
    late = "late_segments" in x.columns
    x = x.assign(far=x.measured_s > FAR * x.predicted_s,
                 late=x["late_segments"].fillna(0) > 0 if late else False,
                 again=x["retimed"].fillna(False).astype(bool) if late else False)
    if not (x.far.any() or x.late.any()):
        return []
    lines = ["", f"Steps measured beyond {FAR:g} times their price, by run, with the seconds they add over it "
             "(a host that fell behind the executor's sleeps inside a step shows as such a step: "
             "validation/VALIDATION.md; runs recording late segments give their count and the "
             "steps timed again):", "",
             "| run | steps | beyond: steps | beyond: seconds over the price | run's measured seconds "
             "| late: steps | timed again |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run, g in x.groupby("run"):
        f = g[g.far]
        has = late and g["late_segments"].notna().any()
        lines.append(f"| {run} | {len(g)} | {len(f)} | {(f.measured_s - f.predicted_s).sum():.3f} | "
                     f"{g.measured_s.sum():.2f} | {int(g.late.sum()) if has else 'n/a'} | "
                     f"{int(g.again.sum()) if has else 'n/a'} |")
    return lines


def prefix_hits(exec_dir: Path, priced: dict | None = None, twins: Path | None = None) -> str:
    """How much of each executed prefix-caching run's prompts its prefix cache served: a slice
    whose repeated blocks return only after the cache has evicted them exercises no cached prefill.
    With `priced` (run -> the profiled twin's seconds per executed step), the mean error of the
    run's eager steps with a prompt beside that of the same slice and model executed under `vllm`;
    with `twins` (the folder of the profiled twins), the blocks each twin hit: which blocks are
    still cached when a prompt comes depends on the schedule, so a twin whose steps last longer or
    shorter can hit other blocks than its run."""
    x = priced_steps(exec_dir, priced) if priced else None
    eager = {} if x is None else {run: g for run, g in x[x.kind == "eager, with a prompt"].groupby("run")}

    def err(run: str) -> str:
        g = eager.get(run)
        return f"{len(g)} | {100 * g.err.mean():+.1f}%" if g is not None and len(g) else "0 | n/a"
    rows, hit, missed = [], [], []
    for p in sorted(exec_dir.glob("*/summary.json")):
        trace, preset = parse_name(p.parent.name)[:2]
        if preset != "vllm-prefix":
            continue
        m = json.loads(p.read_text())
        (hit if m.get("prefix_cache_hits", 0) else missed).append(trace)
        plain = p.parent.name.replace("__vllm-prefix__", "__vllm__", 1)
        twin = twins / p.parent.name / "summary.json" if twins else None
        twin_hits = str(json.loads(twin.read_text()).get("prefix_cache_hits", 0)) if twin and twin.is_file() else "n/a"
        rows.append(f"| {p.parent.name} | {m.get('prefix_cache_queries', 0)} | {m.get('prefix_cache_hits', 0)} | "
                    + (f"{twin_hits} | " if twins else "") + f"{m.get('prefix_saved_tokens', 0)} |"
                    + (f" {err(p.parent.name)} | {err(plain)} |" if eager else ""))
    if not rows:
        return ""
    text = ["Prefix caching in the executed `vllm-prefix` runs."]
    if missed:
        why = {"traces/data/azure_conv_2023_sample.csv": "the Azure samples carry no prefix hashes",
               "traces/data/azure_code_2023_sample.csv": "the Azure samples carry no prefix hashes",
               "traces/data/mooncake_sample.jsonl": "the Mooncake sample's windows send a block again only "
               "after the cache has evicted it"}
        reasons = sorted({why.get(SLICES.get(t, (t,))[0], f"{t} sends no block again while it is cached")
                          for t in missed})
        text.append(f"Where no block hits ({'; '.join(reasons)}), the run prices and executes as `vllm` does.")
    if hit:
        text.append(f"Where blocks hit ({', '.join(sorted(set(hit)))}), the executed step runs each hit prompt's "
                    "prefill over its cached keys through the paged prefill kernel, and the profile prices such a "
                    "step by its prefill-attention table at those cached tokens.")
    text.append("Prefill over cached keys is executed in the `vllm-chunked` runs' later chunks too.")
    head = ["| run | blocks looked up | blocks hit |" + (" profiled twin: blocks hit |" if twins else "")
            + " prompt tokens saved |", "| --- | ---: | ---: |" + (" ---: |" if twins else "") + " ---: |"]
    if twins:
        text.append("Which blocks are still cached when a prompt comes depends on the schedule: a profiled twin "
                    "whose steps last longer or shorter than its run's can hit other blocks, and then its "
                    "latencies can part from the run's by more than its steps do.")
    if eager:
        text.append("The eager steps with a prompt of each run, priced by its profiled twin, stand beside those "
                    "of the same slice executed under `vllm` (no prefix cache).")
        head = [head[0] + " eager steps | mean error | under vllm: eager steps | under vllm: mean error |",
                head[1] + " ---: | ---: | ---: | ---: |"]
    return "\n".join([textwrap.fill(" ".join(text), 100), "", *head, *rows]) + "\n"


def repeat_moves(repeat_dir, exec_dir: Path) -> dict[str, tuple[str, dict]]:
    """The slices executed twice: run name -> (the repeat's device, how far each figure moved, a
    signed fraction (repeat - first) / first, as the twins' errors are), for each run in
    `repeat_dir` with a namesake in `exec_dir`; {} without."""
    if not repeat_dir:
        return {}
    from analysis.fidelity import compare, errors
    out = {}
    for run in sorted(p.parent for p in Path(repeat_dir).glob("*/executor.json")):
        first = exec_dir / run.name
        if (first / "executor.json").is_file():
            out[run.name] = (json.loads((run / "executor.json").read_text()).get("device", "?"),
                             errors(compare(run, first)))
    return out


def judged(rows: list[dict], moves: dict) -> str:
    """The sentence under a cost model's table when slices were executed twice: the figures whose
    executed run moved less than their target between the two executions (the others cannot be
    judged to the target against one of them), and how many of those are within it."""
    twice = [(r, moves[name][1]) for r in rows
             if (name := run_name(r["trace"], r["preset"], r["model"], r.get("tensor_parallel", 1))) in moves]
    parts = []
    for key in ERRORS[1:]:
        fit = [r for r, moved in twice if abs(moved[key]) <= TARGETS[key] and isinstance(r.get(key), (int, float))]
        parts.append(f"{key} {sum(abs(r[key]) <= TARGETS[key] for r in fit)}/{len(fit)}")
    return ("Of the runs executed twice, the figures whose executed run moved no further than the target "
            "between the two executions (\"Executed twice\"; a figure that moved further cannot be judged to "
            "its target against one execution), within target: " + ", ".join(parts) + ".\n")


def repeats(moves: dict, earlier: bool = False) -> str:
    """The table of slices executed twice (`moves`: `repeat_moves`; `earlier`: the other execution
    is the earlier one, as with --added-tables-lease); '' without."""
    lines = [f"| {name} | {device} | " + " | ".join(f"{100 * e[k]:+.1f}%" for k in ERRORS[1:]) + " |"
             for name, (device, e) in moves.items()]
    if not lines:
        return ""
    head = "| run | device | " + " | ".join(ERRORS[1:]) + " |"
    other = ("The same slice executed on an earlier lease of the device (the one the profiles' other tables "
             "come from)" if earlier else "The same slice executed again on another lease of the device (another "
             "machine of the same kind, or the same one later)")
    return ("### Executed twice\n\n" + other + ", against the run in the tables: how far the executed runs "
            "themselves move (signed fractions, (that execution - the run in the tables) / the run in the "
            "tables).\n\n"
            + "\n".join([head, "|" + " --- |" * (1 + len(ERRORS))] + lines) + "\n")


def first_copies(exec_dir: Path) -> str:
    """A sentence on the executed runs whose first block copy lasts far longer than their later ones
    (the process's first copy, paid inside a step where the executor did not warm it up); '' if none."""
    import numpy as np
    import pandas as pd
    firsts = []
    for steps in sorted(exec_dir.glob("*/executor_steps.parquet")):
        copy = pd.read_parquet(steps, columns=["m_copy_s"]).m_copy_s.to_numpy()
        copy = copy[copy > 0]
        if len(copy) > 1 and copy[0] > 20 * np.median(copy[1:]):
            firsts.append((copy[0], np.median(copy[1:])))
    if not firsts:
        return ""
    lo, hi = min(f for f, _ in firsts), max(f for f, _ in firsts)
    return (f" {len(firsts)} executed runs hold, in their first copy-on-write step, the process's first block "
            f"copy ({1e3 * lo:.0f}-{1e3 * hi:.0f} ms, against {1e3 * min(m for _, m in firsts):.2f}-"
            f"{1e3 * max(m for _, m in firsts):.2f} ms for their later copies): a start-up cost that the executor "
            "now pays before its first step (`validation/VALIDATION.md`), which these runs predate and the "
            "simulation does not price.")


def added_tables(measured: list[tuple[str, dict]]) -> dict[str, list[str]]:
    """The tables of `measured` (`measured_tables`: added or measured again by `blocksim profile
    --add-table`), each with the days they were measured."""
    out: dict[str, set[str]] = {}
    for name, m in measured:
        out.setdefault(name, set()).add(str(m.get("utc", "?"))[:10])
    return {k: sorted(v) for k, v in sorted(out.items())}


def added_commands(measured: list[tuple[str, dict]]) -> list[str]:
    """The `blocksim profile --add-table` commands (as each table's ``measured`` key records them)
    that measured the tables of `measured` (`measured_tables`)."""
    return sorted({str(m["command"]) for _, m in measured if m.get("command")})


def measured_tables(exec_dir: Path, sim_dir: Path) -> list[tuple[str, dict]]:
    """(table name, its ``measured`` dict) for each table so marked in the profiles pricing the runs'
    profiled twins, each profile read once."""
    from validation.profile import shipped_name
    out, seen = [], set()
    for run in sorted(p.parent for p in exec_dir.glob("*/executor.json")):
        base = sim_dir / "profiled" / run.name
        if not (base / "summary.json").exists():
            continue
        _, _, model, tp = parse_name(run.name)
        gpu = json.loads((run / "summary.json").read_text())["config"]["gpu"]["name"]
        src = twin_profile(base, ROOT / "blocksim" / "profiles" / shipped_name(model, gpu, "float16", tp))
        if src in seen:
            continue
        seen.add(src)
        for name, table in json.loads(src.read_text())["components"].items():
            if isinstance(table, dict) and isinstance(table.get("measured"), dict):
                out.append((name, table["measured"]))
    return out


def lease_note(same_lease: bool, exec_dir: Path, repeated: bool = False,
               added: dict[str, list[str]] | None = None) -> str:
    """The paragraph on where the profiles and the executed runs were measured (naming the "Executed
    twice" table only where the document has one); `added` (`added_tables`): the runs share a lease
    with those tables of the profiles only."""
    again = (": the same slices executed there (\"Executed twice\", at the end) show how far, and" if repeated else
             " (these slices were executed on this lease only, so this document has no measure of how far "
             "the executed runs move between leases), and")
    if added:
        names = ", ".join(f"`{k}`" for k in added)
        days = ", ".join(sorted({d for v in added.values() for d in v}))
        text = ("The executed runs were measured on one lease of the device with the profiles' tables "
                f"{names} (measured again by `blocksim profile --add-table` on {days}: each names its lease "
                "under its `measured` key); the profiles' other tables (linear layers, prefill attention, cache "
                "writes, sampling, the eager overhead, moves) on an earlier lease. So a graph-replayed decode "
                "step is priced by tables of the runs' own lease, and an eager step by tables of the earlier "
                "one but for its decode rows' attention (`attn_decode`). Another lease (another machine of the same kind, or the same one at another time) moves "
                "the executed runs themselves"
                + (": the same slices executed on the earlier lease (\"Executed twice\", at the end) show how far, "
                   "and" if repeated else again) + " a figure that moves further between two executions "
                "than its target cannot be judged to that target against one of them.")
    elif same_lease:
        text = ("The profiles of the models executed here and the executed runs were measured on one lease of "
                "the device (`benchmarks/fidelity_device.sh`: the profiles first, then the runs, on the same "
                "machine; a table added to a profile later, by `blocksim profile --add-table`, names its own "
                "lease under its `measured` key). The graph steps of one or two rows, whose shape the profile "
                "times exactly as a run executes it, show what remains between the profile's measurement and a run's on that machine: "
                "their mean error in the per-run table below. Another lease (another machine of the same kind, "
                "or the same one at another time) moves the executed runs themselves"
                + again + " a figure that moves further between two executions than its target cannot be judged to "
                "that target against one of them.")
    else:
        text = ("The profile and the executed runs were measured on different leases of the device (machines "
                "of the same kind, or the same one at another time). The graph steps of one or two rows, whose "
                "shape the profile times exactly as a run executes it, show how far the two leases differ: "
                "their mean error in the per-run table below is the profile's lease against the run's"
                + (", and the same slice executed on two leases (\"Executed twice\", at the end) moves by as "
                   "much. Both bound" if repeated else ". It bounds")
                + " what a per-step or latency error below a percent or two can mean.")
    return textwrap.fill(text + first_copies(exec_dir), 100)


def device_command(exec_dir: Path, h100: bool, profiles: bool) -> str:
    """The device script's command that executes the runs found in `exec_dir` (its models, slices
    and presets named where they differ from the script's defaults), profiling those models first
    where `profiles`."""
    runs = [parse_name(p.parent.name) for p in exec_dir.glob("*/executor.json")]
    models = [m for m in MODELS if any(r[2] == m for r in runs)] + sorted({r[2] for r in runs} - set(MODELS))
    traces = [t for t in SLICES if any(r[0] == t for r in runs)]
    presets = [p for p in PRESETS if any(r[1] == p for r in runs)]
    defaults = {"PROFILE_MODELS": "llama-2-7b llama-3-8b mistral-7b", "RUN_MODELS": " ".join(MODELS),
                "TRACES": "azure-conv azure-code" if h100 else " ".join(STANDARD_SLICES),
                "PRESETS": "vllm" if h100 else " ".join(PRESETS)}
    want = {"PROFILE_MODELS": " ".join(models) if profiles else "", "RUN_MODELS": " ".join(models),
            "TRACES": " ".join(traces), "PRESETS": " ".join(presets)}
    if profiles and set(models) == set(MODELS):
        want["PROFILE_MODELS"] = defaults["PROFILE_MODELS"]  # the script's default profiles these and mistral-7b
    env = [] if h100 else ["GPU=h200-141gb"]
    tp = {r[3] for r in runs}
    if len(set(runs)) < len(models) * len(traces) * len(presets) * len(tp):
        # not every run of models x slices x presets: the script's RUNS names these alone
        want = {"PROFILE_MODELS": want["PROFILE_MODELS"],
                "RUNS": " ".join(f"{r[2]}:{r[0]}:{r[1]}" for r in sorted(set(runs), key=lambda r: (r[2], r[0], r[1])))}
        defaults["RUNS"] = ""
    env += [f'{k}="{v}"' for k, v in want.items() if runs and v != defaults[k]]
    script = "bash benchmarks/fidelity_h100.sh" if h100 else "bash benchmarks/fidelity_device.sh"
    return " ".join(env + [script]) if len(" ".join(env)) < 60 else " ".join(env) + " \\\n    " + script


def twins_profile_dir(sim_dir: Path) -> str | None:
    """The folder of the profiles that priced the profiled twins in `sim_dir` (`simulate
    --profile-dir`), relative to the repository where it lies inside it; None where they are the
    shipped ones (or the twins name none)."""
    shipped = (ROOT / "blocksim" / "profiles").resolve()
    dirs = {twin_profile(run, shipped / "-").parent.resolve() for run in (sim_dir / "profiled").glob("*")
            if (run / "summary.json").is_file()}
    dirs.discard(shipped)
    if not dirs:
        return None
    d = sorted(dirs)[0]
    return str(d.relative_to(ROOT.resolve())) if d.is_relative_to(ROOT.resolve()) else str(d)


def commands_block(a, devices: list[str], added: list[str] | None = None) -> str:
    """The commands that make the document from these arguments of `results` (the device's first;
    `added`: the `--add-table` commands, `added_commands`, with --added-tables-lease)."""
    h100 = bool(devices) and all("H100" in d for d in devices)
    exec_dir = Path(a.exec)
    if a.same_lease or a.added_tables_lease:
        lines = ["# on the GPU, the profiles and the executed runs on one lease", device_command(exec_dir, h100, True)]
    else:
        lines = ["# on the GPU, the executed runs (priced by the profiles shipped, measured on another lease)",
                 device_command(exec_dir, h100, False)]
    if a.added_tables_lease:
        lines = [f"# on the GPU, the profiles and the slices executed (fetched into {a.repeat or 'another directory'})",
                 *lines[1:],
                 f"# on a later lease, the profiles' tables measured again (through benchmarks/profile_add_table.sh), "
                 f"then the slices executed (into {a.exec})",
                 *(added or []),
                 device_command(exec_dir, h100, False)]
    elif a.repeat:
        lines += [f"# on another lease, the slices executed again (fetched into {a.repeat})",
                  device_command(Path(a.repeat), h100, False)]
    pdir = twins_profile_dir(Path(a.sim))
    if pdir:  # each profile's own command, as it records it (where a device script's options differed)
        for f in sorted((ROOT / pdir).glob("*.json")):
            prof = json.loads(f.read_text())
            if prof.get("command"):
                lines.append(f"# {f.name} measured by: {prof['command']}")
            later: dict[tuple, list[str]] = {}  # tables added later (`--add-table`), by the command that added them
            for name, c in prof.get("components", {}).items():
                m = (c.get("measured") or {}) if isinstance(c, dict) else {}
                if m.get("command"):
                    carried = (m.get("carried_from") or {}).get("profile")
                    later.setdefault((m["command"], carried), []).append(name)
            for (cmd, carried), names in later.items():
                if carried:  # measured on another lease (benchmarks/profile_carry_table.py)
                    lines.append(f"#   its {', '.join(names)} carried from another lease's {carried} "
                                 f"(benchmarks/profile_carry_table.py), measured there by: {cmd}")
                else:
                    lines.append(f"#   then, its {', '.join(names)} by: {cmd}")
    lines += ["# on any machine, with the executed runs and profiles fetched"
              + (f" (the profiles into {pdir}, the shipped ones left as they are)" if pdir else ""),
              f"python benchmarks/fidelity_runs.py simulate --exec {a.exec} --out {a.sim}"
              + (f" --profile-dir {pdir}" if pdir else "")]
    if a.repeat_sim:
        rdir = twins_profile_dir(Path(a.repeat_sim))
        lines.append(f"python benchmarks/fidelity_runs.py simulate --exec {a.repeat} --out {a.repeat_sim}"
                     + (f" --profile-dir {rdir}" if rdir else ""))
    if a.sensitivity:
        scales = sorted({r["scale"] for r in json.loads(Path(a.sensitivity).read_text()).get("at", [])})
        lines.append(f"python benchmarks/fidelity_runs.py sensitivity --exec {a.exec} --sim {a.sim} \\\n"
                     f"    --out {Path(a.sim).parent / 'sensitivity'} --json {a.sensitivity}"
                     + (" --at " + " ".join(f"{f:g}" for f in scales) if scales else ""))
    opts = [f"--json {a.json}", f"--markdown {a.markdown}"]
    opts += [f"--repeat {a.repeat}"] * bool(a.repeat) + [f"--repeat-sim {a.repeat_sim}"] * bool(a.repeat_sim)
    opts += ["--same-lease"] * a.same_lease
    opts += ["--added-tables-lease"] * a.added_tables_lease
    opts += [f"--sensitivity {a.sensitivity}"] * bool(a.sensitivity)
    lines.append(f"python benchmarks/fidelity_runs.py results --exec {a.exec} --sim {a.sim} \\\n    " + " ".join(opts))
    return "\n".join(lines)


#: what each trace file of `SLICES` is, for the results document
SOURCES = {
    "traces/data/azure_conv_2023_sample.csv": "the bundled Azure conversation sample",
    "traces/data/azure_code_2023_sample.csv": "the bundled Azure code sample",
    "traces/data/mooncake_sample.jsonl": "the bundled Mooncake sample (prefix hashes)",
    "benchmarks/slices/mooncake_synthetic_1005_1020.jsonl":
        "the requests of the Mooncake synthetic trace that arrive in [1005 s, 1020 s) (`benchmarks/slices/`: "
        "prompts send again the blocks of prompts a few requests before them), timed from the first",
    "benchmarks/slices/mooncake_synthetic_960_1020.jsonl":
        "the requests of the Mooncake synthetic trace that arrive in [960 s, 1020 s), timed from the first",
}


def slices_text(names) -> str:
    """One sentence naming each slice of `names`: its trace, window and rate, from `SLICES`."""
    parts = []
    for t in names:
        file, (lo, hi), rate = SLICES[t]
        times = {1.0: "", 2.0: " at twice its rate"}.get(rate, f" at {rate:g} times its rate")
        parts.append(f"{t} = {SOURCES.get(file, file)}, arrivals [{lo:g} s, {hi:g} s){times}")
    return (f"Slices (`benchmarks/fidelity_runs.py`, prompts clipped to {CLIP_TOKENS} tokens): "
            + "; ".join(parts) + ".")


def markdown_doc(rows: list[dict], exec_dir: Path, priced: dict, repeated: str, moved: str, args,
                 moves: dict | None = None, added: dict[str, list[str]] | None = None,
                 added_cmds: list[str] | None = None) -> str:
    """benchmarks/FIDELITY.md: how the figures were made (`args`: those of `results`) and the
    generated tables (`moves`: `repeat_moves`, for which figures can be judged; `added`:
    `added_tables` and `added_cmds`: `added_commands`, with --added-tables-lease)."""
    devices = sorted({json.loads(p.read_text()).get("device", "?") for p in exec_dir.glob("*/executor.json")})
    torch_v = sorted({json.loads(p.read_text()).get("torch", "?") for p in exec_dir.glob("*/executor.json")})
    done = {p.parent.name for p in exec_dir.glob("*/executor.json")}
    seen = {parse_name(d)[0] for d in done}
    out = [HEADER.format(devices=", ".join(devices), torch=", ".join(torch_v),
                         lease=lease_note(args.same_lease, exec_dir, bool(repeated), added),
                         slices=slices_text([t for t in SLICES if t in STANDARD_SLICES or t in seen]),
                         commands=commands_block(args, devices, added_cmds))]
    want = [run_name(t, p, m) for m in MODELS for t in SLICES if t in STANDARD_SLICES or t in seen for p in PRESETS]
    missing = [w for w in want if w not in done]
    out.append(f"Executed runs: {len(want) - len(missing)} of {len(want)}"
               + (f"; not executed (device time): {', '.join(missing)}." if missing else ".") + "\n")
    out.append(step_kinds(exec_dir, priced))
    out.append(prefix_hits(exec_dir, priced, Path(args.sim) / "profiled"))
    for cost in ("profiled", "roofline"):
        sub = [r for r in rows if r["cost_model"] == cost]
        if not sub:
            continue
        out.append(f"### {cost} cost model\n")
        out.append(markdown_table(sub))
        out.append("Within target (|error| <= target): " + ", ".join(f"{k} {met(sub, k)}" for k in ERRORS) + ".\n")
        if moves:
            out.append(judged(sub, moves))
        out.append(request_table(sub))
    if moved:
        out.append(moved)
    if repeated:
        out.append(repeated)
    return "\n".join(out)


HEADER = """# Fidelity: simulated against executed runs

Generated by `python benchmarks/fidelity_runs.py results` from the run directories; do not edit the
figures by hand.

The executed run of a slice is `blocksim replay SLICE --executor cuda`: the same engine with every
step executed by the model (random fp16 weights, whole model, the paged prefill kernel, the fast
decode kernel, CUDA graphs for pure decodes) and lasting its measured GPU time
(`validation/VALIDATION.md`). Its simulated twins are the same replay priced by the profiled cost
model (the profile of the model and GPU, the shipped one or those of `simulate --profile-dir` as
the commands below say, measured by `blocksim profile` on a synthetic grid, never on these traces)
and by the roofline (constants fitted on the same profiles' grids).
Errors are signed fractions (simulated - executed) / executed; `step_mape` is the mean absolute
per-step error of the cost model pricing the executed run's own steps (`blocksim fidelity`).
Targets: step MAPE 3%, TTFT / TPOT / end-to-end p50 and p99 3% (TTFT p99 5%), throughput 2%.

Devices: {devices} (torch {torch}).

Reading the tables: the per-step table below splits each executed step's profiled prediction
error by kind of step. The executor primes the first eager step of each shape untimed (its host's
first calls of that shape would otherwise outlast the sleep queued before a segment and show in
the measured GPU time), and the profile times prefill attention inside whole steps and the linear
layers on real-valued operands, as the executed steps run them (`validation/VALIDATION.md`,
`benchmarks/eager_gap.py`). The latency percentiles of these runs under memory pressure amplify
small per-step differences through scheduling (a prompt admitted a step earlier or later), so
the latency errors are larger than the per-step error: the table "How far the latencies move with
the step times" gives, per slice, how far each figure moves when every step lasts 1% longer or
shorter. A graph-replayed decode step is priced by its padded batch, the mean context over its
rows (padding rows as rows of no context) and its longest row over that mean (the profile's
`decode_step_longest` table, measured on batches whose rows fall in equal steps from the longest),
where a profile has the `decode_step_shared` table, by the
share of its context that `n = 2` samples read from their prompt's shared blocks (partly from the
L2 cache; a profile without the table prices them as if they did not share them), and, where a
profile has the `decode_step_padded` table, by the share of its rows that are padding (the
table's ratio of a step whose real rows hold the tokens and whose padding rows hold one each to
the step of the same tokens spread over all its rows; a profile without it prices a padded step
as the spread one) (`benchmarks/decode_step_shapes.py`, `benchmarks/step_families.py`, docs/cost_models.md, "The
profiled model").

{lease}

{slices} Presets vllm,
vllm-prefix and vllm-chunked with 900 GPU blocks (14400 token slots: requests wait for memory or are
preempted); swap-n2 = two samples per request, 700 blocks, preemption by swap.

Commands, as this document was made:

```sh
{commands}
```
"""


def markdown_table(rows: list[dict]) -> str:
    head = "| trace | preset | model | cost model | " + " | ".join(ERRORS) + " |"
    lines = [head, "|" + " --- |" * (4 + len(ERRORS))]
    for r in rows:
        vals = " | ".join(f"{100 * r[k]:+.1f}%" if isinstance(r.get(k), (int, float)) else "n/a" for k in ERRORS)
        model = r["model"] + (f" tp{r['tensor_parallel']}" if (r.get("tensor_parallel") or 1) > 1 else "")
        lines.append(f"| {r['trace']} | {r['preset']} | {model} | {r['cost_model']} | {vals} |")
    return "\n".join(lines) + "\n"


MOVE_KEYS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "output_tokens_per_s")


def profiles_at(rev: str, dest: Path) -> Path | None:
    """The shipped profiles as of git revision `rev` (a directory is taken as it is), in `dest`;
    None, after one line on stderr, where `rev` is neither."""
    if Path(rev).is_dir():
        return Path(rev)
    refused = (f"moves: --before {rev}: neither a folder nor a git revision of this repository with "
               f"blocksim/profiles; name a commit or a folder of profiles")
    try:
        names = subprocess.run(["git", "ls-tree", "--name-only", rev, "blocksim/profiles/"], cwd=ROOT,
                               capture_output=True, text=True)
        if names.returncode != 0 or not names.stdout.strip():
            print(refused, file=sys.stderr)
            return None
        dest.mkdir(parents=True, exist_ok=True)
        for name in names.stdout.split():
            if name.endswith(".json"):
                text = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, capture_output=True,
                                      check=True).stdout
                (dest / Path(name).name).write_bytes(text)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"{refused} ({e})", file=sys.stderr)
        return None
    return dest


def code_at(rev: str, dest: Path) -> Path | None:
    """The repository's files as of git revision `rev`, unpacked in `dest` (replaced); None, after
    one line on stderr, where `rev` is not a revision of this repository."""
    import shutil
    import tarfile
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    p = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, capture_output=True)
    if p.returncode != 0:
        print(f"moves: --before {rev} --code: not a git revision of this repository; name a commit",
              file=sys.stderr)
        return None
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def cmd_moves(a) -> int:
    """Every slice and preset simulated with the profiles as of --before and with the shipped ones:
    how far the simulated figures move when a profile's tables are measured again."""
    from validation.profile import shipped_name
    out = Path(a.out)
    after = ROOT / "blocksim" / "profiles"
    roots = {"before": ROOT, "after": ROOT}
    if a.code:  # the simulator's code as of --before, the working tree's profiles on both sides
        roots["before"] = code_at(a.before, out / "code-before")
        if roots["before"] is None:
            return 2
        before = after
    else:
        before = profiles_at(a.before, out / "profiles-before")
    if before is None:
        return 2
    names = {model: shipped_name(model, a.gpu, "float16", 1) for model in a.models}
    for model, name in names.items():
        lacking = [str(d) for d in (before, after) if not (d / name).is_file()]
        if lacking:
            print(f"moves: --models {model} --gpu {a.gpu}: no profile {name} in {' or '.join(lacking)}; name a "
                  f"model and GPU with a profile on both sides", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "moves.log", "a") as log:
        for model, name in names.items():
            for trace in a.traces:
                for preset in a.presets:
                    path = slice_file(trace, PRESETS[preset][2], out / "traces")
                    run = run_name(trace, preset, model)
                    got = {}
                    for tag, pdir in (("before", before), ("after", after)):
                        dest = out / tag / run
                        rc = blocksim(replay_args(path.resolve(), preset, model, a.gpu, dest.resolve())
                                      + ["--cost-model", "profiled", "--cost-profile", str((pdir / name).resolve())],
                                      log, roots[tag])
                        if rc != 0:
                            print(f"moves: {run} ({tag}) failed, rc {rc}: see {out / 'moves.log'}", file=sys.stderr)
                            return 2
                        got[tag] = json.loads((dest / "summary.json").read_text())
                    row = {"run": run, "trace": trace, "preset": preset, "model": model, "gpu": a.gpu}
                    for k in MOVE_KEYS:
                        b, f = got["before"][k], got["after"][k]
                        row[k] = {"before": b, "after": f, "move": (f / b - 1) if b else None}
                    rows.append(row)
                    print(f"moves {run}: " + ", ".join(f"{k[:-2]} {100 * row[k]['move']:+.2f}%" for k in MOVE_KEYS
                                                     if row[k]["move"] is not None), flush=True)
    what = ("the simulator's code as of " + a.before + ", the working tree's blocksim/profiles" if a.code
            else a.before)
    write_json(a.json, {"before": what, "after": "the working tree's code and blocksim/profiles", "gpu": a.gpu,
                        "rows": rows})
    for k in MOVE_KEYS:
        m = [abs(r[k]["move"]) for r in rows if r[k]["move"] is not None]
        if m:
            print(f"{k}: largest move {100 * max(m):.2f}%, median {100 * sorted(m)[len(m) // 2]:.2f}% over {len(m)} runs")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/fidelity_runs.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    def runs_of(p, tensor_parallel: bool = True) -> None:
        """The options naming a set of runs: models, slices, presets, GPU (and tensor-parallel degree)."""
        p.add_argument("--models", nargs="+", default=list(MODELS))
        p.add_argument("--traces", nargs="+", default=list(STANDARD_SLICES), choices=list(SLICES))
        p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
        p.add_argument("--gpu", default="h200-141gb")
        if tensor_parallel:
            p.add_argument("--tensor-parallel", type=int, default=1, help="GPUs each model is split over (default 1)")
    e = sub.add_parser("execute")
    e.add_argument("--out", required=True)
    runs_of(e)
    e.add_argument("--budget-s", type=float, default=None,
                   help="start no run that would not end within this many seconds of the start (each run's "
                        "seconds expected from its simulated twin: expected_exec_s, times machine_pace once "
                        "a run took longer than expected)")
    e.add_argument("--executor-prefill", choices=("auto", "kernel", "wgmma", "sdpa"), default=None,
                   help="`blocksim replay --executor-prefill` of the executed runs (default: replay's own)")
    e.set_defaults(func=cmd_execute)
    t = sub.add_parser("estimate", help="the device seconds each executed run is expected to take")
    runs_of(t)
    t.add_argument("--profiles", action="store_true",
                   help="each model's profile too, at the seconds its shipped profile took to measure")
    t.set_defaults(func=cmd_estimate)
    s = sub.add_parser("simulate")
    s.add_argument("--exec", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--cost-models", nargs="+", default=["profiled", "roofline"])
    s.add_argument("--profile-dir", default=None, help="profiles to use (default: the shipped ones): "
                   "the profiled model's, and the grids the roofline's constants are fitted on")
    s.set_defaults(func=cmd_simulate)
    r = sub.add_parser("results")
    r.add_argument("--exec", required=True)
    r.add_argument("--sim", required=True)
    r.add_argument("--cost-models", nargs="+", default=["profiled", "roofline"])
    r.add_argument("--json", required=True)
    r.add_argument("--markdown", default=None)
    r.add_argument("--repeat", default=None, metavar="DIR",
                   help="executed runs of the same slices made again: a table of their differences")
    r.add_argument("--repeat-sim", default=None, metavar="DIR",
                   help="the --repeat runs simulated (`simulate --exec REPEAT --out DIR`): the profile's per-step "
                        "error against them too, by kind of step, in the \"Executed twice\" section")
    r.add_argument("--sensitivity", default=None, metavar="JSON",
                   help="a `sensitivity` results file: its table goes into --markdown")
    r.add_argument("--same-lease", action="store_true",
                   help="the profiles and the executed runs come from one lease of the device (as "
                        "benchmarks/fidelity_device.sh makes them): said in --markdown")
    r.add_argument("--added-tables-lease", action="store_true",
                   help="the executed runs come from the lease of the profiles' tables measured again by "
                        "`blocksim profile --add-table` (under their `measured` key), the other tables from an "
                        "earlier one: said in --markdown")
    r.add_argument("--merge", action="store_true",
                   help="keep the --json file's rows of other runs (model, GPU, tensor-parallel degree, ...)")
    r.set_defaults(func=cmd_results)
    v = sub.add_parser("sensitivity", help="how far each slice's latencies move with its step times")
    v.add_argument("--exec", required=True)
    v.add_argument("--sim", required=True, help="the simulate output holding each run's profiled twin")
    v.add_argument("--out", required=True)
    v.add_argument("--step", type=float, default=0.01, help="the scale either side of 1 (default 0.01)")
    v.add_argument("--json", required=True)
    v.add_argument("--at", type=float, nargs="+", default=[], metavar="F",
                   help="also the errors against the executed runs with every step priced F times (e.g. 0.97)")
    v.set_defaults(func=cmd_sensitivity)
    m = sub.add_parser("moves", help="how far the simulated figures move between two sets of profiles (or two "
                                     "revisions of the simulator)")
    m.add_argument("--before", required=True, metavar="REV|DIR",
                   help="a git revision whose shipped profiles to compare with (or a folder of profiles)")
    m.add_argument("--code", action="store_true",
                   help="--before names a revision whose simulator to compare with, both sides priced by the "
                        "working tree's shipped profiles")
    runs_of(m, tensor_parallel=False)
    m.add_argument("--out", required=True, help="a folder for the runs")
    m.add_argument("--json", required=True)
    m.set_defaults(func=cmd_moves)
    a = ap.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())

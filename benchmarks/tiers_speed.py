"""Wall time of the Mooncake synthetic trace with KV tiers against the same run without.

    python benchmarks/tiers_speed.py [--repeats 3] [--json benchmarks/results/tiers_speed.json] [--tier-time]

llama-2-7b on h100-80gb, the built-in roofline (benchmarks/roofline_defaults.json), prompts clipped to
the model's 4,096 tokens. Each configuration runs `--repeats` times in this process (the trace read
once); the best wall time of the engine's run counts, and the best CPU time of this process over
the same runs (what other jobs on the machine take from it does not count there, what they take of
its caches does). A configuration with tiers alternates its runs with runs of its policy's "gpu
only" configuration, and its ratio is to the best of those (`gpu_only_wall_s`), so that the load
of the machine weighs on both sides alike. Each run starts after `gc.collect()`, as in a fresh
process, so that a tree whose dropped engines stay in reference cycles (benchmarks/REPLAY.md,
"Many runs in one process") is not timed among its own leftovers. The JSON records the machine's
load average before and after. Needs ../shared/traces beside the repository.

`--tier-time`: one more run of each configuration with tiers, its calls into the tier store
(`blocksim.memory.tiers.TierStore`: lookups, onload plans, commits, stores, the step counters)
timed, to split its wall time into the tier store's work and the rest (the engine, scheduler and
memory manager, which simulate more steps and lookups with tiers); the timers add to its wall time.
And one more run of every configuration counting the engine's iterations (`iterations`): the
scheduler's calls, the spans of decode steps and the single steps they led to, and the idle waits
for chunks to land.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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
from blocksim.memory.tiers import TierStore  # noqa: E402
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


#: the tier store's methods the engine, the schedulers and the memory managers call
TIER_CALLS = ("match", "plan_onload", "commit", "count_query", "on_computed", "on_gpu_hit", "on_gpu_block_evicted",
              "take_wait", "totals", "take_ops")


@contextlib.contextmanager
def wrapped(targets, wrap):
    """Within the block, each `(owner, attribute, key)` of `targets` holds `wrap(key, original)`;
    the originals are put back after it, however it ends."""
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in targets]
    for (owner, attr, key), (_, _, original) in zip(targets, originals):
        setattr(owner, attr, wrap(key, original))
    try:
        yield
    finally:
        for owner, attr, original in originals:
            setattr(owner, attr, original)


def timed_tier_run(cfg, trace) -> dict:
    """One run with each of `TIER_CALLS` timed: its wall time and the seconds in each call."""
    spent = dict.fromkeys(TIER_CALLS, 0.0)
    clock = time.perf_counter

    def timer(name, method):
        def call(*args, **kwargs):
            t0 = clock()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += clock() - t0
        return call

    with wrapped([(TierStore, name, name) for name in TIER_CALLS], timer):
        gc.collect()
        engine = Engine(cfg, trace, make_cost_model(cfg, PROFILE))
        t0 = clock()
        engine.run()
        wall = clock() - t0
    return {"wall_s": wall, "tier_store_s": sum(spent.values()), "rest_s": wall - sum(spent.values()),
            "calls_s": {k: v for k, v in spent.items() if v}}


def counted_run(cfg, trace) -> dict:
    """One run with the engine's iterations counted: spans, single steps and idle waits (the
    scheduler is called once for each)."""
    import blocksim.engine.engine as engine_module
    count = {"spans": 0, "single_steps": 0, "idle_waits": 0}

    def counting(name, fn):
        def call(*args, **kwargs):
            count[name] += 1
            return fn(*args, **kwargs)
        return call

    with wrapped([(engine_module, "run_span", "spans"), (Engine, "_run_step", "single_steps"),
                  (Engine, "_sleep_until", "idle_waits")], counting):
        gc.collect()
        Engine(cfg, trace, make_cost_model(cfg, PROFILE)).run()
    return {"scheduler_calls": sum(count.values()), **count}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "tiers_speed.json"))
    p.add_argument("--tier-time", action="store_true",
                   help="one more run per configuration with tiers, its tier store calls timed")
    a = p.parse_args()
    base = build_config("vllm-v1", cost_profile=PROFILE)
    trace = load_trace(str(TRACE), clip_max_len=base.model.max_model_len)
    rows = []
    refs = {}  # policy -> its "gpu only" configuration
    load_before = os.getloadavg()
    for name, (policy, options) in CONFIGS.items():
        cfg = build_config(policy, cost_profile=PROFILE, **options)
        ref_cfg = refs.setdefault(policy, cfg)
        timed = {"run": [float("inf"), float("inf")], "ref": [float("inf"), float("inf")]}
        summary = None
        # a configuration with tiers alternates with its reference
        turns = (("run", cfg),) if ref_cfg is cfg else (("ref", ref_cfg), ("run", cfg))
        for _ in range(a.repeats):
            for which, c in turns:
                engine = res = None  # the run before freed and its garbage collected (the docstring)
                gc.collect()
                engine = Engine(c, trace, make_cost_model(c, PROFILE))
                t0, c0 = time.perf_counter(), time.process_time()
                res = engine.run()
                slot = timed[which]
                slot[0] = min(slot[0], time.perf_counter() - t0)
                slot[1] = min(slot[1], time.process_time() - c0)
                if which == "run":
                    summary = res.summary
        best, best_cpu = timed["run"]
        ref, ref_cpu = timed["ref"] if ref_cfg is not cfg else timed["run"]
        rows.append({"config": name, "policy": policy, "options": options, "wall_s": best,
                     "ratio_to_gpu_only": best / ref, "cpu_s": best_cpu, "cpu_ratio_to_gpu_only": best_cpu / ref_cpu,
                     "gpu_only_wall_s": ref, "gpu_only_cpu_s": ref_cpu,
                     "steps": summary["steps"], "ttft_mean_s": summary["ttft_mean_s"],
                     **{k: summary[k] for k in ("tier_host_hit_rate", "tier_disk_hit_rate") if k in summary}})
        print(f"{name:<72} {best:6.2f} s  x{best / ref:.2f}  (CPU {best_cpu:5.2f} s  x{best_cpu / ref_cpu:.2f})  "
              f"{summary['steps']:>7} steps  TTFT mean {summary['ttft_mean_s']:.3f} s")
        if a.tier_time:
            engine = res = None  # the last repeat's engine and records freed before the counted run
            rows[-1]["iterations"] = it = counted_run(cfg, trace)
            print(f"{'':<72} {it['scheduler_calls']} scheduler calls: {it['spans']} spans, "
                  f"{it['single_steps']} single steps, {it['idle_waits']} idle waits")
        if a.tier_time and cfg.tiers is not None:
            engine = res = None  # the last repeat's engine and records freed before the timed run
            split = rows[-1]["tier_time"] = timed_tier_run(cfg, trace)
            print(f"{'':<72} timed run {split['wall_s']:.2f} s: tier store {split['tier_store_s']:.2f} s, "
                  f"rest {split['rest_s']:.2f} s")
    out = {"trace": "mooncake/synthetic_trace.jsonl", "model": base.model.name,
           "gpu": base.gpu.name, "python": platform.python_version(), "machine": platform.machine(),
           "repeats": a.repeats, "tier_time": a.tier_time, "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()},
           "runs": rows}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()

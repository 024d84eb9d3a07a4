"""Pricing an executed run's steps with another cost model: the run re-played at its measured step times.

An executed run (``blocksim replay --executor``) is determined by its requests, its configuration
and its step durations: the scheduler sees the same clock. `measured_replay` runs the engine again
on the executed run's requests and configuration, every step lasting the executed run's measured
time (the engine's `StepExecutor` hook, so spans are off), and prices each step with a given cost
model. The replay's ``t_*_s`` columns are then that model's prediction of the very steps that were
executed; this is checked, step by step (prompts, tokens, decodes, context, block moves), and a
replay that diverges is refused rather than compared.

Requests come from the executed run's ``requests.parquet`` (arrivals, lengths and samples as run);
prefix hashes, for prefix-caching runs, from the trace file its summary names, matched by request id.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.rundir import Run


class ReplayDiverged(RuntimeError):
    """The replay at measured times did not reproduce the executed run's steps."""


class MeasuredSteps:
    """A `blocksim.engine.executor.StepExecutor` whose step i lasts the executed run's measured seconds."""

    def __init__(self, durations_s: np.ndarray) -> None:
        self.durations_s = np.asarray(durations_s, dtype=np.float64)

    def execute(self, step: int, out, predicted: dict[str, float]) -> float:
        if step >= len(self.durations_s):
            raise ReplayDiverged(f"the replay runs more steps than the {len(self.durations_s)} executed")
        return float(self.durations_s[step])

    def save(self, out_dir) -> None:  # nothing of its own to write
        return None


def rebuild_config(summary: dict):
    """The `SimConfig` a run's summary.json describes."""
    from blocksim.config import CacheConfig, GPUSpec, ModelSpec, PolicyConfig, SchedulerConfig, SimConfig
    c = summary["config"]
    return SimConfig(model=ModelSpec(**c["model"]), gpu=GPUSpec(**c["gpu"]), cache=CacheConfig(**c["cache"]),
                     scheduler=SchedulerConfig(**c["scheduler"]), tensor_parallel=c["tensor_parallel"],
                     policy=c["policy"], policy_config=PolicyConfig(**c["policy_config"]))


def rebuild_cost_model(summary: dict, config=None):
    """The cost model a run's summary.json records, for `config` (default: that run's own). A profiled
    model needs its profile file still readable and the same measurement (its ``created_utc``) as
    the run used; a roofline's constants are in the record."""
    from blocksim.cost import CostParams, ProfiledCostModel, RooflineCostModel, load_profile
    rec = summary.get("cost_model") or {}
    config = config if config is not None else rebuild_config(summary)
    if rec.get("name") == "profiled":
        profile = load_profile(rec["profile"])
        made = profile.header.get("created_utc")
        if rec.get("created_utc") and made != rec["created_utc"]:
            raise ValueError(f"cost profile {rec['profile']} was measured at {made}, not at {rec['created_utc']} "
                             f"as the run used it: simulate the run again with this profile")
        cal = profile.header.get("calibrated")  # `blocksim profile --calibrate`'s record
        now = cal.get("utc") if isinstance(cal, dict) else None
        then = (rec.get("calibrated") or {}).get("utc")
        if now != then:
            said = {None: "not calibrated"}
            raise ValueError(f"cost profile {rec['profile']} is {said.get(now, f'calibrated at {now}')}, the run used "
                             f"it {said.get(then, f'calibrated at {then}')}: simulate the run again with this profile")
        again = dict(sorted(profile.tables_measured.items()))
        if "tables_measured" in rec and again != rec["tables_measured"]:  # runs recorded before it lack the key
            moved = sorted(k for k in set(again) | set(rec["tables_measured"])
                           if again.get(k) != rec["tables_measured"].get(k))
            raise ValueError(f"cost profile {rec['profile']}: table(s) {', '.join(moved)} measured again since the "
                             f"run used it: simulate the run again with this profile")
        return ProfiledCostModel(config, profile)
    if rec.get("name") == "roofline":
        return RooflineCostModel(config, CostParams(**rec["params"]) if rec.get("params") else None,
                                 source=rec.get("profile"))
    raise ValueError(f"cost model {rec.get('name')!r} cannot be rebuilt from summary.json")


def executed_trace(run: Run):
    """The executed run's requests as a trace, with prefix hashes from its trace file when it has them."""
    from traces.trace import Trace
    cols = [c for c in ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "priority")
            if c in run.requests]
    df = run.requests[cols].reset_index(drop=True)
    hash_tokens = None
    src = run.summary.get("trace")
    if src and Path(str(src)).is_file():
        import traces
        t = traces.read_trace(str(src))
        if "prefix_hashes" in t.df.columns and "request_id" in t.df.columns and t.hash_block_tokens:
            hashes = pd.Series(list(t.df["prefix_hashes"]), index=t.df["request_id"].to_numpy())
            if set(df.request_id) <= set(hashes.index):
                need = -(-df.prompt_tokens.to_numpy() // t.hash_block_tokens)  # prompts clipped as run
                lists = [list(h)[:k] for h, k in zip(hashes.loc[df.request_id.to_numpy()], need)]
                if all(len(h) == k for h, k in zip(lists, need)):
                    df["prefix_hashes"] = lists
                    hash_tokens = t.hash_block_tokens
    return Trace(df=df, hash_block_tokens=hash_tokens, name=run.path.name)


def measured_replay(cost_summary: dict, exe: Run) -> np.ndarray:
    """Per executed step, the predicted seconds of the cost model that `cost_summary` (a summary.json)
    records; raises ReplayDiverged when the replay does not reproduce the executed steps."""
    from analysis.fidelity import COMPOSITION, predicted_step_s, same_steps
    from blocksim.engine import Engine
    config = rebuild_config(exe.summary)
    cost = rebuild_cost_model(cost_summary, config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the simulated run reported its own extrapolation
        res = Engine(config, executed_trace(exe), cost, executor=MeasuredSteps(exe.steps.duration_s)).run()
    if not same_steps(res.steps, exe.steps):
        n = min(len(res.steps), len(exe.steps))
        diff = [c for c in COMPOSITION if c in exe.steps
                and not (res.steps[c].to_numpy()[:n] == exe.steps[c].to_numpy()[:n]).all()]
        raise ReplayDiverged(f"the replay at measured times gives {len(res.steps)} steps against "
                             f"{len(exe.steps)} executed (differing in {', '.join(diff) or 'count'})")
    return predicted_step_s(res.steps)

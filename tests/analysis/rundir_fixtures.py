"""A tiny hand-built run directory whose metrics are worked out by hand in the tests.

Capacity 100 token slots (10 blocks of 10). Four requests, one rejected; four steps over 8 s.

| req | arrival | sched | first token | finish | out x n | queue | ttft | tpot | e2e | norm |
|-----|---------|-------|-------------|--------|---------|-------|------|------|-----|------|
| 0   | 0       | 0     | 1           | 4      | 4 x 1   | 0     | 1    | 1    | 4   | 1    |
| 1   | 1       | 2     | 3           | 5      | 2 x 2   | 1     | 2    | 2    | 4   | 2    |
| 2   | 2       | 4     | 6           | 6      | 1 x 1   | 2     | 4    | NaN  | 4   | 4    |
| 3   | 3       | rejected                                                            |

Steps (start, duration, token_states, reservation, internal, external, free):
(0,1, 10,20,5,5,60) (1,3, 40,10,10,20,20) (4,2, 30,0,10,0,60) (6,2, 0,0,0,0,100)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

NAN = np.nan


def tiny_requests() -> pd.DataFrame:
    return pd.DataFrame({
        "request_id": [0, 1, 2, 3],
        "arrival_s": [0.0, 1.0, 2.0, 3.0],
        "prompt_tokens": [10, 20, 6, 100],
        "output_tokens": [4, 2, 1, 5],
        "n": [1, 2, 1, 1],
        "priority": [0, 0, 0, 0],
        "status": ["finished", "finished", "finished", "rejected"],
        "reject_reason": ["", "", "", "prompt too long"],
        "first_scheduled_s": [0.0, 2.0, 4.0, NAN],
        "first_token_s": [1.0, 3.0, 6.0, NAN],
        "finish_s": [4.0, 5.0, 6.0, NAN],
        "queue_s": [0.0, 1.0, 2.0, NAN],
        "ttft_s": [1.0, 2.0, 4.0, NAN],
        "tpot_s": [1.0, 2.0, NAN, NAN],
        "e2e_s": [4.0, 4.0, 4.0, NAN],
        "norm_latency_s": [1.0, 2.0, 4.0, NAN],
        "preemptions": [0, 1, 1, 0],
        "swaps": [0, 1, 0, 0],
        "recomputed_tokens": [0, 0, 6, 0],
    })


def tiny_steps() -> pd.DataFrame:
    mem = np.array([[10, 20, 5, 5, 60], [40, 10, 10, 20, 20], [30, 0, 10, 0, 60], [0, 0, 0, 0, 100]])
    zeros = [0, 0, 0, 0]
    return pd.DataFrame({
        "step": [0, 1, 2, 3],
        "start_s": [0.0, 1.0, 4.0, 6.0],
        "duration_s": [1.0, 3.0, 2.0, 2.0],
        "num_prefill_seqs": [1, 1, 1, 0],
        "prefill_tokens": [10, 20, 6, 0],
        "num_decode_seqs": [0, 1, 2, 0],
        "decode_ctx_tokens": [0, 11, 45, 0],
        "running": [1, 2, 2, 0],
        "waiting": [2, 1, 0, 0],
        "swapped": [0, 1, 0, 0],
        "gpu_blocks_used": [4, 8, 4, 0],
        "cpu_blocks_used": [0, 3, 0, 0],
        "blocks_swapped_in": [0, 0, 3, 0],
        "blocks_swapped_out": [0, 3, 0, 0],
        "blocks_copied": zeros,
        "preempted": [0, 1, 1, 0],
        "finished": [0, 0, 1, 2],
        "rejected": [0, 0, 1, 0],
        "t_linear_s": [1.0, 3.0, 2.0, 2.0],
        "t_attn_prefill_s": zeros, "t_attn_decode_s": zeros, "t_swap_s": zeros,
        "t_copy_s": zeros, "t_overhead_s": zeros,
        **{f"mem_{c}": mem[:, i] for i, c in enumerate(
            ["token_states", "reservation", "internal_frag", "external_frag", "free"])},
    })


def tiny_summary(policy: str = "vllm") -> dict:
    return {
        "version": "1.0",
        "config": {"policy": policy, "model": "llama-2-7b", "gpu": "h100-80gb", "block_size": 10,
                   "scheduler": {"max_num_seqs": 256}},
        "num_gpu_blocks": 10, "num_cpu_blocks": 4, "block_size": 10, "capacity_tokens": 100,
        "requests": 4, "finished": 3, "rejected": 1, "simulated_s": 8.0, "wall_s": 0.01,
        "steps": 4, "requests_per_s": 0.375, "norm_latency_mean_s": 7 / 3, "preemptions": 2,
        "bytes_swapped": 6144,
    }


def tiny_extents() -> pd.DataFrame:
    return pd.DataFrame({"step": [0, 0, 0, 3], "start_s": [0.0, 0.0, 0.0, 6.0],
                         "extent_tokens": [10, 20, 30, 100]})


def write_run(path: Path, requests=None, steps=None, summary=None, extents=None) -> Path:
    """Write a run directory (defaults: the tiny run above, without free extents)."""
    path.mkdir(parents=True, exist_ok=True)
    (tiny_requests() if requests is None else requests).to_parquet(path / "requests.parquet")
    (tiny_steps() if steps is None else steps).to_parquet(path / "steps.parquet")
    (path / "summary.json").write_text(json.dumps(tiny_summary() if summary is None else summary))
    if extents is not None:
        extents.to_parquet(path / "free_extents.parquet")
    return path


def synthetic_run(path: Path, n_steps: int, n_requests: int, policy: str = "vllm", seed: int = 0,
                  rate_scale: float = 1.0) -> Path:
    """A large, plausible-looking run (random but consistent columns) for plotting and timing."""
    rng = np.random.default_rng(seed)
    capacity = 16 * 2000
    t = np.cumsum(rng.uniform(0.01, 0.05, n_steps))
    duration = np.diff(np.concatenate([[0.0], t]))
    start = t - duration
    load = 0.5 + 0.45 * np.sin(np.linspace(0, 6 * np.pi, n_steps)) ** 2
    token = (capacity * load * 0.7).astype(np.int64)
    res = (capacity * load * 0.15).astype(np.int64)
    internal = (capacity * load * 0.03).astype(np.int64)
    external = (capacity * load * 0.05).astype(np.int64)
    free = capacity - token - res - internal - external
    steps = tiny_steps().iloc[:0].reindex(range(n_steps))
    for col in steps.columns:
        steps[col] = rng.integers(0, 4, n_steps) if col not in ("start_s", "duration_s") else 0.0
    steps = steps.assign(step=np.arange(n_steps), start_s=start, duration_s=duration,
                         running=(load * 40).astype(np.int64), waiting=((load - 0.5) * 60).clip(0).astype(np.int64),
                         num_decode_seqs=(load * 40).astype(np.int64), preempted=(rng.random(n_steps) < 0.01).astype(np.int64),
                         mem_token_states=token, mem_reservation=res, mem_internal_frag=internal,
                         mem_external_frag=external, mem_free=free)
    arrival = np.sort(rng.uniform(0, t[-1] * 0.9, n_requests)) / rate_scale
    out = rng.integers(1, 500, n_requests)
    queue = rng.exponential(0.5 * rate_scale, n_requests)
    ttft = queue + rng.uniform(0.05, 0.3, n_requests)
    tpot = rng.uniform(0.02, 0.06, n_requests)
    e2e = ttft + tpot * (out - 1)
    requests = pd.DataFrame({
        "request_id": np.arange(n_requests), "arrival_s": arrival, "prompt_tokens": rng.integers(10, 1000, n_requests),
        "output_tokens": out, "n": np.ones(n_requests, dtype=np.int64), "priority": 0, "status": "finished",
        "reject_reason": "", "first_scheduled_s": arrival + queue, "first_token_s": arrival + ttft,
        "finish_s": arrival + e2e, "queue_s": queue, "ttft_s": ttft, "tpot_s": np.where(out > 1, tpot, np.nan),
        "e2e_s": e2e, "norm_latency_s": e2e / out, "preemptions": 0, "swaps": 0, "recomputed_tokens": 0,
    })
    summary = {**tiny_summary(policy), "num_gpu_blocks": 2000, "block_size": 16, "capacity_tokens": capacity,
               "requests": n_requests, "finished": n_requests, "rejected": 0, "simulated_s": float(t[-1]),
               "steps": n_steps}
    return write_run(path, requests, steps, summary)

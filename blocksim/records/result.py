"""A finished run: per-request and per-step frames, the summary, and the run directory writer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

RUN_FORMAT_VERSION = 1


def _pcts(prefix: str, values: np.ndarray) -> dict[str, float]:
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return {f"{prefix}_{k}_s": float("nan") for k in ("mean", "p50", "p90", "p99")}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {f"{prefix}_mean_s": float(v.mean()), f"{prefix}_p50_s": float(p50),
            f"{prefix}_p90_s": float(p90), f"{prefix}_p99_s": float(p99)}


def request_frame(groups, reqs: pd.DataFrame) -> pd.DataFrame:
    groups = sorted(groups, key=lambda g: g.index)
    df = reqs.drop(columns=["_row"], errors="ignore").copy()
    df["status"] = [g.status for g in groups]
    df["reject_reason"] = [g.reject_reason for g in groups]
    for col in ("first_scheduled_s", "first_token_s", "finish_s"):
        df[col] = np.array([getattr(g, col) for g in groups], dtype=np.float64)
    for col in ("preemptions", "swaps", "recomputed_tokens"):
        df[col] = np.array([getattr(g, col) for g in groups], dtype=np.int64)
    df["queue_s"] = df.first_scheduled_s - df.arrival_s
    df["ttft_s"] = df.first_token_s - df.arrival_s
    df["e2e_s"] = df.finish_s - df.arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        df["tpot_s"] = np.where(df.output_tokens > 1, (df.finish_s - df.first_token_s) / (df.output_tokens - 1),
                                np.nan)
    df["norm_latency_s"] = df.e2e_s / df.output_tokens
    order = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "priority", "status",
             "reject_reason", "first_scheduled_s", "first_token_s", "finish_s", "queue_s", "ttft_s", "tpot_s",
             "e2e_s", "norm_latency_s", "preemptions", "swaps", "recomputed_tokens"]
    return df[order]


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, config, block_bytes: int, wall_s: float,
              num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> dict:
    fin = requests[requests.status == "finished"]
    sim_s = float(steps.start_s.iloc[-1] + steps.duration_s.iloc[-1]) if len(steps) else 0.0
    span = sim_s - float(requests.arrival_s.min()) if len(requests) else 0.0
    out_tokens = float((fin.output_tokens * fin.n).sum())
    in_tokens = float(fin.prompt_tokens.sum())
    swapped_in, swapped_out = int(steps.blocks_swapped_in.sum()), int(steps.blocks_swapped_out.sum())
    s = {
        "version": RUN_FORMAT_VERSION,
        "config": config,
        "num_gpu_blocks": num_gpu_blocks, "num_cpu_blocks": num_cpu_blocks, "block_size": block_size,
        "capacity_tokens": num_gpu_blocks * block_size,
        "requests": int(len(requests)), "finished": int(len(fin)),
        "rejected": int((requests.status == "rejected").sum()),
        "simulated_s": sim_s, "wall_s": wall_s, "steps": int(len(steps)),
        "requests_per_s": len(fin) / span if span > 0 else float("nan"),
        "output_tokens_per_s": out_tokens / span if span > 0 else float("nan"),
        "total_tokens_per_s": (out_tokens + in_tokens) / span if span > 0 else float("nan"),
    }
    for name in ("ttft", "tpot", "e2e"):
        s.update(_pcts(name, fin[f"{name}_s"].to_numpy()))
    s["norm_latency_mean_s"] = float(fin.norm_latency_s.mean()) if len(fin) else float("nan")
    s.update({
        "preemptions": int(requests.preemptions.sum()), "swap_outs": int(requests.swaps.sum()),
        "blocks_swapped_in": swapped_in, "blocks_swapped_out": swapped_out,
        "bytes_swapped": (swapped_in + swapped_out) * block_bytes,
        "blocks_copied": int(steps.blocks_copied.sum()),
        "recomputed_tokens": int(requests.recomputed_tokens.sum()),
        "reject_reasons": {str(k): int(v) for k, v in
                           requests.loc[requests.status == "rejected", "reject_reason"].value_counts().items()},
    })
    return s


@dataclass
class RunResult:
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    free_extents: pd.DataFrame | None = None

    @classmethod
    def build(cls, engine, wall_s: float) -> "RunResult":
        steps = engine.rec.to_frame()
        reqs = request_frame(engine.groups, engine.reqs)
        cfg = engine.config
        summary = summarize(reqs, steps, cfg.to_dict(), cfg.block_bytes, wall_s, engine.bm.num_total_gpu_blocks,
                            engine.bm.num_total_cpu_blocks, engine.bm.block_size)
        stats = getattr(engine.bm, "stats", None)
        if stats is not None:
            summary.update(stats())
        return cls(reqs, steps, summary, engine.extents_frame())

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.requests.to_parquet(out / "requests.parquet", index=False)
        self.steps.to_parquet(out / "steps.parquet", index=False)
        if self.free_extents is not None:
            self.free_extents.to_parquet(out / "free_extents.parquet", index=False)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2, default=_json_default) + "\n")
        return out


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")

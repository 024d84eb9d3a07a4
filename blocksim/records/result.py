"""A finished run: per-request and per-step frames, the summary, and the run directory writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from blocksim.records import metrics
from blocksim.records.schema import (
    FREE_EXTENTS_FILE,
    REQUEST_COLUMNS,
    REQUESTS_FILE,
    RUN_FORMAT_VERSION,
    STEP_DTYPES,
    STEP_DTYPES_TP,
    STEPS_FILE,
    SUMMARY_FILE,
    TIER_REQUESTS_FILE,
    TIER_STEPS_FILE,
)
from blocksim.records.steps import StepRecorder
from blocksim.records.tier_records import tier_request_frame

#: Steps per row group of steps.parquet: the columns of one row group are built and buffered by the
#: Parquet writer at a time, so this bounds the memory of writing (30 columns of 8 bytes: under 8 MB per group).
STEP_ROW_GROUP = 1 << 15
#: How steps.parquet's columns are encoded: plain values compressed by zstd. Dictionary encoding
#: (Parquet's default) holds a hash table of every distinct value of a column chunk while writing,
#: as much memory again as the steps themselves, and the file is smaller without it.
STEP_ENCODING = {"use_dictionary": False, "compression": "zstd"}


def request_frame(groups, reqs: pd.DataFrame) -> pd.DataFrame:
    """requests.parquet: the trace's columns plus each group's outcome and latencies, in
    `schema.REQUEST_COLUMNS` order."""
    groups = sorted(groups, key=lambda g: g.index)
    cols = {c: reqs[c].to_numpy() for c in reqs.columns if c != "_row"}
    cols["status"] = np.array([str(g.status) for g in groups], dtype=object)
    cols["reject_reason"] = np.array([g.reject_reason for g in groups], dtype=object)
    for col in ("first_scheduled_s", "first_token_s", "finish_s"):
        cols[col] = np.array([getattr(g, col) for g in groups], dtype=np.float64)
    for col in ("preemptions", "swaps", "recomputed_tokens"):
        cols[col] = np.array([getattr(g, col) for g in groups], dtype=np.int64)
    arrival, output = cols["arrival_s"], cols["output_tokens"]
    cols["queue_s"] = cols["first_scheduled_s"] - arrival
    cols["ttft_s"] = cols["first_token_s"] - arrival
    cols["e2e_s"] = cols["finish_s"] - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["tpot_s"] = np.where(output > 1, (cols["finish_s"] - cols["first_token_s"]) / (output - 1), np.nan)
    cols["norm_latency_s"] = cols["e2e_s"] / output
    return pd.DataFrame({c: cols[c] for c in REQUEST_COLUMNS})


def summarize(requests: pd.DataFrame, steps: StepRecorder, config, block_bytes: int, wall_s: float,
              num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> dict:
    """summary.json: the run's configuration and sizes, and its metrics (`blocksim.records.metrics`),
    from the step records' totals (no step frame is built)."""
    fin = metrics.finished(requests)
    counts = metrics.event_counts_from(requests, {c: steps.column_sum(c) for c in metrics.EVENT_STEP_COLUMNS})
    end_s = steps.end_s()
    swapped_blocks = counts["blocks_swapped_in"] + counts["blocks_swapped_out"]
    return {
        "version": RUN_FORMAT_VERSION,
        "config": config,
        "num_gpu_blocks": num_gpu_blocks, "num_cpu_blocks": num_cpu_blocks, "block_size": block_size,
        "capacity_tokens": num_gpu_blocks * block_size,
        "requests": int(len(requests)), "finished": int(len(fin)),
        "rejected": int((requests.status == "rejected").sum()),
        "simulated_s": end_s, "wall_s": wall_s, "steps": steps.num_steps,
        **metrics.throughput_until(requests, end_s),
        **metrics.latency_stats(requests, metrics.SUMMARY_LATENCY_METRICS),
        "preemptions": counts["preemptions"], "swap_outs": counts["swap_outs"],
        "blocks_swapped_in": counts["blocks_swapped_in"], "blocks_swapped_out": counts["blocks_swapped_out"],
        "bytes_swapped": swapped_blocks * block_bytes,
        "blocks_copied": counts["blocks_copied"], "recomputed_tokens": counts["recomputed_tokens"],
        "reject_reasons": {str(k): int(v) for k, v in
                           requests.loc[requests.status == "rejected", "reject_reason"].value_counts().items()},
    }


class RunResult:
    """A finished run: its request frame, step records, summary, free extents (contiguous
    allocators) and tier tables (KV tiers). `steps` builds the step frame on first use; `save` writes steps.parquet from the
    records a row group at a time, without it."""

    def __init__(self, requests: pd.DataFrame, steps: StepRecorder, summary: dict,
                 free_extents: pd.DataFrame | None = None, tier_requests: pd.DataFrame | None = None,
                 tier_steps: pd.DataFrame | None = None) -> None:
        self.requests = requests
        self.step_records = steps
        self.summary = summary
        self.free_extents = free_extents
        self.tier_requests = tier_requests  # with KV tiers: tier_requests.parquet and tier_steps.parquet
        self.tier_steps = tier_steps

    @property
    def steps(self) -> pd.DataFrame:
        return self.step_records.to_frame()

    def step_frame(self, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
        """The step frame, or (`columns`) a frame of those columns only, built without the others."""
        return self.step_records.to_frame(columns)

    @classmethod
    def build(cls, engine, wall_s: float) -> "RunResult":
        rec = engine.rec
        rec.close()
        reqs = request_frame(engine.groups, engine.reqs)
        cfg = engine.config
        summary = summarize(reqs, rec, cfg.to_dict(), cfg.block_bytes, wall_s, engine.bm.num_total_gpu_blocks,
                            engine.bm.num_total_cpu_blocks, engine.bm.block_size)
        summary.update(engine.bm.stats())
        tiers = getattr(engine, "tiers", None)
        if tiers is None:
            return cls(reqs, rec, summary, engine.extents_frame())
        summary.update(tiers.stats())
        tier_reqs = tier_request_frame(engine.groups, hasattr(engine.sched, "onloading"))
        summary["tier_onload_wait_mean_s"] = float(tier_reqs.onload_wait_s.mean()) if len(tier_reqs) else 0.0
        return cls(reqs, rec, summary, engine.extents_frame(), tier_reqs, engine.tier_rec.to_frame())

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.requests.to_parquet(out / REQUESTS_FILE, index=False)
        write_steps(self.step_records, out / STEPS_FILE)
        if self.free_extents is not None:
            self.free_extents.to_parquet(out / FREE_EXTENTS_FILE, index=False)
        if self.tier_requests is not None:
            self.tier_requests.to_parquet(out / TIER_REQUESTS_FILE, index=False)
            self.tier_steps.to_parquet(out / TIER_STEPS_FILE, index=False)
        (out / SUMMARY_FILE).write_text(json.dumps(self.summary, indent=2, default=_json_default) + "\n")
        return out


def write_steps(records: StepRecorder, path: Path) -> None:
    """steps.parquet from the step records, one row group of `STEP_ROW_GROUP` steps at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dtypes = STEP_DTYPES_TP if records.comm else STEP_DTYPES
    schema = pa.schema([(c, pa.float64() if dtype == "float64" else pa.int64()) for c, dtype in dtypes.items()])
    with pq.ParquetWriter(path, schema, **STEP_ENCODING) as writer:
        for cols in records.row_groups(STEP_ROW_GROUP):
            writer.write_table(pa.table(cols, schema=schema))
            del cols  # before the next group is built


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")

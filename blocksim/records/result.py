"""A finished run: per-request and per-step frames, the summary, and the run directory writer.

A run keeps its request records as numpy columns (`RequestColumns`): the summary reads them and
requests.parquet is written from them, like steps.parquet from the step records, through Arrow
arrays built from their buffers (`blocksim.records.arrow`), so a replay that writes its run
directory never loads pandas; `RunResult.requests` builds the frame on first use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from blocksim.records import metrics
from blocksim.records.schema import (
    FREE_EXTENTS_FILE,
    REQUEST_COLUMNS,
    REQUEST_DTYPES,
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
from blocksim.records.tier_records import (TierStepRecorder, nan_skipping_mean, tier_columns_frame,
                                           tier_request_columns)

if TYPE_CHECKING:
    import pandas as pd

#: Steps per row group of steps.parquet: the columns of one row group are built and buffered by the
#: Parquet writer at a time, so this bounds the memory of writing (30 columns of 8 bytes: under 8 MB per group).
STEP_ROW_GROUP = 1 << 15
#: How steps.parquet's columns are encoded: plain values compressed by zstd. Dictionary encoding
#: (Parquet's default) holds a hash table of every distinct value of a column chunk while writing,
#: as much memory again as the steps themselves, and the file is smaller without it.
STEP_ENCODING = {"use_dictionary": False, "compression": "zstd"}


class RequestColumns:
    """requests.parquet's columns as numpy arrays (`schema.REQUEST_COLUMNS`): a column by name, the
    rows of a boolean mask (`columns[mask]`) and the number of rows, what the summary's metrics read."""

    __slots__ = ("columns",)

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.columns[key]
        return RequestColumns({c: v[key] for c, v in self.columns.items()})

    def __len__(self) -> int:
        return len(self.columns["request_id"])

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.columns)


def request_columns(groups, reqs) -> RequestColumns:
    """requests.parquet: the trace's columns (`reqs`, by name: the engine's request columns) plus
    each group's outcome and latencies, in `schema.REQUEST_COLUMNS` order."""
    groups = sorted(groups, key=lambda g: g.index)
    cols = {c: np.asarray(reqs[c]) for c in ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "n",
                                              "priority")}
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
    return RequestColumns({c: cols[c] for c in REQUEST_COLUMNS})


def request_frame(groups, reqs) -> pd.DataFrame:
    """`request_columns` as a frame."""
    return request_columns(groups, reqs).frame()


def _by_frequency(values) -> dict:
    """How often each value occurs, the most frequent first (ties in order of first occurrence)."""
    counts: dict = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def summarize(requests: RequestColumns | pd.DataFrame, steps: StepRecorder, config, block_bytes: int, wall_s: float,
              num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> dict:
    """summary.json: the run's configuration and sizes, and its metrics (`blocksim.records.metrics`),
    from the step records' totals (no step frame is built)."""
    fin = metrics.finished(requests)
    status = np.asarray(requests["status"])
    counts = metrics.event_counts_from(requests, {c: steps.column_sum(c) for c in metrics.EVENT_STEP_COLUMNS})
    end_s = steps.end_s()
    swapped_blocks = counts["blocks_swapped_in"] + counts["blocks_swapped_out"]
    return {
        "version": RUN_FORMAT_VERSION,
        "config": config,
        "num_gpu_blocks": num_gpu_blocks, "num_cpu_blocks": num_cpu_blocks, "block_size": block_size,
        "capacity_tokens": num_gpu_blocks * block_size,
        "requests": int(len(requests)), "finished": int(len(fin)),
        "rejected": int((status == "rejected").sum()),
        "simulated_s": end_s, "wall_s": wall_s, "steps": steps.num_steps,
        **metrics.throughput_until(requests, end_s),
        **metrics.latency_stats(requests, metrics.SUMMARY_LATENCY_METRICS),
        "preemptions": counts["preemptions"], "swap_outs": counts["swap_outs"],
        "blocks_swapped_in": counts["blocks_swapped_in"], "blocks_swapped_out": counts["blocks_swapped_out"],
        "bytes_swapped": swapped_blocks * block_bytes,
        "blocks_copied": counts["blocks_copied"], "recomputed_tokens": counts["recomputed_tokens"],
        "reject_reasons": {str(k): int(v) for k, v in
                           _by_frequency(np.asarray(requests["reject_reason"])[status == "rejected"]).items()},
    }


class RunResult:
    """A finished run: its request frame, step records, summary, free extents (contiguous
    allocators) and tier tables (KV tiers). `requests`, `steps` and the tier tables build their
    frames on first use; `save` writes steps.parquet from the records a row group at a time, without
    a frame."""

    def __init__(self, requests: RequestColumns | pd.DataFrame, steps: StepRecorder, summary: dict,
                 free_extents: pd.DataFrame | None = None,
                 tier_requests: dict[str, np.ndarray] | pd.DataFrame | None = None,
                 tier_steps: TierStepRecorder | pd.DataFrame | None = None) -> None:
        self._requests = requests
        self.step_records = steps
        self.summary = summary
        self.free_extents = free_extents
        # with KV tiers: tier_requests.parquet's columns and tier_steps.parquet's records (or frames)
        self._tier_requests = tier_requests
        self._tier_steps = tier_steps

    @property
    def requests(self) -> pd.DataFrame:
        """The request frame (built from the request columns on first use)."""
        if isinstance(self._requests, RequestColumns):
            self._requests = self._requests.frame()
        return self._requests

    @property
    def tier_requests(self) -> pd.DataFrame | None:
        """tier_requests.parquet's frame (KV tiers; built on first use), else None."""
        if isinstance(self._tier_requests, dict):
            self._tier_requests = tier_columns_frame(self._tier_requests)
        return self._tier_requests

    @property
    def tier_steps(self) -> pd.DataFrame | None:
        """tier_steps.parquet's frame (KV tiers; built on first use), else None."""
        if isinstance(self._tier_steps, TierStepRecorder):
            self._tier_steps = self._tier_steps.to_frame()
        return self._tier_steps

    @property
    def steps(self) -> pd.DataFrame:
        return self.step_records.to_frame()

    def step_columns(self, columns: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """The step records' columns (`columns`: those only) as arrays, built without a frame."""
        rec = self.step_records
        return next(rec.row_groups(max(rec.num_steps, 1), columns))

    def step_frame(self, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
        """The step frame, or (`columns`) a frame of those columns only, built without the others."""
        return self.step_records.to_frame(columns)

    @classmethod
    def build(cls, engine, wall_s: float) -> "RunResult":
        rec = engine.rec
        rec.close()
        reqs = request_columns(engine.groups, engine.reqs)
        cfg = engine.config
        summary = summarize(reqs, rec, cfg.to_dict(), cfg.block_bytes, wall_s, engine.bm.num_total_gpu_blocks,
                            engine.bm.num_total_cpu_blocks, engine.bm.block_size)
        summary.update(engine.bm.stats())
        tiers = getattr(engine, "tiers", None)
        if tiers is None:
            return cls(reqs, rec, summary, engine.extents_frame())
        summary.update(tiers.stats())
        tier_reqs = tier_request_columns(engine.groups, hasattr(engine.sched, "onloading"))
        wait = tier_reqs["onload_wait_s"]
        summary["tier_onload_wait_mean_s"] = nan_skipping_mean(wait) if len(wait) else 0.0
        return cls(reqs, rec, summary, engine.extents_frame(), tier_reqs, engine.tier_rec)

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if isinstance(self._requests, RequestColumns):
            write_requests(self._requests, out / REQUESTS_FILE)
        else:
            self._requests.to_parquet(out / REQUESTS_FILE, index=False)
        write_steps(self.step_records, out / STEPS_FILE)
        if self.free_extents is not None:
            self.free_extents.to_parquet(out / FREE_EXTENTS_FILE, index=False)
        if self.tier_requests is not None:
            self.tier_requests.to_parquet(out / TIER_REQUESTS_FILE, index=False)
            self.tier_steps.to_parquet(out / TIER_STEPS_FILE, index=False)
        (out / SUMMARY_FILE).write_text(json.dumps(self.summary, indent=2, default=_json_default) + "\n")
        return out


_ARROW_TYPES = {"int64": "int64", "float64": "float64", "str": "large_string"}  # as a frame of them is written


def write_requests(requests: RequestColumns, path: Path) -> None:
    """requests.parquet from the request columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from blocksim.records.arrow import table

    schema = pa.schema([(c, getattr(pa, _ARROW_TYPES[t])()) for c, t in REQUEST_DTYPES.items()])
    pq.write_table(table(requests.columns, schema), path)


def write_steps(records: StepRecorder, path: Path) -> None:
    """steps.parquet from the step records, one row group of `STEP_ROW_GROUP` steps at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from blocksim.records.arrow import table

    dtypes = STEP_DTYPES_TP if records.comm else STEP_DTYPES
    schema = pa.schema([(c, pa.float64() if dtype == "float64" else pa.int64()) for c, dtype in dtypes.items()])
    with pq.ParquetWriter(path, schema, **STEP_ENCODING) as writer:
        for cols in records.row_groups(STEP_ROW_GROUP):
            writer.write_table(table(cols, schema))
            del cols  # before the next group is built


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")

"""The run directory, declared once: file names, each table's columns in order with their dtypes,
the memory categories, the format version and the summary keys readers rely on.

The writer (`blocksim.records.result`, `blocksim.records.steps`) builds its frames from these
declarations; readers (`analysis.rundir`, the sweep) check a directory against them. A table's
``*_COLUMNS`` is everything written, in order; ``*_REQUIRED`` is the subset a reader needs (older
run directories without the other columns still load).

A run directory holds:

- ``requests.parquet``: one row per request (`REQUEST_DTYPES`);
- ``steps.parquet``: one row per engine step (`STEP_DTYPES`);
- ``summary.json``: the run's configuration and its summary metrics (`SUMMARY_KEYS` at least);
- ``free_extents.parquet``: free extents sampled over time, contiguous allocators only
  (`FREE_EXTENT_DTYPES`);
- ``tier_requests.parquet`` and ``tier_steps.parquet``: with KV tiers only, per request its hits per
  tier and its TTFT split, per step the bytes each direction moved (`TIER_REQUEST_DTYPES`,
  `TIER_STEP_DTYPES`).
"""

from __future__ import annotations

from blocksim.interfaces import MemoryBreakdown

#: Written to ``summary.json["version"]``.
RUN_FORMAT_VERSION = 1
#: Major versions of the run-directory format that readers accept.
SUPPORTED_MAJOR_VERSIONS = (0, 1)

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "summary.json"
FREE_EXTENTS_FILE = "free_extents.parquet"
TIER_REQUESTS_FILE = "tier_requests.parquet"
TIER_STEPS_FILE = "tier_steps.parquet"

#: The five memory categories, in token slots, in stacking order (bottom to top): the fields of the
#: memory managers' `MemoryBreakdown`; they sum to the GPU capacity in token slots at every step.
MEMORY_CATEGORIES: tuple[str, ...] = MemoryBreakdown._fields
MEMORY_COLUMNS = tuple(f"mem_{c}" for c in MEMORY_CATEGORIES)

#: requests.parquet, column -> dtype, in written order; "str" is text (a Parquet string column).
REQUEST_DTYPES = {
    "request_id": "int64", "arrival_s": "float64", "prompt_tokens": "int64", "output_tokens": "int64",
    "n": "int64", "priority": "int64", "status": "str", "reject_reason": "str",
    "first_scheduled_s": "float64", "first_token_s": "float64", "finish_s": "float64",
    "queue_s": "float64", "ttft_s": "float64", "tpot_s": "float64", "e2e_s": "float64",
    "norm_latency_s": "float64", "preemptions": "int64", "swaps": "int64", "recomputed_tokens": "int64",
}
REQUEST_COLUMNS = tuple(REQUEST_DTYPES)
#: The requests.parquet columns readers need.
REQUEST_REQUIRED = tuple(c for c in REQUEST_COLUMNS if c not in ("priority", "reject_reason"))
#: SLO keys and the requests.parquet column each bounds (`blocksim.records.metrics.slo_met`).
SLO_COLUMNS = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "e2e": "e2e_s",
    "queue": "queue_s",
    "norm_latency": "norm_latency_s",
}

#: The tensor-parallel all-reduces' time: a column of steps.parquet only for runs with tensor_parallel > 1.
COMM_COLUMN = "t_comm_s"
#: Every column a step's row records (steps.parquet's but `step`), in order.
ROW_COLUMNS = (
    "start_s", "duration_s", "num_prefill_seqs", "prefill_tokens", "num_decode_seqs",
    "decode_ctx_tokens", "running", "waiting", "swapped", "gpu_blocks_used", "cpu_blocks_used",
    "blocks_swapped_in", "blocks_swapped_out", "blocks_copied", "preempted", "finished", "rejected",
    "t_linear_s", "t_attn_prefill_s", "t_attn_decode_s", "t_swap_s", "t_copy_s", COMM_COLUMN, "t_overhead_s",
    *MEMORY_COLUMNS,
)
#: steps.parquet's columns in written order for a run with tensor_parallel > 1 (`COMM_COLUMN` included).
STEP_COLUMNS_TP = ("step",) + ROW_COLUMNS
#: steps.parquet's columns in written order (a run on one GPU: no `COMM_COLUMN`); times (``*_s``)
#: are float64, everything else int64.
STEP_COLUMNS = tuple(c for c in STEP_COLUMNS_TP if c != COMM_COLUMN)
FLOAT_COLUMNS = frozenset(c for c in ROW_COLUMNS if c.endswith("_s"))
STEP_DTYPES = {c: "float64" if c in FLOAT_COLUMNS else "int64" for c in STEP_COLUMNS}
STEP_DTYPES_TP = {c: "float64" if c in FLOAT_COLUMNS else "int64" for c in STEP_COLUMNS_TP}
#: The steps.parquet columns readers need.
STEP_REQUIRED = (
    "step", "start_s", "duration_s", "num_prefill_seqs", "num_decode_seqs",
    "running", "waiting", "swapped", "blocks_swapped_in", "blocks_swapped_out",
    "preempted", *MEMORY_COLUMNS,
)

#: free_extents.parquet, column -> dtype, in written order; all columns are required.
FREE_EXTENT_DTYPES = {"step": "int64", "start_s": "float64", "extent_tokens": "int64"}
FREE_EXTENT_COLUMNS = tuple(FREE_EXTENT_DTYPES)

#: The summary.json keys readers need.
SUMMARY_KEYS = ("version", "config", "capacity_tokens", "simulated_s")

#: tier_requests.parquet (KV tiers only), column -> dtype: prompt tokens hit per tier over all the
#: request's admissions, tokens found in a tier but recomputed by the onload mode, seconds waiting for
#: loads, and TTFT split into queueing (`ttft_s - ttft_onload_s - ttft_prefill_s`), onload wait before
#: the first token, and prefill (first scheduled to first token).
TIER_REQUEST_DTYPES = {
    "request_id": "int64", "gpu_hit_tokens": "int64", "host_hit_tokens": "int64", "disk_hit_tokens": "int64",
    "onload_skipped_tokens": "int64", "onload_wait_s": "float64", "ttft_queue_s": "float64",
    "ttft_onload_s": "float64", "ttft_prefill_s": "float64",
}
TIER_REQUEST_COLUMNS = tuple(TIER_REQUEST_DTYPES)
#: tier_steps.parquet (KV tiers only): bytes copied by each step, per direction (stores issued at the
#: step's end and loads and write-backs issued when it was scheduled), chunks dropped from each tier,
#: and requests holding blocks for loads after it.
TIER_STEP_DTYPES = {
    "step": "int64", "bytes_gpu_to_host": "int64", "bytes_gpu_to_disk": "int64", "bytes_host_to_disk": "int64",
    "bytes_host_to_gpu": "int64", "bytes_disk_to_gpu": "int64", "host_evictions": "int64", "disk_evictions": "int64",
    "onloading": "int64",
}
TIER_STEP_COLUMNS = tuple(TIER_STEP_DTYPES)

"""Columnar step records: single steps as row tuples, spans of steps as column arrays.

Rows are kept in arrival order as a list of chunks; `to_frame()` concatenates them once at the end.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Every column of steps.parquet but `step`, in the order rows are given to `add`.
ROW_COLUMNS = (
    "start_s", "duration_s", "num_prefill_seqs", "prefill_tokens", "num_decode_seqs",
    "decode_ctx_tokens", "running", "waiting", "swapped", "gpu_blocks_used", "cpu_blocks_used",
    "blocks_swapped_in", "blocks_swapped_out", "blocks_copied", "preempted", "finished", "rejected",
    "t_linear_s", "t_attn_prefill_s", "t_attn_decode_s", "t_swap_s", "t_copy_s", "t_overhead_s",
    "mem_token_states", "mem_reservation", "mem_internal_frag", "mem_external_frag", "mem_free",
)
STEP_COLUMNS = ("step",) + ROW_COLUMNS
FLOAT_COLUMNS = frozenset(c for c in ROW_COLUMNS if c.endswith("_s"))


class StepRecorder:
    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self._chunks: list[dict[str, np.ndarray]] = []
        self.num_steps = 0

    def add(self, row: tuple) -> None:
        """One step: values in `ROW_COLUMNS` order."""
        self._rows.append(row)
        self.num_steps += 1

    def add_many(self, k: int, values: dict) -> None:
        """`k` steps; each value is a scalar (repeated) or an array of length k."""
        self._flush()
        self._chunks.append({c: np.broadcast_to(np.asarray(values[c]), (k,)) for c in ROW_COLUMNS})
        self.num_steps += k

    def _flush(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows))
            self._chunks.append({c: np.asarray(v) for c, v in zip(ROW_COLUMNS, cols)})
            self._rows = []

    def to_frame(self) -> pd.DataFrame:
        self._flush()
        data = {"step": np.arange(self.num_steps, dtype=np.int64)}
        for c in ROW_COLUMNS:
            dtype = np.float64 if c in FLOAT_COLUMNS else np.int64
            data[c] = (np.concatenate([ch[c].astype(dtype, copy=False) for ch in self._chunks])
                       if self._chunks else np.zeros(0, dtype))
        return pd.DataFrame(data)

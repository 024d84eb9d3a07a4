"""Records of the KV tiers: per step, the bytes each direction moved; per request, hits per tier and
the TTFT split (`blocksim.records.schema.TIER_STEP_DTYPES`, `TIER_REQUEST_DTYPES`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from blocksim.records.schema import TIER_REQUEST_COLUMNS, TIER_REQUEST_DTYPES, TIER_STEP_COLUMNS, TIER_STEP_DTYPES

if TYPE_CHECKING:
    import pandas as pd

class TierStepRecorder:
    """Per step, the tiers' cumulative counters after it (`TierStore.totals`); `to_frame` takes
    the differences. Most steps move nothing: consecutive steps with equal counters are kept as
    one run of them."""

    def __init__(self) -> None:
        self._totals: list[tuple] = []  # the counters of each run of steps
        self._steps: list[int] = []     # the steps of each run
        self._onloading: list[int] = []

    def add(self, totals: tuple, onloading: int, steps: int = 1) -> None:
        """`steps` steps (a span's further steps move nothing) ending with these totals."""
        if steps > 1:
            if self._totals:
                self._steps[-1] += steps - 1
            else:
                self._totals.append((0,) * len(totals))
                self._steps.append(steps - 1)
            self._onloading.extend([onloading] * (steps - 1))
        if self._totals and (self._totals[-1] is totals or self._totals[-1] == totals):
            self._steps[-1] += 1
        else:
            self._totals.append(totals)
            self._steps.append(1)
        self._onloading.append(onloading)

    def to_frame(self) -> pd.DataFrame:
        n = len(self._onloading)
        runs = np.array(self._totals, np.int64).reshape(-1, 7)
        steps = np.array(self._steps, np.int64)
        table = np.zeros((n, 9), np.int64)  # the columns of TIER_STEP_COLUMNS, all int64
        table[:, 0] = np.arange(n, dtype=np.int64)
        # a step's moves: nonzero only at the first step of a run
        table[np.cumsum(steps) - steps, 1:8] = np.diff(runs, axis=0, prepend=np.zeros((1, 7), np.int64))
        table[:, 8] = self._onloading
        import pandas as pd

        return pd.DataFrame(table, columns=list(TIER_STEP_COLUMNS)).astype(TIER_STEP_DTYPES)


def tier_request_columns(groups, onload_before_schedule: bool = True) -> dict[str, np.ndarray]:
    """tier_requests.parquet's columns (`TIER_REQUEST_COLUMNS` order): one row per request, in trace
    order. `onload_before_schedule`: a request waits for its loads before it is scheduled (vLLM
    V1), else inside the step that prefills it (the step lasts until its loads land)."""
    groups = sorted(groups, key=lambda g: g.index)
    hits = np.array([g.tier_tokens or (0, 0, 0) for g in groups], np.int64).reshape(-1, 3)
    arrival = np.array([g.arrival_s for g in groups], np.float64)
    first_sched = np.array([g.first_scheduled_s for g in groups], np.float64)
    first_token = np.array([g.first_token_s for g in groups], np.float64)
    onload_ttft = np.array([g.onload_ttft_s for g in groups], np.float64)
    cols = {
        "request_id": np.array([g.request_id for g in groups], np.int64),
        "gpu_hit_tokens": hits[:, 0], "host_hit_tokens": hits[:, 1], "disk_hit_tokens": hits[:, 2],
        "onload_skipped_tokens": np.array([g.onload_skipped_tokens for g in groups], np.int64),
        "onload_wait_s": np.array([g.onload_wait_s for g in groups], np.float64),
        "ttft_queue_s": first_sched - arrival - (onload_ttft if onload_before_schedule else 0.0),
        "ttft_onload_s": np.where(np.isnan(first_token), np.nan, onload_ttft),
        "ttft_prefill_s": first_token - first_sched - (0.0 if onload_before_schedule else onload_ttft),
    }
    return {c: cols[c] for c in TIER_REQUEST_COLUMNS}


def tier_columns_frame(columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """A frame of `tier_request_columns`, in `TIER_REQUEST_DTYPES`."""
    import pandas as pd

    return pd.DataFrame(columns).astype(TIER_REQUEST_DTYPES)


def nan_skipping_mean(values: np.ndarray) -> float:
    """The mean of `values` without its NaNs, as pandas' `Series.mean` sums it (NaNs as zeros in the
    sum); NaN when every value is NaN."""
    missing = np.isnan(values)
    count = values.size - int(missing.sum())
    if not count:
        return math.nan
    return float(np.where(missing, 0.0, values).sum() / count)

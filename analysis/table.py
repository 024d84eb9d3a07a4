"""Runs as table rows: one run directory as a flat row of metrics, and a table of rows Parquet accepts.

The comparison table (``summary.parquet``) and the sweep table (``sweep.parquet``) are built from
these rows.
"""

from __future__ import annotations

import pandas as pd

from analysis.metrics import (
    goodput_metrics,
    memory_fractions,
    offered_rate,
    prefix_hit_rate,
    queue_means,
    token_states_of_used,
)
from analysis.rundir import Run

#: Changes whenever `run_row`'s columns do, so saved rows of earlier runs are recomputed.
ROW_VERSION = 2


def run_row(run: Run, slo: dict[str, float] | None = None) -> dict:
    """One run as a flat row: its summary's scalars, offered rate, prefix hit rate, memory fractions
    (and the share of used memory holding token states), mean running and waiting groups, and
    goodput under ``slo`` when given."""
    row = {k: v for k, v in run.summary.items() if not isinstance(v, (dict, list))}
    row["offered_rate_req_s"] = offered_rate(run.requests)
    hit_rate = prefix_hit_rate(run.summary)
    if hit_rate is not None:
        row["prefix_hit_rate"] = hit_rate
    if slo:
        row.update(goodput_metrics(run, slo))
    fractions = memory_fractions(run)
    row.update(fractions)
    row["token_states_of_used_frac"] = token_states_of_used(fractions)
    row.update(queue_means(run))
    return row


def parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns mixing numbers and strings across runs become numbers where possible, else text."""
    for col in df.columns[df.dtypes == object]:
        values = df[col].dropna()
        if values.map(lambda v: isinstance(v, str)).all():
            continue
        numeric = pd.to_numeric(df[col], errors="coerce")
        ok = numeric.notna() | df[col].isna()
        df[col] = numeric if ok.all() else df[col].map(lambda v: None if v is None else str(v))
    return df

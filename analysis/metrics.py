"""Metrics from one run: per request, per run, and where the KV memory went over time.

The run metrics are `blocksim.records.metrics`, the same functions that write ``summary.json``,
applied to a loaded run directory; its docstring states the conventions (throughput and goodput
per second of the serving interval, from the first arrival to the end of the last step;
percentiles over finished requests; time-weighted memory means). This module adds what only
the analysis needs: per-request tables, prefix-cache hit rates and time-binned series.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.rundir import Run
from blocksim.records import metrics
from blocksim.records.metrics import LATENCY_METRICS, PERCENTILES, offered_rate, slo_met, time_weights
from blocksim.records.schema import MEMORY_CATEGORIES, MEMORY_COLUMNS

__all__ = [
    "LATENCY_METRICS", "PERCENTILES", "REQUEST_METRIC_COLUMNS", "goodput_metrics", "memory_fractions",
    "memory_means", "memory_timeseries", "offered_rate", "prefix_hit_rate", "request_metrics", "run_metrics",
    "queue_means", "slo_met", "time_binned", "time_weights", "token_states_of_used",
]

REQUEST_METRIC_COLUMNS = (
    "request_id", "status", "arrival_s", "prompt_tokens", "output_tokens", "n",
    "queue_s", "ttft_s", "tpot_s", "e2e_s", "norm_latency_s",
    "preemptions", "swaps", "recomputed_tokens",
)


def request_metrics(run: Run) -> pd.DataFrame:
    """Per-request latency and preemption metrics (one row per request, rejected ones included)."""
    return run.requests.loc[:, list(REQUEST_METRIC_COLUMNS)].reset_index(drop=True)


def goodput_metrics(run: Run, slo: dict[str, float]) -> dict[str, float]:
    """Requests within the SLO: count, per second of serving interval, and share of all requests."""
    return metrics.goodput(run.requests, run.steps, slo)


def memory_means(run: Run) -> dict[str, float]:
    """Time-weighted mean token slots in each memory category (keys: ``MEMORY_CATEGORIES``)."""
    return metrics.memory_means(run.steps)


def memory_fractions(run: Run) -> dict[str, float]:
    """Time-weighted mean share of capacity per category: ``token_states_frac`` ... ``free_frac``.

    The five sum to 1 when every step's categories sum to the capacity.
    """
    return metrics.memory_fractions(run.steps, run.capacity_tokens)


def token_states_of_used(fractions: dict[str, float]) -> float:
    """Share of the used KV capacity (all but ``free``) that holds token states, from time-averaged
    fractions: ``token_states_frac / (1 - free_frac)``; NaN when nothing was used."""
    used = 1.0 - fractions["free_frac"]
    return fractions["token_states_frac"] / used if used > 0 else math.nan


def queue_means(run: Run) -> dict[str, float]:
    """Time-weighted mean request groups running (the batch) and waiting: ``running_mean``,
    ``waiting_mean`` (NaN without steps)."""
    steps = run.steps
    w = time_weights(steps)
    if len(steps) == 0 or not w.sum() > 0:
        return {"running_mean": math.nan, "waiting_mean": math.nan}
    return {f"{c}_mean": float(np.average(steps[c].to_numpy(dtype=float), weights=w)) for c in ("running", "waiting")}


def prefix_hit_rate(summary: dict) -> float | None:
    """Prefix-cache hits per query, or None when the run has no prefix cache counters."""
    hits, queries = summary.get("prefix_cache_hits"), summary.get("prefix_cache_queries")
    if hits is None or queries is None:
        return None
    return hits / queries if queries > 0 else math.nan


def run_metrics(run: Run, slo: dict[str, float] | None = None) -> dict[str, float]:
    """One run's headline numbers as a flat dict, computed from its records (not read from its
    summary): the same values ``summary.json`` holds under the same keys, plus queue latency,
    offered rate, goodput under ``slo``, prefix hit rate and memory fractions."""
    req, steps = run.requests, run.steps
    counts = metrics.event_counts(req, steps)
    m: dict[str, float] = {
        "requests": len(req),
        "finished": len(metrics.finished(req)),
        "rejected": int(req["status"].eq("rejected").sum()),
        "simulated_s": metrics.simulated_s(steps),
        "offered_rate_req_s": offered_rate(req),
        **metrics.throughput(req, steps),
        **metrics.latency_stats(req, LATENCY_METRICS),
    }
    if slo:
        m.update(goodput_metrics(run, slo))
    m.update({k: counts[k] for k in ("preemptions", "swap_outs", "blocks_swapped_in", "blocks_swapped_out")})
    m["bytes_swapped"] = float(run.summary.get("bytes_swapped", math.nan))
    m["recomputed_tokens"] = counts["recomputed_tokens"]
    hit_rate = prefix_hit_rate(run.summary)
    if hit_rate is not None:
        m["prefix_hit_rate"] = hit_rate
    fractions = memory_fractions(run)
    m.update(fractions)
    m["token_states_of_used_frac"] = token_states_of_used(fractions)
    m.update(queue_means(run))
    return m


def time_binned(
    steps: pd.DataFrame,
    columns: list[str],
    bins: int = 400,
    how: str = "mean",
    width_s: float | None = None,
) -> pd.DataFrame:
    """Downsample per-step columns onto equal time bins (a step counts in the bin it starts in).

    The bins span the run from the first step's start to the last step's end: ``bins`` of them,
    or as many as it takes of ``width_s`` seconds each when ``width_s`` is given.

    ``how="mean"``: duration-weighted mean per bin (empty bins dropped), for states such as
    memory or queue lengths. ``how="rate"``: per-bin sum divided by the bin width, i.e. events
    per second, for counters such as ``preempted``. The index ``time_s`` is the bin centre.
    Cost is O(steps) with numpy, so 500k-step runs bin in milliseconds.
    """
    if how not in ("mean", "rate"):
        raise ValueError(f"how must be 'mean' or 'rate', not {how!r}")
    start = steps["start_s"].to_numpy(dtype=float)
    if len(start) == 0:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="time_s"), dtype=float)
    t0, t1 = float(start.min()), float((steps["start_s"] + steps["duration_s"]).max())
    if width_s is not None:
        if width_s <= 0:
            raise ValueError(f"width_s must be positive, not {width_s}")
        width, bins = width_s, max(1, math.ceil((t1 - t0) / width_s - 1e-9))
    else:
        width = (t1 - t0) / bins if t1 > t0 else 1.0
    idx = np.minimum(((start - t0) / width).astype(np.int64), bins - 1)
    centres = t0 + (np.arange(bins) + 0.5) * width
    data = {}
    if how == "mean":
        w = time_weights(steps)
        wsum = np.bincount(idx, weights=w, minlength=bins)
        keep = wsum > 0
        for col in columns:
            total = np.bincount(idx, weights=steps[col].to_numpy(dtype=float) * w, minlength=bins)
            data[col] = total[keep] / wsum[keep]
        centres = centres[keep]
    else:
        for col in columns:
            data[col] = np.bincount(idx, weights=steps[col].to_numpy(dtype=float), minlength=bins) / width
    return pd.DataFrame(data, index=pd.Index(centres, name="time_s"))


def memory_timeseries(run: Run, bins: int | None = None) -> pd.DataFrame:
    """Token slots per memory category over time: every step (``bins=None``) or time-binned."""
    cols = list(MEMORY_COLUMNS)
    if bins is None:
        ts = run.steps.set_index("start_s")[cols]
        ts.index.name = "time_s"
    else:
        ts = time_binned(run.steps, cols, bins)
    return ts.rename(columns=dict(zip(MEMORY_COLUMNS, MEMORY_CATEGORIES)))

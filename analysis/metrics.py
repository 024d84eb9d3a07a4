"""Metrics from one run: per request, per run, and where the KV memory went over time.

Conventions:
- Throughput divides by the run's simulated time (``summary["simulated_s"]``) and counts
  finished requests only; a request of ``n`` sequences produced ``n * output_tokens`` tokens.
- Percentiles are numpy's default (linear interpolation) over finished requests.
- Memory means are time-weighted: a step's memory state holds for its ``duration_s``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.rundir import MEMORY_CATEGORIES, MEMORY_COLUMNS, Run
from analysis.slo import SLO_COLUMNS

LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue")
PERCENTILES = (50, 90, 99)

REQUEST_METRIC_COLUMNS = (
    "request_id", "status", "arrival_s", "prompt_tokens", "output_tokens", "n",
    "queue_s", "ttft_s", "tpot_s", "e2e_s", "norm_latency_s",
    "preemptions", "swaps", "recomputed_tokens",
)


def request_metrics(run: Run) -> pd.DataFrame:
    """Per-request latency and preemption metrics (one row per request, rejected ones included)."""
    return run.requests.loc[:, list(REQUEST_METRIC_COLUMNS)].reset_index(drop=True)


def slo_met(requests: pd.DataFrame, slo: dict[str, float]) -> pd.Series:
    """True for finished requests within every bound of ``slo``.

    A missing TPOT (single-token outputs have none) satisfies a TPOT bound.
    """
    ok = requests["status"].eq("finished")
    for key, bound in slo.items():
        values = requests[SLO_COLUMNS[key]]
        within = values <= bound
        if key == "tpot":
            within |= values.isna()
        ok &= within
    return ok


def _per_second(amount: float, duration_s: float) -> float:
    return amount / duration_s if duration_s > 0 else math.nan


def goodput_metrics(run: Run, slo: dict[str, float]) -> dict[str, float]:
    """Requests within the SLO: count, per second of simulated time, and share of all requests."""
    good = int(slo_met(run.requests, slo).sum())
    total = len(run.requests)
    return {
        "goodput_requests": good,
        "goodput_requests_per_s": _per_second(good, float(run.summary["simulated_s"])),
        "slo_attainment": good / total if total else math.nan,
    }


def time_weights(steps: pd.DataFrame) -> np.ndarray:
    """Step durations as weights; equal weights when the run took no simulated time."""
    w = steps["duration_s"].to_numpy(dtype=float)
    return w if w.sum() > 0 else np.ones_like(w)


def memory_means(run: Run) -> dict[str, float]:
    """Time-weighted mean token slots in each memory category (keys: ``MEMORY_CATEGORIES``)."""
    if run.steps.empty:
        return {c: math.nan for c in MEMORY_CATEGORIES}
    w = time_weights(run.steps)
    return {
        c: float(np.average(run.steps[col].to_numpy(dtype=float), weights=w))
        for c, col in zip(MEMORY_CATEGORIES, MEMORY_COLUMNS)
    }


def memory_fractions(run: Run) -> dict[str, float]:
    """Time-weighted mean share of capacity per category: ``token_states_frac`` ... ``free_frac``.

    The five sum to 1 when every step's categories sum to the capacity.
    """
    capacity = run.capacity_tokens
    return {
        f"{c}_frac": (mean / capacity if capacity > 0 else math.nan)
        for c, mean in memory_means(run).items()
    }


def prefix_hit_rate(summary: dict) -> float | None:
    """Prefix-cache hits per query, or None when the run has no prefix cache counters."""
    hits, queries = summary.get("prefix_cache_hits"), summary.get("prefix_cache_queries")
    if hits is None or queries is None:
        return None
    return hits / queries if queries > 0 else math.nan


def offered_rate(requests: pd.DataFrame) -> float:
    """Arrival rate in requests/s: (count - 1) / span of arrivals; NaN with under two arrivals."""
    arrivals = requests["arrival_s"]
    span = arrivals.max() - arrivals.min() if len(arrivals) else 0.0
    return (len(arrivals) - 1) / span if span > 0 else math.nan


def run_metrics(run: Run, slo: dict[str, float] | None = None) -> dict[str, float]:
    """One run's headline numbers as a flat dict (see the module docstring for conventions)."""
    req = run.requests
    done = req[req["status"].eq("finished")]
    duration = float(run.summary["simulated_s"])
    out_tokens = float((done["output_tokens"] * done["n"]).sum())
    m: dict[str, float] = {
        "requests": len(req),
        "finished": len(done),
        "rejected": int(req["status"].eq("rejected").sum()),
        "simulated_s": duration,
        "offered_rate_req_s": offered_rate(req),
        "requests_per_s": _per_second(len(done), duration),
        "output_tokens_per_s": _per_second(out_tokens, duration),
        "total_tokens_per_s": _per_second(out_tokens + float(done["prompt_tokens"].sum()), duration),
    }
    for name in LATENCY_METRICS:
        values = done[f"{name}_s"].dropna().to_numpy(dtype=float)
        m[f"{name}_mean_s"] = float(values.mean()) if len(values) else math.nan
        for p in PERCENTILES:
            m[f"{name}_p{p}_s"] = float(np.percentile(values, p)) if len(values) else math.nan
    m["norm_latency_mean_s"] = float(done["norm_latency_s"].mean()) if len(done) else math.nan
    if slo:
        m.update(goodput_metrics(run, slo))
    steps = run.steps
    m["preemptions"] = int(steps["preempted"].sum())
    m["swap_outs"] = int(req["swaps"].sum())
    m["blocks_swapped_in"] = int(steps["blocks_swapped_in"].sum())
    m["blocks_swapped_out"] = int(steps["blocks_swapped_out"].sum())
    m["bytes_swapped"] = float(run.summary.get("bytes_swapped", math.nan))
    m["recomputed_tokens"] = int(req["recomputed_tokens"].sum())
    hit_rate = prefix_hit_rate(run.summary)
    if hit_rate is not None:
        m["prefix_hit_rate"] = hit_rate
    m.update(memory_fractions(run))
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

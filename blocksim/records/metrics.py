"""Run metrics from the request and step records: the one implementation behind ``summary.json``
(`blocksim.records.result.summarize`), the analysis package (`analysis.metrics.run_metrics`) and
its reports.

Conventions:

- Throughput and goodput count finished requests (a request of ``n`` sequences produced
  ``n * output_tokens`` output tokens; a rejected request's prompt is not counted) per second of
  the *serving interval*: from the first request's arrival to the end of the last step. Time
  before the first arrival is not time the system served anything, so a trace whose clock starts
  at 5.5 s gives the same throughput as the same trace starting at 0 s. The engine rebases
  arrivals so the first request arrives at 0 s on every path, so for the runs it writes the
  interval equals ``simulated_s``.
- Latency statistics are over finished requests with a finite value (single-token outputs have
  no TPOT); percentiles are numpy's default (linear interpolation).
- Memory means are time-weighted: a step's memory state holds for its ``duration_s``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from blocksim.records.schema import MEMORY_CATEGORIES, MEMORY_COLUMNS, SLO_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

# `finished` ... `event_counts_from` read a request frame or a run's request columns
# (`blocksim.records.result.RequestColumns`) alike: a column by name, the rows of a mask, len().

#: Latency metrics (``<name>_s`` columns of requests.parquet) with statistics in `run_metrics`.
LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue")
#: The latency metrics summary.json reports.
SUMMARY_LATENCY_METRICS = ("ttft", "tpot", "e2e")
PERCENTILES = (50, 90, 99)

def finished(requests: pd.DataFrame) -> pd.DataFrame:
    """The finished requests' rows."""
    return requests[requests["status"] == "finished"]


def simulated_s(steps: pd.DataFrame) -> float:
    """When the last step ends (simulated seconds); 0 for a run without steps."""
    if not len(steps):
        return 0.0
    return float(steps["start_s"].iloc[-1] + steps["duration_s"].iloc[-1])


def serving_interval_s(requests: pd.DataFrame, steps: pd.DataFrame) -> float:
    """Seconds from the first request's arrival to the end of the last step; 0 without requests."""
    return interval_until(requests, simulated_s(steps))


def interval_until(requests: pd.DataFrame, end_s: float) -> float:
    """Seconds from the first request's arrival to `end_s`; 0 without requests."""
    if not len(requests):
        return 0.0
    return end_s - float(requests["arrival_s"].min())


def per_second(amount: float, duration_s: float) -> float:
    """``amount / duration_s``; NaN when no time passed."""
    return amount / duration_s if duration_s > 0 else math.nan


def throughput(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float]:
    """Finished requests, output tokens and prompt plus output tokens per second of serving interval."""
    return throughput_until(requests, simulated_s(steps))


def throughput_until(requests: pd.DataFrame, end_s: float) -> dict[str, float]:
    """`throughput` of a run whose last step ends at `end_s`."""
    done = finished(requests)
    span = interval_until(requests, end_s)
    out_tokens = float((done["output_tokens"] * done["n"]).sum())
    in_tokens = float(done["prompt_tokens"].sum())
    return {
        "requests_per_s": per_second(len(done), span),
        "output_tokens_per_s": per_second(out_tokens, span),
        "total_tokens_per_s": per_second(out_tokens + in_tokens, span),
    }


def latency_stats(requests: pd.DataFrame, names: tuple[str, ...] = LATENCY_METRICS) -> dict[str, float]:
    """``<name>_mean_s`` and ``<name>_p50_s`` ... ``<name>_p99_s`` over finished requests, plus
    ``norm_latency_mean_s``; NaN where no finished request has a value."""
    done = finished(requests)
    out: dict[str, float] = {}
    for name in names:
        v = np.asarray(done[f"{name}_s"], dtype=np.float64)
        v = v[np.isfinite(v)]
        out[f"{name}_mean_s"] = float(v.mean()) if len(v) else math.nan
        pcts = np.percentile(v, PERCENTILES) if len(v) else [math.nan] * len(PERCENTILES)
        out.update({f"{name}_p{p}_s": float(x) for p, x in zip(PERCENTILES, pcts)})
    out["norm_latency_mean_s"] = _mean(done["norm_latency_s"]) if len(done) else math.nan
    return out


def _mean(values) -> float:
    """The mean of the values that are not NaN as pandas takes it (NaN as 0 in the sum, not in the
    count); NaN when every value is NaN."""
    v = np.asarray(values, dtype=np.float64)
    nan = np.isnan(v)
    if not nan.any():
        return float(v.sum() / len(v))
    count = len(v) - int(nan.sum())
    return float(np.where(nan, 0.0, v).sum() / count) if count else math.nan


#: The steps.parquet columns `event_counts` totals.
EVENT_STEP_COLUMNS = ("blocks_swapped_in", "blocks_swapped_out", "blocks_copied")


def event_counts(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, int]:
    """Preemptions, swap-outs, blocks swapped and copied, and recomputed tokens over the run."""
    return event_counts_from(requests, {c: int(steps[c].sum()) for c in EVENT_STEP_COLUMNS if c in steps})


def event_counts_from(requests: pd.DataFrame, step_totals: dict[str, int]) -> dict[str, int]:
    """`event_counts` from the totals of the steps' `EVENT_STEP_COLUMNS` (a missing column counts 0)."""
    return {
        "preemptions": int(requests["preemptions"].sum()), "swap_outs": int(requests["swaps"].sum()),
        "blocks_swapped_in": step_totals.get("blocks_swapped_in", 0),
        "blocks_swapped_out": step_totals.get("blocks_swapped_out", 0),
        "blocks_copied": step_totals.get("blocks_copied", 0),
        "recomputed_tokens": int(requests["recomputed_tokens"].sum()),
    }


def offered_rate(requests: pd.DataFrame) -> float:
    """Arrival rate in requests/s: (count - 1) / span of arrivals; NaN with under two arrivals."""
    arrivals = requests["arrival_s"]
    span = arrivals.max() - arrivals.min() if len(arrivals) else 0.0
    return (len(arrivals) - 1) / span if span > 0 else math.nan


def slo_met(requests: pd.DataFrame, slo: dict[str, float]) -> pd.Series:
    """True for finished requests within every bound of ``slo`` (keys: `SLO_COLUMNS`).

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


def goodput(requests: pd.DataFrame, steps: pd.DataFrame, slo: dict[str, float]) -> dict[str, float]:
    """Requests within the SLO: count, per second of serving interval, and share of all requests."""
    good = int(slo_met(requests, slo).sum())
    total = len(requests)
    return {
        "goodput_requests": good,
        "goodput_requests_per_s": per_second(good, serving_interval_s(requests, steps)),
        "slo_attainment": good / total if total else math.nan,
    }


def time_weights(steps: pd.DataFrame) -> np.ndarray:
    """Step durations as weights; equal weights when the run took no simulated time."""
    w = steps["duration_s"].to_numpy(dtype=float)
    return w if w.sum() > 0 else np.ones_like(w)


def memory_means(steps: pd.DataFrame) -> dict[str, float]:
    """Time-weighted mean token slots in each memory category (keys: ``MEMORY_CATEGORIES``)."""
    if steps.empty:
        return {c: math.nan for c in MEMORY_CATEGORIES}
    w = time_weights(steps)
    return {
        c: float(np.average(steps[col].to_numpy(dtype=float), weights=w))
        for c, col in zip(MEMORY_CATEGORIES, MEMORY_COLUMNS)
    }


def memory_fractions(steps: pd.DataFrame, capacity_tokens: int) -> dict[str, float]:
    """Time-weighted mean share of capacity per category: ``token_states_frac`` ... ``free_frac``.

    The five sum to 1 when every step's categories sum to the capacity.
    """
    return {
        f"{c}_frac": (mean / capacity_tokens if capacity_tokens > 0 else math.nan)
        for c, mean in memory_means(steps).items()
    }

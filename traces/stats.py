"""Summary statistics of a trace, for ``blocksim traces info``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .trace import Trace

PERCENTILES = (50, 90, 99)


def describe(trace: Trace) -> dict:
    """Rows, span, mean rate, length percentiles, burstiness and (with hashes) prefix reuse.

    ``interarrival_cv`` is the coefficient of variation of inter-arrival times: 1 for
    Poisson arrivals, above 1 for bursty ones.
    """
    df = trace.df
    arrival = df["arrival_s"].to_numpy()
    span_s = float(arrival[-1]) if len(arrival) else 0.0
    out = {
        "name": trace.name,
        "requests": len(trace),
        "span_s": span_s,
        "mean_rate_per_s": len(trace) / span_s if span_s > 0 else float("nan"),
        "interarrival_cv": interarrival_cv(arrival),
    }
    for col in ("prompt_tokens", "output_tokens"):
        values = df[col].to_numpy()
        out[f"{col}_mean"] = float(values.mean()) if len(values) else float("nan")
        for p in PERCENTILES:
            out[f"{col}_p{p}"] = float(np.percentile(values, p)) if len(values) else float("nan")
        out[f"{col}_max"] = int(values.max()) if len(values) else 0
    if (df["n"] > 1).any():
        out["n_mean"] = float(df["n"].mean())
    if trace.has_hashes:
        out["hash_block_tokens"] = trace.hash_block_tokens
        out.update(prefix_reuse(trace))
    if trace.report.summary():
        out["read_report"] = trace.report.summary()
    return out


def interarrival_cv(arrival_s: np.ndarray) -> float:
    """Standard deviation over mean of the gaps between consecutive arrivals."""
    gaps = np.diff(arrival_s)
    if len(gaps) < 2 or gaps.mean() == 0:
        return float("nan")
    return float(gaps.std() / gaps.mean())


def prefix_reuse(trace: Trace) -> dict:
    """Prefix-cache reuse with an unbounded cache, over ``prefix_hashes`` in arrival order.

    A block is a hit when it and every block before it in the same prompt were seen in an
    earlier request (a leading-prefix match). ``prefix_reuse_ratio`` = hit blocks / all blocks.
    """
    lists = pa.array(trace.df["prefix_hashes"])
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    ids = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
    total = int(lengths.sum())
    if total == 0:
        return {"hash_blocks": 0, "unique_hash_blocks": 0, "prefix_reuse_ratio": float("nan")}
    owner = np.repeat(np.arange(len(lengths)), lengths)
    unique, first_pos = np.unique(ids, return_index=True)
    first_owner = owner[first_pos][np.searchsorted(unique, ids)]
    seen_before = first_owner < owner
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos_in_prompt = np.arange(total) - np.repeat(starts, lengths)
    miss_pos = np.where(seen_before, np.iinfo(np.int64).max, pos_in_prompt)
    nonempty = lengths > 0
    first_miss = np.minimum.reduceat(miss_pos, starts[nonempty])
    hits = np.minimum(first_miss, lengths[nonempty]).sum()
    return {"hash_blocks": total, "unique_hash_blocks": len(unique), "prefix_reuse_ratio": float(hits / total)}

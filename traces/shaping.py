"""Shaping a trace: pure functions that return a new :class:`Trace`.

Every result keeps the trace invariants: sorted by ``arrival_s``, first arrival 0.0,
request ids and lengths carried over unchanged (except where a function says otherwise).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .lazy_pandas import pd
from .trace import Trace, hash_dtype


def _with_rows(trace: Trace, rows: np.ndarray, arrival_s: np.ndarray | None = None) -> Trace:
    """A copy of ``trace`` with the rows ``rows`` (positions, in order), re-based to start at 0."""
    df = trace.df.iloc[rows].reset_index(drop=True)
    arrival = df["arrival_s"].to_numpy() if arrival_s is None else arrival_s
    df["arrival_s"] = arrival - arrival[0] if len(arrival) else arrival
    return dataclasses.replace(trace, df=df)


def head(trace: Trace, n: int) -> Trace:
    """The first ``n`` requests."""
    if n < 0:
        raise ValueError(f"head needs n >= 0, got {n}")
    return _with_rows(trace, np.arange(min(n, len(trace))))


def window(trace: Trace, start_s: float, end_s: float | None = None) -> Trace:
    """Requests arriving in ``[start_s, end_s)``, re-timed so the first arrives at 0.0."""
    arrival = trace.df["arrival_s"].to_numpy()
    end = np.inf if end_s is None else end_s
    if end < start_s:
        raise ValueError(f"window end_s {end_s} is before start_s {start_s}")
    return _with_rows(trace, np.flatnonzero((arrival >= start_s) & (arrival < end)))


def scale_rate(trace: Trace, factor: float) -> Trace:
    """Multiply the request rate by ``factor``: every inter-arrival time is divided by it.

    ``factor`` 2 compresses the trace into half the time; 0.5 stretches it to twice.
    """
    if not factor > 0 or not np.isfinite(factor):
        raise ValueError(f"scale_rate needs a finite factor > 0, got {factor}")
    return _with_rows(trace, np.arange(len(trace)), trace.df["arrival_s"].to_numpy() / factor)


def poisson_retime(trace: Trace, rate_per_s: float, seed: int = 0) -> Trace:
    """Keep the requests and their order, replace arrivals by a Poisson process at ``rate_per_s``.

    Inter-arrival times are exponential with mean ``1 / rate_per_s``; the first request
    arrives at 0.0. This is how the PagedAttention paper replays a trace at a chosen rate.
    """
    if not rate_per_s > 0:
        raise ValueError(f"poisson_retime needs rate_per_s > 0, got {rate_per_s}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, size=len(trace))
    if len(gaps):
        gaps[0] = 0.0
    return _with_rows(trace, np.arange(len(trace)), np.cumsum(gaps))


def subsample(trace: Trace, fraction: float | None = None, *, count: int | None = None, seed: int = 0) -> Trace:
    """A random subset (without replacement, order kept): ``fraction`` of the requests or ``count`` of them."""
    if (fraction is None) == (count is None):
        raise ValueError("subsample needs exactly one of fraction or count")
    if fraction is not None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"subsample fraction must be in [0, 1], got {fraction}")
        count = round(fraction * len(trace))
    if not 0 <= count <= len(trace):
        raise ValueError(f"subsample count must be in [0, {len(trace)}], got {count}")
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(trace), size=count, replace=False))
    return _with_rows(trace, rows)


def clip_to_max_len(trace: Trace, max_len: int) -> tuple[Trace, int]:
    """Clip requests to a model's context of ``max_len`` tokens; return the trace and how many changed.

    Prompts are cut to ``max_len - 1`` tokens (keeping their start, so prefix hashes
    stay valid; the hash list is cut to match), then outputs to ``max_len - prompt``.
    After the call ``prompt_tokens + output_tokens <= max_len`` for every request.
    """
    if max_len < 2:
        raise ValueError(f"clip_to_max_len needs max_len >= 2, got {max_len}")
    df = trace.df.copy()
    prompt = df["prompt_tokens"].to_numpy()
    output = df["output_tokens"].to_numpy()
    new_prompt = np.minimum(prompt, max_len - 1)
    new_output = np.minimum(output, max_len - new_prompt)
    changed = (new_prompt != prompt) | (new_output != output)
    df["prompt_tokens"] = new_prompt
    df["output_tokens"] = new_output
    if trace.has_hashes and (new_prompt != prompt).any():
        blocks = -(-new_prompt // trace.hash_block_tokens)
        df["prefix_hashes"] = _truncate_lists(pa.array(df["prefix_hashes"]), blocks)
    return dataclasses.replace(trace, df=df), int(changed.sum())


def _truncate_lists(lists: pa.ListArray, keep: np.ndarray) -> pd.Series:
    """Keep the first ``keep[i]`` items of each list (vectorized)."""
    values = pc.list_flatten(lists).to_numpy()
    lengths = pc.list_value_length(lists).to_numpy()
    flat_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    keep = np.minimum(keep, lengths)
    take = np.repeat(flat_starts, keep) + (np.arange(keep.sum()) - np.repeat(np.cumsum(keep) - keep, keep))
    offsets = np.concatenate([[0], np.cumsum(keep)]).astype(np.int32)
    out = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[take], pa.int64()))
    return pd.Series(out, dtype=hash_dtype())

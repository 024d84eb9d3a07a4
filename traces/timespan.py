"""Plausibility of a trace's time span: catch a time column read in the wrong unit."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .errors import TraceWarning

MAX_PLAUSIBLE_SPAN_S = 31 * 86400.0
MAX_PLAUSIBLE_RATE_PER_S = 100_000.0
_MIN_REQUESTS_FOR_RATE = 1000


def check_span(arrival_s: np.ndarray, *, path: Path, column: str, unit: str | None) -> None:
    """Warn (:class:`TraceWarning`, naming ``column``) when the span looks like a unit mix-up.

    Longer than a month suggests milliseconds read as seconds; a mean rate above
    100,000 requests per second over at least 1,000 requests suggests the reverse.
    """
    if len(arrival_s) < 2:
        return
    span_s = float(arrival_s.max() - arrival_s.min())
    unit_text = f"read as {unit}" if unit and unit != "datetime" else "parsed as date-times"
    if span_s > MAX_PLAUSIBLE_SPAN_S:
        warnings.warn(
            f"{path}: column {column!r} ({unit_text}) spans {span_s / 86400:.1f} days, which is implausible "
            f"for a serving trace; if it is in milliseconds or microseconds pass time_unit (--time-unit) ms or us",
            TraceWarning, stacklevel=3)
    elif len(arrival_s) >= _MIN_REQUESTS_FOR_RATE and (span_s == 0 or len(arrival_s) / span_s > MAX_PLAUSIBLE_RATE_PER_S):
        warnings.warn(
            f"{path}: column {column!r} ({unit_text}) puts {len(arrival_s)} requests in {span_s:.6g} s, which is "
            f"implausibly fast; if it is in seconds rather than a smaller unit pass time_unit (--time-unit) s",
            TraceWarning, stacklevel=3)

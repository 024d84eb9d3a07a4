"""Plausibility of a trace's arrival times: catch a time column read in the wrong unit.

A serving trace spans at most about a month and offers between one request a minute and a few
thousand requests a second on average. Outside those bounds the arrival column is most likely in
another unit than it was read in (milliseconds read as seconds stretch a trace 1,000 times; read
as microseconds they squeeze it 1,000 times), whatever the number of requests.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .errors import TraceWarning

MAX_PLAUSIBLE_SPAN_S = 31 * 86400.0
#: Mean arrival rates outside [MIN, MAX] requests per second are implausible for a serving trace.
MAX_PLAUSIBLE_RATE_PER_S = 2_000.0
MIN_PLAUSIBLE_RATE_PER_S = 1 / 60.0
#: Requests that all arrive at one instant are an offline batch, except in a trace this large.
_MIN_REQUESTS_FOR_ZERO_SPAN = 1000


def implausible_span(arrival_s: np.ndarray) -> str | None:
    """Why the arrival times in seconds look like a unit mix-up (with the unit to try), or None."""
    n = len(arrival_s)
    if n < 2:
        return None
    span_s = float(arrival_s.max() - arrival_s.min())
    if span_s > MAX_PLAUSIBLE_SPAN_S:
        return (f"spans {span_s / 86400:.1f} days, longer than a serving trace; if the column is in milliseconds "
                f"or microseconds pass time_unit (--time-unit) ms or us")
    if span_s == 0:
        if n >= _MIN_REQUESTS_FOR_ZERO_SPAN:
            return (f"puts all {n} requests at one instant; if the column is in seconds rather than a smaller "
                    f"unit pass time_unit (--time-unit) s")
        return None
    rate = (n - 1) / span_s
    if rate > MAX_PLAUSIBLE_RATE_PER_S:
        return (f"puts {n} requests in {span_s:.3g} s, a mean of {rate:,.0f} requests/s, faster than a serving "
                f"trace; if the column is in seconds or milliseconds rather than a smaller unit pass "
                f"time_unit (--time-unit) s or ms")
    if rate < MIN_PLAUSIBLE_RATE_PER_S:
        return (f"puts {n} requests in {span_s:,.0f} s, one every {span_s / (n - 1):,.0f} s on average, slower "
                f"than a serving trace; if the column is in milliseconds rather than seconds pass "
                f"time_unit (--time-unit) ms")
    return None


def check_span(arrival_s: np.ndarray, *, path: Path, column: str, unit: str | None) -> None:
    """Warn (:class:`TraceWarning`, naming ``column`` and its unit) when `implausible_span` finds a reason."""
    why = implausible_span(arrival_s)
    if why:
        unit_text = f"read as {unit}" if unit and unit != "datetime" else "parsed as date-times"
        warnings.warn(f"{path}: column {column!r} ({unit_text}) {why}", TraceWarning, stacklevel=3)

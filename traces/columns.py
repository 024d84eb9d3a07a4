"""Vectorized conversion of raw source columns to canonical values, collecting bad rows.

Every converter returns the converted numpy/arrow array (bad rows hold a placeholder)
and a list of :class:`RowProblem`, one per kind of problem, each with a row mask.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .lazy_pandas import pd

TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
TIME_UNITS = tuple(TIME_UNITS_S) + ("datetime",)
HASH_TYPE = pa.list_(pa.int64())


@dataclass
class RowProblem:
    """Rows where ``mask`` is true have the problem ``kind`` in source column ``column``.

    ``describe(i)`` words the problem for raw row ``i`` (quoting the bad value).
    """

    column: str
    kind: str
    mask: np.ndarray
    hint: str
    describe: Callable[[int], str]


def _problem(column: str, kind: str, mask, hint: str, raw: pd.Series | None = None) -> list[RowProblem]:
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        return []
    if raw is None:
        return [RowProblem(column, kind, mask, hint, lambda i: kind)]
    return [RowProblem(column, kind, mask, hint, lambda i: f"{kind} {_shown(raw.iloc[i])}")]


def _shown(value) -> str:
    """A source value as written in a message: numpy scalars as plain numbers."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def to_counts(raw: pd.Series, column: str, *, minimum: int = 0, what: str = "token count") -> tuple[np.ndarray, list[RowProblem]]:
    """Integer counts >= ``minimum``; missing, non-numeric, fractional or too-small values are problems."""
    missing = raw.isna().to_numpy()
    numeric = raw if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw) \
        else pd.to_numeric(raw, errors="coerce")
    values = numeric.to_numpy(dtype=np.float64, na_value=np.nan)
    non_numeric = np.isnan(values) & ~missing
    finite = np.isfinite(values)
    fractional = finite & (values != np.floor(values))
    too_small = finite & (values < minimum)
    bad_value = f"expected a non-negative integer {what}" if minimum == 0 else f"expected an integer {what} >= {minimum}"
    if minimum == 1 and what == "token count":  # a request's prompt and output: zero is a row of its own kind
        zero = too_small & (values == 0)
        too_small = too_small & ~zero
        zero_problem = _problem(column, "zero token count", zero, "a request needs at least 1 prompt token and "
                                "1 output token; remove the row")
    else:
        zero_problem = []
    small_kind = "negative value" if minimum in (0, 1) and what == "token count" else "value too small"
    problems = (
        _problem(column, "missing value", missing, f"every row needs a {what} in this column")
        + _problem(column, "non-numeric value", non_numeric, bad_value, raw)
        + _problem(column, "non-finite value", ~finite & ~missing & ~non_numeric, bad_value, raw)
        + _problem(column, "fractional value", fractional, bad_value, raw)
        + _problem(column, small_kind, too_small, bad_value, raw)
        + zero_problem
    )
    ints = np.where(finite, values, 0).astype(np.int64)
    return ints, problems


def to_integers(raw: pd.Series, column: str) -> tuple[np.ndarray, list[RowProblem]]:
    """Any integers (e.g. priorities, which may be negative)."""
    return to_counts(raw, column, minimum=np.iinfo(np.int64).min, what="integer")


def to_seconds(raw: pd.Series, column: str, unit: str) -> tuple[np.ndarray, list[RowProblem]]:
    """Seconds since the earliest valid timestamp, reading ``raw`` in ``unit``.

    ``unit`` is one of :data:`TIME_UNITS`; ``datetime`` parses ISO 8601 date-time strings
    (any number of fractional digits; time zones are converted to UTC).
    """
    missing = raw.isna().to_numpy()
    if unit == "datetime":
        ns, parsed = _datetime_ns(raw if is_text(raw) else raw.astype(str))
        bad = ~parsed & ~missing
        good = ~(bad | missing)
        base = ns[good].min() if good.any() else 0
        seconds = np.where(good, (ns - base) / 1e9, 0.0)
        hint = "expected a date-time such as 2023-11-16 18:15:46.6805900; for numbers pass time_unit (--time-unit) s or ms"
        return seconds, (_problem(column, "missing timestamp", missing, hint)
                         + _problem(column, "unparseable timestamp", bad, hint, raw))
    if unit not in TIME_UNITS_S:
        raise ValueError(f"unknown time unit {unit!r}; use one of {', '.join(TIME_UNITS)}")
    numeric = raw if pd.api.types.is_numeric_dtype(raw) else pd.to_numeric(raw, errors="coerce")
    values = numeric.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values) & ~missing
    hint = f"expected a number of {unit}; for date-time strings pass time_unit (--time-unit) datetime"
    good = ~(bad | missing)
    base = values[good].min() if good.any() else 0.0
    seconds = np.where(good, (values - base) * TIME_UNITS_S[unit], 0.0)
    return seconds, (_problem(column, "missing timestamp", missing, hint)
                     + _problem(column, "unparseable timestamp", bad, hint, raw))


def _datetime_ns(raw: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Nanoseconds since the epoch (UTC when zoned) and a mask of parsed rows.

    Arrow's ISO 8601 cast is tried first (fast); any failure falls back to pandas, which
    parses row by row in C and marks unparseable values.
    """
    try:
        strings = pa.array(raw.array) if isinstance(raw.dtype, (pd.StringDtype, pd.ArrowDtype)) else pa.array(raw)
        for target in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
            try:
                stamps = pc.cast(strings, target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
            parsed = stamps.is_valid().to_numpy(zero_copy_only=False)
            ns = pc.cast(stamps, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
            return ns, parsed
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=True)
    ns = stamps.dt.tz_localize(None).dt.as_unit("ns").to_numpy().view(np.int64)
    return ns, stamps.notna().to_numpy()


def is_text(raw: pd.Series) -> bool:
    return pd.api.types.is_string_dtype(raw) or raw.dtype == object


def to_hashes(raw: pd.Series, column: str, prompt_tokens: np.ndarray, prompt_ok: np.ndarray,
              block_tokens: int, prompt_column: str) -> tuple[pa.Array, list[RowProblem]]:
    """Lists of int64 block hashes; each row must hold ``ceil(prompt_tokens / block_tokens)`` ids."""
    hint_type = "expected a JSON list of integer block hashes"
    array, not_list = _hash_array(raw)
    missing = np.asarray(array.is_null().to_numpy(zero_copy_only=False)) & ~not_list
    lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
    expected = -(-prompt_tokens // block_tokens)
    wrong = ~missing & ~not_list & prompt_ok & (lengths != expected)
    hint_len = (f"each row needs ceil({prompt_column} / {block_tokens}) hashes of {block_tokens}-token blocks; "
                f"check that {prompt_column} and {column} belong together")

    def describe_len(i: int) -> str:
        return (f"{lengths[i]} hash ids for {prompt_column} {prompt_tokens[i]}, "
                f"expected ceil({prompt_tokens[i]} / {block_tokens}) = {expected[i]}")

    problems = _problem(column, "missing hash list", missing, hint_type) + \
        _problem(column, "not a list of integers", not_list, hint_type, raw)
    if wrong.any():
        problems.append(RowProblem(column, "hash count inconsistent with prompt length", wrong, hint_len, describe_len))
    return array.fill_null(pa.scalar([], HASH_TYPE)), problems


def _hash_array(raw: pd.Series) -> tuple[pa.Array, np.ndarray]:
    """Arrow list<int64> array of ``raw`` and a mask of rows that are not lists of integers."""
    if isinstance(raw.dtype, pd.ArrowDtype) and pa.types.is_list(raw.dtype.pyarrow_dtype):
        array = pa.array(raw)
        if array.type == HASH_TYPE:
            return array, np.zeros(len(raw), dtype=bool)
    values = raw.tolist()
    if is_text(raw):  # CSV: JSON lists as text, "[1, 2]"
        values = [_json_list(v) for v in values]
    try:
        return pa.array(values, type=HASH_TYPE, from_pandas=True), np.zeros(len(raw), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    # error path only: find the rows that are not lists of integers
    not_list = np.array([not (_is_null(v) or _is_int_list(v)) for v in values], dtype=bool)
    cleaned = [None if bad else v for v, bad in zip(values, not_list)]
    return pa.array(cleaned, type=HASH_TYPE, from_pandas=True), not_list


def _json_list(value):
    """A JSON list held as text, parsed; anything else as it is."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _is_null(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _is_int_list(value) -> bool:
    return isinstance(value, (list, tuple, np.ndarray)) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value)

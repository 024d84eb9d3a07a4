"""A plain CSV trace read by Arrow alone, without pandas.

`read_trace` tries this first for an uncompressed CSV file read strictly: Arrow's CSV reader
parses the file (every line with the header's number of fields, no blank line), and the trace is
built here when every needed column is clean: token counts and counts parsed as integers at
least their minimum (no zero output of a format that marks failed requests by it), request ids
unique, arrivals ISO 8601 date-times or finite numbers in the format's unit. The values are those
the general reader (`traces.read`) gives: date-times parsed by the same Arrow cast, numbers
rounded to the nearest double as pandas' parser rounds them, seconds from the earliest arrival
computed alike, rows sorted by arrival (stable) and rebased to 0. Anything else returns None, and
the general reader reads the file (naming any problem).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from .columns import TIME_UNITS_S
from .errors import ReadReport, TraceError
from .formats import resolve_format
from .timespan import check_span
from .trace import Trace

log = logging.getLogger(__name__)

_COMPRESSED = {".gz", ".bz2", ".xz", ".zst", ".zip"}
_MINIMUM = {"prompt_tokens": 1, "output_tokens": 1, "n": 1, "beam_width": 1}


def _numpy(column) -> np.ndarray | None:
    """An Arrow int64 or float64 column without nulls as a numpy array (from its buffer: an Arrow
    column's own `to_numpy` loads pandas); None for any other column."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    dtype = {pa.int64(): np.int64, pa.float64(): np.float64}.get(array.type)
    if dtype is None or array.null_count:
        return None
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * 8).copy()


def _header(path: Path) -> list[str] | None:
    """The header's column names when it is plain (ASCII names without quotes), else None."""
    with open(path, "rb") as f:
        line = f.readline()
    if not line.endswith(b"\n") or not line.isascii() or b'"' in line or b"'" in line:
        return None
    names = line.rstrip(b"\r\n").decode().split(",")
    return names if all(names) and len(set(names)) == len(names) else None


def _seconds(column, unit: str | None) -> tuple[np.ndarray, str] | None:
    """Seconds from the earliest arrival and the unit read, as `columns.to_seconds` gives them for
    a clean column; None when the column is neither numbers nor date-times (or has a bad value).
    Numbers parse as the general reader parses them (both round each to the nearest double)."""
    if unit is None or unit in TIME_UNITS_S:
        try:
            values = _numpy(pc.cast(column, pa.float64()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values = None
        if values is not None:
            if not np.isfinite(values).all():
                return None
            return (values - values.min()) * TIME_UNITS_S[unit or "s"], unit or "s"
        if unit is not None:
            return None
    for target in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
        try:
            stamps = pc.cast(column, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        if stamps.null_count:
            return None
        ns = _numpy(pc.cast(stamps, pa.int64()))
        return (ns - ns.min()) / 1e9, "datetime"
    return None


def read_plain_csv(path: Path, format: str | None, mapping, keep_failed: bool, time_unit: str | None,
                   hash_block_tokens: int | None, name: str | None) -> Trace | None:
    """The trace of a clean CSV file (the module's conditions), or None for the general reader."""
    if path.suffix.lower() in _COMPRESSED or not path.is_file():
        return None
    columns = _header(path)
    if columns is None:
        return None
    try:
        spec = resolve_format(path, columns, format, mapping, time_unit, hash_block_tokens)
    except TraceError:
        return None
    sources = {f: src for f, src in spec.columns.items() if src in columns}
    if any(f not in sources for f in spec.columns if f not in spec.optional) or "prefix_hashes" in sources:
        return None
    arrival_src = sources["arrival_s"]
    try:
        table = pcsv.read_csv(path, read_options=pcsv.ReadOptions(use_threads=False),
                              parse_options=pcsv.ParseOptions(ignore_empty_lines=False),
                              convert_options=pcsv.ConvertOptions(column_types={arrival_src: pa.string()},
                                                                  strings_can_be_null=True))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, UnicodeDecodeError):
        return None
    if table.column_names != columns or not table.num_rows:
        return None
    found = _seconds(table[arrival_src], spec.time_unit)
    if found is None:
        return None
    values = {"arrival_s": found[0]}
    for f, src in sources.items():
        if f == "arrival_s":
            continue
        v = _numpy(table[src])
        if v is None or v.dtype != np.int64:
            return None
        minimum = 0 if f == "output_tokens" and spec.zero_output_is_failure else _MINIMUM.get(f)
        if minimum is not None and (v < minimum).any():
            return None
        values[f] = v.astype(np.float64).astype(np.int64)  # as the general reader converts counts
    if spec.zero_output_is_failure and (values["output_tokens"] == 0).any():
        return None
    if "request_id" in values and len(np.unique(values["request_id"])) != len(values["request_id"]):
        return None
    check_span(values["arrival_s"], path=path, column=arrival_src, unit=spec.time_unit)
    n_rows = table.num_rows
    values.setdefault("request_id", np.arange(n_rows, dtype=np.int64))
    order = np.argsort(values["arrival_s"], kind="stable")
    values = {f: v[order] for f, v in values.items()}
    values["arrival_s"] = values["arrival_s"] - values["arrival_s"][0]
    values.setdefault("n", np.ones(n_rows, np.int64))
    values.setdefault("priority", np.zeros(n_rows, np.int64))
    report = ReadReport()
    if spec.zero_output_is_failure:
        report = ReadReport(0, (), {}, 0, keep_failed, "line")
    log.info("read %d requests from %s (%s, format %s, arrivals in %s)", n_rows, path, "csv", spec.name,
             spec.time_unit or "s / date-times")
    return Trace.from_arrays(values, name if name is not None else path.name.split(".")[0], report)

"""``read_trace``: any supported file to a canonical :class:`Trace`.

Pipeline: a clean CSV file is read by Arrow alone (`traces.fast_csv`); any other file: detect
the format from the columns, load the needed columns (vectorized), convert each to canonical units
while collecting bad rows, then either raise a :class:`TraceError` for the first bad row or
(``lenient``) drop the bad rows and report them.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .columns import RowProblem, is_text, to_counts, to_hashes, to_integers, to_seconds
from .errors import ReadReport, TraceError, TraceWarning
from .fast_csv import read_plain_csv
from .formats import FormatSpec, resolve_format
from .lazy_pandas import pd
from .tables import RawTable, _parquet_error, container_of, load_table, name_mismatch, peek_columns
from .timespan import check_span
from .trace import Trace

_FIRST_LINES_REPORTED = 10
log = logging.getLogger(__name__)


def read_trace(
    path: str | Path,
    format: str | None = None,
    *,
    mapping: dict[str, str] | None = None,
    lenient: bool = False,
    keep_failed: bool = False,
    time_unit: str | None = None,
    hash_block_tokens: int | None = None,
    name: str | None = None,
) -> Trace:
    """Read a trace file (CSV, JSONL or Parquet, format detected from its columns).

    ``format`` forces a format (``azure``, ``burstgpt``, ``mooncake``, ``canonical``,
    ``generic``). ``mapping`` maps canonical fields to source columns, e.g.
    ``{"arrival_s": "ts", "prompt_tokens": "in", "output_tokens": "out"}``; ``time_unit``
    is the unit of the arrival column (``s``, ``ms``, ``us``, ``ns``, ``min``, ``h`` or
    ``datetime``). Bad rows raise :class:`TraceError` unless ``lenient``, which skips
    them, warns and records them in ``trace.report``. ``keep_failed`` keeps BurstGPT's
    failed requests (zero response tokens), which are otherwise dropped and counted.
    """
    path = Path(path)
    container = container_of(path) if path.exists() else "csv"
    mismatch = name_mismatch(path, container)
    try:
        trace = _read(path, container, format, mapping, lenient, keep_failed, time_unit, hash_block_tokens, name)
    except TraceError as e:
        if mismatch:  # one message: the mismatch may be the cause
            raise TraceError(e.path, f"{mismatch}; {e.problem}", line=e.line, column=e.column, hint=e.hint,
                             where=e.where) from None
        raise
    if mismatch:
        warnings.warn(f"{path}: {mismatch}", TraceWarning, stacklevel=2)
    return trace


def _read(path: Path, container: str, format, mapping, lenient, keep_failed, time_unit, hash_block_tokens,
          name) -> Trace:
    if container == "csv" and not lenient:  # a clean CSV file: Arrow alone (traces.fast_csv)
        trace = read_plain_csv(path, format, mapping, keep_failed, time_unit, hash_block_tokens, name)
        if trace is not None:
            return trace
    columns = peek_columns(path, container)
    spec = resolve_format(path, columns, format, mapping, time_unit, hash_block_tokens)
    written_by_us = container == "parquet" and spec.name == "canonical" and format is None and not mapping
    if written_by_us and b"blocksim.trace" in (_parquet_metadata(path) or {}):
        try:
            trace = Trace.from_parquet(path)
        except (pa.ArrowException, OSError) as e:
            raise _parquet_error(path, e) from None
        except ValueError as e:
            raise TraceError(path, f"not a valid trace ({e})",
                             hint="write it again with blocksim traces convert or traces.Trace.to_parquet") from None
        df = trace.df
        if (df["prompt_tokens"] > 0).all() and (df["output_tokens"] > 0).all():
            return trace
        # zero-length requests (a Trace may hold them): read row by row, naming or skipping them
        spec = resolve_format(path, columns, format, mapping, time_unit, hash_block_tokens or trace.hash_block_tokens)
    sources = _present_sources(path, spec, columns)
    table = load_table(path, container, list(dict.fromkeys(sources.values())), lenient=lenient)
    values, problems = _convert(table, spec, sources)
    keep, report = _apply_problems(table, problems, lenient)
    frame = pd.DataFrame({f: v[keep] for f, v in values.items() if f != "prefix_hashes"})
    if "prefix_hashes" in values:
        frame["prefix_hashes"] = pd.Series(values["prefix_hashes"].filter(keep), dtype=pd.ArrowDtype(values["prefix_hashes"].type))
    frame, report = _handle_failed(frame, spec, report, keep_failed, path)
    if len(frame) == 0:
        raise TraceError(path, "no valid requests left after skipping bad rows", hint="check the file and the column mapping")
    check_span(frame["arrival_s"].to_numpy(), path=path, column=sources["arrival_s"], unit=spec.time_unit)
    frame = _sort_and_rebase(frame)
    log.info("read %d requests from %s (%s, format %s, arrivals in %s)", len(frame), path, container, spec.name,
             spec.time_unit or "s / date-times")
    hbt = spec.hash_block_tokens if "prefix_hashes" in frame else None
    return Trace(frame, hbt, name if name is not None else path.name.split(".")[0], report)


def _parquet_metadata(path: Path):
    try:
        return pq.read_schema(str(path)).metadata
    except (pa.ArrowException, OSError) as e:
        raise _parquet_error(path, e) from None


def _present_sources(path: Path, spec: FormatSpec, columns: list[str]) -> dict[str, str]:
    """Canonical field -> source column, for the fields this file provides."""
    have = set(columns)
    sources = {}
    for f, src in spec.columns.items():
        if src in have:
            sources[f] = src
        elif f not in spec.optional:
            shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
            raise TraceError(path, f"missing column {src!r} (needed for {f}); the file has: {shown}", line=1, column=src,
                             hint=f"read as format {spec.name!r}; map another column with --map {f}=COLUMN or pick --format")
    if "prefix_hashes" in sources and not spec.hash_block_tokens:
        raise TraceError(path, "prefix hashes need their block size", column=sources["prefix_hashes"],
                         hint="pass hash_block_tokens (--hash-block-tokens), e.g. 16 or 512")
    return sources


def _convert(table: RawTable, spec: FormatSpec, sources: dict[str, str]):
    df, values, problems = table.df, {}, []
    arrival_raw = df[sources["arrival_s"]]
    unit = spec.time_unit or ("datetime" if is_text(arrival_raw) else "s")
    values["arrival_s"], found = to_seconds(arrival_raw, sources["arrival_s"], unit)
    problems += found
    for f in ("prompt_tokens", "output_tokens"):
        # a request has at least one prompt and one output token; BurstGPT's zero outputs are failed requests
        minimum = 0 if f == "output_tokens" and spec.zero_output_is_failure else 1
        values[f], found = to_counts(df[sources[f]], sources[f], minimum=minimum)
        problems += found
    for f, minimum in (("n", 1), ("beam_width", 1)):
        if f in sources:
            values[f], found = to_counts(df[sources[f]], sources[f], minimum=minimum, what="count")
            problems += found
    for f in ("request_id", "priority"):
        if f in sources:
            values[f], found = to_integers(df[sources[f]], sources[f])
            problems += found
    if "request_id" in values:
        dup = pd.Series(values["request_id"]).duplicated().to_numpy()
        problems += [RowProblem(sources["request_id"], "duplicate request id", dup, "request ids must be unique",
                                lambda i: f"duplicate request id {values['request_id'][i]}")] if dup.any() else []
    if "prefix_hashes" in sources:
        prompt_col = sources["prompt_tokens"]
        prompt_ok = ~np.logical_or.reduce([p.mask for p in problems if p.column == prompt_col] or [np.zeros(len(df), bool)])
        values["prefix_hashes"], found = to_hashes(df[sources["prefix_hashes"]], sources["prefix_hashes"],
                                                   values["prompt_tokens"], prompt_ok, spec.hash_block_tokens, prompt_col)
        problems += found
    if table.blank is not None and table.blank.any():
        for p in problems:
            p.mask = p.mask & ~table.blank
        problems = [p for p in problems if p.mask.any()]
        problems.insert(0, RowProblem("", "blank line", table.blank, "remove blank lines inside the file",
                                      lambda i: "blank line"))
    return values, problems


def _apply_problems(table: RawTable, problems: list[RowProblem], lenient: bool) -> tuple[np.ndarray, ReadReport]:
    """Rows to keep, and the report; raises for the first bad row unless ``lenient``."""
    n_rows = len(table.df)
    bad = np.logical_or.reduce([p.mask for p in problems]) if problems else np.zeros(n_rows, bool)
    if not lenient and problems:
        first = {id(p): int(np.flatnonzero(p.mask)[0]) for p in problems}
        worst = min(problems, key=lambda p: table.lines[first[id(p)]])
        i = first[id(worst)]
        n_bad = int(bad.sum())
        more = f" ({n_bad} bad rows in total, first at {table.where}s {_first_lines(table.lines[bad])})" if n_bad > 1 else ""
        hint = worst.hint + "; or pass lenient=True (--lenient) to skip bad rows"
        if table.truncated_tail and i == n_rows - 1:
            hint = "the last line looks truncated (the file does not end with a newline); " + hint
        raise TraceError(table.path, worst.describe(i) + more, line=int(table.lines[i]), column=worst.column or None,
                         hint=hint, where=table.where)
    reasons: dict[str, int] = {}
    for _line, why in table.unparsed:
        reasons[why.split(" (")[0]] = reasons.get(why.split(" (")[0], 0) + 1
    for p in problems:
        key = f"{p.column}: {p.kind}" if p.column else p.kind
        reasons[key] = reasons.get(key, 0) + int(p.mask.sum())
    skipped_lines = np.sort(np.concatenate([table.lines[bad], np.array([n for n, _ in table.unparsed], np.int64)]))
    report = ReadReport(len(skipped_lines), tuple(int(x) for x in skipped_lines[:_FIRST_LINES_REPORTED]), reasons,
                        where=table.where)
    if report.skipped_rows:
        warnings.warn(f"{table.path}: {report.summary()}", TraceWarning, stacklevel=3)
    return ~bad, report


def _first_lines(lines: np.ndarray) -> str:
    shown = ", ".join(str(int(x)) for x in lines[:5])
    return shown + (", ..." if len(lines) > 5 else "")


def _handle_failed(frame: pd.DataFrame, spec: FormatSpec, report: ReadReport, keep_failed: bool, path: Path):
    if not spec.zero_output_is_failure:
        return frame, report
    failed = frame["output_tokens"].to_numpy() == 0
    n_failed = int(failed.sum())
    report = ReadReport(report.skipped_rows, report.skipped_lines, report.skip_reasons, n_failed, keep_failed,
                        report.where)
    if n_failed:
        verb = "kept" if keep_failed else "dropped (pass keep_failed=True / --keep-failed to keep them)"
        warnings.warn(f"{path}: {n_failed} failed requests (zero response tokens) {verb}", TraceWarning, stacklevel=3)
    return (frame if keep_failed else frame[~failed]), report


def _sort_and_rebase(frame: pd.DataFrame) -> pd.DataFrame:
    """Stable sort by arrival (ties keep file order); ids default to file order; first arrival 0.0."""
    if "request_id" not in frame:
        frame.insert(0, "request_id", np.arange(len(frame), dtype=np.int64))
    order = np.argsort(frame["arrival_s"].to_numpy(), kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    frame["arrival_s"] = frame["arrival_s"] - frame["arrival_s"].iloc[0]
    return frame

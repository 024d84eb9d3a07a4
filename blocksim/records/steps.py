"""Columnar step records, filled one step or one span of steps at a time.

A step or a span of steps is one *segment*: a row of every column's value (0 where the value
varies over the span) with its step count, kept in numpy chunks of `SEGMENT_CHUNK_ROWS` rows (one
float64 and one int64 block each; rows are written into them `ROW_BUFFER` at a time). A span's
columns that vary from step to step (start times, contexts, memory columns) are kept as the
arrays given, per column, and concatenated into one array per `PENDING_ARRAYS` spans (int32 where the values fit); columns a span describes rather
than gives (`DeferredColumns`: the memory columns, which follow from the span's first step) are
computed then, for all those spans at once. A span thus costs one row write and a list append per
varying column, and its constant columns take 8 bytes each for the whole span instead of per step.

Once closed, the records come out as columns `row_groups` at a time (each column its segments'
values repeated over their steps, with the span arrays written over the rows of the spans that
gave them), so a run directory is written without holding every step's row; `to_frame` builds the
whole frame, `column_sum` and `end_s` answer the summary without it.
"""

from __future__ import annotations

from collections import namedtuple
from itertools import chain, groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

import numpy as np

# ROW_COLUMNS: every column of steps.parquet but `step`, in the order rows are given to `add`.
from blocksim.records.schema import (COMM_COLUMN, FLOAT_COLUMNS, ROW_COLUMNS, STEP_COLUMNS,  # noqa: F401 (re-exported)
                                     STEP_COLUMNS_TP)


if TYPE_CHECKING:
    import pandas as pd

# One step's values by column name: `StepRow(start_s=..., duration_s=..., ...)`, every column of
# steps.parquet but `step`.
StepRow = namedtuple("StepRow", ROW_COLUMNS)

SEGMENT_CHUNK_ROWS = 1 << 14
ROW_BUFFER = 1 << 10  # segment rows kept as tuples, then written into the chunks together
PENDING_ARRAYS = 1 << 10
FLOAT_ROW_COLUMNS = tuple(c for c in ROW_COLUMNS if c in FLOAT_COLUMNS)
INT_ROW_COLUMNS = tuple(c for c in ROW_COLUMNS if c not in FLOAT_COLUMNS)
# A chunk's int block holds the int columns, then each segment's step count and its varying-column bits.
_STEPS, _VARYING = len(INT_ROW_COLUMNS), len(INT_ROW_COLUMNS) + 1
# column -> (float block?, column in its block, its bit in a segment's varying-column bits)
_PLACE = {c: (c in FLOAT_COLUMNS, (FLOAT_ROW_COLUMNS if c in FLOAT_COLUMNS else INT_ROW_COLUMNS).index(c),
              1 << ROW_COLUMNS.index(c))
          for c in ROW_COLUMNS}
_floats_of = itemgetter(*(ROW_COLUMNS.index(c) for c in FLOAT_ROW_COLUMNS))
_ints_of = itemgetter(*(ROW_COLUMNS.index(c) for c in INT_ROW_COLUMNS))
_ONE_STEP = (1, 0)  # a single step's count and varying-column bits
_ZERO_ROW = dict.fromkeys(ROW_COLUMNS, 0)  # a span's row before its constant values: 0 where not given
_float_values = itemgetter(*FLOAT_ROW_COLUMNS)
_int_values = itemgetter(*INT_ROW_COLUMNS)
_INT32 = np.iinfo(np.int32)


class DeferredColumns(NamedTuple):
    """Span columns given as a description and computed when pending spans are joined:
    `build(args, steps)` gets the `args` of consecutive spans that share this spec (in order) and
    their step counts (an int64 array), and returns each of `columns` over all their steps, in order."""

    columns: tuple[str, ...]
    build: Callable[[list, np.ndarray], dict[str, np.ndarray]]


class StepRecorder:
    """Step rows as segments (a step, or a span of steps); the frame and the row groups keep
    `COMM_COLUMN` only when `comm` (tensor parallel > 1)."""

    def __init__(self, comm: bool = False) -> None:
        self.comm = comm
        self.columns = STEP_COLUMNS_TP if comm else STEP_COLUMNS  # the records' columns, in written order
        self._chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (floats, ints), SEGMENT_CHUNK_ROWS rows each
        self._used = SEGMENT_CHUNK_ROWS  # rows written in the last chunk
        self._float_rows: list[tuple] = []  # segment rows not written into the chunks yet (ROW_BUFFER at most)
        self._int_rows: list[tuple] = []
        self._pending: dict[str, list[np.ndarray]] = {c: [] for c in ROW_COLUMNS}  # spans' arrays, in order
        self._joined: dict[str, list[np.ndarray]] = {c: [] for c in ROW_COLUMNS}  # ... concatenated
        self._num_pending = 0  # spans with arrays in `_pending` or `_deferred`
        self._deferred: list[tuple[DeferredColumns, Any, int]] = []  # (spec, args, steps) of pending spans
        self.num_steps = 0
        self._closed = False
        self._frame: pd.DataFrame | None = None

    def _flush_rows(self) -> None:
        """Write the buffered segment rows into the chunks, starting chunks as the last fills."""
        floats = np.fromiter(chain.from_iterable(self._float_rows), np.float64,
                             len(self._float_rows) * len(FLOAT_ROW_COLUMNS)).reshape(-1, len(FLOAT_ROW_COLUMNS))
        ints = np.fromiter(chain.from_iterable(self._int_rows), np.int64,
                           len(self._int_rows) * (len(INT_ROW_COLUMNS) + 2)).reshape(-1, len(INT_ROW_COLUMNS) + 2)
        self._float_rows.clear()
        self._int_rows.clear()
        i = 0
        while i < len(floats):
            if self._used == SEGMENT_CHUNK_ROWS:
                self._chunks.append((np.empty((SEGMENT_CHUNK_ROWS, len(FLOAT_ROW_COLUMNS)), np.float64),
                                     np.empty((SEGMENT_CHUNK_ROWS, len(INT_ROW_COLUMNS) + 2), np.int64)))
                self._used = 0
            u = self._used
            m = min(len(floats) - i, SEGMENT_CHUNK_ROWS - u)
            chunk_floats, chunk_ints = self._chunks[-1]
            chunk_floats[u:u + m] = floats[i:i + m]
            chunk_ints[u:u + m] = ints[i:i + m]
            self._used = u + m
            i += m

    def add(self, row: StepRow) -> None:
        """One step."""
        if self._closed:
            self._check_open()
        self._float_rows.append(_floats_of(row))
        self._int_rows.append(_ints_of(row) + _ONE_STEP)
        self.num_steps += 1
        if len(self._int_rows) == ROW_BUFFER:
            self._flush_rows()

    def add_many(self, k: int, constant: dict, varying: dict,
                 deferred: tuple[DeferredColumns, Any] | None = None) -> None:
        """`k` steps: `constant` maps columns to one value each (a column in none of them is 0),
        `varying` to a numpy array of k values; `deferred`, `(spec, args)`: the columns of `spec`,
        built from `args` when the pending spans are joined."""
        if self._closed:
            self._check_open()
        row = _ZERO_ROW.copy()
        row.update(constant)
        bits = 0
        pending = self._pending
        for c, v in varying.items():
            if len(v) != k:
                raise ValueError(f"step records: column {c} has {len(v)} values for {k} steps")
            pending[c].append(v)
            bits |= _PLACE[c][2]
        if deferred is not None:
            spec, args = deferred
            for c in spec.columns:
                bits |= _PLACE[c][2]
            self._deferred.append((spec, args, k))
        self._float_rows.append(_float_values(row))
        self._int_rows.append(_int_values(row) + (k, bits))
        self.num_steps += k
        if len(self._int_rows) == ROW_BUFFER:
            self._flush_rows()
        if bits:
            self._num_pending += 1
            if self._num_pending == PENDING_ARRAYS:
                self._join_pending()

    def _join_pending(self) -> None:
        if self._deferred:
            self._build_deferred()
        for c, arrays in self._pending.items():
            if arrays:
                joined = np.concatenate(arrays)
                if joined.dtype == np.int64 and _INT32.min <= joined.min() and joined.max() <= _INT32.max:
                    joined = joined.astype(np.int32)  # half the memory; written back as int64
                self._joined[c].append(joined)
                arrays.clear()
        self._num_pending = 0

    def _build_deferred(self) -> None:
        """The pending spans' deferred columns, built per run of spans sharing a spec, into `_pending`."""
        pending = self._pending
        built: set[str] = set()
        for _, run in groupby(self._deferred, key=lambda d: id(d[0])):
            run = list(run)
            spec = run[0][0]
            columns = spec.build([args for _, args, _ in run], np.array([k for _, _, k in run], np.int64))
            for c in spec.columns:
                if pending[c] and c not in built:
                    raise ValueError(f"step records: column {c} is given both as arrays and as deferred "
                                     f"columns among the pending spans")
                pending[c].append(columns[c])
                built.add(c)
        self._deferred.clear()

    def close(self) -> None:
        """End the records: no step can be added afterwards."""
        if self._closed:
            return
        self._join_pending()
        self._flush_rows()
        if self._chunks:  # the unused rows of the last chunk are dropped
            floats, ints = self._chunks[-1]
            self._chunks[-1] = (floats[:self._used], ints[:self._used])
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("step records were already closed (close, to_frame or row_groups)")

    def _segments(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Segment rows `first` to `stop` (exclusive) of the closed records: their float and int blocks."""
        c0, c1 = first // SEGMENT_CHUNK_ROWS, (stop - 1) // SEGMENT_CHUNK_ROWS
        parts = [(f, i) for f, i in self._chunks[c0:c1 + 1]]
        lo, hi = first - c0 * SEGMENT_CHUNK_ROWS, stop - c1 * SEGMENT_CHUNK_ROWS
        if len(parts) == 1:
            f, i = parts[0]
            return f[lo:hi], i[lo:hi]
        parts[0] = (parts[0][0][lo:], parts[0][1][lo:])
        parts[-1] = (parts[-1][0][:hi], parts[-1][1][:hi])
        return np.concatenate([f for f, _ in parts]), np.concatenate([i for _, i in parts])

    def row_groups(self, rows: int, columns: tuple[str, ...] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The steps in order, `rows` at a time (the last group may be shorter; one empty group
        for a run without steps): each a dict of `columns` (of `self.columns`, the default, in that
        order) to arrays of their dtypes. Closes the records; each call starts again from the first step."""
        self.close()
        columns = self.columns if columns is None else columns
        _check_columns(columns, self.columns)
        columns = tuple(c for c in ROW_COLUMNS if c in columns), "step" in columns
        counts = np.concatenate([i[:, _STEPS] for _, i in self._chunks]) if self._chunks else np.zeros(0, np.int64)
        ends = np.cumsum(counts)  # each segment's end, in steps
        spans = {c: _Pieces(pieces) for c, pieces in self._joined.items() if pieces and c in columns[0]}
        n = self.num_steps
        for a in range(0, max(n, 1), rows):
            yield self._rows(a, min(a + rows, n), columns, counts, ends, spans)  # no reference kept here meanwhile

    def _rows(self, a: int, b: int, columns: tuple[tuple[str, ...], bool], counts: np.ndarray, ends: np.ndarray,
              spans: dict) -> dict[str, np.ndarray]:
        """Steps `a` to `b` (exclusive) of `columns` (row columns, and whether `step` is one),
        `row_groups` taking span values from `spans` in order."""
        s0, s1 = int(np.searchsorted(ends, a, "right")), int(np.searchsorted(ends, b - 1, "right")) + 1
        floats, ints = self._segments(s0, s1) if b > a else (np.empty((0, len(FLOAT_ROW_COLUMNS))),
                                                            np.empty((0, _VARYING + 1), np.int64))
        steps = np.minimum(ends[s0:s1], b) - np.maximum(ends[s0:s1] - counts[s0:s1], a)  # within [a, b)
        seg = np.repeat(np.arange(len(steps)), steps)
        varying = ints[:, _VARYING]
        cols = {"step": np.arange(a, b, dtype=np.int64)} if columns[1] else {}
        for c in columns[0]:
            is_float, r, bit = _PLACE[c]
            col = (floats if is_float else ints)[:, r].take(seg)
            if c in spans:
                in_span = (varying & bit).astype(bool).take(seg)
                col[in_span] = spans[c].take(int(np.count_nonzero(in_span)))
            cols[c] = col
        return cols

    def to_frame(self, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
        """The steps as a frame in `self.columns` order, built on the first call (which closes the
        records); with `columns`, a frame of those columns only, built on each call."""
        import pandas as pd

        if columns is not None:
            _check_columns(columns, self.columns)
            if self._frame is not None:
                return self._frame[[c for c in self.columns if c in columns]]
            return pd.DataFrame(next(self.row_groups(max(self.num_steps, 1), columns)), copy=False)
        if self._frame is None:
            self._frame = pd.DataFrame(next(self.row_groups(max(self.num_steps, 1))), copy=False)
        return self._frame

    def column_sum(self, column: str) -> int:
        """The total of an integer column over every step (closes the records)."""
        self.close()
        is_float, r, bit = _PLACE[column]
        if is_float:
            raise ValueError(f"column_sum: {column} is a float column; its total depends on the order of addition")
        total = 0
        for _, ints in self._chunks:
            constant = (ints[:, _VARYING] & bit) == 0
            total += int(np.dot(ints[constant, r], ints[constant, _STEPS]))
        return total + sum(int(p.sum()) for p in self._joined[column])

    def end_s(self) -> float:
        """When the last step ends (its start plus its duration); 0 without steps. Closes the records."""
        self.close()
        if not self.num_steps:
            return 0.0
        floats, ints = self._chunks[-1]
        varying = int(ints[-1, _VARYING])

        def last(c: str) -> float:
            _, r, bit = _PLACE[c]
            return float(self._joined[c][-1][-1] if varying & bit else floats[-1, r])

        return last("start_s") + last("duration_s")


def _check_columns(columns, known: tuple[str, ...]) -> None:
    if not set(columns) <= set(known):
        raise ValueError(f"step records: no column {sorted(set(columns) - set(known))}; "
                         f"the columns are {list(known)}")


class _Pieces:
    """A column's span values, in arrays taken from in order."""

    def __init__(self, pieces: list[np.ndarray]) -> None:
        self._pieces, self._next, self._offset = pieces, 0, 0  # next piece, values of it already taken

    def take(self, m: int) -> np.ndarray:
        """The next `m` values."""
        out = []
        while m:
            p = self._pieces[self._next]
            got = p[self._offset:self._offset + m]
            out.append(got)
            m -= len(got)
            self._offset += len(got)
            if self._offset == len(p):
                self._next, self._offset = self._next + 1, 0
        return out[0] if len(out) == 1 else np.concatenate(out) if out else np.empty(0)

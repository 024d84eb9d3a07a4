"""Columnar step records in numpy buffers, filled one step or one span of steps at a time.

Steps are written into chunks, each one float64 and one int64 block of shape (columns, rows): a
step is two column writes, a span of steps two broadcasts of its constant values plus one slice
per column that varies. Chunks double in size from `FIRST_CHUNK_STEPS` rows up to
`MAX_CHUNK_STEPS` (large blocks are mapped memory, handed back to the system when freed).
`to_frame` builds the frame once and closes the recorder: a run that fits in the first chunk gets
views of its rows; a longer one has each chunk copied into the frame's columns and freed in turn,
so building the frame needs the records' memory plus at most one chunk.
"""

from __future__ import annotations

from collections import namedtuple
from operator import itemgetter

import numpy as np
import pandas as pd

# ROW_COLUMNS: every column of steps.parquet but `step`, in the order rows are given to `add`.
from blocksim.records.schema import COMM_COLUMN, FLOAT_COLUMNS, ROW_COLUMNS, STEP_COLUMNS  # noqa: F401 (re-exported)


# One step's values by column name: `StepRow(start_s=..., duration_s=..., ...)`, every column of
# steps.parquet but `step`.
StepRow = namedtuple("StepRow", ROW_COLUMNS)

FIRST_CHUNK_STEPS = 1 << 14
MAX_CHUNK_STEPS = 1 << 19
FLOAT_ROW_COLUMNS = tuple(c for c in ROW_COLUMNS if c in FLOAT_COLUMNS)
INT_ROW_COLUMNS = tuple(c for c in ROW_COLUMNS if c not in FLOAT_COLUMNS)
# column -> (float block?, row in its block)
_PLACE = {c: (c in FLOAT_COLUMNS, (FLOAT_ROW_COLUMNS if c in FLOAT_COLUMNS else INT_ROW_COLUMNS).index(c))
          for c in ROW_COLUMNS}
_floats_of = itemgetter(*(ROW_COLUMNS.index(c) for c in FLOAT_ROW_COLUMNS))
_ints_of = itemgetter(*(ROW_COLUMNS.index(c) for c in INT_ROW_COLUMNS))


class StepRecorder:
    """Step rows in columnar buffers; the frame keeps `COMM_COLUMN` only when `comm` (tensor parallel > 1)."""

    def __init__(self, comm: bool = False) -> None:
        self.comm = comm
        self._chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (floats, ints)
        self._size = self._used = 0  # rows of the last chunk, rows written in it
        self._rows: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        self.num_steps = 0
        self._frame: pd.DataFrame | None = None

    def _check_open(self) -> None:
        if self._frame is not None:
            raise RuntimeError("step records were already moved into their frame (to_frame)")

    def _room(self) -> int:
        """Rows left in the last chunk, after starting a new one if it is full."""
        self._check_open()
        if self._used == self._size:
            self._size = min(2 * self._size, MAX_CHUNK_STEPS) if self._chunks else FIRST_CHUNK_STEPS
            floats = np.empty((len(FLOAT_ROW_COLUMNS), self._size), np.float64)
            ints = np.empty((len(INT_ROW_COLUMNS), self._size), np.int64)
            self._chunks.append((floats, ints))
            self._rows = (list(ints), list(floats))  # one view per column, indexed by (is_float, row)
            self._used = 0
        return self._size - self._used

    def add(self, row: StepRow) -> None:
        """One step."""
        self._room()
        floats, ints = self._chunks[-1]
        u = self._used
        floats[:, u] = _floats_of(row)
        ints[:, u] = _ints_of(row)
        self._used = u + 1
        self.num_steps += 1

    def add_many(self, k: int, values: dict) -> None:
        """`k` steps; each value is a numpy array of length k or a Python scalar (repeated)."""
        const = ([0] * len(INT_ROW_COLUMNS), [0.0] * len(FLOAT_ROW_COLUMNS))
        varying = []
        ndarray = np.ndarray
        for c, v in values.items():
            is_float, r = _PLACE[c]
            if type(v) is ndarray:
                varying.append((is_float, r, v))
            else:
                const[is_float][r] = v
        done = 0
        while done < k:
            m = min(self._room(), k - done)
            floats, ints = self._chunks[-1]
            rows = self._rows
            u = self._used
            end = u + m
            floats[:, u:end] = np.array(const[1], np.float64)[:, None]
            ints[:, u:end] = np.array(const[0], np.int64)[:, None]
            whole = m == k
            for is_float, r, v in varying:
                rows[is_float][r][u:end] = v if whole else v[done:done + m]
            self._used = end
            done += m
        self.num_steps += k

    def to_frame(self) -> pd.DataFrame:
        """The steps as a frame in `STEP_COLUMNS` order (`STEP_COLUMNS_TP` with `comm`), built once: no
        step can be added afterwards."""
        if self._frame is not None:
            return self._frame
        n = self.num_steps
        kept = ROW_COLUMNS if self.comm else tuple(c for c in ROW_COLUMNS if c != COMM_COLUMN)
        chunks, self._chunks, self._rows = self._chunks, [], ([], [])
        cols = {"step": np.arange(n, dtype=np.int64)}
        if len(chunks) == 1:  # the frame's columns are views of the chunk's rows
            blocks = {True: chunks[0][0], False: chunks[0][1]}
            for c in kept:
                is_float, r = _PLACE[c]
                cols[c] = blocks[is_float][r, :n]
            chunks = []
        else:
            cols.update((c, np.empty(n, np.float64 if c in FLOAT_COLUMNS else np.int64)) for c in kept)
        start = 0
        chunks.reverse()
        while chunks:  # each chunk freed once copied
            floats, ints = chunks.pop()
            m = min(floats.shape[1], n - start)
            for block, names in ((floats, FLOAT_ROW_COLUMNS), (ints, INT_ROW_COLUMNS)):
                for r, c in enumerate(names):
                    if c in cols:
                        cols[c][start:start + m] = block[r, :m]
            start += m
            del floats, ints
        self._frame = pd.DataFrame(cols, copy=False)
        return self._frame

"""Columnar step records: one Python list per column, extended in bulk for spans of steps."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pandas as pd

# ROW_COLUMNS: every column of steps.parquet but `step`, in the order rows are given to `add`.
from blocksim.records.schema import FLOAT_COLUMNS, ROW_COLUMNS, STEP_COLUMNS  # noqa: F401 (re-exported)


# One step's values by column name: `StepRow(start_s=..., duration_s=..., ...)`, every column of
# steps.parquet but `step`.
StepRow = namedtuple("StepRow", ROW_COLUMNS)


class StepRecorder:
    def __init__(self) -> None:
        self.cols: list[list] = [[] for _ in ROW_COLUMNS]
        self.num_steps = 0

    def add(self, row: StepRow) -> None:
        """One step."""
        for lst, v in zip(self.cols, row):
            lst.append(v)
        self.num_steps += 1

    def add_many(self, k: int, values: dict) -> None:
        """`k` steps; each value is a numpy array of length k or a Python scalar (repeated)."""
        for lst, c in zip(self.cols, ROW_COLUMNS):
            v = values[c]
            if isinstance(v, np.ndarray):
                lst.extend(v.tolist())
            else:
                lst.extend([v] * k)
        self.num_steps += k

    def to_frame(self) -> pd.DataFrame:
        data = {"step": np.arange(self.num_steps, dtype=np.int64)}
        for c, lst in zip(ROW_COLUMNS, self.cols):
            data[c] = np.asarray(lst, dtype=np.float64 if c in FLOAT_COLUMNS else np.int64)
        return pd.DataFrame(data)

"""Arrow arrays from numpy columns, built from their buffers.

`pyarrow.array` and `pyarrow.table` on numpy input import pandas (pyarrow's pandas shim checks
each input for pandas types); a run directory is written from these arrays instead, so a replay
that writes one never loads pandas.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMPY = {pa.int64(): np.int64, pa.int32(): np.int32, pa.float64(): np.float64}


def numeric_array(values: np.ndarray, type: pa.DataType) -> pa.Array:
    """A numeric column (no nulls) as an Arrow array of `type` (int64, int32 or float64), its
    values converted as numpy converts them."""
    values = np.ascontiguousarray(values, dtype=_NUMPY[type])
    return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(values)])


def string_array(values, type: pa.DataType = pa.large_string()) -> pa.Array:
    """A column of str or None (null) as an Arrow (large) string array."""
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    encoded = [v.encode() if v is not None else b"" for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64 if type == pa.large_string() else np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    nulls = len(values) - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(type, len(values), [bitmap, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
                                 null_count=nulls)


def table(columns: dict, schema: pa.Schema) -> pa.Table:
    """The columns (numpy arrays; object arrays of str or None for string fields) as a table of `schema`."""
    arrays = [string_array(columns[f.name], f.type) if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
              else numeric_array(columns[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)

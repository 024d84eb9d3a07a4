"""The canonical trace: one row per request, columnar, sorted by arrival."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import ReadReport
from .lazy_pandas import pd

INT_COLUMNS = ("request_id", "prompt_tokens", "output_tokens", "n", "priority")
REQUIRED_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "priority")
OPTIONAL_COLUMNS = ("prefix_hashes", "beam_width")
PARQUET_KEY = b"blocksim.trace"


def hash_dtype():
    """The pandas dtype of `prefix_hashes`: Arrow lists of int64."""
    return pd.ArrowDtype(pa.list_(pa.int64()))


def __getattr__(name: str):
    if name == "HASH_DTYPE":  # pandas loads only when a frame of hashes is built
        return hash_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests of one workload, sorted by ``arrival_s``.

    ``df`` columns: ``request_id`` (int64, unique), ``arrival_s`` (float64, seconds from
    the first request, which arrives at 0.0), ``prompt_tokens`` and ``output_tokens``
    (int64, >= 0; ``output_tokens`` is per sequence), ``n`` (int64 >= 1, sequences in
    the group), ``priority`` (int64, higher is more urgent), optionally ``prefix_hashes``
    (``list<int64>`` per row: one id per ``hash_block_tokens`` tokens of the prompt, the
    last block may be partial; equal ids at equal positions mean a shared prefix) and
    ``beam_width`` (int64 >= 1; > 1 marks beam search with ``n == beam_width``).

    Construction checks these invariants and fills ``n`` = 1, ``priority`` = 0 and
    ``request_id`` = 0..N-1 when absent. Treat ``df`` as read-only: the shaping
    functions return new traces.

    ``arrays`` holds the canonical numeric columns as numpy arrays. A trace made by
    :meth:`from_arrays` (a plain CSV file read by Arrow) builds ``df`` on first use only.
    """

    df: pd.DataFrame
    hash_block_tokens: int | None = None
    name: str = ""
    report: ReadReport = field(default_factory=ReadReport)

    def __post_init__(self) -> None:
        object.__setattr__(self, "df", _canonical_frame(self.df, self.hash_block_tokens))

    @classmethod
    def from_arrays(cls, columns: dict[str, np.ndarray], name: str = "", report: ReadReport | None = None) -> Trace:
        """A trace of the canonical columns `REQUIRED_COLUMNS` (numpy arrays, `beam_width` optional,
        no prefix hashes), checked as construction checks a frame; its ``df`` is built on first use."""
        cols = {c: _as_int64(c, columns[c]) if c != "arrival_s" else _as_float64(c, columns[c])
                for c in (*REQUIRED_COLUMNS, *(["beam_width"] if "beam_width" in columns else []))}
        _check_values(cols)
        trace = object.__new__(cls)
        for k, v in (("hash_block_tokens", None), ("name", name), ("report", report or ReadReport()),
                     ("_arrays", cols)):
            object.__setattr__(trace, k, v)
        return trace

    def __getattr__(self, name: str):
        if name == "df" and "_arrays" in self.__dict__:  # a trace from arrays: its frame, built now
            cols = self.__dict__["_arrays"]
            frame = pd.DataFrame({c: cols[c] for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in cols})
            object.__setattr__(self, "df", frame)
            return frame
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The canonical numeric columns (`REQUIRED_COLUMNS`, and `beam_width` when present) as numpy arrays."""
        if "_arrays" in self.__dict__:
            return self.__dict__["_arrays"]
        df = self.df
        return {c: df[c].to_numpy() for c in (*REQUIRED_COLUMNS, "beam_width") if c in df.columns}

    def __len__(self) -> int:
        return len(self.arrays["arrival_s"]) if "df" not in self.__dict__ else len(self.df)

    def __repr__(self) -> str:
        arrival = self.arrays["arrival_s"]
        span = float(arrival[-1]) if len(arrival) else 0.0
        hashes = f", hash_block_tokens={self.hash_block_tokens}" if self.has_hashes else ""
        return f"Trace(name={self.name!r}, requests={len(self)}, span_s={span:.3f}{hashes})"

    @property
    def has_hashes(self) -> bool:
        return "df" in self.__dict__ and "prefix_hashes" in self.df.columns

    def to_parquet(self, path: str | Path) -> None:
        """Write the trace; ``name`` and ``hash_block_tokens`` travel in the file metadata."""
        table = pa.Table.from_pandas(self.df, preserve_index=False)
        meta = {"name": self.name, "hash_block_tokens": self.hash_block_tokens, "version": 1}
        table = table.replace_schema_metadata({PARQUET_KEY: json.dumps(meta).encode()})
        pq.write_table(table, str(path))

    @classmethod
    def from_parquet(cls, path: str | Path) -> Trace:
        """Read a file written by :meth:`to_parquet`."""
        table = pq.read_table(str(path))
        meta = json.loads((table.schema.metadata or {}).get(PARQUET_KEY, b"{}"))
        df = table.replace_schema_metadata(None).to_pandas(types_mapper=_arrow_list_mapper)
        return cls(df, meta.get("hash_block_tokens"), meta.get("name") or Path(path).stem)


def _arrow_list_mapper(arrow_type: pa.DataType):
    return hash_dtype() if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) else None


def _canonical_frame(df: pd.DataFrame, hash_block_tokens: int | None) -> pd.DataFrame:
    """Return ``df`` with canonical dtypes and column order, or raise ``ValueError``."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"Trace.df must be a pandas DataFrame, not {type(df).__name__}")
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        if col not in df.columns:
            raise ValueError(f"Trace needs a {col!r} column; got {list(df.columns)}")
    n_rows = len(df)
    out = {
        "request_id": df["request_id"] if "request_id" in df else np.arange(n_rows),
        "arrival_s": df["arrival_s"],
        "prompt_tokens": df["prompt_tokens"],
        "output_tokens": df["output_tokens"],
        "n": df["n"] if "n" in df else np.ones(n_rows, np.int64),
        "priority": df["priority"] if "priority" in df else np.zeros(n_rows, np.int64),
    }
    cols = {name: _as_int64(name, values) for name, values in out.items() if name != "arrival_s"}
    cols["arrival_s"] = _as_float64("arrival_s", out["arrival_s"])
    if "beam_width" in df:
        cols["beam_width"] = _as_int64("beam_width", df["beam_width"])
    _check_values(cols)
    frame = pd.DataFrame({name: cols[name] for name in REQUIRED_COLUMNS})
    if "beam_width" in cols:
        frame["beam_width"] = cols["beam_width"]
    if "prefix_hashes" in df:
        frame["prefix_hashes"] = _as_hashes(df["prefix_hashes"], cols["prompt_tokens"], hash_block_tokens)
    return frame


def _as_int64(name: str, values) -> np.ndarray:
    arr = values if isinstance(values, np.ndarray) else pd.Series(values).to_numpy()
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    if len(arr) == 0:
        return np.zeros(0, np.int64)
    raise ValueError(f"Trace column {name!r} must hold integers, got dtype {arr.dtype}")


def _as_float64(name: str, values) -> np.ndarray:
    arr = values if isinstance(values, np.ndarray) else pd.Series(values).to_numpy()
    if arr.dtype.kind not in "fiu" and len(arr):
        raise ValueError(f"Trace column {name!r} must be numeric seconds, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_values(cols: dict[str, np.ndarray]) -> None:
    arrival = cols["arrival_s"]
    rules = [
        ("arrival_s", ~np.isfinite(arrival) | (arrival < 0), "must be finite and >= 0"),
        ("prompt_tokens", cols["prompt_tokens"] < 0, "must be >= 0"),
        ("output_tokens", cols["output_tokens"] < 0, "must be >= 0"),
        ("n", cols["n"] < 1, "must be >= 1"),
    ]
    if "beam_width" in cols:
        rules.append(("beam_width", cols["beam_width"] < 1, "must be >= 1"))
    for name, bad, rule in rules:
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"Trace column {name!r} {rule}; row {i} has {cols[name][i]}")
    if len(arrival):
        if arrival[0] != 0.0:
            raise ValueError(f"Trace arrival_s must start at 0.0 (first request), got {arrival[0]}")
        unsorted = np.diff(arrival) < 0
        if unsorted.any():
            raise ValueError(f"Trace must be sorted by arrival_s; row {_first_bad(unsorted) + 1} is earlier than the row before")
    ids = cols["request_id"]
    if len(np.unique(ids)) != len(ids):
        raise ValueError("Trace request_id values must be unique")


def _as_hashes(values, prompt_tokens: np.ndarray, hash_block_tokens: int | None) -> pd.Series:
    if not hash_block_tokens or hash_block_tokens < 1:
        raise ValueError("a Trace with prefix_hashes needs hash_block_tokens >= 1")
    arr = pa.array(values, type=pa.list_(pa.int64()), from_pandas=True)
    if arr.null_count:
        raise ValueError("Trace prefix_hashes must not be null; use an empty list")
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    expected = -(-prompt_tokens // hash_block_tokens)
    bad = lengths != expected
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(
            f"Trace row {i}: {lengths[i]} prefix hashes for {prompt_tokens[i]} prompt tokens; "
            f"expected ceil(prompt_tokens / {hash_block_tokens}) = {expected[i]}"
        )
    return pd.Series(arr, dtype=hash_dtype())

"""Load a CSV, JSONL or Parquet file into a raw table with the line number of every row.

Reading is vectorized (pandas' C parser, pyarrow's JSON and Parquet readers). Only when
pyarrow rejects a JSONL file does a line-by-line pass run, to find and name the bad lines.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from .errors import TraceError
from .lazy_pandas import pd

CONTAINERS = ("csv", "jsonl", "parquet")
_COMPRESSION = {".gz", ".bz2", ".xz", ".zst", ".zip"}
_SUFFIX = {".csv": "csv", ".txt": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}
_LENIENT_HINT = "fix or remove the line, or pass lenient=True (--lenient) to skip bad lines"


@dataclass
class RawTable:
    """Source columns as read, before any conversion.

    ``lines[i]`` is the 1-based line (``where == "line"``) or row (``"row"``) number of
    ``df`` row ``i``. ``unparsed`` lists ``(line, reason)`` for lines the parser could not
    turn into a row (only in lenient mode; strict mode raises instead).
    """

    path: Path
    df: pd.DataFrame
    lines: np.ndarray
    where: str = "line"
    truncated_tail: bool = False
    unparsed: list[tuple[int, str]] = field(default_factory=list)
    blank: np.ndarray | None = None


def container_of(path: Path) -> str:
    """``csv``, ``jsonl`` or ``parquet``, from the file's first bytes.

    Parquet starts with ``PAR1``, JSONL with ``{``; anything else is read as CSV
    (`name_mismatch` words a disagreement with the extension). A file named ``.parquet`` that holds
    neither Parquet nor text is refused as corrupt.
    """
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    named = _SUFFIX.get(suffixes[-1]) if suffixes else None
    head = _head_bytes(path)
    if not head.strip():  # empty: the reader says so
        return named or "csv"
    if head.startswith(b"PAR1"):
        found = "parquet"
    elif head.lstrip().startswith(b"{"):
        found = "jsonl"
    else:
        found = "csv"
        if named == "parquet" and head and not _looks_like_text(head):
            raise TraceError(path, "not a Parquet file (it does not start with the Parquet magic bytes PAR1)",
                             hint="the file is corrupt or not a trace; write it again "
                                  "(blocksim traces convert IN OUT.parquet)")
    return found


def name_mismatch(path: Path, container: str) -> str | None:
    """Words for an extension that names another container than the content, or None."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    named = _SUFFIX.get(suffixes[-1]) if suffixes else None
    if named is None or named == container:
        return None
    return (f"the name says {named.upper()} but the content is {container.upper()}, read as {container.upper()} "
            f"(rename it to end in .{container})")


def _head_bytes(path: Path, size: int = 4096) -> bytes:
    try:
        if path.suffix.lower() == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read(size)
        with open(path, "rb") as f:
            return f.read(size)
    except (OSError, EOFError) as e:
        raise TraceError(path, f"cannot read the file ({e})", hint="check that it is a complete, readable file") from None


def _looks_like_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 4  # a character cut by the end of the sample
    return True


def _parquet_error(path: Path, e: Exception) -> TraceError:
    reason = " ".join(str(e).split())
    return TraceError(path, f"not a readable Parquet file ({reason})",
                      hint="the file is truncated or corrupt; write it again (blocksim traces convert IN OUT.parquet)")


def _encoding_error(path: Path, e: UnicodeDecodeError) -> TraceError:
    """Where the first byte that is not UTF-8 is, as a 1-based line."""
    try:
        data = _read_bytes(path)
        data.decode("utf-8")
        line, byte = None, None
    except UnicodeDecodeError as found:
        line = data.count(b"\n", 0, found.start) + 1
        byte = data[found.start]
    except OSError:
        line, byte = None, None
    what = f"byte 0x{byte:02x} is not UTF-8 text" if byte is not None else f"not UTF-8 text ({e.reason})"
    return TraceError(path, what, line=line,
                      hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT), or pass lenient=True "
                           "(--lenient) to read such bytes as replacement characters and skip rows they break")


def peek_columns(path: Path, container: str) -> list[str]:
    """Column names of the file, reading as little as possible."""
    _check_not_empty(path)
    if container == "parquet":
        try:
            return list(pq.read_schema(str(path)).names)
        except (pa.ArrowException, OSError) as e:
            raise _parquet_error(path, e) from None
    if container == "csv":
        try:
            return [str(c) for c in pd.read_csv(path, nrows=0).columns]
        except UnicodeDecodeError as e:
            raise _encoding_error(path, e) from None
        except pd.errors.EmptyDataError:
            raise TraceError(path, "the file is empty", hint="a trace needs a header and at least one request") from None
        except (pd.errors.ParserError, ValueError) as e:
            raise TraceError(path, f"cannot read the CSV header ({' '.join(str(e).split())})", line=1,
                             hint="the first line must name the columns, separated by commas") from None
    for lineno, raw in enumerate(_read_bytes(path).split(b"\n"), 1):
        if raw.strip():
            try:
                obj = json.loads(raw)
            except ValueError as e:
                raise TraceError(path, f"not valid JSON ({e})", line=lineno, hint="expected one JSON object per line") from None
            if not isinstance(obj, dict):
                raise TraceError(path, "not a JSON object", line=lineno, hint="expected one JSON object per line")
            return list(obj)
    raise TraceError(path, "the file is empty", hint="a trace needs at least one request")


def load_table(path: Path, container: str, columns: list[str], *, lenient: bool) -> RawTable:
    """Read ``columns`` (all present in the file) of every row."""
    _check_not_empty(path)
    if container == "csv":
        table = _load_csv(path, columns, lenient)
    elif container == "jsonl":
        table = _load_jsonl(path, columns, lenient)
    else:
        try:
            frame = pq.read_table(str(path), columns=columns).to_pandas(types_mapper=_list_mapper)
        except (pa.ArrowException, OSError) as e:
            raise _parquet_error(path, e) from None
        table = RawTable(path, frame, np.arange(1, len(frame) + 1), where="row")
    if len(table.df) == 0 and not table.unparsed:
        raise TraceError(path, "the file has no requests (no data rows)", hint="a trace needs at least one request")
    return table


def _check_not_empty(path: Path) -> None:
    if not path.exists():
        raise TraceError(path, "no such file", hint="check the path")
    if path.stat().st_size == 0:
        raise TraceError(path, "the file is empty", hint="a trace needs a header (CSV) and at least one request")


def _list_mapper(arrow_type: pa.DataType):
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pd.ArrowDtype(arrow_type)
    return None


def _ends_without_newline(path: Path) -> bool:
    if path.suffix.lower() in _COMPRESSION:
        return False
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) not in (b"\n", b"\r")


def _load_csv(path: Path, columns: list[str], lenient: bool) -> RawTable:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        try:
            # all columns are parsed (not usecols) so that lines with too many fields are caught
            df = pd.read_csv(path, skip_blank_lines=False, on_bad_lines="warn" if lenient else "error",
                             encoding_errors="replace" if lenient else "strict")
        except UnicodeDecodeError as e:
            raise _encoding_error(path, e) from None
        except pd.errors.EmptyDataError:
            raise TraceError(path, "the file is empty", hint="a trace needs a header and at least one request") from None
        except pd.errors.ParserError as e:
            found = re.search(r"line (\d+), saw (\d+)", str(e))
            line = int(found.group(1)) if found else None
            problem = f"wrong number of fields (saw {found.group(2)})" if found else f"cannot parse CSV ({e})"
            raise TraceError(path, problem, line=line, hint=_LENIENT_HINT) from None
    skipped: list[tuple[int, str]] = []
    for w in caught:
        if issubclass(w.category, pd.errors.ParserWarning):
            skipped += [(int(n), why) for n, why in re.findall(r"Skipping line (\d+): ([^\n]*)", str(w.message))]
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    lines = np.arange(2, 2 + len(df) + len(skipped), dtype=np.int64)
    if skipped:
        lines = np.setdiff1d(lines, np.array([n for n, _ in skipped], dtype=np.int64))
    df, lines = _drop_trailing_blank_rows(df, lines)
    blank = df.isna().all(axis=1).to_numpy()
    return RawTable(path, df[columns], lines, truncated_tail=_ends_without_newline(path), unparsed=skipped,
                    blank=blank)


def _drop_trailing_blank_rows(df: pd.DataFrame, lines: np.ndarray):
    """Blank lines at the end of a CSV file are not requests; blank lines inside it are bad rows."""
    blank = df.isna().all(axis=1).to_numpy()
    keep = len(df)
    while keep and blank[keep - 1]:
        keep -= 1
    return df.iloc[:keep], lines[:keep]


def _read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix.lower() == ".gz" else data


def _nonblank_line_numbers(data: bytes) -> np.ndarray:
    """1-based numbers of the lines that hold something other than whitespace."""
    arr = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(arr == 10)
    starts = np.concatenate([[0], newlines + 1])
    ends = np.concatenate([newlines, [len(arr)]])
    solid = np.concatenate([[0], np.cumsum(~np.isin(arr, (9, 10, 13, 32)))])
    return np.flatnonzero(solid[ends] - solid[starts] > 0) + 1


def _load_jsonl(path: Path, columns: list[str], lenient: bool) -> RawTable:
    data = _read_bytes(path)
    truncated = not data.endswith((b"\n", b"\r"))
    if not data.strip():
        raise TraceError(path, "the file is empty", hint="a trace needs at least one request")
    lines = _nonblank_line_numbers(data)
    try:
        block = max(1 << 20, min(len(data) + 1, 1 << 26))
        table = pj.read_json(BytesIO(data), read_options=pj.ReadOptions(block_size=block))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        table = None
    if table is None or table.num_rows != len(lines):
        return _load_jsonl_by_line(path, data, columns, lenient, truncated)
    present = [c for c in columns if c in table.column_names]
    df = table.select(present).to_pandas(types_mapper=_list_mapper)
    for missing in set(columns) - set(present):
        df[missing] = None
    return RawTable(path, df[columns], lines, truncated_tail=truncated)


def _load_jsonl_by_line(path: Path, data: bytes, columns: list[str], lenient: bool, truncated: bool) -> RawTable:
    """Slow path, run only when pyarrow rejects the file: parse each line to name the bad ones."""
    records, lines, unparsed = [], [], []
    raw_lines = data.split(b"\n")
    for lineno, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except UnicodeDecodeError as e:
            unparsed.append((lineno, f"byte 0x{raw[e.start]:02x} is not UTF-8 text"))
            continue
        except ValueError as e:
            unparsed.append((lineno, f"not valid JSON ({getattr(e, 'msg', e)})"))
            continue
        if not isinstance(obj, dict):
            unparsed.append((lineno, "not a JSON object"))
            continue
        records.append(obj)
        lines.append(lineno)
    last_line = max((i for i, r in enumerate(raw_lines, 1) if r.strip()), default=0)
    if unparsed and not lenient:
        lineno, reason = unparsed[0]
        hint = _LENIENT_HINT
        if truncated and lineno == last_line:
            hint = "the last line looks truncated (the file does not end with a newline); " + hint
        more = f" ({len(unparsed)} such lines)" if len(unparsed) > 1 else ""
        raise TraceError(path, reason + more, line=lineno, hint=hint)
    df = pd.DataFrame.from_records(records, columns=columns) if records else pd.DataFrame(columns=columns)
    return RawTable(path, df, np.asarray(lines, dtype=np.int64), truncated_tail=truncated, unparsed=unparsed)

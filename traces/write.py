"""Write a :class:`Trace` as Parquet, CSV or JSONL: the format ``to`` names, else the output's extension.

Parquet keeps everything (``name`` and ``hash_block_tokens`` in the file metadata). CSV and JSONL
hold the canonical columns; CSV writes ``prefix_hashes`` as JSON lists (``"[1, 2]"``), and both
need ``hash_block_tokens`` (``--hash-block-tokens``) given again when read back. A file is written
under a temporary name beside its destination and renamed when complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .errors import TraceError
from .trace import Trace

OUTPUT_FORMATS = ("parquet", "csv", "jsonl")
_EXTENSIONS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def output_format(path: str | Path, to: str | None = None) -> str:
    """``parquet``, ``csv`` or ``jsonl``: ``to`` when given, else from ``path``'s extension."""
    if to is not None:
        if to not in OUTPUT_FORMATS:
            raise TraceError(path, f"unknown output format {to!r}", hint=f"use one of {', '.join(OUTPUT_FORMATS)}")
        return to
    found = _EXTENSIONS.get(Path(path).suffix.lower())
    if found is None:
        raise TraceError(path, f"cannot tell the output format from the extension {Path(path).suffix or '(none)'!r}",
                         hint=f"end the name in {', '.join(_EXTENSIONS)}, or pass --to {'|'.join(OUTPUT_FORMATS)}")
    return found


def write_trace(trace: Trace, path: str | Path, to: str | None = None) -> str:
    """Write ``trace`` to ``path`` in `output_format` and return the format."""
    path = Path(path)
    fmt = output_format(path, to)
    if path.is_dir():
        raise TraceError(path, "is a directory", hint="name an output file")
    if not path.parent.is_dir():
        raise TraceError(path, f"the folder {path.parent} does not exist", hint="create it, or name another output")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if fmt == "parquet":
            trace.to_parquet(tmp)
        else:
            df = trace.df.copy()
            if "prefix_hashes" in df:
                hashes = [list(map(int, h)) for h in df["prefix_hashes"]]
                df["prefix_hashes"] = [json.dumps(h) for h in hashes] if fmt == "csv" else hashes
            if fmt == "csv":
                df.to_csv(tmp, index=False)
            else:
                df.to_json(tmp, orient="records", lines=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return fmt

"""Result files of the benchmark scripts: checked before a run starts, written whole at its end."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def refuse_unwritable(path: str, where: str) -> bool:
    """True, after one line on stderr naming `where` (e.g. ``"dispatch_rows.py: --json"``), when
    `path` cannot be written: its folder missing or read-only, or it is a folder or read-only
    itself. Nothing is created, so a run that stops early leaves no empty file."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    why = ("is a folder" if p.is_dir() else "its folder does not exist" if not folder.is_dir()
           else "its folder is not writable" if not os.access(folder, os.W_OK)
           else "it is not writable" if p.exists() and not os.access(p, os.W_OK) else None)
    if why:
        print(f"{where} {path}: {why}; name a writable file", file=sys.stderr)
    return why is not None


def write_json(path: str | Path, obj) -> None:
    """`obj` as JSON at `path`, written beside it and moved into place: never half-written."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1) + "\n")
        tmp.replace(p)
    finally:
        tmp.unlink(missing_ok=True)

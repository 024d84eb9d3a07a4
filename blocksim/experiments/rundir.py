"""A run directory appears whole or not at all.

`staged(out)` yields a fresh directory named like `out` inside a temporary sibling
(``.NAME.partial-XXXX/NAME`` in the same folder, so the final rename stays on one file system and
what is written there sees its final name). When the block completes, the sibling is
renamed to `out`; when it raises (an error, Ctrl-C), the sibling is removed and `out` is left as
it was. An existing non-empty `out` is refused unless `overwrite`, which replaces it whole: the
old directory is moved aside, the new one renamed into place, and only then the old one deleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from blocksim.config import ConfigError


def check_out_dir(out: str | Path, overwrite: bool = False, flag: str = "--out") -> Path:
    """`out` as a Path, refusing a file, or a non-empty directory without `overwrite`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {out}: is a file, not a directory; name a directory")
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise ConfigError(f"{flag} {out}: the directory exists and is not empty; pass --overwrite to replace it "
                          f"whole, or name a new directory")
    return out


@contextmanager
def staged(out: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory that becomes `out` when the block completes."""
    out = check_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        tmp = holder / out.name
        tmp.mkdir()
        yield tmp
        place(tmp, out)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def place(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`, replacing what is there; the old `out` is deleted last."""
    if not out.exists():
        os.replace(tmp, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rmdir(aside)
    os.replace(out, aside)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(aside, out)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)

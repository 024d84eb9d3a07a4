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
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"{flag} {out}: {above} is a file, not a directory; name a directory elsewhere")
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


def is_earlier_output(out: Path, marker: str) -> bool:
    """Whether `out` holds an earlier output of a driver that reuses complete runs: its `marker`
    file, or only run directories (with their ``point.json``) and hidden leftovers."""
    if (out / marker).exists():
        return True
    entries = [e for e in out.iterdir() if not e.name.startswith(".")]
    return bool(entries) and all(e.is_dir() and (e / "point.json").exists() for e in entries)


@contextmanager
def resumable(out: str | Path, *, marker: str, overwrite: bool = False, flag: str = "--out") -> Iterator[Path]:
    """The output directory of a driver that reuses complete runs (`compare`, `sweep`).

    `out` may be new, empty, or an earlier output of the same driver (`is_earlier_output`);
    anything else is refused unless `overwrite`. With `overwrite` an existing `out` is moved aside,
    deleted when the block completes, and put back when it raises (an error, Ctrl-C).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {out}: is a file, not a directory; name a directory")
    aside = None
    if out.is_dir() and any(out.iterdir()):
        if overwrite:
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rmdir(aside)
            os.replace(out, aside)
        elif not is_earlier_output(out, marker):
            raise ConfigError(f"{flag} {out}: the directory is not empty and is not an earlier output of this "
                              f"command (no {marker}); pass --overwrite to replace it whole, or name a new directory")
    try:
        yield out
    except BaseException:
        if aside is not None:
            shutil.rmtree(out, ignore_errors=True)
            os.replace(aside, out)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)

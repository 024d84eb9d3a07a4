"""Reading a run directory (the simulator's public output contract) into pandas.

A run directory holds ``requests.parquet``, ``steps.parquet`` and ``summary.json``, and
optionally ``free_extents.parquet`` (contiguous allocators only); `blocksim.records.schema`
declares its files, columns and dtypes. ``load_run`` checks that every file, every column the
analysis reads (the schema's ``*_REQUIRED``) and every required summary key is there, and that
the run's format version is one this package understands, so a bad directory fails with a
message naming what is wrong rather than a KeyError deep inside a plot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from blocksim.records.schema import (
    FREE_EXTENT_COLUMNS,
    FREE_EXTENTS_FILE,
    MEMORY_CATEGORIES,
    MEMORY_COLUMNS,
    REQUEST_REQUIRED,
    REQUESTS_FILE,
    STEP_REQUIRED,
    STEPS_FILE,
    SUMMARY_FILE,
    SUMMARY_KEYS,
    SUPPORTED_MAJOR_VERSIONS,
)

#: The schema's names that readers (the sweep, the reports) import from here.
__all__ = [
    "FREE_EXTENTS_FILE", "MEMORY_CATEGORIES", "MEMORY_COLUMNS", "REQUESTS_FILE", "STEPS_FILE", "SUMMARY_FILE",
    "SUMMARY_KEYS", "SUPPORTED_MAJOR_VERSIONS", "Run", "RunDirError", "load_run", "read_summary",
]


class RunDirError(ValueError):
    """A run directory is missing files or columns, or comes from an unsupported version."""


@dataclass(frozen=True)
class Run:
    """One simulation's records. ``free_extents`` is None when the allocator has no extents."""

    path: Path
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    free_extents: pd.DataFrame | None = None

    @property
    def config(self) -> dict:
        return self.summary.get("config") or {}

    @property
    def policy(self) -> str:
        return str(self.config.get("policy", self.path.name))

    @property
    def capacity_tokens(self) -> int:
        return int(self.summary["capacity_tokens"])


def _major_version(version) -> int | None:
    """``1``, ``"1"``, ``"1.2"`` and ``"1.2.3"`` all have major version 1; None if unparseable."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _read_parquet(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise RunDirError(f"{path}: cannot be read as parquet ({exc})") from exc
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise RunDirError(f"{path}: missing column(s) {', '.join(missing)}")
    return df


def read_summary(run_dir: str | Path) -> dict:
    """Read and check ``summary.json`` (present, a JSON object, required keys, supported version)."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        raise RunDirError(f"{Path(run_dir)}: missing {SUMMARY_FILE}")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(summary, dict):
        raise RunDirError(f"{path}: expected a JSON object")
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise RunDirError(f"{path}: missing key(s) {', '.join(missing)}")
    major = _major_version(summary["version"])
    if major not in SUPPORTED_MAJOR_VERSIONS:
        supported = ", ".join(f"{v}.x" for v in SUPPORTED_MAJOR_VERSIONS)
        raise RunDirError(
            f"{path}: run format version {summary['version']!r} is not supported "
            f"(this analysis reads {supported}); re-run the simulation with this blocksim"
        )
    return summary


def load_run(run_dir: str | Path) -> Run:
    """Load a run directory, raising ``RunDirError`` naming any missing file, column or key."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    missing = [f for f in (REQUESTS_FILE, STEPS_FILE, SUMMARY_FILE) if not (run_dir / f).is_file()]
    if missing:
        raise RunDirError(f"{run_dir}: missing {', '.join(missing)}")
    summary = read_summary(run_dir)
    requests = _read_parquet(run_dir / REQUESTS_FILE, REQUEST_REQUIRED)
    steps = _read_parquet(run_dir / STEPS_FILE, STEP_REQUIRED)
    extents_path = run_dir / FREE_EXTENTS_FILE
    extents = _read_parquet(extents_path, FREE_EXTENT_COLUMNS) if extents_path.is_file() else None
    return Run(run_dir, requests, steps, summary, extents)

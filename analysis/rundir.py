"""Reading a run directory (the simulator's public output contract) into pandas.

A run directory holds ``requests.parquet``, ``steps.parquet`` and ``summary.json``, and
optionally ``free_extents.parquet`` (contiguous allocators only). ``load_run`` checks that
every file and every column the analysis reads is there, and that the run's format version
is one this package understands, so a bad directory fails with a message naming what is
wrong rather than a KeyError deep inside a plot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "summary.json"
FREE_EXTENTS_FILE = "free_extents.parquet"

#: Major versions of the run-directory format this package reads.
SUPPORTED_MAJOR_VERSIONS = (0, 1)

#: The five memory categories, in token slots, in stacking order (bottom to top).
MEMORY_CATEGORIES = ("token_states", "reservation", "internal_frag", "external_frag", "free")
MEMORY_COLUMNS = tuple(f"mem_{c}" for c in MEMORY_CATEGORIES)

REQUEST_COLUMNS = (
    "request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "status",
    "first_scheduled_s", "first_token_s", "finish_s", "queue_s", "ttft_s", "tpot_s",
    "e2e_s", "norm_latency_s", "preemptions", "swaps", "recomputed_tokens",
)
STEP_COLUMNS = (
    "step", "start_s", "duration_s", "num_prefill_seqs", "num_decode_seqs",
    "running", "waiting", "swapped", "blocks_swapped_in", "blocks_swapped_out",
    "preempted", *MEMORY_COLUMNS,
)
SUMMARY_KEYS = ("version", "config", "capacity_tokens", "simulated_s")
FREE_EXTENT_COLUMNS = ("step", "start_s", "extent_tokens")


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
    requests = _read_parquet(run_dir / REQUESTS_FILE, REQUEST_COLUMNS)
    steps = _read_parquet(run_dir / STEPS_FILE, STEP_COLUMNS)
    extents_path = run_dir / FREE_EXTENTS_FILE
    extents = _read_parquet(extents_path, FREE_EXTENT_COLUMNS) if extents_path.is_file() else None
    return Run(run_dir, requests, steps, summary, extents)

"""One point: shape its trace, simulate it, write its run directory atomically, read its metrics.

A point's run directory appears only when it is complete: the worker writes it under
``OUT/.partial/`` and renames it into place (`RunLayout.run_dir`) as its last act, after
``point.json`` (its metrics row). A killed sweep or comparison therefore leaves either a complete
directory or none, and a rerun skips complete ones (`cached_row`). A point that raises is reported
with its error, and ``error.txt`` in its run directory holds the traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import traces
from analysis.rundir import REQUESTS_FILE, STEPS_FILE, SUMMARY_FILE, SUMMARY_KEYS, load_run
from analysis.slo import parse_slo
from analysis.table import ROW_VERSION, run_row
from blocksim.experiments.spec import Point

RUNS_DIR = "runs"
PARTIAL_DIR = ".partial"
POINT_FILE = "point.json"
ERROR_FILE = "error.txt"


@dataclass(frozen=True)
class RunLayout:
    """Where a driver writes: run directory ``name`` goes to ``root/runs/name`` (a sweep) or, with
    ``runs=""``, to ``root/name`` (a comparison); each is built under ``root/.partial/`` first."""

    root: Path
    runs: str = RUNS_DIR

    def run_dir(self, name: str) -> Path:
        return self.root / self.runs / name

    def relative(self, name: str) -> str:
        """``name``'s run directory relative to ``root`` (the table's ``run_dir`` column)."""
        return (Path(self.runs) / name).as_posix()

    @property
    def partial(self) -> Path:
        return self.root / PARTIAL_DIR


def replay_runner(trace, out_dir, **kwargs) -> dict:
    """``blocksim.experiments.runner.replay``, imported on the first run: the simulator loads in
    the worker process, not when the CLI registers its commands."""
    from blocksim.experiments.runner import replay
    return replay(trace, out_dir, **kwargs)


def shape_trace(trace, point: Point):
    """The point's trace: its first ``max_requests``, re-timed as a seeded Poisson process at the
    slice's own mean rate when the point has a ``seed``. (``rate_scale`` is applied by replay.)"""
    if point.max_requests is not None:
        trace = traces.head(trace, point.max_requests)
    if point.seed is not None and len(trace) > 1:
        arrival = trace.df["arrival_s"].to_numpy()
        span = float(arrival.max() - arrival.min())
        if span > 0:
            trace = traces.poisson_retime(trace, (len(trace) - 1) / span, seed=point.seed)
    return trace


def point_metrics(run_dir: Path, slo: dict[str, float]) -> dict:
    """A run's flat summary plus offered rate, memory fractions and (with an SLO) goodput."""
    return run_row(load_run(run_dir), slo)


def simulate_point(point: Point, trace, dest: Path, slo_text: str, runner: Callable) -> dict:
    """Run one point into ``dest`` and write its ``point.json``; returns the metrics row."""
    dest.mkdir(parents=True, exist_ok=True)
    runner(shape_trace(trace, point), dest, policy=point.policy, rate_scale=point.rate_scale,
           overrides=point.overrides() or None, progress=False, write_report=False)
    metrics = point_metrics(dest, parse_slo(slo_text))
    _write_point_file(dest, point, slo_text, metrics)
    return metrics


def _write_point_file(run_dir: Path, point: Point, slo_text: str, metrics: dict) -> None:
    (run_dir / POINT_FILE).write_text(json.dumps({"key": point.key(), "slo": slo_text, "row_version": ROW_VERSION,
                                                  "metrics": metrics}, default=_json_default))


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    return str(o)


def error_outcome(exc: BaseException) -> tuple:
    return ("error", " ".join(f"{type(exc).__name__}: {exc}".split()), traceback.format_exc())


def install_run_dir(src: Path, final: Path) -> None:
    """Move a finished run directory into place (replacing any incomplete leftover)."""
    if final.exists():
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, final)


def run_point_into(layout: RunLayout, name: str, point: Point, trace, slo_text: str, runner: Callable) -> tuple:
    """Run one point into ``layout.run_dir(name)`` (atomically); never raises.

    Returns ``("ok", metrics)`` or ``("error", message, traceback)``.
    """
    tmp = layout.partial / f"{name}.{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        metrics = simulate_point(point, trace, tmp, slo_text, runner)
        install_run_dir(tmp, layout.run_dir(name))
        return ("ok", metrics)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported in the sweep table
        outcome = error_outcome(exc)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            write_error(layout.run_dir(name), outcome[2])
        except OSError:
            pass
        return outcome


def write_error(run_dir: Path, text: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / ERROR_FILE).write_text(text)


def is_complete(run_dir: Path) -> bool:
    """A run directory with both tables and a summary.json that parses and has its keys."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(summary, dict) and all(k in summary for k in SUMMARY_KEYS)
            and (run_dir / REQUESTS_FILE).is_file() and (run_dir / STEPS_FILE).is_file())


def cached_row(run_dir: Path, point: Point, slo_text: str) -> dict | None:
    """The metrics of a complete earlier run of ``point`` (recomputed if the SLO or the row's
    columns (`analysis.table.ROW_VERSION`) changed), else None."""
    if not is_complete(run_dir):
        return None
    try:
        saved = json.loads((run_dir / POINT_FILE).read_text())
        if (saved.get("key"), saved.get("slo"), saved.get("row_version")) == (point.key(), slo_text, ROW_VERSION):
            return saved["metrics"]
    except (OSError, ValueError, KeyError):
        pass
    try:
        metrics = point_metrics(run_dir, parse_slo(slo_text))
    except Exception:  # noqa: BLE001 - unreadable: run it again
        return None
    _write_point_file(run_dir, point, slo_text, metrics)
    return metrics

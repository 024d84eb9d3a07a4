"""Metrics, tables, reports and fragmentation analysis over blocksim run directories.

The public names below load lazily, so importing ``analysis`` (or ``analysis.cli``) does not
import matplotlib until a report is drawn.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Run": "analysis.rundir",
    "RunDirError": "analysis.rundir",
    "load_run": "analysis.rundir",
    "MEMORY_CATEGORIES": "analysis.rundir",
    "parse_slo": "analysis.slo",
    "request_metrics": "analysis.metrics",
    "run_metrics": "analysis.metrics",
    "slo_met": "analysis.metrics",
    "memory_means": "analysis.metrics",
    "memory_fractions": "analysis.metrics",
    "memory_timeseries": "analysis.metrics",
    "time_binned": "analysis.metrics",
    "write_report": "analysis.report",
    "fragmentation_report": "analysis.fragmentation",
    "FragmentationReport": "analysis.fragmentation",
    "run_row": "analysis.table",
    "parquet_safe": "analysis.table",
    "add_analysis_commands": "analysis.cli",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

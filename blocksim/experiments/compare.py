"""Compare policies on one trace: the (policy x rate scale) grid, run by the sweep's driver.

``compare`` is a preset of the sweep machinery (`blocksim.experiments.backends.run_jobs`): each
(policy, rate scale) pair is one point, run on the local cores or on Ray into
``OUT/<policy>_x<rate>/``. As in a sweep, the trace is read once, a run directory appears only
when complete, rerunning into the same ``OUT`` reuses complete runs, and a run that raises is
recorded as ``status="failed"`` with its error (``error.txt`` in its directory holds the
traceback) while the others complete. ``OUT/summary.parquet`` has one row per run,
``OUT/compare.json`` the setup, and ``OUT/report.html`` / ``report.md`` compare the runs
(`analysis.report.write_report`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

import traces
from analysis.cli import slo_type
from analysis.headline import RUN_KEYS, headline_frame, text_table
from analysis.slo import format_slo
from analysis.table import parquet_safe
from blocksim.experiments.backends import BACKENDS, GridSource, Job, add_backend_options, run_jobs
from blocksim.experiments.configfile import read_config_file
from blocksim.experiments.rundir import resumable
from blocksim.experiments.points import RunLayout, replay_runner
from blocksim.experiments.spec import Point, validate_points

Runner = Callable[..., dict]

#: The grid's own columns, first in the table; the run's metrics follow.
_KEY_COLUMNS = ("policy", "rate_scale", "status", "error", "attempts", "run_dir")


def run_dir_name(policy: str, rate_scale: float) -> str:
    """``vllm`` at 0.5 -> ``vllm_x0.5``; characters unsafe in file names become ``-``."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '-', policy)}_x{rate_scale:g}"


def slo_text(slo: dict[str, float]) -> str:
    """An SLO in seconds as ``parse_slo`` text that reads back to the same floats."""
    return ",".join(f"{k}={v!r}s" for k, v in slo.items())


def compare_points(label: str, policies: list[str], rate_scales: list[float], overrides: dict) -> list[Point]:
    """The grid as sweep points, policy slowest: every override shared, policy and rate scale varying."""
    return [Point(label, {**overrides, "policy": p, "rate_scale": r}, ("policy", "rate_scale"))
            for p in policies for r in rate_scales]


def compare(
    trace: str | Path | traces.Trace,
    policies: list[str],
    rate_scales: list[float] = (1.0,),
    out_dir: str | Path = "compare",
    workers: int | None = None,
    *,
    runner: Runner | None = None,
    slo: dict[str, float] | None = None,
    overrides: dict | None = None,
    progress: bool = False,
    report: bool = True,
    backend: str = "local",
    address: str | None = None,
    reference_rate_scale: float | None = None,
    **common,
) -> pd.DataFrame:
    """Run every (policy, rate scale) on ``trace`` and return the combined summary.

    ``common`` keyword arguments are simulator overrides for every run (merged into
    ``overrides``, e.g. ``model="llama-2-13b", max_requests=500``). ``workers`` defaults to the
    number of local cores (capped by the number of runs); ``workers=1`` runs in this process.
    ``backend="ray"`` runs on Ray (``address``: a cluster to join). ``runner`` replaces the
    simulator (same signature as ``blocksim.experiments.runner.replay``; it receives the trace
    already read and cut to ``max_requests``); without one, every policy and option is checked
    before any run starts, and a warning is printed when more than 1% of the requests will be
    rejected as too long. ``reference_rate_scale`` (one of ``rate_scales``; default: the one
    closest to 1) is the rate whose runs the report's time series show. Writes
    ``summary.parquet``, ``compare.json`` and (with ``report=True``) the report.
    """
    policies = list(dict.fromkeys(policies))
    rate_scales = list(dict.fromkeys(float(r) for r in rate_scales))
    if not policies:
        raise ValueError("compare needs at least one policy")
    if not rate_scales or any(not (r > 0 and math.isfinite(r)) for r in rate_scales):
        raise ValueError(f"rate scales must be positive numbers, got {rate_scales}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if reference_rate_scale is not None and float(reference_rate_scale) not in rate_scales:
        raise ValueError(f"reference rate scale {reference_rate_scale} is not one of the rate scales {rate_scales}")
    is_path = isinstance(trace, (str, Path))
    if is_path and not Path(trace).exists():
        raise FileNotFoundError(f"trace {trace} not found")
    overrides = {**(overrides or {}), **common}
    label = Path(trace).stem if is_path else (getattr(trace, "name", "") or "trace")
    points = compare_points(label, policies, rate_scales, overrides)
    if runner is None:  # the simulator: refuse a bad policy or option before any run starts
        validate_points(points)
    loaded = traces.read_trace(trace) if is_path else trace
    if runner is None:
        from blocksim.experiments.runner import rejection_warning  # the simulator: loaded when a comparison runs

        warnings = {rejection_warning(loaded, p, overrides, clip_hint="--set clip_to_model=true")
                    for p in policies}
        for line in sorted(w for w in warnings if w):
            print(f"blocksim compare: {line}", file=sys.stderr)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    slo = slo or {}
    jobs = [Job(run_dir_name(p.policy, p.rate_scale), p, order=(i,)) for i, p in enumerate(points)]
    rows = run_jobs(GridSource(jobs), RunLayout(out_dir, runs=""), {label: loaded}, runner or replay_runner,
                    slo_text(slo), backend=backend, workers=workers, address=address, progress=progress,
                    desc="compare")
    table = []
    for r in rows:
        point = r["_job"].point
        row = {"policy": point.policy, "rate_scale": point.rate_scale,
               **{k: r[k] for k in _KEY_COLUMNS[2:]}}
        row.update({k: v for k, v in r.items() if k not in row and k not in ("name", "_job")})
        table.append(row)
    # analysis.report loads matplotlib: imported when a comparison is written, not when the CLI starts
    from analysis.report import COMPARE_SETUP, COMPARE_SUMMARY, write_report

    summary = parquet_safe(pd.DataFrame(table))
    summary.to_parquet(out_dir / COMPARE_SUMMARY, index=False)
    setup = {"trace": str(trace) if is_path else label, "policies": policies, "rate_scales": rate_scales,
             "slo": format_slo(slo), "overrides": overrides, "backend": backend, "workers": workers,
             "address": address}
    if reference_rate_scale is not None:
        setup["reference_rate_scale"] = float(reference_rate_scale)
    (out_dir / COMPARE_SETUP).write_text(json.dumps(setup, indent=2, default=str))
    if report:
        write_report(out_dir)
    return summary


# ---------------------------------------------------------------- command line

def _rate_scales(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rate scales must be positive numbers, got {text!r}")
    return rates


def _setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), yaml.safe_load(value)


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        overrides = read_config_file(args.config) if args.config else {}
        policies = args.policy or ([overrides["policy"]] if overrides.get("policy") else [])
        overrides.pop("policy", None)
        if not policies:
            raise ValueError("compare needs --policy (repeat it for several), or 'policy' in the --config file")
        overrides.update(dict(args.set or []))
        for key in ("max_requests", "model", "gpu"):
            if getattr(args, key) is not None:
                overrides[key] = getattr(args, key)
        from analysis.report import COMPARE_SETUP  # loads matplotlib: only when a comparison runs

        with resumable(args.out, marker=COMPARE_SETUP, overwrite=args.overwrite):
            summary = compare(args.trace, policies, args.rate_scale, args.out, args.workers, slo=args.slo,
                              overrides=overrides, progress=not args.quiet, backend=args.backend,
                              address=args.address)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"blocksim compare: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(text_table(headline_frame(summary, RUN_KEYS)))
    for row in summary[summary["status"] != "ok"].itertuples():
        print(f"  {row.policy} x{row.rate_scale:g} failed: {row.error}")
    if "rejected" in summary and summary["rejected"].fillna(0).gt(0).any():
        worst = summary.loc[summary["rejected"].fillna(0).idxmax()]
        print(f"rejected requests: up to {int(worst['rejected']):,} of {int(worst['requests']):,} per run "
              f"(the requests table of each run directory holds the reasons)")
    reused = int((summary["attempts"] == 0).sum())
    if reused:
        print(f"{reused} of {len(summary)} runs reused from an earlier compare into {args.out}")
    print(f"\nsummary: {args.out}/summary.parquet\nreport:  {args.out}/report.html\n         {args.out}/report.md")
    failed = int((summary["status"] != "ok").sum())
    if failed:
        print(f"{failed} of {len(summary)} runs failed; see the error column and error.txt", file=sys.stderr)
    return 1 if failed else 0


def add_compare_command(subparsers) -> None:
    """Register ``blocksim compare`` on an argparse sub-parser set."""
    p = subparsers.add_parser("compare", help="run a trace under several policies and rates, then compare",
                              description="One simulation per (policy, rate scale), in parallel on the local "
                                          "cores or on Ray, each into OUT/<policy>_x<rate>/; then "
                                          "OUT/summary.parquet and OUT/report.html. Rerunning into the same "
                                          "OUT reuses complete runs. Exit status 1 if any run failed.")
    p.add_argument("trace", metavar="TRACE", help="trace file (any format `blocksim replay` reads)")
    p.add_argument("--policy", action="append", default=None, metavar="P",
                   help="policy preset or plugin (repeat for several; default: 'policy' of the --config file)")
    p.add_argument("--rate-scale", type=_rate_scales, default=[1.0], metavar="R[,R...]",
                   help="arrival-rate multipliers, e.g. 0.5,1,2,4 (default 1)")
    p.add_argument("--slo", type=slo_type, default=None, metavar="SLO",
                   help="goodput SLO, e.g. ttft=2s,tpot=100ms,e2e=30s (units s or ms)")
    add_backend_options(p)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: new, empty or an earlier compare's (its complete runs are reused)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out whole instead of reusing its runs (default: reuse an earlier "
                        "compare's, refuse anything else)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="YAML/TOML file of run options for every run (the keys of `blocksim replay --config`); "
                        "--policy, --set and the flags here override it")
    p.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--model", default=None, help="model name from the catalog")
    p.add_argument("--gpu", default=None, help="GPU name from the catalog")
    p.add_argument("--set", type=_setting, action="append", metavar="KEY=VALUE",
                   help="any other simulator override for every run (repeatable; VALUE parsed as YAML)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (drawn only when stderr is a terminal)")
    p.add_argument("--no-progress", dest="quiet", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_compare)

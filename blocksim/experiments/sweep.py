"""Parameter sweeps: a YAML spec -> one run directory per point, ``sweep.parquet``, a report.

``run_sweep`` validates every point, loads each trace once, runs the points on the local cores
(``backend="local"``) or on Ray (``backend="ray"``), and writes into ``out_dir``::

    runs/<name>/          one run directory per point (+ point.json, its metrics row)
    sweep.parquet         one row per run: parameters, status, error, attempts, metrics
    max_rate.parquet      with find="max-rate": one row per configuration
    sweep.json            the resolved spec and options
    sweep_report.html/.md the report

Rerunning into the same ``out_dir`` reuses every complete run directory. See docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

import traces
from analysis.slo import parse_slo
from analysis.sweep_report import write_sweep_report
from analysis.table import parquet_safe
from blocksim.config import ConfigError
from blocksim.experiments.backends import BACKENDS, GridSource, Job, add_backend_options, run_jobs
from blocksim.experiments.configfile import read_config_file
from blocksim.experiments.rundir import resumable
from blocksim.experiments.points import RunLayout, replay_runner
from blocksim.experiments.search import MaxRateSource
from blocksim.experiments.spec import Point, SpecError, SweepSpec, load_spec, validate_points

SWEEP_TABLE = "sweep.parquet"
MAX_RATE_TABLE = "max_rate.parquet"
SETUP_FILE = "sweep.json"
FIND_MODES = ("max-rate",)


def _param_columns(spec: SweepSpec) -> list[str]:
    keys = ["trace", "policy", "rate_scale", *spec.base, *spec.axes]
    if spec.seeds:
        keys.append("seed")
    return list(dict.fromkeys(keys))


def _params(point: Point, columns: list[str]) -> dict:
    values = {"trace": point.trace, "policy": point.policy, "rate_scale": point.rate_scale}
    return {c: values[c] if c in values else point.params.get(c) for c in columns}


def _table(rows: list[dict]) -> pd.DataFrame:
    return parquet_safe(pd.DataFrame(rows))


def load_traces(spec: SweepSpec) -> dict:
    """Every trace of the spec, read once: label -> `traces.Trace`."""
    return {ref.label: traces.read_trace(ref.path()) for ref in spec.traces}


def rejection_warnings(points: list[Point], loaded: dict) -> list[str]:
    """The distinct rejection warnings of the points (`runner.rejection_warning`), each naming its
    trace, for the start of a sweep."""
    # the runner imports the whole simulator: loaded when a sweep runs, not when the CLI starts
    from blocksim.experiments.runner import rejection_warning

    seen: dict[str, None] = {}
    for p in points:
        overrides = {**p.overrides(), "max_requests": p.max_requests}
        line = rejection_warning(loaded[p.trace], p.policy, overrides, clip_hint="clip_to_model: true in 'base'",
                                   model_hint="'model:'")
        if line:
            seen.setdefault(f"trace {p.trace}: {line}")
    return list(seen)


def run_sweep(spec: SweepSpec | str | Path, out_dir: str | Path, *, backend: str = "local",
              workers: int | None = None, address: str | None = None, slo: str | None = None,
              find: str | None = None, goodput_threshold: float = 0.9, bisect_steps: int = 6,
              progress: bool = False, report: bool = True, runner: Callable | None = None) -> pd.DataFrame:
    """Run a sweep and return its table (also written to ``out_dir/sweep.parquet``).

    ``slo`` (``"ttft=2s,tpot=100ms"``) overrides the spec's; it adds goodput columns and ranks the
    report's best configurations. ``find="max-rate"`` searches, per configuration, the highest
    rate scale meeting the SLO (see `blocksim.experiments.search`); its results are
    ``out_dir/max_rate.parquet`` and ``df.attrs["max_rate"]``. ``runner`` replaces
    ``blocksim.experiments.runner.replay`` (same signature; must pickle, e.g. a module-level function).
    Raises `SpecError` before running anything if any point is invalid.
    """
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    if backend not in BACKENDS:
        raise SpecError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if workers is not None and workers < 1:
        raise SpecError(f"workers must be >= 1, got {workers}")
    slo_text = slo if slo is not None else (spec.slo or "")
    try:
        parse_slo(slo_text)
    except ValueError as exc:
        raise SpecError(f"slo: {exc}") from None
    points = spec.points()
    if find is not None:
        if find not in FIND_MODES:
            raise SpecError(f"unknown search {find!r}; choose one of {', '.join(FIND_MODES)}")
        if not slo_text:
            raise SpecError("--find max-rate needs an SLO (--slo or 'slo:' in the spec)")
        if "rate_scale" in spec.axes:
            raise SpecError("with --find max-rate the rate scale is searched: remove the 'rate_scale' axis "
                            "(base.rate_scale sets where the search starts)")
        if bisect_steps < 0:
            raise SpecError(f"bisect steps must be >= 0, got {bisect_steps}")
    validate_points(points)
    loaded = load_traces(spec)
    if runner is None:
        for line in rejection_warnings(points, loaded):
            print(f"blocksim sweep: {line}", file=sys.stderr)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    setup = {**spec.to_dict(), "slo": slo_text, "backend": backend, "workers": workers, "address": address,
             "find": find, "points": len(points)}
    if find:
        setup.update(goodput_threshold=goodput_threshold, bisect_steps=bisect_steps)
        source = MaxRateSource(points, goodput_threshold, bisect_steps)
    else:
        source = GridSource([Job(p.name(), p, order=(i,)) for i, p in enumerate(points)])
    (out_dir / SETUP_FILE).write_text(json.dumps(setup, indent=2, default=str))

    started = time.perf_counter()
    rows = run_jobs(source, RunLayout(out_dir), loaded, runner or replay_runner, slo_text, backend=backend,
                    workers=workers, address=address, progress=progress)
    setup["wall_s"] = round(time.perf_counter() - started, 2)

    columns = _param_columns(spec)
    df = _table([{**_params(r["_job"].point, columns), **{k: v for k, v in r.items() if k not in columns
                                                          and k != "_job"}} for r in rows])
    df.to_parquet(out_dir / SWEEP_TABLE, index=False)
    max_rate = None
    if find:
        cfg_cols = [c for c in columns if c != "rate_scale"]
        max_rate = _table([{**_params(s.config, cfg_cols), **s.result()} for s in source.searches])
        max_rate.to_parquet(out_dir / MAX_RATE_TABLE, index=False)
        df.attrs["max_rate"] = max_rate
    (out_dir / SETUP_FILE).write_text(json.dumps(setup, indent=2, default=str))
    if report:
        write_sweep_report(out_dir, df, setup, max_rate)
    return df


# ---------------------------------------------------------------- command line

def with_config_file(spec: SweepSpec, path: str) -> SweepSpec:
    """`spec` with the options of a config file under its ``base`` (the spec's own base wins)."""
    config = read_config_file(path)
    return dataclasses.replace(spec, base={**config, **spec.base})


def _fail(message: str) -> int:
    print(f"blocksim sweep: {message}", file=sys.stderr)
    return 2


def cmd_sweep(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec)
        if args.config:
            spec = with_config_file(spec, args.config)
        if args.dry_run:
            points = spec.points()
            validate_points(points)
            print(f"{len(points)} points over {len(spec.traces)} trace(s); all valid")
            for p in points[:10]:
                print(f"  runs/{p.name()}")
            if len(points) > 10:
                print(f"  ... and {len(points) - 10} more")
            return 0
        with resumable(args.out, marker=SETUP_FILE, overwrite=args.overwrite):
            df = run_sweep(spec, args.out, backend=args.backend, workers=args.workers, address=args.address,
                           slo=args.slo, find=args.find, goodput_threshold=args.goodput_threshold,
                           bisect_steps=args.bisect_steps, progress=not args.quiet, report=not args.no_report)
    except (SpecError, ConfigError) as exc:
        return _fail(" ".join(str(exc).split()))
    except (FileNotFoundError, RuntimeError) as exc:
        return _fail(str(exc))
    failed = df[df["status"] != "ok"]
    reused = int((df["attempts"] == 0).sum())
    print(f"{len(df)} runs: {len(df) - len(failed)} ok ({reused} reused), {len(failed)} failed")
    rejecting = df[df["rejected"].fillna(0) > 0] if "rejected" in df else df.iloc[:0]
    if len(rejecting):
        worst = rejecting.loc[rejecting["rejected"].idxmax()]
        print(f"{len(rejecting)} runs rejected requests, up to {int(worst['rejected']):,} of "
              f"{int(worst['requests']):,} ({worst['name']})")
    if "max_rate" in df.attrs:
        mr = df.attrs["max_rate"]
        cols = [c for c in mr.columns if c not in ("error", "max_rate_run_dir", "requests_per_s")]
        print(mr[cols].to_string(index=False))
        print(f"max rate: {Path(args.out) / MAX_RATE_TABLE}")
    print(f"table:  {Path(args.out) / SWEEP_TABLE}")
    if not args.no_report:
        print(f"report: {Path(args.out) / 'sweep_report.html'}\n        {Path(args.out) / 'sweep_report.md'}")
    for name, err in list(zip(failed["name"], failed["error"]))[:5]:
        print(f"failed: {name}: {err}", file=sys.stderr)
    return 1 if len(failed) else 0


def add_sweep_command(subparsers) -> None:
    """Register ``blocksim sweep`` on an argparse sub-parser set."""
    p = subparsers.add_parser(
        "sweep", help="run a grid of configurations (YAML spec) on local cores or Ray",
        description="Run every point of a YAML sweep spec (traces x axes x seeds) into OUT/runs/, then "
                    "write OUT/sweep.parquet and OUT/sweep_report.html. Rerunning skips complete points. "
                    "Exit status 1 if any point failed, 2 for an invalid spec. See docs/sweeps.md.")
    p.add_argument("spec", metavar="SPEC.yaml", help="sweep spec: traces, base options, axes (docs/sweeps.md)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: new, empty or an earlier sweep's (its complete points are reused)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out whole instead of reusing its points (default: reuse an earlier "
                        "sweep's, refuse anything else)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="YAML/TOML file of run options (the keys of `blocksim replay --config`) under the spec's "
                        "'base'; the spec's own base and axes win")
    add_backend_options(p)
    p.add_argument("--slo", default=None, metavar="SLO",
                   help="e.g. ttft=2s,tpot=100ms (units s or ms); overrides the spec's slo")
    p.add_argument("--find", choices=FIND_MODES, default=None,
                   help="max-rate: per configuration, the highest rate scale meeting the SLO")
    p.add_argument("--goodput-threshold", type=float, default=0.9,
                   help="with --find: share of requests that must meet the SLO (default 0.9)")
    p.add_argument("--bisect-steps", type=int, default=6, help="with --find: bisection steps (default 6)")
    p.add_argument("--dry-run", action="store_true", help="validate the spec and list the points")
    p.add_argument("--no-report", action="store_true", help="skip sweep_report.html / .md")
    p.add_argument("--quiet", action="store_true", help="no progress bar (drawn only when stderr is a terminal)")
    p.set_defaults(func=cmd_sweep)

"""Run one trace under several policies and request rates, in parallel, and compare them.

Each (policy, rate scale) pair is one call of the simulator's ``replay`` in its own process,
writing ``OUT/<policy>_x<rate>/``. A run that raises is recorded as ``status="failed"`` with its
error (and ``error.txt`` holding the traceback in its directory); the others still complete.
``OUT/summary.parquet`` has one row per run; ``OUT/report.html`` / ``report.md`` compare them.
"""

from __future__ import annotations

import json
import math
import os
import re
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from analysis.metrics import (
    goodput_metrics,
    memory_fractions,
    offered_rate,
    prefix_hit_rate,
)
from analysis.report import COMPARE_SETUP, COMPARE_SUMMARY, write_report
from analysis.rundir import load_run
from analysis.slo import format_slo

Runner = Callable[..., dict]


def replay_runner(trace_path: str, out_dir: str, **kwargs) -> dict:
    """The real simulator (imported in the worker, so ``analysis`` does not need it to load)."""
    from blocksim.experiments.runner import replay

    return replay(trace_path, out_dir, **kwargs)


def run_dir_name(policy: str, rate_scale: float) -> str:
    """``vllm`` at 0.5 -> ``vllm_x0.5``; characters unsafe in file names become ``-``."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '-', policy)}_x{rate_scale:g}"


def _run_one(runner: Runner, trace: str, run_dir: str, policy: str, rate_scale: float,
             overrides: dict | None) -> tuple[dict | None, str, str]:
    """(summary, error, traceback) of one run; never raises, so one failure cannot sink the pool."""
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "error.txt").unlink(missing_ok=True)  # from an earlier failed attempt
        summary = runner(trace, run_dir, policy=policy, rate_scale=rate_scale,
                         overrides=overrides or None, progress=False, write_report=False)
        return (summary if isinstance(summary, dict) else {}), "", ""
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported in the summary, not re-raised
        return None, " ".join(f"{type(exc).__name__}: {exc}".split()), traceback.format_exc()


def _row(out_dir: Path, policy: str, rate_scale: float, result: tuple, slo: dict) -> dict:
    summary, error, tb = result
    name = run_dir_name(policy, rate_scale)
    row = {"policy": policy, "rate_scale": rate_scale, "status": "failed", "error": error, "run_dir": name}
    if summary is None:
        if tb:
            (out_dir / name).mkdir(parents=True, exist_ok=True)
            (out_dir / name / "error.txt").write_text(tb)
        return row
    try:
        run = load_run(out_dir / name)
    except Exception as exc:  # noqa: BLE001 - an incomplete run directory is a failed run
        row["error"] = f"run finished but its directory is unusable: {exc}"
        return row
    flat = run_row(run, slo)
    flat.update({k: v for k, v in summary.items() if not isinstance(v, (dict, list))})
    row.update({k: v for k, v in flat.items() if k not in row})
    row["status"] = "ok"
    return row


def run_row(run, slo: dict | None = None) -> dict:
    """One run as a flat row: its summary's scalars, offered rate, prefix hit rate, memory fractions,
    and goodput under `slo` when given (shared by compare and sweep tables)."""
    row = {k: v for k, v in run.summary.items() if not isinstance(v, (dict, list))}
    row["offered_rate_req_s"] = offered_rate(run.requests)
    hit_rate = prefix_hit_rate(run.summary)
    if hit_rate is not None:
        row["prefix_hit_rate"] = hit_rate
    if slo:
        row.update(goodput_metrics(run, slo))
    row.update(memory_fractions(run))
    return row


def parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns mixing numbers and strings across runs become numbers where possible, else text."""
    for col in df.columns[df.dtypes == object]:
        values = df[col].dropna()
        if values.map(lambda v: isinstance(v, str)).all():
            continue
        numeric = pd.to_numeric(df[col], errors="coerce")
        ok = numeric.notna() | df[col].isna()
        df[col] = numeric if ok.all() else df[col].map(lambda v: None if v is None else str(v))
    return df


def compare(
    trace: str | Path,
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
    **common,
) -> pd.DataFrame:
    """Run every (policy, rate scale) on ``trace`` and return the combined summary.

    ``common`` keyword arguments are simulator overrides for every run (merged into
    ``overrides``, e.g. ``model="llama-2-13b", max_requests=500``). ``workers`` defaults to the
    number of local cores (capped by the number of runs); ``workers=1`` runs in this process.
    ``runner`` replaces the simulator (same signature as ``blocksim.experiments.runner.replay``).
    Writes ``summary.parquet``, ``compare.json`` and (with ``report=True``) the report.
    """
    policies = list(dict.fromkeys(policies))
    rate_scales = list(dict.fromkeys(float(r) for r in rate_scales))
    if not policies:
        raise ValueError("compare needs at least one policy")
    if not rate_scales or any(not (r > 0 and math.isfinite(r)) for r in rate_scales):
        raise ValueError(f"rate scales must be positive numbers, got {rate_scales}")
    if isinstance(trace, (str, Path)) and runner is None and not Path(trace).exists():
        raise FileNotFoundError(f"trace {trace} not found")
    overrides = {**(overrides or {}), **common}
    if runner is None:  # the simulator: refuse a bad policy or option before any run starts
        from blocksim.experiments.runner import check_options
        for policy in policies:
            check_options(policy, overrides)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runner = runner or replay_runner
    slo = slo or {}
    jobs = [(p, r) for p in policies for r in rate_scales]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    args = {job: (runner, str(trace), str(out_dir / run_dir_name(*job)), *job, overrides) for job in jobs}
    results: dict[tuple, tuple] = {}
    bar = tqdm(total=len(jobs), desc="compare", unit="run", disable=not progress)
    if workers == 1:
        for job in jobs:
            results[job] = _run_one(*args[job])
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_run_one, *args[job]): job for job in jobs}
            for future in as_completed(futures):
                try:
                    results[futures[future]] = future.result()
                except Exception as exc:  # noqa: BLE001 - e.g. a worker killed by the OS
                    results[futures[future]] = (None, f"{type(exc).__name__}: {exc}", "")
                bar.update()
    bar.close()
    summary = parquet_safe(pd.DataFrame([_row(out_dir, *job, results[job], slo) for job in jobs]))
    summary.to_parquet(out_dir / COMPARE_SUMMARY, index=False)
    setup = {"trace": str(trace), "policies": policies, "rate_scales": rate_scales,
             "slo": format_slo(slo), "overrides": overrides, "workers": workers}
    (out_dir / COMPARE_SETUP).write_text(json.dumps(setup, indent=2, default=str))
    if report:
        write_report(out_dir)
    return summary

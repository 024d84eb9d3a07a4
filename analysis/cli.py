"""The ``report``, ``fragmentation`` and ``compare`` sub-commands of ``blocksim``.

``blocksim``'s main parser calls ``add_analysis_commands(subparsers)`` and then
``args.func(args)``; each handler returns an exit status. Heavy imports (matplotlib, the
simulator) happen inside the handlers so ``blocksim --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from analysis.slo import parse_slo


def _slo(text: str) -> dict[str, float]:
    try:
        return parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


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


def _fail(command: str, exc: Exception) -> int:
    print(f"blocksim {command}: {exc}", file=sys.stderr)
    return 2


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import write_report
    from analysis.rundir import RunDirError

    try:
        html, md = write_report(args.run_dir, slo=args.slo)
    except RunDirError as exc:
        return _fail("report", exc)
    print(f"report: {html}\n        {md}")
    return 0


def cmd_fragmentation(args: argparse.Namespace) -> int:
    from analysis.fragmentation import fragmentation_report
    from analysis.rundir import RunDirError

    try:
        rep = fragmentation_report(args.run_dir, top_k=args.top_k, window_s=args.window_s)
    except RunDirError as exc:
        return _fail("fragmentation", exc)
    print(rep.breakdown.to_string(index=False))
    print()
    print(rep.windows.to_string(index=False))
    print(f"\nfragmentation report: {rep.md_path}\n                      {rep.html_path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from blocksim.experiments.compare import compare

    overrides = dict(args.set or [])
    for key in ("max_requests", "model", "gpu"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    try:
        summary = compare(args.trace, args.policy, args.rate_scale, args.out, args.workers,
                          slo=args.slo, overrides=overrides, progress=not args.no_progress)
    except (ValueError, OSError) as exc:
        return _fail("compare", exc)
    cols = [c for c in ("policy", "rate_scale", "status", "requests_per_s", "norm_latency_mean_s",
                        "goodput_requests_per_s", "token_states_frac", "error") if c in summary.columns]
    print(summary[cols].to_string(index=False))
    print(f"\nsummary: {args.out}/summary.parquet\nreport:  {args.out}/report.html\n         {args.out}/report.md")
    failed = int((summary["status"] != "ok").sum())
    if failed:
        print(f"{failed} of {len(summary)} runs failed; see the error column and error.txt", file=sys.stderr)
    return 1 if failed else 0


def add_analysis_commands(subparsers) -> None:
    """Register ``report``, ``fragmentation`` and ``compare`` on an argparse sub-parser set."""
    p = subparsers.add_parser("report", help="(re)write report.html and report.md for a run or compare directory",
                              description="Write report.html (self-contained) and report.md into RUN_DIR, "
                                          "a run directory or a `blocksim compare` output directory.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--slo", type=_slo, default=None, metavar="SLO",
                   help="add goodput under this SLO, e.g. ttft=2s,tpot=100ms,e2e=30s (units s or ms)")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("fragmentation", help="where KV memory was wasted, and when",
                              description="Breakdown of KV memory, the worst windows by wasted slots with "
                                          "the requests resident then, and free-extent sizes where recorded. "
                                          "Writes fragmentation.md and fragmentation.html into RUN_DIR.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--top-k", type=int, default=5, help="worst windows to list (default 5)")
    p.add_argument("--window-s", type=float, default=None,
                   help="window length in seconds (default: the run split into 50 windows)")
    p.set_defaults(func=cmd_fragmentation)

    p = subparsers.add_parser("compare", help="run a trace under several policies and rates, then compare",
                              description="One simulation per (policy, rate scale), in parallel on the local "
                                          "cores, each into OUT/<policy>_x<rate>/; then OUT/summary.parquet "
                                          "and OUT/report.html. Exit status 1 if any run failed.")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--policy", action="append", required=True, metavar="P",
                   help="policy preset or plugin (repeat for several)")
    p.add_argument("--rate-scale", type=_rate_scales, default=[1.0], metavar="R[,R...]",
                   help="arrival-rate multipliers, e.g. 0.5,1,2,4 (default 1)")
    p.add_argument("--slo", type=_slo, default=None, metavar="SLO",
                   help="goodput SLO, e.g. ttft=2s,tpot=100ms,e2e=30s (units s or ms)")
    p.add_argument("--workers", type=int, default=None, help="parallel runs (default: local cores)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--model", default=None, help="model name from the catalog")
    p.add_argument("--gpu", default=None, help="GPU name from the catalog")
    p.add_argument("--set", type=_setting, action="append", metavar="KEY=VALUE",
                   help="any other simulator override for every run (repeatable; VALUE parsed as YAML)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_compare)

"""The ``report`` and ``fragmentation`` sub-commands of ``blocksim``, and the ``--slo`` argument type.

``blocksim``'s main parser calls ``add_analysis_commands(subparsers)`` and then
``args.func(args)``; each handler returns an exit status. The handlers import the report modules
(and so matplotlib) when they run, so ``blocksim --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from analysis.rundir import RunDirError
from analysis.slo import parse_slo


def slo_type(text: str) -> dict[str, float]:
    """argparse type for ``--slo``: ``ttft=2s,tpot=100ms`` -> seconds per key."""
    try:
        return parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _fail(command: str, exc: Exception) -> int:
    print(f"blocksim {command}: {exc}", file=sys.stderr)
    return 2


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import write_report  # loads matplotlib: only when this command runs

    try:
        html, md = write_report(args.run_dir, slo=args.slo)
    except RunDirError as exc:
        return _fail("report", exc)
    print(f"report: {html}\n        {md}")
    return 0


def cmd_fragmentation(args: argparse.Namespace) -> int:
    from analysis.fragmentation import fragmentation_report  # loads matplotlib: only when this command runs

    try:
        rep = fragmentation_report(args.run_dir, top_k=args.top_k, window_s=args.window_s)
    except RunDirError as exc:
        return _fail("fragmentation", exc)
    print(rep.breakdown.to_string(index=False))
    print()
    print(rep.windows.to_string(index=False))
    print(f"\nfragmentation report: {rep.md_path}\n                      {rep.html_path}")
    return 0


def add_analysis_commands(subparsers) -> None:
    """Register ``report`` and ``fragmentation`` on an argparse sub-parser set."""
    p = subparsers.add_parser("report", help="(re)write report.html and report.md for a run or compare directory",
                              description="Write report.html (self-contained) and report.md into RUN_DIR, "
                                          "a run directory or a `blocksim compare` output directory.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (blocksim replay --out) or a compare output")
    p.add_argument("--slo", type=slo_type, default=None, metavar="SLO",
                   help="add goodput under this SLO, e.g. ttft=2s,tpot=100ms,e2e=30s (units s or ms)")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("fragmentation", help="where KV memory was wasted, and when",
                              description="Breakdown of KV memory, the worst windows by wasted slots with "
                                          "the requests resident then, and free-extent sizes where recorded. "
                                          "Writes fragmentation.md and fragmentation.html into RUN_DIR.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (blocksim replay --out)")
    p.add_argument("--top-k", type=int, default=5, help="worst windows to list (default 5)")
    p.add_argument("--window-s", type=float, default=None,
                   help="window length in seconds (default: the run split into 50 windows)")
    p.set_defaults(func=cmd_fragmentation)

"""The ``blocksim fidelity SIM_RUN EXEC_RUN`` command: console table, report and results row.

Writes ``OUT/fidelity.html`` and ``OUT/fidelity.md`` (latency CDFs of both runs overlaid,
predicted against measured step times, the error tables) and ``OUT/fidelity.json`` (the row);
with ``--results FILE`` also adds the row to that results file (e.g.
``benchmarks/results/fidelity-h200.json``). What is compared is `analysis.fidelity`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.fidelity import Fidelity, FidelityError, append_rows, compare


def console_table(f: Fidelity) -> str:
    cm = f.cost_model
    lines = [f"fidelity: {f.sim.path} (simulated, cost model {cm.get('name')}"
             f"{', ' + str(cm.get('profile')) if cm.get('profile') else ''}) against {f.exec.path} (executed)",
             f"  requests finished in both: {f.matched}",
             f"  {'metric':<8} {'pct':>4} {'simulated':>12} {'executed':>12} {'error':>8}"]
    for r in f.latency.itertuples(index=False):
        scale, unit = (1e3, "ms") if r.metric == "tpot" else (1.0, "s")
        lines.append(f"  {r.metric:<8} {'p' + str(r.percentile):>4} {r.sim_s * scale:>10.3f}{unit:>2} "
                     f"{r.exec_s * scale:>10.3f}{unit:>2} {r.err:>+8.2%}")
    for r in ([] if f.per_request is None else f.per_request.itertuples(index=False)):
        lines.append(f"  {r.metric:<8} by request: " + ("n/a (no request)" if not r.requests else
                     f"median {r.median:+.2%} (10%-90%: {r.p10:+.2%} to {r.p90:+.2%}, {r.requests} requests)"))
    t = f.throughput
    lines.append(f"  {'throughput':<13} {t['sim']:>10.1f}  {t['exec']:>10.1f}   {t['err']:>+8.2%}  (output tokens/s)")
    mape = f.step_mape
    lines.append(f"  per-step MAPE: {'n/a' if mape is None else f'{mape:.2%}'}"
                 f"{'' if f.predicted_s is None else f' over {len(f.predicted_s)} steps'} ({f.step_source})")
    return "\n".join(lines)


def step_scatter(f: Fidelity) -> bytes:
    """Predicted against measured seconds per executed step, log-log, with the y = x line."""
    from analysis.figures import _figure, _themed, series_style

    @_themed
    def draw():
        fig, axes = _figure(1, 1, width=6.0, row_height=5.0)
        ax = axes[0, 0]
        pred, meas = f.predicted_s, f.measured_s
        ok = (pred > 0) & (meas > 0)
        steps = f.exec.steps
        kinds = {"decode only": steps.num_prefill_seqs.to_numpy() == 0}
        if len(kinds["decode only"]) != len(pred):  # re-priced plan steps: one kind
            kinds = {"steps": np.ones(len(pred), dtype=bool)}
        else:
            kinds["with a prompt"] = ~kinds["decode only"]
        for i, (label, mask) in enumerate(kinds.items()):
            m = mask & ok
            if m.any():
                st = series_style(i)
                ax.scatter(meas[m] * 1e3, pred[m] * 1e3, s=6, alpha=0.5, color=st["color"], marker=st["marker"],
                           label=f"{label} ({int(m.sum())})")
        if ok.any():
            lo = min(meas[ok].min(), pred[ok].min()) * 1e3
            hi = max(meas[ok].max(), pred[ok].max()) * 1e3
            ax.plot([lo, hi], [lo, hi], color="#333333", linewidth=1, label="predicted = measured")
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set(xlabel="measured step time (ms)", ylabel="predicted step time (ms)")
        ax.legend(loc="upper left")
        return fig

    return draw()


def write_fidelity_report(f: Fidelity, out_dir: Path, row: dict) -> tuple[Path, Path]:
    from analysis.document import Image, Section, Table, write_document
    from analysis.figures import latency_cdfs

    out_dir.mkdir(parents=True, exist_ok=True)
    ids = set(f.sim.requests.request_id) & set(f.exec.requests.request_id)
    reqs = {f"simulated ({f.cost_model.get('name')})": f.sim.requests[f.sim.requests.request_id.isin(ids)],
            "executed": f.exec.requests[f.exec.requests.request_id.isin(ids)]}
    lat = f.latency.rename(columns={"sim_s": "simulated (s)", "exec_s": "executed (s)", "err": "error"})
    sections = [
        Section("summary", "Errors", [
            f"Simulated run {f.sim.path}, executed run {f.exec.path}; {f.matched} requests finished in both. "
            f"Errors are (simulated - executed) / executed.",
            Table(lat, "latency percentiles over the requests finished in both runs"),
            *([Table(f.per_request, "each request's own error (matched by id): median and 10%-90% range over the "
                                   "requests; a percentile above can move further than the median request does")]
              if f.per_request is not None else []),
            Table(pd.DataFrame([{"simulated (tok/s)": f.throughput["sim"], "executed (tok/s)": f.throughput["exec"],
                                 "error": f.throughput["err"]}]), "output tokens per second of the serving interval"),
        ]),
        Section("cdfs", "Latency distributions", [Image(latency_cdfs(reqs), "latency CDFs of both runs",
                                                        "simulated and executed, overlaid")]),
    ]
    steps = [f"Per-step MAPE: {'n/a' if f.step_mape is None else f'{f.step_mape:.2%}'}; predictions from "
             f"{f.step_source}."]
    if f.predicted_s is not None and len(f.predicted_s):
        steps.append(Image(step_scatter(f), "predicted against measured step time", "one point per executed step"))
    sections.append(Section("steps", "Step times", steps))
    (out_dir / "fidelity.json").write_text(json.dumps(row, indent=1) + "\n")
    return write_document(out_dir, "fidelity", "Simulation fidelity", sections)


def cmd_fidelity(args: argparse.Namespace) -> int:
    try:
        f = compare(args.sim_run, args.exec_run)
        row = f.row(trace=args.trace)
    except FidelityError as e:
        print(f"blocksim fidelity: {e}", file=sys.stderr)
        return 2
    print(console_table(f))
    html, md = write_fidelity_report(f, Path(args.out), row)
    print(f"\nreport: {html}\n        {md}")
    if args.results:
        try:
            print(f"results: {append_rows(args.results, [row])}")
        except FidelityError as e:
            print(f"blocksim fidelity: {e}", file=sys.stderr)
            return 2
    return 0


def add_fidelity_command(subparsers) -> None:
    p = subparsers.add_parser("fidelity", help="errors of a simulated run against an executed run of the same trace",
                              description="TTFT / TPOT / end-to-end p50, p90 and p99 errors, throughput error, "
                                          "latency CDFs overlaid and per-step predicted against measured times.")
    p.add_argument("sim_run", metavar="SIM_RUN", help="run directory of blocksim replay")
    p.add_argument("exec_run", metavar="EXEC_RUN", help="run directory of the same trace executed "
                                                        "(blocksim replay --executor cuda)")
    p.add_argument("--out", required=True, metavar="DIR", help="where fidelity.html, .md and .json go")
    p.add_argument("--results", default=None, metavar="FILE",
                   help="add the row to this JSON list (e.g. benchmarks/results/fidelity-h200.json)")
    p.add_argument("--trace", default=None, metavar="NAME", help="the row's trace name (default: SIM's trace file name)")
    p.set_defaults(func=cmd_fidelity)

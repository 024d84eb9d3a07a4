"""The profiled model's error on executed graph-replayed decode steps, by their rows (one, two, more)
and their mean context (where the profile's context grid interpolates between its points):

    python benchmarks/graph_steps_by_context.py EXEC:SIM [EXEC:SIM ...] --json OUT

EXEC: a folder of executed runs (`fidelity_runs.py execute`, plans recorded); SIM: the folder its
twins were simulated into (`fidelity_runs.py simulate`), whose profiled twins name the profile that
prices each run's steps. Each executed plan is re-priced step by step
(`analysis.fidelity.reprice_plan`) and its decode-only steps are grouped by their rows (1, 2, 3 or
more) and the mean context of their rows, in bins of 64 tokens up to 1,152, then wider, and the steps
of three rows or more by their longest row over their mean context too; the JSON holds, per set and
group, each bin's steps and mean signed error (predicted / measured - 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BINS = [0, 64, *range(128, 1153, 64), 1536, 2048, 3072, 4096, 8192]
#: Steps of three rows or more also by their longest row over their mean context.
LONGEST_BINS = [1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 20.0]


def graph_steps(exec_dir: Path, sim_dir: Path) -> pd.DataFrame:
    """One row per executed decode-only step: run, rows, mean context of its rows, error."""
    from analysis.fidelity import reprice_plan
    from analysis.fidelity_replay import rebuild_cost_model
    from blocksim.records.plan import read_plan
    rows = []
    for run in sorted(p.parent for p in exec_dir.glob("*/executor.json")):
        summary = sim_dir / "profiled" / run.name / "summary.json"
        if not (run / "plan").is_dir() or not summary.is_file():
            continue
        nos, pred = reprice_plan(run, rebuild_cost_model(json.loads(summary.read_text())))
        price = dict(zip(nos, pred))
        measured = pd.read_parquet(run / "executor_steps.parquet").set_index("step")["measured_s"]
        _, _, seqs, _ = read_plan(run)
        for step, g in seqs.groupby("step"):
            if g.is_prefill.any() or step not in price or step not in measured.index:
                continue
            ctx = g.context_len.to_numpy(np.float64)
            rows.append({"run": run.name, "rows": len(g), "context": float(ctx.mean()),
                         "longest": float(ctx.max() / ctx.mean()), "err": price[step] / float(measured[step]) - 1})
    return pd.DataFrame(rows, columns=["run", "rows", "context", "longest", "err"])


def binned(steps: pd.DataFrame, column: str, bins: list, label: str, name: str | None = None) -> list[dict]:
    """The steps' errors in `bins` of `column`: each bin's interval (under `name`, else `column`),
    steps and mean signed error; printed after `label`, the bins that hold steps."""
    grouped = steps.groupby(pd.cut(steps[column], bins), observed=True)["err"]
    print(f"{label}: " + ", ".join(f"({i.left:g}, {i.right:g}] {np.mean(v) * 100:+.1f}%" for i, v in grouped if len(v)))
    return [{name or column: [float(i.left), float(i.right)], "steps": int(len(v)), "mean_err": float(np.mean(v))}
            for i, v in grouped]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sets", nargs="+", metavar="EXEC:SIM")
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    out = {"command": "python benchmarks/graph_steps_by_context.py " + " ".join(a.sets) + f" --json {a.json}",
           "sets": []}
    for pair in a.sets:
        exec_dir, _, sim_dir = pair.partition(":")
        if not sim_dir or not Path(exec_dir).is_dir() or not Path(sim_dir).is_dir():
            print(f"graph_steps_by_context.py: {pair}: give EXEC:SIM, two folders (executed runs, their simulated "
                  f"twins)", file=sys.stderr)
            return 2
        d = graph_steps(Path(exec_dir), Path(sim_dir))
        entry = {"exec": exec_dir, "sim": sim_dir, "by_rows": {}}
        for n, b in (("1", d[d.rows == 1]), ("2", d[d.rows == 2]), ("3+", d[d.rows > 2])):
            entry["by_rows"][n] = binned(b, "context", BINS, f"{exec_dir} {n} row(s)")
        entry["rows_3plus_by_longest"] = binned(d[d.rows > 2], "longest", LONGEST_BINS,
                                                f"{exec_dir} 3+ rows by longest / mean context", "longest_over_mean")
        out["sets"].append(entry)
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far two measurements of a profile's ``decode_step`` table differ, cell by cell (no GPU).

    python benchmarks/decode_step_repeat.py A.json B.json [--json OUT.json]

A and B are profiles of one model (``blocksim profile`` files, or files holding only their
``decode_step`` component in the same place). Over the cells both grids share, it reports:

* the cell spread: ``B / A - 1`` per cell, its median and 90th percentile in absolute value;
* the shape spread: each cell's ratio to its batch's cell at the first shared context (16 tokens in
  the profiler's grid), compared the same way (what the profiled model's interpolation between
  contexts of one batch rests on);
* the order: the profiler measures the table batch by batch, each batch's contexts in rising
  order, so consecutive cells were measured seconds apart. ``lag1_correlation`` is the correlation
  of each cell's difference with the next one's in that order, and ``sign_runs`` the lengths of
  the runs of one sign. Differences that come in long runs of one sign and size are a drift of
  the device over time (both measurements hold, each for its own minutes), not noise of single
  cells; spreading each cell's measurement over several passes through the table averages such a
  drift, where more repetitions in a row do not.

A profile that lacks the table, or grids that share fewer than two cells, get one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def table(path: str) -> dict:
    """The ``decode_step`` component of the profile at ``path`` (ValueError naming what is wrong)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON profile ({e})") from None
    t = doc.get("components", {}).get("decode_step") if isinstance(doc, dict) else None
    if not isinstance(t, dict) or not {"grid", "seconds"} <= set(t):
        raise ValueError(f"{path}: no decode_step table (measure it with blocksim profile --add-table decode_step)")
    return t


def compare(a: dict, b: dict) -> dict:
    """The spreads between two ``decode_step`` tables over the cells of both grids, in the
    profiler's measuring order (batch, then context)."""
    batches = [x for x in a["grid"]["batch"] if x in b["grid"]["batch"]]
    contexts = [x for x in a["grid"]["context"] if x in b["grid"]["context"]]

    def cell(t, x, c):
        return t["seconds"][t["grid"]["batch"].index(x)][t["grid"]["context"].index(c)]

    diffs, shape = [], []
    for x in batches:
        for c in contexts:
            diffs.append(cell(b, x, c) / cell(a, x, c) - 1)
            if contexts[0] != c:
                shape.append((cell(b, x, c) / cell(b, x, contexts[0])) / (cell(a, x, c) / cell(a, x, contexts[0])) - 1)
    if len(diffs) < 2:
        raise ValueError(f"the two tables share {len(diffs)} cell(s); need two or more")
    d = np.asarray(diffs)
    runs, sign, n = [], np.sign(d[0]), 0
    for v in d:
        if np.sign(v) == sign:
            n += 1
        else:
            runs.append(n)
            sign, n = np.sign(v), 1
    runs.append(n)

    def summary(v):
        v = np.abs(np.asarray(v))
        return {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "max": float(v.max())}

    return {"batches": batches, "contexts": contexts, "cells": len(diffs),
            "cell_spread": summary(d), "shape_spread": summary(shape) if shape else None,
            "mean_difference": float(d.mean()),
            "lag1_correlation": (float(np.corrcoef(d[:-1], d[1:])[0, 1])
                                 if d[:-1].std() > 0 and d[1:].std() > 0 else None),  # None: no spread to correlate
            "sign_runs": runs, "differences": [[round(float(v), 6) for v in d[i:i + len(contexts)]]
                                               for i in range(0, len(d), len(contexts))]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args()
    try:
        out = compare(table(args.a), table(args.b))
    except ValueError as e:
        print(f"decode_step_repeat.py: {e}", file=sys.stderr)
        return 2
    out = {"a": args.a, "b": args.b, **out}
    c, s = out["cell_spread"], out["shape_spread"]
    shape = (f"ratio to the {out['contexts'][0]}-token cell median {s['median']:.2%}, p90 {s['p90']:.2%}"
             if s else "one shared context: no ratio between contexts")
    print(f"{out['cells']} cells: cell spread median {c['median']:.2%}, p90 {c['p90']:.2%}; {shape}; "
          f"lag-1 correlation in measuring order "
          f"{out['lag1_correlation'] if out['lag1_correlation'] is None else round(out['lag1_correlation'], 2)}, "
          f"{len(out['sign_runs'])} runs of one sign (longest {max(out['sign_runs'])})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

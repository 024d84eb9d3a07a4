"""Leave-one-out check of the profiled cost model's interpolation rule on a measured profile.

For each (table, axis) below, every inner grid point along the axis is dropped, at every point of
the other axes, and interpolated from its two neighbours by a straight line in seconds and by a
power law (straight in log-seconds against log-x); the figure is the median relative error
against the measured value. `blocksim.cost.interpolate` uses straight lines everywhere but along
prefill attention's new tokens, where the power law is the rule. Along those new tokens a third
rule is checked too (`work`): a straight line in the attention's work ``p (c + p / 2)`` for ``p``
new tokens after ``c`` cached ones, at each grid column's ``c``.

    python benchmarks/interpolation_check.py blocksim/profiles/*__float16__tp1.json \
        --json benchmarks/results/interpolation_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

#: (table, axis) pairs checked, in the order docs/cost_models.md names them.
CHECKS = (("decode_step", "context"), ("attn_decode", "context"), ("linear", "tokens"),
          ("attn_prefill", "cached_tokens"), ("attn_prefill", "new_tokens"))


def leave_one_out(grid: np.ndarray, seconds: np.ndarray, axis: int) -> dict[str, float]:
    """Median relative errors of the straight line and the power law at every inner point of `axis`."""
    s = np.moveaxis(seconds, axis, 0)
    line, power = [], []
    for i in range(1, len(grid) - 1):
        x0, x, x1 = grid[i - 1], grid[i], grid[i + 1]
        y0, y, y1 = s[i - 1], s[i], s[i + 1]
        w = (x - x0) / (x1 - x0)
        line.append(np.abs(y0 + w * (y1 - y0) - y) / y)
        if x0 > 0:
            lw = (np.log(x) - np.log(x0)) / (np.log(x1) - np.log(x0))
            power.append(np.abs(np.exp(np.log(y0) + lw * (np.log(y1) - np.log(y0))) - y) / y)
    out = {"points": int(sum(a.size for a in line)), "straight_line": float(np.median(np.concatenate(
        [a.ravel() for a in line])))}
    if power:
        out["power_law"] = float(np.median(np.concatenate([a.ravel() for a in power])))
    return out


def attention_work(new: float, cached: float) -> float:
    """Prefill attention's work in query-key pairs: `new` causal queries after `cached` keys."""
    return new * (cached + new / 2)


def work_leave_one_out(new: np.ndarray, cached: np.ndarray, seconds: np.ndarray) -> float:
    """Median relative error, at every inner new-tokens point of a (batch, new, cached) table, of
    the straight line in the attention's work between its two neighbours."""
    errs = []
    for i in range(1, len(new) - 1):
        p0, p, p1 = new[i - 1], new[i], new[i + 1]
        for k, c in enumerate(cached):
            w0 = attention_work(p0, c)
            w = (attention_work(p, c) - w0) / (attention_work(p1, c) - w0)
            y0, y, y1 = seconds[:, i - 1, k], seconds[:, i, k], seconds[:, i + 1, k]
            errs.append(np.abs(y0 + w * (y1 - y0) - y) / y)
    return float(np.median(np.concatenate(errs)))


def check(path: Path) -> dict:
    prof = json.loads(path.read_text())
    if not isinstance(prof, dict) or not isinstance(prof.get("components"), dict):
        raise ValueError("no components object")
    rows = []
    for table, axis in CHECKS:
        t = prof["components"].get(table)
        if t is None or axis not in t["axes"] or len(t["grid"][axis]) < 3:
            continue
        grid = np.asarray(t["grid"][axis], dtype=np.float64)
        seconds = np.asarray(t["seconds"], np.float64)
        rows.append({"table": table, "axis": axis, **leave_one_out(grid, seconds, t["axes"].index(axis))})
        if (table, axis) == ("attn_prefill", "new_tokens") and t["axes"] == ["batch", "new_tokens", "cached_tokens"]:
            rows[-1]["work"] = work_leave_one_out(grid, np.asarray(t["grid"]["cached_tokens"], np.float64), seconds)
    return {"profile": str(path), "created_utc": prof.get("created_utc"), "device": prof.get("device"), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/interpolation_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", help="profile files (blocksim-profile/1)")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args(argv)
    results = []
    for p in a.profiles:
        try:
            r = check(Path(p))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"interpolation_check: {p}: not a readable profile ({e}); give a blocksim-profile/1 file",
                  file=sys.stderr)
            return 2
        results.append(r)
        print(r["profile"])
        for row in r["rows"]:
            pw = f"{100 * row['power_law']:.1f}%" if "power_law" in row else "n/a"
            work = f", straight in the work {100 * row['work']:.1f}%" if "work" in row else ""
            print(f"  {row['table']}.{row['axis']}: straight line {100 * row['straight_line']:.1f}%, "
                  f"power law {pw}{work} ({row['points']} points)")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

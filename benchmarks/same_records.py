"""Check that two run directories (or two trees of them) hold the same records.

    python benchmarks/same_records.py BEFORE AFTER

Compares ``requests.parquet``, ``steps.parquet``, ``free_extents.parquet`` and the KV tier tables
(``tier_requests.parquet``, ``tier_steps.parquet``, a recorded plan's ``plan/tier_ops.parquet``) of every run
directory under BEFORE with its namesake under AFTER: same columns, dtypes and values (floats
bit for bit; NaN equals NaN). Prints one line per run and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

FILES = ("requests.parquet", "steps.parquet", "free_extents.parquet", "tier_requests.parquet", "tier_steps.parquet",
         "plan/tier_ops.parquet")


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("steps.parquet"))


def differences(before: Path, after: Path) -> list[str]:
    found = []
    for name in FILES:
        a, b = before / name, after / name
        if not a.exists() and not b.exists():
            continue
        if a.exists() != b.exists():
            found.append(f"{name} present in only one")
            continue
        x, y = pd.read_parquet(a), pd.read_parquet(b)
        if list(x.columns) != list(y.columns):
            found.append(f"{name}: columns {list(x.columns)} != {list(y.columns)}")
            continue
        try:
            pd.testing.assert_frame_equal(x, y, check_exact=True)
        except AssertionError as e:
            found.append(f"{name}: {' '.join(str(e).split())[:300]}")
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    a = p.parse_args()
    bad = 0
    dirs = run_dirs(a.before)
    if not dirs:
        print(f"no run directory under {a.before}", file=sys.stderr)
        return 2
    for d in dirs:
        rel = d.relative_to(a.before)
        diffs = differences(d, a.after / rel)
        rows = len(pd.read_parquet(d / "steps.parquet", columns=["step"]))
        print(f"{str(rel) or '.'}: {'same' if not diffs else 'DIFFERENT'} ({rows} steps)")
        for line in diffs:
            print(f"  {line}")
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

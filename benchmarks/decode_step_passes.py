"""Does measuring ``decode_step`` in several passes make it repeatable? (on a GPU)

    PYTHONPATH=. python benchmarks/decode_step_passes.py --model llama-3-8b --out DIR [--passes 2]

Measures the profile's ``decode_step`` slice (equal rows: ``LONGEST`` 1 only) four times on one
device, in turn: one pass, ``--passes`` passes, one pass, ``--passes`` passes
(`validation.profile.Profiler.decode_step`, `validation.profile.DECODE_PASSES`), and writes each
table as ``DIR/decode_step-p{passes}-{a,b}.json`` (a profile holding that table only), then
compares the two measurements of each kind (`benchmarks/decode_step_repeat.py`) into
``DIR/passes.json``: if passes at different times average the device's drift, the two
``--passes`` tables differ less than the two single-pass ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step_repeat import compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.passes < 2:
        print("decode_step_passes.py: --passes must be 2 or more (it is compared with one pass)", file=sys.stderr)
        return 2
    import torch

    from blocksim.catalog import Catalog
    from validation.profile import Profiler, device_name
    if not torch.cuda.is_available():
        print("decode_step_passes.py: needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prof = Profiler(Catalog([]).model(args.model))
    prof.grid["LONGEST"] = (1.0,)
    tables = {}
    for run, passes in (("a", 1), ("a", args.passes), ("b", 1), ("b", args.passes)):
        prof.grid["DECODE_PASSES"] = passes
        t0 = time.perf_counter()
        table, _ = prof.decode_step()
        table["measure_s"] = round(time.perf_counter() - t0, 3)
        tables[(passes, run)] = table
        path = out / f"decode_step-p{passes}-{run}.json"
        path.write_text(json.dumps({"model": args.model, "device": device_name("cuda"), "torch": torch.__version__,
                                    "components": {"decode_step": table}}, indent=1) + "\n")
        print(f"{path}: {table['measure_s']:.0f} s", flush=True)
    result = {"model": args.model, "device": device_name("cuda"), "order": ["p1-a", f"p{args.passes}-a", "p1-b",
                                                                             f"p{args.passes}-b"]}
    for passes in (1, args.passes):
        c = compare(tables[(passes, "a")], tables[(passes, "b")])
        result[f"passes_{passes}"] = c
        shape = c["shape_spread"] or {"median": float("nan"), "p90": float("nan")}
        print(f"{passes} pass(es): cell spread median {c['cell_spread']['median']:.2%}, p90 "
              f"{c['cell_spread']['p90']:.2%}; ratio to the {c['contexts'][0]}-token cell median "
              f"{shape['median']:.2%}, p90 {shape['p90']:.2%}; lag-1 {c['lag1_correlation']}", flush=True)
    (out / "passes.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

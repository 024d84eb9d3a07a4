"""The linear layers of an eager step timed at token counts between the profile's grid points (on a
GPU), to see what interpolating between those points misses.

    PYTHONPATH=. python benchmarks/linear_grid.py --model llama-3-8b --step 8 --out OUT.json

Times `blocksim profile`'s `linear` component (everything of a step but attention, cache writes and
sampling: one prompt of n tokens) with the profile's clock, at every multiple of `--step` tokens
from `--low` to `--high`, in that order. Writes the token counts and their median seconds; `python
benchmarks/linear_grid.py --report OUT.json` prints how far the piecewise-linear interpolation (the
cost model's rule for this table) between the file's coarse points is from each measured count.
The coarse points (`--coarse`) are its powers of two, or its multiples of a step: `--coarse 64` is
the grid `blocksim profile` measures up to 4,096 tokens, and a `--step 8` file read with it shows
the time between the profile's points, where all but one in 64 of a run's token counts fall.

`--reprice OUT.json --exec EXEC --sim SIM --profile PROFILE` prices the eager steps with a prompt
of an executed run (`blocksim replay --executor cuda`) as its profiled twin SIM does
(`analysis.fidelity.compare`: SIM's cost model, PROFILE, pricing EXEC's steps), then again with
their linear layers scaled by the measured file's counts against its coarse interpolation (for the
steps whose tokens lie in the measured range): what a profile measured on the finer grid would
change, written as JSON (`--json`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(a) -> int:
    import torch

    from blocksim.catalog import MODELS
    from validation.profile import Profiler
    prof = Profiler(MODELS[a.model], progress=False)
    tokens = list(range(a.low, a.high + 1, a.step))
    secs = []
    t0 = time.time()
    for n in tokens:
        secs.append(prof.clock.median(prof._forward(prof._tokens_batch(n), ("linear",))))
        print(f"{n:6d} tokens {secs[-1] * 1e3:8.3f} ms", flush=True)
    res = {"model": a.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "tokens": tokens, "seconds": secs, "measure_s": time.time() - t0}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


def coarse_points(tokens, coarse: str):
    """Which of a measured file's token counts form the coarse grid: the powers of two (`pow2`), or
    the multiples of a step (`coarse` an integer, e.g. 64 for the profile's grid up to 4,096)."""
    import numpy as np
    t = np.asarray(tokens, np.int64)
    if coarse == "pow2":
        keep = (t & (t - 1)) == 0
    else:
        keep = t % int(coarse) == 0
    if keep.sum() < 2:
        print(f"linear_grid.py: --coarse {coarse}: fewer than two of the file's token counts "
              f"({int(t[0])}-{int(t[-1])}) lie on it; give a step the file's counts include", file=sys.stderr)
        raise SystemExit(2)
    return keep


def report(path: str, coarse: str = "pow2") -> int:
    import numpy as np

    from blocksim.cost.interpolate import Line
    res = json.loads(Path(path).read_text())
    t, s = np.asarray(res["tokens"]), np.asarray(res["seconds"])
    on = np.flatnonzero(coarse_points(t, coarse))
    coarse_line = Line("linear", "tokens", t[on].astype(np.float64), s[on])
    print(f"{res['model']} on {res['device']}: interpolation between {[int(t[i]) for i in on]} tokens")
    for n, sec, est in zip(t, s, coarse_line.eval(t.astype(np.float64))):
        print(f"{n:6d} tokens  measured {sec * 1e3:8.3f} ms  interpolated {est * 1e3:8.3f} ms  {est / sec - 1:+.1%}")
    return 0


def reprice(a) -> int:
    import warnings

    import numpy as np
    import pandas as pd

    from analysis.fidelity import compare
    from blocksim.cost.interpolate import Line
    fine = json.loads(Path(a.reprice).read_text())
    t, s = np.asarray(fine["tokens"], np.float64), np.asarray(fine["seconds"])
    dense = Line("linear", "tokens", t, s)
    on = coarse_points(fine["tokens"], a.coarse)
    coarse = Line("linear", "tokens", t[on], s[on])
    p = json.loads(Path(a.profile).read_text())["components"]["linear"]
    profiled = Line("linear", "tokens", np.asarray(p["grid"]["tokens"], np.float64), np.asarray(p["seconds"]))
    out = {"fine": a.reprice, "profile": a.profile, "runs": []}
    for ex, sim in zip(a.exec, a.sim):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = compare(sim, ex)
        steps = pd.read_parquet(Path(ex) / "executor_steps.parquet")
        steps["predicted"] = f.predicted_s
        e = steps[~steps.graph & (steps.num_prefills > 0)]
        n = e.num_tokens.to_numpy(np.float64)
        inside = (n >= t[0]) & (n <= t[-1])
        nc = np.clip(n, t[0], t[-1])
        scale = np.where(inside, dense.eval(nc) / coarse.eval(nc), 1.0)
        again = e.predicted + profiled.eval(n) * (scale - 1)
        before, after = e.predicted / e.measured_s - 1, again / e.measured_s - 1
        row = {"exec": ex, "sim": sim, "steps": len(e), "steps_in_range": int(inside.sum())}
        for name, err in (("all", slice(None)), ("in_range", inside)):
            row[name] = {"mean_err_before": float(before[err].mean()), "mean_err_after": float(after[err].mean()),
                         "mape_before": float(before[err].abs().mean()), "mape_after": float(after[err].abs().mean())}
        out["runs"].append(row)
        r = row["in_range"]
        print(f"{Path(ex).name}: {row['steps_in_range']} of {row['steps']} eager prompt steps in range: mean error "
              f"{r['mean_err_before']:+.2%} -> {r['mean_err_after']:+.2%}, MAPE {r['mape_before']:.2%} -> "
              f"{r['mape_after']:.2%}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--low", type=int, default=512)
    ap.add_argument("--high", type=int, default=4096)
    ap.add_argument("--step", type=int, default=64)
    ap.add_argument("--out")
    ap.add_argument("--report", metavar="JSON", help="print the interpolation error of a measured file")
    ap.add_argument("--reprice", metavar="JSON", help="re-price executed runs' eager steps with a measured file")
    ap.add_argument("--exec", nargs="+", default=[], help="--reprice: executed run directories")
    ap.add_argument("--sim", nargs="+", default=[], help="--reprice: their profiled twins, in the same order")
    ap.add_argument("--profile", help="--reprice: the profile the twins were priced by")
    ap.add_argument("--json", help="--reprice: write the result here")
    ap.add_argument("--coarse", default="pow2",
                    help="--report and --reprice: the coarse grid among the file's counts, pow2 (powers of two) "
                         "or a step (e.g. 64, the profile's grid up to 4,096 tokens)")
    a = ap.parse_args()
    if a.report:
        return report(a.report, a.coarse)
    if a.reprice:
        if not a.exec or len(a.exec) != len(a.sim) or not a.profile:
            ap.error("--reprice needs --exec and --sim of the same length and --profile")
        return reprice(a)
    if not a.out:
        ap.error("--out is required to measure")
    return measure(a)


if __name__ == "__main__":
    raise SystemExit(main())

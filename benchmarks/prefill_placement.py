"""The paged prefill kernel's grid placed on the SMs, against measured attention times: whether the
steps whose row blocks with the most keys share an SM are the slow ones.

    python benchmarks/prefill_placement.py --wide-steps WIDE_STEPS.json [--json OUT.json]
        [--price PROFILE ...] [--predicted PREDICTED.json]

Reads a `benchmarks/wide_steps.py` file (its cases' prompts, new and cached tokens, and the
attention timed inside each whole step) and places each case's grid as the executor launches it:
the mma.sync configuration `kernels.choose_prefill_config` picks (config 0: 128 packed rows a
thread block, config 1: 64), a grid of (row blocks of the longest sequence, KV heads, sequences)
with the row blocks with the most keys first (`kernels/DESIGN.md`), block `i` of the linear order
(row blocks fastest) on SM `i mod SMS`. A block's work is the keys it walks (its sequence's cached
tokens and the new tokens up to its last row). Prints, per case, the attention measured, the keys of
the busiest SM and of the longest block, their ratio (`share`: about 2 where two of the longest
blocks land on one SM), and the measured milliseconds per thousand keys of the busiest SM. A model
of placement, not a measurement of it: the block scheduler's order is not observed.

`--price PROFILE`: each case's prefill attention priced by the profiled cost model of that profile
(`ProfiledCostModel.attn_prefill`, the placement included), its signed error against the measured
attention and the mean absolute error over the cases. `--predicted FILE`: prices written before the
cases were timed (`{"predicted": {case: {name: seconds}}}`), each name's errors likewise: a
held-out check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def placement(new: list[int], cached: list[int], num_heads: int, num_kv_heads: int, head_size: int,
              num_sms: int) -> dict:
    """Keys of the busiest SM and of the longest block, the configuration and the grid of one step's
    prefill attention (`new[i]` tokens after `cached[i]`, sequences in the step's order)."""
    from kernels.fast.prefill import LARGE_ROWS, choose_prefill_config
    group = num_heads // num_kv_heads
    rows = [p * group for p in new]
    cfg = choose_prefill_config(len(new), max(new), num_heads, num_kv_heads, head_size, num_sms)
    bm = LARGE_ROWS if cfg == 0 else LARGE_ROWS // 2
    blocks_x = -(-max(rows) // bm)
    load = [0] * num_sms
    longest = 0
    for z, (p, c, r) in enumerate(zip(new, cached, rows)):
        for h in range(num_kv_heads):
            for x in range(blocks_x):
                m0 = (blocks_x - 1 - x) * bm  # the row blocks with the most keys first
                if m0 >= r:
                    continue  # beyond this sequence's rows: the block exits at once
                keys = c + min(p, (m0 + bm - 1) // group + 1)
                load[(x + blocks_x * (h + num_kv_heads * z)) % num_sms] += keys
                longest = max(longest, keys)
    busiest = max(load)
    return {"config": cfg, "grid": [blocks_x, num_kv_heads, len(new)], "busiest_sm_keys": busiest,
            "longest_block_keys": longest, "share": busiest / longest}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wide-steps", required=True, metavar="JSON", help="a benchmarks/wide_steps.py result")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SMs (132: H100 SXM and H200)")
    ap.add_argument("--json", help="write the table here")
    ap.add_argument("--price", action="append", default=[], metavar="PROFILE",
                    help="price each case by this profile's cost model (repeatable)")
    ap.add_argument("--predicted", metavar="JSON", help="prices written before the cases were timed")
    a = ap.parse_args()
    try:
        res = json.loads(Path(a.wide_steps).read_text())
        prefills, passes = res["prefills"], res["passes"]
    except (OSError, ValueError, KeyError) as e:
        print(f"prefill_placement.py: --wide-steps {a.wide_steps}: not a wide_steps.py result ({e})", file=sys.stderr)
        return 2
    from blocksim.catalog import MODELS
    m = MODELS[res["model"]]
    rows = []
    for name, pf in prefills.items():
        new, cached = [p for p, _ in pf], [c for _, c in pf]
        attn = statistics.mean(one[name]["attn_in_step"] for one in passes if name in one)
        place = placement(new, cached, m.num_heads, m.num_kv_heads, m.head_size, a.sms)
        rows.append({"case": name, "new": new, "cached": cached, "attn_in_step_s": attn, **place,
                     "ms_per_1k_busiest_keys": attn * 1e6 / place["busiest_sm_keys"]})
        print(f"{name:16s} config {place['config']}  attention {attn * 1e3:6.2f} ms  busiest SM "
              f"{place['busiest_sm_keys']:6d} keys  longest block {place['longest_block_keys']:5d}  share "
              f"{place['share']:4.2f}  {rows[-1]['ms_per_1k_busiest_keys']:5.3f} ms per 1k busiest keys")
    prices = {}
    try:
        for path in a.price:
            prices[f"priced by {path}"] = profile_prices(path, res["model"], prefills)
        if a.predicted:
            written = json.loads(Path(a.predicted).read_text())["predicted"]
            for key in sorted({k for v in written.values() for k in v}):
                prices[f"{key} of {a.predicted}"] = {case: v[key] for case, v in written.items() if key in v}
    except (OSError, ValueError, KeyError) as e:
        print(f"prefill_placement.py: --price / --predicted: {e}; give a profile of {res['model']} and a "
              f'file of {{"predicted": {{case: {{name: seconds}}}}}}', file=sys.stderr)
        return 2
    errors = {}
    for label, priced in prices.items():
        errs = {r["case"]: priced[r["case"]] / r["attn_in_step_s"] - 1 for r in rows if r["case"] in priced}
        for r in rows:
            if r["case"] in errs:
                r.setdefault("errors", {})[label] = errs[r["case"]]
        errors[label] = {"cases": len(errs), "mape": statistics.mean(abs(e) for e in errs.values()) if errs else None,
                         "worst_case": max(errs, key=lambda k: abs(errs[k])) if errs else None}
        print(f"{label}: {len(errs)} cases, mean absolute error {errors[label]['mape']:.2%}, "
              f"worst {errors[label]['worst_case']} {errs[errors[label]['worst_case']]:+.1%}")
    if a.json:
        Path(a.json).write_text(json.dumps({"wide_steps": a.wide_steps, "model": res["model"],
                                            "device": res.get("device"), "sms": a.sms, "cases": rows,
                                            "errors": errors}, indent=1) + "\n")
    return 0


def profile_prices(path: str, model: str, prefills: dict) -> dict[str, float]:
    """Each case's prefill attention as the profiled cost model of the profile at `path` prices it."""
    import numpy as np

    from blocksim.catalog import GPUS, MODELS
    from blocksim.config import SimConfig
    from blocksim.cost.profile_file import load_profile
    from blocksim.cost.profiled import ProfiledCostModel
    prof = load_profile(path)
    if prof.model != model:
        raise ValueError(f"{path} is a profile of {prof.model}, the cases are of {model}")
    cost = ProfiledCostModel(SimConfig(model=MODELS[model], gpu=GPUS[prof.gpu]), prof)
    return {name: float(cost.attn_prefill(np.array([p for p, _ in pf]), np.array([c for _, c in pf])))
            for name, pf in prefills.items()}


if __name__ == "__main__":
    raise SystemExit(main())

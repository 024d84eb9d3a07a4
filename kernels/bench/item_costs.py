"""Where the time of a causal prefill with no cached tokens goes: a fixed cost per work item
against a cost per tile of products, fitted on the `prefill` section's c = 0 shapes (no GPU).

    python kernels/bench/item_costs.py kernels/results/h200-prefill.json [--sms 132]
    python kernels/bench/item_costs.py kernels/results/ws-variants/h100-c0-handoff-item-handoff1.json
    python kernels/bench/item_costs.py kernels/results/h100-prefill-newkv.json --new-kv

The input is the `prefill` section's JSON, or an `ab-TAG.json` of `kernels/bench/ab_c0.py` (config
7 and the fastest SDPA backend on the c = 0 shapes of one build, as `kernels/bench/ab_builds.sh`
writes them; the heads are the section's, `PREFILL_HEADS`).

The warp-specialized kernel's work is items of 128 packed query rows of one (sequence, KV head)
pair, each over the key tiles of 128 keys its rows see (the causal band). Per shape this counts
the items and the (item, key tile) steps each SM takes on average, and fits, per model's heads,
time = a * tile steps per SM + b * items per SM by least squares, for the kernel ("paged") and for
the fastest SDPA backend on contiguous K/V measured beside it (whose own tiles may differ: the
same counts serve as a yardstick). A kernel whose `b` is large loses to the backend on short
sequences, where each item has few tiles.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROWS = 128  # packed query rows per item
KEYS = 128  # keys per tile


def counts(batch: int, new: int, heads: int, kv_heads: int) -> tuple[int, int]:
    """Items and (item, key tile) steps of a c = 0 prefill of `batch` sequences of `new` tokens."""
    group = heads // kv_heads
    row_blocks = math.ceil(new * group / ROWS)
    tiles = sum(math.ceil(min((rb * ROWS + ROWS - 1) // group + 1, new) / KEYS) for rb in range(row_blocks))
    pairs = batch * kv_heads
    return row_blocks * pairs, tiles * pairs


def fit(rows: list[dict], sms: int) -> list[dict]:
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        shapes = [r for r in rows if r["model"] == model and r["shape"][1] == 0]
        if len(shapes) < 2:
            continue
        x = []
        for r in shapes:
            b, _, p = r["shape"]
            items, steps = counts(b, p, r["heads"], r["kv_heads"])
            x.append((steps / sms, items / sms))
        x = np.asarray(x)
        for name in ("paged", "sdpa"):
            y = np.asarray([r[name] * 1e3 for r in shapes])  # microseconds
            (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
            fitted = x @ np.asarray([a, b])
            out.append({"model": model, "kernel": name, "us_per_tile_step": float(a), "us_per_item": float(b),
                        "shapes": [r["shape"] for r in shapes], "items_per_sm": x[:, 1].tolist(),
                        "tile_steps_per_sm": x[:, 0].tolist(), "measured_us": y.tolist(),
                        "fitted_us": fitted.tolist()})
    return out


#: the prefill section's model heads (kernels.bench.prefill.PREFILL_HEADS, repeated here so that this
#: script needs no torch): model -> (query heads, KV heads)
HEADS = {"llama-3-8b": (32, 8), "llama-2-7b": (32, 32)}


def section_rows(res, new_kv: bool = False) -> tuple[list[dict], str]:
    """The rows of either input as the `prefill` section's (`model`, `shape`, `paged`, `sdpa`, `heads`,
    `kv_heads`), and what to call the measurement; ValueError names what is wrong with the input.
    ``new_kv``: the kernel's times given the new tokens' keys and values (`paged_new_kv`, `ms7_new_kv`)
    as "paged"."""
    if isinstance(res, dict):
        rows, what, keys = res.get("prefill"), res.get("device", ""), ("paged_new_kv" if new_kv else "paged", "sdpa")
        if not isinstance(rows, list):
            raise ValueError("no 'prefill' list")
    elif isinstance(res, list):
        rows, what, keys = res, "ab_c0", ("ms7_new_kv" if new_kv else "ms7", "ms_sdpa")
    else:
        raise ValueError("neither a prefill section (an object) nor an ab_c0 file (a list)")
    out = []
    for n, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"row {n} is not an object")
        model, shape = r.get("model"), r.get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(v, int) and v >= 0 for v in shape)):
            raise ValueError(f"row {n}: shape must be [batch, cached, new], got {shape!r}")
        times = [r.get(k) for k in keys]
        if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in times):
            raise ValueError(f"row {n}: {' and '.join(keys)} must be positive times in ms, got {times!r}")
        if keys[0].startswith("ms7"):
            if model not in HEADS:
                raise ValueError(f"row {n}: model must be one of {sorted(HEADS)}, got {model!r}")
            heads = HEADS[model]
            what = f"ab_c0 build {r.get('tag', '?')}"
        else:
            heads = (r.get("heads"), r.get("kv_heads"))
            if not all(isinstance(h, int) and h > 0 for h in heads) or heads[0] % heads[1]:
                raise ValueError(f"row {n}: heads and kv_heads must be positive, heads a multiple of kv_heads")
        out.append({"model": model, "shape": shape, "paged": times[0], "sdpa": times[1], "heads": heads[0],
                    "kv_heads": heads[1]})
    return out, what


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a JSON of `python -m kernels.bench --sections prefill --json`, or an "
                    "ab-TAG.json of kernels/bench/ab_c0.py")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SMs (H100 SXM and H200: 132)")
    ap.add_argument("--new-kv", action="store_true", help="fit the kernel's times given the new tokens' keys and "
                    "values (the runs that measured them)")
    ap.add_argument("--json", help="write the fits here")
    a = ap.parse_args()
    try:
        rows, what = section_rows(json.loads(Path(a.results).read_text()), a.new_kv)
        fits = fit(rows, a.sms)
        if not fits:
            raise ValueError("no model has two c = 0 shapes or more to fit")
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        print(f"item_costs.py: {a.results}: not a prefill section or ab_c0 JSON to fit ({e})", file=sys.stderr)
        return 2
    print(f"{what or a.results}, {a.sms} SMs")
    for f in fits:
        worst = max(abs(m / v - 1) for m, v in zip(f["fitted_us"], f["measured_us"]))
        print(f"{f['model']:<11} {f['kernel']:<6} {f['us_per_tile_step']:.2f} us per tile step + "
              f"{f['us_per_item']:.2f} us per item (fit within {worst:.1%} of the {len(f['shapes'])} shapes)")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": a.results, "sms": a.sms, "new_kv": a.new_kv, "fits": fits},
                                           indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

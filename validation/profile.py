"""A cost profile for ``blocksim replay --cost-profile`` from a ``python -m kernels.bench --json``
results file: ``scale_attn_decode`` = the fast decode kernel's measured time / the cost model's
predicted time, over all headline shapes together.

    python -m kernels.bench --sections headline --json h200.json
    python -m validation.profile h200.json --out kernels/profiles/h200_fast_decode.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from blocksim.catalog import GPUS
from blocksim.cost import CostParams

# The catalog's GPU for a CUDA device name containing the key.
DEVICE_GPUS = {"H200": "h200-141gb", "H100": "h100-80gb"}


def catalog_gpu(device: str) -> str | None:
    """The catalog name of the GPU whose key is part of ``device`` (e.g. "NVIDIA H200 (132 SMs)")."""
    return next((name for key, name in DEVICE_GPUS.items() if key in device), None)


def build_profile(results: dict) -> dict | None:
    """The profile of a bench results dict; None without headline rows or for a GPU the catalog
    does not know. The predicted time reads the total KV bytes at ``hbm_bw * bw_efficiency``; the
    measured time is the sum of the headline rows' ``fast_default`` (the default storage) medians,
    so scale = predicted bandwidth / measured bandwidth."""
    rows = results.get("headline") or []
    gpu = catalog_gpu(results.get("device", ""))
    if not rows or gpu is None:
        return None
    hbm_gbs = GPUS[gpu].hbm_bw_gbps
    efficiency = CostParams().bw_efficiency
    total_bytes = sum(r["kv_bytes"] for r in rows)
    total_ms = sum(r["fast_default"] for r in rows)
    measured = total_bytes / (total_ms * 1e-3) / 1e9
    predicted = hbm_gbs * efficiency
    source = (f"python -m kernels.bench --json, then python -m validation.profile, on {results['device']}, torch "
              f"{results['torch']}: fast decode kernel (impl='fast', float16, head 128, block 16, "
              f"{results.get('fast_storage', 'default')} storage) over the {len(rows)} headline shapes, {total_bytes / 1e9:.2f} GB of KV in {total_ms:.3f} ms = "
              f"{measured:.0f} GB/s effective; the cost model assumes {gpu} hbm_bw {hbm_gbs:.0f} GB/s x "
              f"bw_efficiency {efficiency} = {predicted:.0f} GB/s; scale = predicted / measured bandwidth = "
              f"measured / predicted time. Copy bandwidth in the same run: {results['copy_gbs']:.0f} GB/s.")
    return {"params": {"scale_attn_decode": round(predicted / measured, 4)}, "source": source}


def write_profile(results: dict, path: str | Path) -> dict | None:
    """``build_profile`` written as JSON to ``path`` (nothing written when it is None)."""
    profile = build_profile(results)
    if profile is not None:
        Path(path).write_text(json.dumps(profile, indent=1) + "\n")
    return profile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a python -m kernels.bench --json file (needs the headline section)")
    ap.add_argument("--out", required=True, help="the cost profile JSON to write")
    args = ap.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    profile = write_profile(results, args.out)
    if profile is None:
        print(f"{args.results}: no headline rows, or a device the catalog does not know ({results.get('device')!r}; "
              f"known: {', '.join(DEVICE_GPUS)})", file=sys.stderr)
        return 1
    print(f"cost profile: {profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

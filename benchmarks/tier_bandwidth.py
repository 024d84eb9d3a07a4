"""Tier transfer bandwidths and latencies on this device, and the tiers' correctness checks.

    PYTHONPATH=. python benchmarks/tier_bandwidth.py --model llama-3-8b --disk-dir /path/on/nvme \
        --out benchmarks/results/tier-h200.json

Writes one JSON: the five moves' tables as cost-profile components (`validation.tiers.bench`,
"blocksim-profile/1" tables ``tier_<src>_<dst>``), every measured point (GPU and file parts,
GB/s), the disk tier's I/O mode, the restored-attention checks (`validation.tiers.check`, both
cache layouts), and a replay of a synthetic tier_ops table (`validation.tiers.synthetic`) with its
checksum mismatches. Exit code 1 when any check fails (a mismatch, a restored block that differs,
attention outside tolerance).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mount(path: Path) -> str:
    try:
        return subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def replay_check(disk_dir: Path, device: str, dims, steps: int, block_size: int) -> dict:
    import torch

    import kernels
    from validation.tiers import TierExecutor, replay_tier_ops
    from validation.tiers.synthetic import synthetic_tier_ops
    chunk_blocks, num_blocks = 16, 4096   # 256-token chunks
    ks, vs = [], []
    for _ in range(dims.num_layers):
        k, v = kernels.allocate_fast_kv_cache(num_blocks, block_size, dims.num_kv_heads, dims.head_size,
                                              torch.float16, device)
        k.normal_()
        v.normal_()
        ks.append(k)
        vs.append(v)
    ex = TierExecutor(ks, vs, chunk_blocks=chunk_blocks, host_chunks=24, disk_chunks=48,
                      disk_path=disk_dir / "tier_replay.kv", staging_chunks=8)
    table = synthetic_tier_ops(steps, chunk_blocks=chunk_blocks, num_gpu_blocks=num_blocks, host_chunks=24,
                               disk_chunks=48, seed=1)
    t0 = time.perf_counter()
    res = replay_tier_ops(ex, table, source="synthetic tier_ops")
    wall = time.perf_counter() - t0
    b = res["batches"]
    out = {"steps": steps, "rows": len(table["step"]), "chunk_bytes": ex.chunk_bytes, "wall_s": wall,
           "mismatches": res["mismatches"], "checked_loads": res["checked_loads"], "disk_mode": res["disk_mode"],
           "by_move": {m: {"chunks": int(g["chunks"].sum()), "bytes": int(g["bytes"].sum()),
                           "seconds": float(g["seconds"].sum())} for m, g in b.groupby("move")}}
    ex.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b", help="catalog model whose KV shape is moved (default llama-3-8b)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="KV dtype (default float16)")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--disk-dir", default=None, help="directory of the disk tier's file (default: a temporary "
                                                     "directory under the current one)")
    ap.add_argument("--chunk-tokens", default="16,64,256,1024", help="chunk sizes in tokens (default 16,64,256,1024)")
    ap.add_argument("--chunks", default="1,4,16", help="chunks per batch (default 1,4,16)")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds per point (default 5)")
    ap.add_argument("--replay-steps", type=int, default=60, help="steps of the synthetic replay (default 60)")
    ap.add_argument("--no-direct", action="store_true", help="buffered I/O even where O_DIRECT works")
    ap.add_argument("--out", required=True, help="JSON to write")
    args = ap.parse_args(argv)

    import torch

    from blocksim.catalog import Catalog
    from validation.model import ModelDims

    dims = ModelDims.of(Catalog([]).model(args.model))
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("tier_bandwidth: no CUDA device is visible to this torch; pass --device cpu", file=sys.stderr)
        return 2
    disk_dir = Path(args.disk_dir) if args.disk_dir else Path(tempfile.mkdtemp(prefix="tier-", dir="."))
    try:
        return _run(args, dims, disk_dir, argv)
    finally:
        if not args.disk_dir:
            shutil.rmtree(disk_dir, ignore_errors=True)


def _run(args, dims, disk_dir: Path, argv) -> int:
    import torch

    from validation.profile import catalog_gpu
    from validation.tiers.bench import measure_tiers
    from validation.tiers.check import restored_attention
    cuda = args.device.startswith("cuda")
    if not (disk_dir.is_dir() and os.access(disk_dir, os.W_OK)):
        print(f"tier_bandwidth: --disk-dir {disk_dir} is not a writable directory", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    t0 = time.perf_counter()
    checks = []
    for layout, dtype in (("vllm", "float16"), ("fast", "float16"), ("fast", "bfloat16")):
        for corrupt in (False, True):
            r = restored_attention(disk_dir, device=args.device, layout=layout, dtype=dtype, corrupt=corrupt,
                                   direct_io=not args.no_direct)
            r["corrupt"] = corrupt
            checks.append(r)
            _say(f"restored attention {layout} {dtype} corrupt={corrupt}: mismatches {r['mismatches']} of "
                 f"{r['checked_loads']}, blocks equal {r['content_equal']}, max err {r['max_abs_err']:.3g}")
    replay = replay_check(disk_dir, args.device, dims, args.replay_steps, args.block_size)
    _say(f"replay of {replay['rows']} rows: {replay['mismatches']} mismatches of {replay['checked_loads']} loads")
    tiers = measure_tiers(num_layers=dims.num_layers, num_kv_heads=dims.num_kv_heads, head_size=dims.head_size,
                          block_size=args.block_size, dtype=args.dtype, device=args.device, disk_dir=disk_dir,
                          chunk_tokens=tuple(int(x) for x in args.chunk_tokens.split(",")),
                          chunks=tuple(int(x) for x in args.chunks.split(",")), reps=args.reps,
                          direct_io=not args.no_direct, progress=_say)
    ok = (all(c["mismatches"] == 0 and c["content_equal"] and c["attention_matches"] for c in checks if not c["corrupt"])
          and all(c["mismatches"] == 1 for c in checks if c["corrupt"])
          and replay["mismatches"] == 0 and tiers["mismatches"] == 0)
    result = {
        "command": "PYTHONPATH=. python benchmarks/tier_bandwidth.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": device_name, "gpu": catalog_gpu(device_name) if cuda else "cpu", "torch": torch.__version__,
        "model": args.model, "dtype": args.dtype, "block_size": args.block_size,
        "disk_dir_mount": _mount(disk_dir), "seconds": time.perf_counter() - t0, "checks_pass": ok,
        "restored_attention": checks, "replay": replay, **tiers,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    _say(f"written to {args.out} (checks {'pass' if ok else 'FAIL'}, disk I/O {tiers['disk_mode']}: "
         f"{tiers['disk_reason']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

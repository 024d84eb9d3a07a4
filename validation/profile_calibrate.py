"""``blocksim profile --calibrate``: a cost profile measured on one machine carried to this one by a
sample of its cells measured here, in a fraction of a whole profile's time.

    blocksim profile --model llama-3-8b --calibrate --out runs/calibrated/llama-3-8b__h100-80gb__float16__tp1.json

Machines of one GPU kind differ by a few percent, most of it one offset over all of a table's
cells. The base profile (``--from``, default the shipped profile of the model, this device's
catalog GPU, ``--dtype`` and tensor-parallel 1) must be one of this device's name, dtype, block
size and CUDA graph sizes. A sample of each calibrated table's cells (`sampled`: every
`SAMPLE_EVERY`-th value of each axis of the base's own grid, and its last) is measured here by the
Profiler's own methods with its grid narrowed to the sample and the base's dtype, block size,
decode attention, prefill attention and cache blocks. A table's scale is the median over its
sampled cells of measured / base seconds (`scale_of`); the profile written is the base with each
calibrated table's seconds times its scale (the same grid), and a top-level ``calibrated`` key
naming the device, torch, time, command, the base (path and ``created_utc``) and, per table, the
scale, the cells it was taken over, the 10th and 90th percentiles of their ratios and the seconds
the table took to measure (a group measured together names the group's).

Calibrated: ``linear`` (its ``graph_seconds`` by a scale of their own, ``linear.graph_seconds``),
``attn_prefill``, ``attn_decode``, ``cache_write``, ``sample``, ``swap_out``, ``swap_in``, ``copy``
(by blocks, measured together), and ``decode_step`` with ``decode_step_longest`` (measured
together, in one pass: a scale is a median over many cells, which a pass's drift of a few tenths of
a percent, `DECODE_PASSES`, barely moves). Left as they are: ``decode_step_shared`` and
``decode_step_padded``, which the cost model reads only as ratios to twins measured alongside
(paired over own blocks, padded over spread), so a machine's offset cancels out of them;
``overhead``, a difference of whole steps and their components; the tier tables; ``allreduce``
(tensor-parallel bases are refused). Cells of ``decode_step_longest`` whose longest row the
model's length caps (``capped``: extrapolated, not measured) are left out of its ratios.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from pathlib import Path

import numpy as np

from validation.profile import (LINEAR_IN_STEP_ABOVE, ProfileError, catalog_gpu, device_name,
                                profiler_for, read_own_profile, shipped_name)

#: Every how many values of an axis a table's sample takes (and the axis's last value): on the
#: shipped grids, about a tenth of each table's cells, so that a calibration measures in about a
#: tenth of a whole profile's time. A 1-D table needs a long stride for that (``linear``: 8 of 79
#: points, 23 of 259), a 3-D one a short stride (``decode_step_longest`` every other value: 128 of
#: 540 cells, 160 of 810, in one pass where the profile takes two). ``attn_prefill`` keeps 12 of
#: 96-144 cells, but its ends hold its longest steps (8 prompts of 8,192 new tokens), so it is
#: the sample's largest share of time: about a sixth of its profile's seconds (estimated from
#: the linear work of its steps). Short axes keep both their ends at any stride.
SAMPLE_EVERY = {"linear": 12, "graph_tokens": 2, "attn_prefill": 4, "attn_decode": 4, "cache_write": 4,
                "sample": 4, "moves": 3, "decode_step": 2}
#: The tables calibrated, by the Profiler method that measures them (with `SAMPLE_EVERY`'s key).
GROUPS = {"linear": ("linear",), "attn_prefill": ("attn_prefill",), "attn_decode": ("attn_decode",),
          "cache_write": ("cache_write",), "sample": ("sample",), "moves": ("swap_out", "swap_in", "copy"),
          "decode_step": ("decode_step", "decode_step_longest")}
#: Each group's grid constants (`Profiler.grid`) by the axis of its table's grid they are sampled from.
GRID_KEYS = {"linear": {"tokens": "LINEAR_TOKENS"},
             "attn_prefill": {"batch": "PREFILL_BATCH", "new_tokens": "PREFILL_NEW", "cached_tokens": "PREFILL_CACHED"},
             "attn_decode": {"batch": "DECODE_BATCH", "context": "DECODE_CONTEXT"},
             "cache_write": {"tokens": "TOKENS"}, "sample": {"sequences": "SEQUENCES"}, "moves": {"blocks": "BLOCKS"},
             "decode_step": {"batch": "STEP_BATCH", "context": "DECODE_CONTEXT", "longest": "LONGEST"}}


def sampled_indices(n: int, every: int) -> list[int]:
    """Indices 0, `every`, 2 * `every`, ... of an axis of `n` values, and its last (n - 1)."""
    if n < 1 or every < 1:
        raise ValueError(f"an axis of {n} values sampled every {every}: both must be at least 1")
    return sorted(set(range(0, n, every)) | {n - 1})


def sampled(values, every: int) -> tuple:
    """The values of an axis at `sampled_indices`."""
    values = list(values)
    return tuple(values[i] for i in sampled_indices(len(values), every))


def _axes(table: dict, key: str) -> list[str]:
    if key == "graph_seconds":
        return ["graph_tokens"] if "graph_tokens" in table["grid"] else list(table["axes"])
    return list(table["axes"])


def cell_ratios(base: dict, measured: dict, key: str = "seconds") -> np.ndarray:
    """measured / base `key` seconds at every cell of `measured`'s grid that `base`'s grid holds
    (each axis value found in the base's axis), but cells either table lists as ``capped`` and
    cells without positive, finite seconds in both."""
    axes = _axes(measured, key)
    if _axes(base, key) != axes or key not in base or key not in measured:
        return np.zeros(0)
    where = []  # per axis: the base index of each measured value, or -1
    for a in axes:
        grid = np.asarray(base["grid"][a], float)
        hits = (np.flatnonzero(np.isclose(grid, v)) for v in measured["grid"][a])
        where.append([int(h[0]) if h.size else -1 for h in hits])
    capped = {tuple(round(float(v), 6) for v in c) for t in (base, measured) for c in t.get("capped", ())}
    b, m = np.asarray(base[key], float), np.asarray(measured[key], float)
    out = []
    for cell in np.ndindex(m.shape):
        at = tuple(where[i][j] for i, j in enumerate(cell))
        if min(at) < 0 or tuple(round(float(measured["grid"][a][j]), 6) for a, j in zip(axes, cell)) in capped:
            continue
        if np.isfinite(m[cell]) and np.isfinite(b[at]) and m[cell] > 0 and b[at] > 0:
            out.append(m[cell] / b[at])
    return np.asarray(out, float)


def scale_of(ratios: np.ndarray) -> dict:
    """A table's scale (the median of its cells' ratios), their count and 10th and 90th percentiles."""
    p10, mid, p90 = np.percentile(ratios, [10, 50, 90])
    return {"scale": float(mid), "cells": int(ratios.size), "p10": float(p10), "p90": float(p90)}


def default_base(model: str, gpu: str, dtype: str, device: str) -> Path:
    """The shipped profile of (`model`, `gpu` or this device's catalog GPU, `dtype`, tensor-parallel 1)."""
    from blocksim.cost.profile_file import PROFILES_DIR
    if gpu == "auto":
        gpu = catalog_gpu(device_name(device))
        if gpu is None:
            raise ProfileError(f"--calibrate: device {device_name(device)!r} is none of the catalog's GPUs; "
                               f"name the base profile with --from, or its GPU with --gpu-name")
    return PROFILES_DIR / shipped_name(model, gpu, dtype, 1)


def read_base(path: Path, *, model: str, device: str, gpu: str, dtype: str, block_size: int) -> dict:
    """The base profile at `path`, refused (ProfileError, one line) where it cannot be calibrated
    here: `read_own_profile`'s checks, and its GPU, dtype and block size those asked for."""
    label = "--calibrate"
    prof = read_own_profile(path, label, model=model, device=device, gpu_only=False, fix="--from")
    if gpu != "auto" and prof.get("gpu") != gpu:
        raise ProfileError(f"{label}: {path} is a profile for {prof.get('gpu')!r}, --gpu-name names {gpu!r}; "
                           f"name a profile for {gpu} with --from, or --gpu-name {prof.get('gpu')}")
    if prof["dtype"] != dtype:
        raise ProfileError(f"{label}: {path} is a {prof['dtype']} profile, --dtype is {dtype}; "
                           f"pass --dtype {prof['dtype']}, or name a {dtype} profile with --from")
    if prof["block_size"] != block_size:
        raise ProfileError(f"{label}: {path} has blocks of {prof['block_size']} tokens, --block-size is "
                           f"{block_size}; pass --block-size {prof['block_size']}, or name another profile with --from")
    if "calibrated" in prof:
        raise ProfileError(f"{label}: {path} is itself calibrated; name the profile it was calibrated from "
                           f"({prof['calibrated'].get('base', {}).get('path')}) with --from")
    return prof


def _narrowed(p, group: str, comps: dict) -> dict | None:
    """The grid constants `group` is measured on: the full grid with the sampled values of the base
    tables' axes; None where the base holds none of the group's tables or this device cannot
    measure them."""
    names = [t for t in GROUPS[group] if isinstance(comps.get(t), dict)]
    if not names or (group == "decode_step" and not p.cuda):
        return None
    source = comps[names[-1]]  # decode_step_longest where the base holds it: its grid has every axis
    every = SAMPLE_EVERY[group]
    grid = dict(p.grid)
    for axis, key in GRID_KEYS[group].items():
        if axis in source["grid"]:
            grid[key] = sampled(source["grid"][axis], every)
    if group == "linear":
        lin = comps["linear"]
        if p.cuda and "in_step_above_tokens" not in lin:  # measured alone above it: so is the sample
            grid["LINEAR_TOKENS"] = sampled([n for n in lin["grid"]["tokens"] if n <= LINEAR_IN_STEP_ABOVE], every)
        grid["GRAPH_TOKENS"] = sampled(lin["grid"].get("graph_tokens", (1,)), SAMPLE_EVERY["graph_tokens"])
    if group == "decode_step":
        grid["LONGEST"] = tuple(sorted({1.0, *grid["LONGEST"]})) if "longest" in source["grid"] else (1.0,)
        grid["DECODE_PASSES"] = 1
    return grid


def calibrate(base_path: Path, base: dict, *, device: str = "cuda", catalog=(), command: str = "",
              progress: bool = True, report=print) -> dict:
    """`base` (read from `base_path` by `read_base`) with each calibrated table's seconds times the
    median ratio of its sampled cells measured here to the base's, and the ``calibrated`` key
    (module docstring). `report(line)` gets one line per table and one of the total seconds."""
    import torch

    from validation.model import ModelDims
    from blocksim.catalog import Catalog
    dims = ModelDims.of(Catalog(list(catalog)).model(base["model"]))
    dtype_bytes = torch.finfo(getattr(torch, base["dtype"])).bits // 8
    cache = {"cache_bytes": int(base["cache_blocks"]) * dims.kv_block_bytes(base["block_size"], dtype_bytes)} \
        if isinstance(base.get("cache_blocks"), int) else {}
    t0 = time.perf_counter()
    p = profiler_for(base, base_path, "--calibrate", device=device, catalog=catalog, progress=progress,
                     prefill=base.get("prefill_attention", "auto"), **cache)
    full, comps = dict(p.grid), base["components"]
    tables = {}
    for group in GROUPS:
        grid = _narrowed(p, group, comps)
        if grid is None:
            continue
        p.grid = grid
        out = p._timed(group, getattr(p, group))
        p.grid = full
        if out is None:
            continue
        measured = dict(zip(("decode_step", "decode_step_longest"), out)) if group == "decode_step" else (
            out if group == "moves" else {group: out})
        for name in GROUPS[group]:
            for key in ("seconds", "graph_seconds"):
                if name not in comps or name not in measured or key not in comps[name]:
                    continue
                label = name if key == "seconds" else f"{name}.{key}"
                ratios = cell_ratios(comps[name], measured[name], key)
                if not ratios.size:
                    report(f"calibrate {base['model']}: {label}: left as it was (no sampled cell on its grid)")
                    continue
                tables[label] = {**scale_of(ratios), "measure_s": p.measure_s[group]}
    prof = json.loads(json.dumps(base))  # a copy
    for label, rec in tables.items():
        name, _, key = label.partition(".")
        table = prof["components"][name]
        table[key or "seconds"] = (np.asarray(table[key or "seconds"], float) * rec["scale"]).tolist()
        report(f"calibrate {base['model']}: {label}: scale {rec['scale']:.4f} (10%-90% of its {rec['cells']} cells' "
               f"ratios: {rec['p10']:.4f}-{rec['p90']:.4f}), {rec['measure_s']:.1f} s")
    total = round(time.perf_counter() - t0, 1)
    report(f"calibrate {base['model']}: {len(tables)} tables calibrated on {device_name(device)} in {total:.1f} s")
    prof["calibrated"] = {
        "device": device_name(device), "torch": torch.__version__,
        "utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command,
        "base": {"path": str(base_path), "created_utc": base.get("created_utc")}, "measure_s": total,
        "tables": tables}
    return prof

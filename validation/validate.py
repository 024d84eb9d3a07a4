"""``blocksim validate RUN_DIR``: execute a recorded plan with the real kernels, check every step,
and compare measured times with the cost model's predictions.

    blocksim replay TRACE --out RUN --record-plan --max-requests 100
    blocksim validate RUN --backend reference            # CPU, tiny subset: correctness only
    blocksim validate RUN --backend cuda                 # GPU: correctness and timing fidelity
    blocksim validate RUN2 --backend cuda --calibrate-with RUN   # fit on RUN, evaluate on RUN2

Writes ``RUN/validation/{timings.parquet,summary.json}``, ``RUN/validation.md`` and, on ``cuda``,
``RUN/validation_scatter.png``; with ``--calibrate-with FIT_RUN`` also ``RUN/cost_profile.json``
(loadable by ``blocksim replay --cost-profile``). Exit status 1 when a step fails its checks.

Subsets. The plan holds the whole model's dimensions; what is executed is stated in the report:
``--layers N`` (the first N layers), ``--kv-heads``, ``--heads`` (query heads, a multiple of the
KV heads), ``--head-size``, ``--dtype``. The reference backend defaults to 1 layer, 1 KV head, 2
query heads where the model has grouped queries (else 1), head size 32, float32; the cuda backend
to the model's heads and head size in float16 and as many layers as fit in GPU memory, checking
the first and last of them (``--check-layers``). Measured times are scaled to the whole model by
the ratio of KV bytes (layers x KV heads x head size x dtype bytes): exact for a subset of layers,
which are identical and run one after another; an approximation for fewer heads.

This module imports torch only when a validation runs (``blocksim`` itself never needs torch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from blocksim.records.plan import PlanError

MODEL_DTYPE_BYTES = 2  # the plan's predictions assume 16-bit KV (the catalog's models)
WORKSPACE_BYTES = 6 << 30  # GPU memory kept free for the checks' temporaries


class ValidationSetupError(RuntimeError):
    """Bad input: no plan, a wrong version, a subset that does not fit or is not supported."""


def _torch():
    try:
        import torch
    except ImportError:
        raise ValidationSetupError("blocksim validate needs PyTorch (and a CUDA build of it for --backend cuda): "
                                   "pip install torch") from None
    return torch


def choose_subset(meta: dict, backend: str, *, layers=None, kv_heads=None, heads=None, head_size=None, dtype=None,
                  check_layers=None, free_bytes: int | None = None):
    """The executed subset for a plan, with notes on what was cut; raises ValidationSetupError."""
    from kernels import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES
    from validation.executor import Subset
    notes = []
    L, KVH, H, D = meta["num_layers"], meta["num_kv_heads"], meta["num_heads"], meta["head_size"]
    group = max(1, H // max(1, KVH))
    ref = backend == "reference"
    if meta["block_size"] not in SUPPORTED_BLOCK_SIZES:
        raise ValidationSetupError(f"block size {meta['block_size']} is not supported by the kernels "
                                   f"({SUPPORTED_BLOCK_SIZES}); record the plan with --block-size 16")
    kvh = kv_heads or (1 if ref else KVH)
    h = heads or (kvh * (min(2, group) if ref else group))
    d = head_size or (32 if ref else D)
    dt = dtype or ("float32" if ref else "float16")
    if kvh > KVH or h > H:
        raise ValidationSetupError(f"the model has {KVH} KV heads and {H} query heads; asked for {kvh} and {h}")
    if h % kvh:
        raise ValidationSetupError(f"--heads {h} must be a multiple of --kv-heads {kvh}")
    if d not in SUPPORTED_HEAD_SIZES:
        raise ValidationSetupError(f"head size {d} is not supported by the kernels; use --head-size with one of "
                                   f"{SUPPORTED_HEAD_SIZES}")
    if dt not in ("float32", "float16", "bfloat16"):
        raise ValidationSetupError(f"--dtype {dt}: use float32, float16 or bfloat16")
    esize = {"float32": 4, "float16": 2, "bfloat16": 2}[dt]
    per_layer = 2 * meta["num_gpu_blocks"] * meta["block_size"] * kvh * d * esize
    if layers is None:
        n = 1 if ref else L
        if free_bytes is not None:
            fit = max(0, (free_bytes - WORKSPACE_BYTES) // per_layer)
            if fit < 1:
                raise ValidationSetupError(
                    f"one layer of {meta['num_gpu_blocks']} GPU blocks needs {per_layer / 2**30:.1f} GiB, "
                    f"{free_bytes / 2**30:.1f} GiB are free (keeping {WORKSPACE_BYTES >> 30} GiB for the checks); "
                    f"validate fewer heads (--kv-heads) or a smaller --head-size, or record with fewer --num-gpu-blocks")
            if fit < n:
                notes.append(f"{n} layers would need {n * per_layer / 2**30:.1f} GiB of GPU memory; "
                             f"validating the first {fit}")
                n = int(fit)
    else:
        n = int(layers)
        if not 1 <= n <= L:
            raise ValidationSetupError(f"--layers {n}: the model has {L} layers")
        if free_bytes is not None and n * per_layer + WORKSPACE_BYTES > free_bytes:
            fit = max(0, (free_bytes - WORKSPACE_BYTES) // per_layer)
            raise ValidationSetupError(
                f"{n} layers of {meta['num_gpu_blocks']} GPU blocks need {n * per_layer / 2**30:.1f} GiB, "
                f"{free_bytes / 2**30:.1f} GiB are free; validate a subset: --layers {fit}" if fit else
                f"{n} layers need {n * per_layer / 2**30:.1f} GiB, {free_bytes / 2**30:.1f} GiB are free; "
                f"use --kv-heads or --head-size to validate fewer heads")
    executed = list(range(n))
    if check_layers is None:
        checked = executed if ref else sorted({executed[0], executed[-1]})
    else:
        checked = sorted({int(x) for x in check_layers})
        if any(x not in executed for x in checked):
            raise ValidationSetupError(f"--check-layers {checked}: executed layers are 0..{n - 1}")
    if (n, kvh, h, d) != (L, KVH, H, D):
        notes.append(f"validated subset: {n}/{L} layers, {kvh}/{KVH} KV heads, {h}/{H} query heads, "
                     f"head size {d}/{D}")
    return Subset(executed, kvh, h, d, dt, checked, notes)


def _iter_steps(steps, seqs, max_steps: int | None):
    """(step, step row dict, sequence columns dict) per step, in order."""
    import numpy as np
    sstep = seqs["step"].to_numpy(np.int64) if len(seqs) else np.zeros(0, np.int64)
    cols = {c: seqs[c].to_numpy() for c in ("request_id", "seq_id", "is_prefill", "context_len", "new_start",
                                             "new_end", "block_table")} if len(seqs) else {}
    srows = steps.to_dict("records")
    if max_steps is not None:
        srows = srows[:max_steps]
    for row in srows:
        st = int(row["step"])
        lo, hi = np.searchsorted(sstep, st, "left"), np.searchsorted(sstep, st, "right")
        yield st, row, ({c: v[lo:hi] for c, v in cols.items()} if cols else
                        {c: [] for c in ("request_id", "seq_id", "is_prefill", "context_len", "new_start",
                                         "new_end", "block_table")})


def validate_run(run_dir, backend: str = "reference", *, out_dir=None, max_steps: int | None = None,
                 progress: bool = False, timing: bool | None = None, **subset_options) -> dict:
    """Execute and check a run's plan; write the validation files; return the summary dict.

    The summary's ``ok`` is False and ``error`` names the step, sequence and blocks when a check
    fails. Raises ValidationSetupError for bad input (no plan, a wrong version, no GPU, no room).
    """
    import numpy as np
    import pandas as pd

    from blocksim.records.plan import TIME_COLUMNS, read_plan
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir
    try:
        meta, steps, seqs, reqs = read_plan(run_dir)
    except (FileNotFoundError, ValueError) as e:
        raise ValidationSetupError(str(e)) from None
    if backend not in ("cuda", "reference"):
        raise ValidationSetupError(f"--backend {backend!r}: use cuda or reference")
    torch = _torch()
    free = None
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise ValidationSetupError("--backend cuda: no CUDA device is visible to this torch "
                                       f"({torch.__version__}); use --backend reference for a CPU check")
        free = torch.cuda.mem_get_info()[0]
    subset = choose_subset(meta, backend, free_bytes=free, **subset_options)
    from validation.executor import COMPONENTS, PlanExecutor, ValidationError
    timing = (backend == "cuda") if timing is None else timing
    ex = PlanExecutor(meta, reqs, subset, "cuda" if backend == "cuda" else "cpu", timing=timing)
    fraction = subset.fraction_of(meta, 4 if subset.dtype == "float32" else 2)
    rows, error = [], None
    t0 = time.perf_counter()
    n_total = len(steps) if max_steps is None else min(max_steps, len(steps))
    for k, (st, srow, cols) in enumerate(_iter_steps(steps, seqs, max_steps)):
        try:
            measured = ex.step(st, srow, cols)
        except ValidationError as e:
            error = e
            break
        if timing:
            dec = ~np.asarray(cols["is_prefill"], dtype=bool)
            rows.append({"step": st, **{c: srow[c] for c in TIME_COLUMNS},
                         **{f"m_{c}_s": measured.get(c, 0.0) / fraction for c in COMPONENTS},
                         "decode_seqs": int(dec.sum()),
                         "decode_ctx_tokens": int(np.asarray(cols["context_len"], dtype=np.int64)[dec].sum()),
                         "new_tokens": int(np.sum(np.asarray(cols["new_end"]) - np.asarray(cols["new_start"]))),
                         "swap_blocks": len(srow["swap_in_src"]) + len(srow["swap_out_src"]),
                         "copy_blocks": len(srow["copy_src"])})
        if progress and (k + 1) % 500 == 0:
            print(f"validate: {k + 1}/{n_total} steps, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    wall = time.perf_counter() - t0
    summary = {
        "ok": error is None, "run_dir": str(run_dir), "backend": backend,
        "device": torch.cuda.get_device_name() if backend == "cuda" else "cpu (PyTorch reference)",
        "torch": torch.__version__, "model": meta.get("model"), "policy": meta.get("policy"),
        "num_gpu_blocks": meta["num_gpu_blocks"], "num_cpu_blocks": meta["num_cpu_blocks"],
        "block_size": meta["block_size"], "steps_in_plan": len(steps),
        "steps_checked": (error.step if error else n_total) if len(steps) else 0,
        "subset": subset.describe(meta), "subset_notes": subset.notes, "timing_scale_to_model": 1 / fraction,
        "wall_s": wall, "error": error.to_dict() if error else None,
        "swaps": int(sum(len(x) for x in steps["swap_in_src"]) + sum(len(x) for x in steps["swap_out_src"]))
        if len(steps) else 0,
        "copies": int(sum(len(x) for x in steps["copy_src"])) if len(steps) else 0,
        "decode_seq_steps": int((~seqs["is_prefill"]).sum()) if len(seqs) else 0,
    }
    vdir = out_dir / "validation"
    vdir.mkdir(parents=True, exist_ok=True)
    timings = pd.DataFrame(rows)
    if timing:
        timings.to_parquet(vdir / "timings.parquet", index=False)
    (vdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def report(run_dir, *, out_dir=None, calibrate_with=None) -> dict:
    """Write ``validation.md`` (and the scatter, and with ``calibrate_with`` the cost profile) from a
    run's saved validation files; returns the summary with the timing errors added."""
    import pandas as pd

    from validation import calibrate as cal
    out_dir = Path(out_dir or run_dir)
    vdir = out_dir / "validation"
    summary = json.loads((vdir / "summary.json").read_text())
    lines = ["## GPU validation", "",
             (f"- run `{summary['run_dir']}`: {summary['model']}, policy {summary['policy']}, "
             f"{summary['num_gpu_blocks']} GPU / {summary['num_cpu_blocks']} CPU blocks of {summary['block_size']} tokens"),
             (f"- backend {summary['backend']} on {summary['device']} (torch {summary['torch']}), "
             f"{summary['wall_s']:.1f} s"),
             f"- executed: {summary['subset']}"]
    lines += [f"- note: {n}" for n in summary["subset_notes"]]
    lines += [(f"- plan: {summary['steps_in_plan']} steps, {summary['decode_seq_steps']} decode sequence-steps, "
              f"{summary['swaps']} blocks swapped, {summary['copies']} copy-on-write copies")]
    if summary["ok"]:
        lines.append(f"- **result: all {summary['steps_checked']} steps passed** (cache content exact, attention "
                     f"within tolerance)")
    else:
        lines.append(f"- **result: FAILED** — {summary['error']['message']}")
    tpath = vdir / "timings.parquet"
    if tpath.exists():
        t = pd.read_parquet(tpath)
        lines += ["", "### Timing fidelity", "",
                  (f"Measured times scaled to the whole model by x{summary['timing_scale_to_model']:.3g} "
                  f"(KV bytes of the model / executed). Cache writes measured: "
                  f"{t['m_write_s'].sum():.4g} s over {int(t['new_tokens'].sum())} tokens (no cost-model "
                  f"component of their own)."), ""]
        before = cal.errors(t)
        summary["errors"] = before
        if calibrate_with is not None:
            fit_t = pd.read_parquet(Path(calibrate_with) / "validation" / "timings.parquet")
            scales = cal.fit_scales(fit_t)
            after = cal.errors(t, scales)
            prof = cal.write_profile(out_dir / "cost_profile.json", scales,
                                     source={"fitted_on": str(calibrate_with), "evaluated_on": str(run_dir),
                                             "device": summary["device"], "scales": scales,
                                             "mape_before_pct": {c: e["mape_pct"] for c, e in before.items()},
                                             "mape_after_pct": {c: e["mape_pct"] for c, e in after.items()}})
            from blocksim.cost import CostParams
            CostParams.from_json(prof)  # the profile must load as --cost-profile
            summary.update(errors_calibrated=after, scales=scales, cost_profile=str(prof))
            lines += [f"Calibration fitted on `{calibrate_with}` (fit-slice MAPE after fit: "
                      + ", ".join(f"{c} {e['mape_pct']:.1f}%" for c, e in cal.errors(fit_t, scales).items()
                                  if e["steps"]) + "), evaluated on this run:", "",
                      cal.errors_table(before, after), "",
                      "Scales: " + ", ".join(f"`{cal.COMPARED[c]}` = {s:.4g}" for c, s in scales.items())
                      + f"; profile `{prof.name}` (`blocksim replay ... --cost-profile {prof}`)."]
        else:
            scales = None
            lines.append(cal.errors_table(before))
        png = cal.scatter_png(t, out_dir / "validation_scatter.png", scales=scales,
                              title=f"{summary['model']} / {summary['policy']} on {summary['device']}")
        if png:
            lines += ["", f"![predicted vs measured]({png.name})"]
    (out_dir / "validation.md").write_text("\n".join(lines) + "\n")
    (vdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# --- CLI ------------------------------------------------------------------------------------------
def add_validate_command(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("validate", help="execute a recorded plan with the real kernels and check it",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run recorded with `blocksim replay ... --record-plan`")
    p.add_argument("--backend", choices=("cuda", "reference"), default="reference",
                   help="cuda: the CUDA kernels, timed; reference: the PyTorch reference on the CPU (default)")
    p.add_argument("--layers", type=int, default=None, help="validate the first N layers")
    p.add_argument("--kv-heads", type=int, default=None, help="KV heads to validate")
    p.add_argument("--heads", type=int, default=None, help="query heads (a multiple of --kv-heads)")
    p.add_argument("--head-size", type=int, default=None, help="head size to validate (default: the plan's)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="cache and activation dtype (default: float32 on reference, float16 on cuda)")
    p.add_argument("--check-layers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   metavar="I,J", help="layers whose cache and outputs are checked (default: all on reference, "
                                       "first and last on cuda)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after the first N steps")
    p.add_argument("--calibrate-with", default=None, metavar="FIT_RUN",
                   help="fit cost-model scales on FIT_RUN's timings, report before/after on RUN_DIR, "
                        "write RUN_DIR/cost_profile.json")
    p.add_argument("--report-only", action="store_true", help="rewrite validation.md from saved timings")
    p.add_argument("--out", default=None, metavar="DIR", help="where to write (default RUN_DIR)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_validate)
    return p


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        if not args.report_only:
            s = validate_run(args.run_dir, args.backend, out_dir=args.out, max_steps=args.max_steps,
                             progress=not args.quiet, layers=args.layers, kv_heads=args.kv_heads, heads=args.heads,
                             head_size=args.head_size, dtype=args.dtype, check_layers=args.check_layers)
        s = report(args.run_dir, out_dir=args.out, calibrate_with=args.calibrate_with)
    except (ValidationSetupError, FileNotFoundError, PlanError) as e:
        print(f"blocksim validate: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"validate: {s['subset']}")
    for n in s["subset_notes"]:
        print(f"  note: {n}")
    if s["ok"]:
        print(f"validate: OK, {s['steps_checked']} steps checked in {s['wall_s']:.1f} s on {s['device']}")
    else:
        print(f"validate: FAILED: {s['error']['message']}")
    for key, label in (("errors", "MAPE"), ("errors_calibrated", "MAPE after calibration")):
        if key in s:
            print(f"  {label}: " + ", ".join(f"{c} {e['mape_pct']:.1f}% ({e['steps']} steps)"
                                           for c, e in s[key].items()))
    print(f"  written: {Path(args.out or args.run_dir) / 'validation.md'}")
    return 0 if s["ok"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m validation.validate")
    sub = p.add_subparsers(dest="command", required=True)
    add_validate_command(sub)
    args = p.parse_args(["validate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

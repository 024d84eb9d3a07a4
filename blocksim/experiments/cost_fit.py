"""``blocksim cost-fit PROFILE``: the roofline's constants fitted on a measured profile, and its error there.

    blocksim cost-fit blocksim/profiles/llama-3-8b__h200-141gb__float16__tp1.json --out fitted.json

Prints, per component, the mean absolute percentage error on the profile's grid points of the
roofline with its default constants and with the fitted ones (`blocksim.cost.fit`), and writes
the fitted constants as a "blocksim-roofline/1" file, usable as ``--cost-profile`` with the
roofline. (``--cost-model roofline --cost-profile PROFILE`` fits the same constants on the fly.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from blocksim.cost import fit_roofline, load_profile
from blocksim.cost.fit import COMPARED, grid_errors, write_params
from blocksim.experiments.runner import build_config


def fit_report(profile_path: str | Path) -> dict:
    """{"params": fitted constants, "default": errors, "fitted": errors} for a profile's own configuration."""
    prof = load_profile(profile_path)
    config = build_config(model=prof.model, gpu=prof.gpu, tensor_parallel=prof.tensor_parallel,
                          block_size=prof.block_size)
    params = fit_roofline(prof, config)
    return {"profile": str(profile_path), "params": params.to_dict(), "default": grid_errors(prof, config),
            "fitted": grid_errors(prof, config, params)}


def cmd_cost_fit(args: argparse.Namespace) -> int:
    rep = fit_report(args.profile)
    print(f"roofline fitted on {args.profile} (least squares on relative error over each table's grid)")
    print(f"  {'component':<13} {'points':>6} {'default MAPE':>13} {'fitted MAPE':>12} {'fitted median err':>18}")
    for comp in [c for c in rep["fitted"] if c in COMPARED] + [c for c in rep["fitted"] if c not in COMPARED]:
        d, f = rep["default"][comp], rep["fitted"][comp]
        print(f"  {comp:<13} {d['points']:>6} {d['mape_pct']:>12.1f}% {f['mape_pct']:>11.1f}% {f['median_err']:>+17.1%}")
    print("  constants: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in rep["params"].items()))
    if args.out:
        from blocksim.cost import CostParams
        path = write_params(CostParams(**rep["params"]), args.out, f"blocksim cost-fit {args.profile}")
        print(f"fitted constants: {path}")
        if args.errors:
            errors = path.with_suffix(".errors.json")
            errors.write_text(json.dumps(rep, indent=1) + "\n")
            print(f"grid errors: {errors}")
    return 0


def add_cost_fit_command(subparsers) -> None:
    p = subparsers.add_parser("cost-fit", help="fit the roofline's constants on a measured profile and report "
                                               "its error on the profile's grids")
    p.add_argument("profile", metavar="PROFILE", help="a blocksim-profile/1 file (blocksim profile)")
    p.add_argument("--out", default=None, metavar="JSON", help="write the fitted constants (a --cost-profile "
                                                                "for the roofline)")
    p.add_argument("--errors", action="store_true", help="also write the error tables beside --out")
    p.set_defaults(func=cmd_cost_fit)

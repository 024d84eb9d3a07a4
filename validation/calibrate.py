"""Timing fidelity: the cost model's predicted step components against measured ones, and a fit.

Inputs are the per-step timings a validation writes (``RUN/validation/timings.parquet``): the
plan's predictions ``t_<component>_s`` and the measured ``m_<component>_s``, the latter already
scaled from the executed subset to the whole model (``validate.py`` says how). Components compared:

* ``attn_decode``: paged attention of the decode batch (all layers), ``t_attn_decode_s``;
* ``swap``: swap in + swap out of the step, ``t_swap_s``;
* ``copy``: copy-on-write block copies, ``t_copy_s``.

Cache writes (``m_write_s``) have no component of their own in the cost model (they are part of
the step's linear / overhead time); they are reported, not compared.

Error: MAPE, the mean over steps where both times are positive of ``|pred - meas| / meas``.
Calibration: per component, the scale ``s`` minimising the squared relative error
``sum(((s * pred - meas) / meas) ** 2)``, i.e. ``s = sum(r) / sum(r ** 2)`` with ``r = pred / meas``.
Every component of the roofline model is linear in its ``scale_*`` parameter, so the calibrated
prediction of a recorded step is ``s * pred`` exactly. Numpy and pandas only; matplotlib for the
scatter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

COMPARED = {"attn_decode": "scale_attn_decode", "swap": "scale_swap", "copy": "scale_copy"}


def _pairs(timings: pd.DataFrame, comp: str) -> tuple[np.ndarray, np.ndarray]:
    p = timings[f"t_{comp}_s"].to_numpy(np.float64)
    m = timings[f"m_{comp}_s"].to_numpy(np.float64)
    ok = (p > 0) & (m > 0)
    return p[ok], m[ok]


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - meas) / meas) * 100) if len(meas) else float("nan")


def errors(timings: pd.DataFrame, scales: dict[str, float] | None = None) -> dict[str, dict]:
    """Per compared component: steps, MAPE (%), total predicted and measured seconds, median ratio
    predicted/measured; predictions multiplied by ``scales[comp]`` when given."""
    out = {}
    for comp in COMPARED:
        p, m = _pairs(timings, comp)
        p = p * (scales or {}).get(comp, 1.0)
        out[comp] = {"steps": len(p), "mape_pct": mape(p, m), "pred_s": float(p.sum()),
                     "meas_s": float(m.sum()),
                     "median_ratio": float(np.median(p / m)) if len(p) else float("nan")}
    return out


def fit_scales(timings: pd.DataFrame) -> dict[str, float]:
    """Per component, the least-squares (relative error) multiplier of the predictions; components
    without measured steps are left out."""
    scales = {}
    for comp in COMPARED:
        p, m = _pairs(timings, comp)
        if len(p):
            r = p / m
            scales[comp] = float(r.sum() / (r * r).sum())
    return scales


def write_profile(path: str | Path, scales: dict[str, float], *, base: dict | None = None,
                  source: dict | None = None) -> Path:
    """A cost profile JSON (``{"params": {...}}``, loadable by ``--cost-profile``). ``base`` holds the
    parameters the plan was predicted with; fitted scales multiply their ``scale_*`` values."""
    base = dict(base or {})
    params = {k: v for k, v in base.items() if v is not None}
    for comp, s in scales.items():
        key = COMPARED[comp]
        params[key] = float(params.get(key, 1.0) * s)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"params": params, "calibration": source or {}}, indent=2) + "\n")
    return path


def scatter_png(timings: pd.DataFrame, path: str | Path, *, title: str = "",
                scales: dict[str, float] | None = None) -> Path | None:
    """Predicted-vs-measured scatter per component (log-log, y = x line); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return None
    comps = [c for c in COMPARED if len(_pairs(timings, c)[0])]
    fig, axes = plt.subplots(1, max(1, len(comps)), figsize=(4.2 * max(1, len(comps)), 4), squeeze=False)
    for ax, comp in zip(axes[0], comps):
        p, m = _pairs(timings, comp)
        ax.scatter(m * 1e3, p * 1e3, s=6, alpha=0.5, label=f"model (MAPE {mape(p, m):.0f}%)")
        if scales and comp in scales:
            ps = p * scales[comp]
            ax.scatter(m * 1e3, ps * 1e3, s=6, alpha=0.5, label=f"calibrated (MAPE {mape(ps, m):.0f}%)")
        lo = min(m.min(), p.min()) * 1e3
        hi = max(m.max(), p.max()) * 1e3
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.set_title(f"{comp} ({len(p)} steps)")
        ax.legend(fontsize=8)
    if not comps:
        axes[0][0].text(0.5, 0.5, "no timed steps", ha="center")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def errors_table(before: dict, after: dict | None = None) -> str:
    """Markdown table of ``errors()`` results (and calibrated ones)."""
    head = "| component | steps | predicted (s) | measured (s) | median pred/meas | MAPE |"
    sep = "| --- | ---: | ---: | ---: | ---: | ---: |"
    if after is not None:
        head += " calibrated MAPE |"
        sep += " ---: |"
    rows = [head, sep]
    for comp, e in before.items():
        row = (f"| {comp} | {e['steps']} | {e['pred_s']:.4g} | {e['meas_s']:.4g} | {e['median_ratio']:.3g} | "
               f"{e['mape_pct']:.1f}% |")
        if after is not None:
            row += f" {after[comp]['mape_pct']:.1f}% |"
        rows.append(row)
    return "\n".join(rows)

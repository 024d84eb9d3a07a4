"""``sweep_report.html`` / ``.md``: heatmaps over two axes, the best configuration per trace, the
capacity-search results, and failed points. Built from ``sweep.parquet`` with ``analysis.document``.
"""

from __future__ import annotations

import io
import math
import numbers

import pandas as pd

from analysis.document import Image, Section, Table, write_document

#: (column, label, higher is better) of the heatmaps, in order; those absent from the table are skipped.
HEATMAP_METRICS = (
    ("max_rate_scale", "max rate scale meeting the SLO", True),
    ("requests_per_s", "throughput (finished req/s)", True),
    ("goodput_requests_per_s", "goodput (req/s within the SLO)", True),
    ("norm_latency_mean_s", "normalized latency (s/token)", False),
)
TABLE_METRICS = ("offered_rate_req_s", "requests_per_s", "goodput_requests_per_s", "slo_attainment",
                 "ttft_p90_s", "tpot_p90_s", "norm_latency_mean_s", "preemptions", "rejected", "prefix_hit_rate",
                 "token_states_of_used_frac")
MAX_TABLE_ROWS = 200
MAX_PANELS = 12


def heatmap_axes(df: pd.DataFrame, axes: list[str], chosen: dict) -> tuple[str, str] | None:
    """The heatmap's (x, y): from the spec's ``report:``, else the two axes with the most values;
    with a single axis the traces are the rows. None when there is nothing two-dimensional."""
    cands = [a for a in axes if a in df.columns and df[a].nunique(dropna=False) > 1]
    if df["trace"].nunique() > 1:
        cands.append("trace")
    x, y = chosen.get("x"), chosen.get("y")
    ranked = sorted(cands, key=lambda a: -df[a].nunique(dropna=False))
    x = x or next((a for a in ranked if a not in (y, "trace")), None) or next((a for a in ranked if a != y), None)
    y = y or next((a for a in ranked if a != x), None)
    return (x, y) if x and y and x != y else None


def _sorted_values(values) -> list:
    """Numbers in order; anything else (policies, traces) in the order of the spec."""
    vals = list(dict.fromkeys(values))
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in vals):
        return sorted(vals)
    return vals


#: A heatmap's colour scale spans at least this share of its largest magnitude, so values that differ
#: by less (noise, rounding) get nearly the same colour instead of opposite ends of the scale.
MIN_RELATIVE_SPAN = 0.02


def colour_limits(values) -> tuple[float, float] | None:
    """(vmin, vmax) of a heatmap's colour scale: the values' range, widened about its middle to
    ``MIN_RELATIVE_SPAN`` of the largest magnitude when narrower. None without a finite value."""
    finite = [float(v) for v in pd.Series(values).dropna() if math.isfinite(float(v))]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    floor = MIN_RELATIVE_SPAN * max(abs(lo), abs(hi)) or 1.0
    if hi - lo < floor:
        mid = (hi + lo) / 2
        lo, hi = mid - floor / 2, mid + floor / 2
    return lo, hi


def heatmap_png(panels: list[tuple[str, pd.DataFrame]], label: str, xlabel: str, ylabel: str,
                higher_better: bool) -> bytes:
    """One heatmap per (title, table) panel, three to a row, each on its own colour scale
    (`colour_limits`), every cell annotated with its value."""
    # matplotlib and seaborn load only when a heatmap is drawn, not when the CLI starts
    import matplotlib as mpl
    import seaborn as sns
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    rows, cols = panels[0][1].shape
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    width = min(18, ncols * (2.8 + 0.8 * cols))
    height = nrows * min(8, 1.6 + 0.45 * rows) + 0.4
    with mpl.rc_context({**sns.axes_style("white"), **sns.plotting_context("paper", font_scale=1.0)}):
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for ax, (title, table) in zip(axes.flat, panels):
            values = table.astype(float)
            limits = colour_limits(values.stack()) or (0.0, 1.0)
            formatter = ScalarFormatter(useOffset=False)
            formatter.set_powerlimits((-3, 4))
            sns.heatmap(values, ax=ax, cmap="viridis" if higher_better else "viridis_r",
                        vmin=limits[0], vmax=limits[1],
                        annot=values.size <= 120 and bool(values.notna().to_numpy().any()), fmt=".4g",
                        linewidths=0.5, linecolor="white", cbar_kws={"shrink": 0.9, "format": formatter})
            ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle(label)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _widened(table: pd.DataFrame) -> bool:
    values = table.stack().astype(float)
    limits = colour_limits(values)
    return limits is not None and limits[1] - limits[0] > values.max() - values.min() + 1e-12


def _relative_spread(values: pd.Series) -> float:
    values = values.dropna()
    if values.empty:
        return -1.0
    scale = max(abs(values.max()), abs(values.min()))
    return float((values.max() - values.min()) / scale) if scale > 0 else 0.0


def informative_slice(df: pd.DataFrame, others: list[str], col: str) -> tuple[dict, pd.DataFrame]:
    """The values of the ``others`` axes at which ``col`` varies most (relative spread) across the
    rest of the grid, and the rows there; a tie goes to the later values (e.g. the higher rate)."""
    if not others:
        return {}, df
    best: tuple[float, dict, pd.DataFrame] | None = None
    for key, rows in df.groupby(others, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        spread = _relative_spread(rows[col])
        if best is None or spread >= best[0]:
            best = (spread, dict(zip(others, key)), rows)
    return best[1], best[2]


def heatmap_images(df: pd.DataFrame, axes: list[str], chosen: dict, seeds: bool = False,
                   metrics: tuple = HEATMAP_METRICS) -> list:
    """Per metric, one image of it over the two heatmap axes, a panel per trace (unless the
    traces are an axis). Other varying axes are held where the metric varies most across the
    grid (`informative_slice`), which the caption names."""
    xy = heatmap_axes(df, axes, chosen) if not df.empty else None
    if xy is None:
        return []
    x, y = xy
    others = [a for a in axes if a not in (x, y) and a in df.columns and df[a].nunique(dropna=False) > 1]
    images = []
    for col, label, higher in metrics:
        if col not in df.columns or not df[col].notna().any():
            continue
        fixed, sel = informative_slice(df, others, col)
        groups = [("", sel)] if "trace" in (x, y) else [(f"trace {t}", g) for t, g in sel.groupby("trace", sort=False)]
        panels = []
        for title, rows in groups[:MAX_PANELS]:
            cells = rows.groupby([y, x], dropna=False)[col].mean().unstack(x)
            panels.append((title, cells.reindex(index=_sorted_values(rows[y]), columns=_sorted_values(rows[x]))))
        caption = f"{label} over {x} and {y}"
        if fixed:
            caption += (f", other axes at {', '.join(f'{a}={v}' for a, v in fixed.items())} "
                        "(where it varies most)")
        caption += "; mean over seeds." if seeds else "."
        if any(_widened(table) for _, table in panels):
            caption += (f" The values differ by less than {MIN_RELATIVE_SPAN:.0%} of their size, so the colour "
                        "scale is widened and they look alike.")
        images.append(Image(heatmap_png(panels, label, x, y, higher), f"heatmap of {label}", caption))
    return images


def best_per_trace(df: pd.DataFrame, axes: list[str], slo_text: str, top: int = 5) -> tuple[pd.DataFrame, str]:
    """Per trace, the ``top`` configurations (axis values, mean over seeds) by goodput under the SLO,
    or by throughput without one."""
    ok = df[df["status"] == "ok"]
    metric = "goodput_requests_per_s" if slo_text and "goodput_requests_per_s" in ok.columns else "requests_per_s"
    keys = ["trace", *[a for a in axes if a in ok.columns and a != "trace"]]
    metrics = [c for c in TABLE_METRICS if c in ok.columns]
    if ok.empty:
        return pd.DataFrame(columns=keys + metrics), metric
    means = ok.groupby(keys, dropna=False, sort=False)[metrics].mean().reset_index()
    best = (means.sort_values(["trace", metric], ascending=[True, False], kind="stable")
            .groupby("trace", sort=False).head(top))
    return best.reset_index(drop=True), metric


def sweep_sections(df: pd.DataFrame, setup: dict, max_rate: pd.DataFrame | None = None) -> list:
    from analysis.report import flatten  # analysis.report loads matplotlib: only when a report is drawn

    axes = list(setup.get("axes") or [])
    seeds = setup.get("seeds")
    slo_text = setup.get("slo") or ""
    ok, failed = df[df["status"] == "ok"], df[df["status"] != "ok"]
    setup_table = pd.DataFrame({"setting": list(flatten(setup)), "value": [str(v) for v in flatten(setup).values()]})
    headline = [f"{len(df)} runs: {len(ok)} ok, {len(failed)} failed"
                + (f", {int((df['attempts'] == 0).sum())} reused from an earlier sweep" if "attempts" in df else "")
                + "."]
    if "rejected" in df and df["rejected"].fillna(0).gt(0).any():
        rejecting = df[df["rejected"].fillna(0) > 0]
        worst = rejecting.loc[rejecting["rejected"].idxmax()]
        headline.append(f"{len(rejecting)} runs rejected requests too long for the model, up to "
                        f"{int(worst['rejected']):,} of {int(worst['requests']):,} ({worst['run_dir']}); "
                        "clip_to_model: true in the spec's base clips them instead.")
    sections = [Section("headline", "Findings", headline)]
    if max_rate is not None:
        cols = [c for c in ("trace", *axes, "seed", "search_status", "max_rate_scale", "max_offered_rate_req_s",
                            "first_failing_rate_scale", "slo_attainment", "goodput_requests_per_s", "probes",
                            "error") if c in max_rate.columns]
        sections.append(Section("max-rate", f"Highest rate meeting the SLO ({slo_text})", [
            (f"Per configuration, the highest rate scale at which at least {setup.get('goodput_threshold')} of "
             "requests finished within every SLO bound, found by doubling/halving then "
             f"{setup.get('bisect_steps')} geometric bisection steps."),
            Table(max_rate[cols]),
        ]))
        mr_axes = [a for a in axes if a != "rate_scale"]
        images = heatmap_images(max_rate[max_rate["max_rate_scale"].notna()], mr_axes,
                                setup.get("report") or {}, bool(seeds), HEATMAP_METRICS[:1])
        if images:
            sections.append(Section("max-rate-heatmaps", "Max rate over two axes", images))
    else:
        images = heatmap_images(ok, axes, setup.get("report") or {}, bool(seeds))
        sections.append(Section("heatmaps", "Heatmaps over two axes",
                                images or ["Fewer than two axes vary (or no run succeeded): no heatmap."]))
        best, metric = best_per_trace(df, axes, slo_text)
        what = f"goodput under the SLO {slo_text}" if metric.startswith("goodput") else "throughput (no SLO given)"
        if len(best):
            top = best.groupby("trace", sort=False).head(1)
            headline += [f"Best by {what.split(' (')[0]} on {r['trace']}: "
                         + ", ".join(f"{a}={r[a]}" for a in axes if a in r and a != "trace")
                         + f" ({r[metric]:.4g} req/s)." for _, r in top.iterrows()]
        sections.append(Section("best", "Best configurations per trace",
                                [f"Top configurations by {what}" + ("; mean over seeds." if seeds else "."),
                                 Table(_short_headers(best[[c for c in best.columns if c in BEST_COLUMNS
                                                            or c == "trace" or c in axes]]))]))
    if len(failed):
        sections.append(Section("failed", "Failed runs", [
            "Each failed run's traceback is in its run directory's error.txt; rerunning the sweep retries them.",
            Table(failed[[c for c in ("run_dir", "attempts", "error") if c in failed.columns]]),
        ]))
    shown = [c for c in ("trace", *axes, "seed", "status", *TABLE_METRICS, "run_dir") if c in df.columns]
    if len(df) <= MAX_TABLE_ROWS:
        sections.append(Section("runs", "Appendix: all runs", [Table(_short_headers(df[shown]))]))
    else:
        sections.append(Section("runs", "Appendix: all runs", [f"{len(df)} runs: see sweep.parquet."]))
    sections.append(Section("setup", "Appendix: setup", [Table(setup_table)]))
    return sections


#: Metric columns of the best-configurations table (all runs show every ``TABLE_METRICS``).
BEST_COLUMNS = ("requests_per_s", "goodput_requests_per_s", "ttft_p90_s", "tpot_p90_s", "preemptions", "rejected",
                "token_states_of_used_frac")
#: Table headers a reader scans faster than column names.
SHORT_HEADERS = {
    "offered_rate_req_s": "offered (req/s)", "requests_per_s": "throughput (req/s)",
    "goodput_requests_per_s": "goodput (req/s)", "slo_attainment": "within SLO", "ttft_p90_s": "TTFT p90 (s)",
    "tpot_p90_s": "TPOT p90 (s)", "norm_latency_mean_s": "norm. latency (s/token)",
    "prefix_hit_rate": "prefix hit rate", "token_states_of_used_frac": "used KV holding tokens",
}


def _short_headers(df: pd.DataFrame) -> pd.DataFrame:
    return df.rename(columns=SHORT_HEADERS)


def write_sweep_report(out_dir, df: pd.DataFrame, setup: dict, max_rate: pd.DataFrame | None = None):
    title = f"blocksim sweep: {setup.get('name', 'sweep')}"
    return write_document(out_dir, "sweep_report", title, sweep_sections(df, setup, max_rate))


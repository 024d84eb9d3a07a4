"""Figures for the reports, each returned as PNG bytes.

One palette (seaborn ``colorblind``) for every figure. Memory categories always get the same
colour and hatch; policies (or runs) get a colour, a marker and a line style, so every figure
still reads when printed in grayscale. Figures are drawn on the Agg canvas directly (no pyplot,
no global backend switch) inside a seaborn theme, and expect already-downsampled time series
(see ``metrics.time_binned``), so their cost does not grow with the number of steps.
"""

from __future__ import annotations

import functools
import io
import math

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis.rundir import MEMORY_CATEGORIES

PALETTE = sns.color_palette("colorblind", 10)

#: category -> (colour, hatch, label); bottom to top of every stack.
CATEGORY_STYLE = {
    "token_states": (PALETTE[0], "", "token states"),
    "reservation": (PALETTE[1], "//", "reservation"),
    "internal_frag": (PALETTE[2], "xx", "internal fragmentation"),
    "external_frag": (PALETTE[3], "\\\\", "external fragmentation"),
    "free": (PALETTE[7], "..", "free"),
}
WASTE_CATEGORIES = ("reservation", "internal_frag", "external_frag")
_SERIES_COLOURS = [PALETTE[i] for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]
_MARKERS = "osD^vPX*h"
_LINESTYLES = ("-", "--", ":", "-.")
_THEME = {
    **sns.axes_style("whitegrid"),
    **sns.plotting_context("paper", font_scale=1.1),
    "hatch.linewidth": 0.6,
    "hatch.color": "#333333",
    "legend.frameon": False,
}
_CDF_POINTS = 512


def series_style(i: int) -> dict:
    """Colour, marker and line style of the i-th policy/run (stable across figures)."""
    return {
        "color": _SERIES_COLOURS[i % len(_SERIES_COLOURS)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "linestyle": _LINESTYLES[i % len(_LINESTYLES)],
    }


def _themed(draw):
    """Run a drawing function inside the theme and return its figure as PNG bytes."""

    @functools.wraps(draw)
    def wrapper(*args, **kwargs) -> bytes:
        with mpl.rc_context(_THEME):
            fig = draw(*args, **kwargs)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()

    return wrapper


def _figure(nrows: int = 1, ncols: int = 1, width: float = 9.0, row_height: float = 3.0, **kw):
    fig = Figure(figsize=(width, row_height * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def legend_below(fig: Figure, handles: list, labels: list[str]):
    """A figure legend under the axes, in as many columns as fit the figure's width (one row if
    they all fit), so no entry is cut off at the figure's edges. A legend's size does not depend
    on where the layout puts it, so each try measures the legend alone, not the whole figure."""
    renderer = fig.canvas.get_renderer()
    for ncols in range(len(handles), 0, -1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncols=ncols)
        if ncols == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width - 4:
            return legend
        legend.remove()
    return None


def _shared_time_axis(fig: Figure, series) -> None:
    """One time range on every panel of a figure with several runs, so their timelines compare."""
    frames = [ts for ts in series if len(ts)]
    if len(frames) > 1:
        lo, hi = min(float(ts.index.min()) for ts in frames), max(float(ts.index.max()) for ts in frames)
        if hi > lo:
            for ax in fig.axes:
                ax.set_xlim(lo, hi)


def _category_patches(categories) -> list[Patch]:
    return [Patch(facecolor=CATEGORY_STYLE[c][0], hatch=CATEGORY_STYLE[c][1], edgecolor="#333333",
                  label=CATEGORY_STYLE[c][2]) for c in categories]


def _category_legend(fig: Figure, categories=MEMORY_CATEGORIES) -> None:
    handles = _category_patches(categories)
    legend_below(fig, handles, [h.get_label() for h in handles])


def _category_legend_right(fig: Figure, categories=MEMORY_CATEGORIES) -> None:
    """The categories beside the axes, top of the stack first, as the bars read."""
    handles = _category_patches(categories)[::-1]
    fig.legend(handles=handles, loc="outside right upper", ncols=1)


def _stack(ax, x: np.ndarray, layers: dict[str, np.ndarray]) -> None:
    bottom = np.zeros_like(x, dtype=float)
    for cat, values in layers.items():
        colour, hatch, label = CATEGORY_STYLE[cat]
        top = bottom + values
        ax.fill_between(x, bottom, top, facecolor=colour, hatch=hatch, edgecolor="#333333",
                        linewidth=0.3, label=label, step="mid")
        bottom = top


@_themed
def memory_area(series: dict[str, pd.DataFrame], capacity: dict[str, int]) -> Figure:
    """Stacked area per run: share of KV capacity (%) in each category over time."""
    fig, axes = _figure(len(series), 1, row_height=2.6, sharex=False)
    for ax, (label, ts) in zip(axes[:, 0], series.items()):
        share = ts[list(MEMORY_CATEGORIES)] * (100.0 / capacity[label])
        _stack(ax, ts.index.to_numpy(), {c: share[c].to_numpy() for c in MEMORY_CATEGORIES})
        ax.set(ylim=(0, 100), ylabel="KV capacity (%)", xlabel="simulated time (s)",
               title=f"{label} (capacity {capacity[label]:,} token slots)")
        ax.margins(x=0)
    _shared_time_axis(fig, series.values())
    _category_legend(fig)
    return fig


@_themed
def memory_bars(fracs: pd.DataFrame, label_col: str, facet_col: str | None = None) -> Figure:
    """Time-averaged breakdown as stacked bars, one per row of ``fracs`` (percent annotated)."""
    facets = [None] if facet_col is None else list(dict.fromkeys(fracs[facet_col]))
    most_bars = max(len(fracs) if f is None else int((fracs[facet_col] == f).sum()) for f in facets)
    ncols = min(len(facets), 3 if most_bars <= 3 else 2)
    nrows = math.ceil(len(facets) / ncols)
    fig, axes = _figure(nrows, ncols, width=2.4 + max(3.0, ncols * (1.4 + 1.0 * most_bars)),
                        row_height=3.8, sharey=True)
    for ax in axes.flat[len(facets):]:
        ax.set_visible(False)
    for ax, facet in zip(axes.flat, facets):
        rows = fracs if facet is None else fracs[fracs[facet_col] == facet]
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for cat in MEMORY_CATEGORIES:
            colour, hatch, label = CATEGORY_STYLE[cat]
            values = rows[f"{cat}_frac"].to_numpy(dtype=float) * 100.0
            ax.bar(x, values, bottom=bottom, color=colour, hatch=hatch, edgecolor="#333333",
                   linewidth=0.4, width=0.65, label=label)
            for xi, b, v in zip(x, bottom, values):
                if v >= 5.0:
                    ax.text(xi, b + v / 2, f"{v:.1f}%", ha="center", va="center", fontsize=8,
                            bbox={"facecolor": "white", "alpha": 0.75, "pad": 1, "linewidth": 0})
            bottom += values
        ax.set_xticks(x, rows[label_col].astype(str), rotation=30 if len(rows) > 3 else 0,
                      ha="right" if len(rows) > 3 else "center")
        ax.set(ylim=(0, 100), ylabel="KV capacity, time-averaged (%)", xlabel=label_col)
        if facet is not None:
            ax.set_title(f"{facet_col} = {facet}")
    _category_legend_right(fig)
    return fig


@_themed
def latency_vs_rate(df: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str) -> Figure:
    """One line per ``policy``: ``y`` against ``x`` (the PagedAttention paper's Fig. 12 form)."""
    fig, axes = _figure(1, 1, width=7.0, row_height=4.0)
    ax = axes[0, 0]
    for i, (policy, rows) in enumerate(df.groupby("policy", sort=False)):
        rows = rows.sort_values(x)
        ax.plot(rows[x], rows[y], label=policy, markersize=6, **series_style(i))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    values = df[y].to_numpy(dtype=float)
    positive = values[values > 0]
    if len(positive) and positive.max() / positive.min() > 30:  # a linear axis would flatten the low lines
        ax.set_yscale("log")
        ax.set_ylabel(f"{ylabel}, log scale")
    else:
        ax.set_ylim(bottom=0)
    ax.legend(title="policy")
    return fig


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF, thinned to at most ``_CDF_POINTS`` quantiles for large samples."""
    values = np.sort(values[~np.isnan(values)])
    if len(values) <= _CDF_POINTS:
        return values, np.arange(1, len(values) + 1) / len(values)
    q = np.linspace(0, 1, _CDF_POINTS)
    return np.quantile(values, q), q


@_themed
def latency_cdfs(requests: dict[str, pd.DataFrame]) -> Figure:
    """CDFs of TTFT, TPOT, end-to-end and normalized latency; one line per run."""
    panels = [("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s/token)"),
              ("e2e_s", "end-to-end latency (s)"), ("norm_latency_s", "normalized latency (s/token)")]
    fig, axes = _figure(2, 2, row_height=3.0)
    for ax, (col, xlabel) in zip(axes.flat, panels):
        lows, highs = [], []
        for i, (label, req) in enumerate(requests.items()):
            done = req[req["status"].eq("finished")]
            x, p = _ecdf(done[col].to_numpy(dtype=float))
            if len(x) == 0:
                continue
            style = series_style(i)
            ax.plot(x, p * 100.0, label=label, color=style["color"], linestyle=style["linestyle"],
                    marker=style["marker"], markevery=max(1, len(x) // 8), markersize=4,
                    drawstyle="steps-post")
            lows.append(x[x > 0].min() if (x > 0).any() else np.nan)
            highs.append(x.max())
        if lows and np.nanmin(lows) > 0 and max(highs) / np.nanmin(lows) > 100:
            ax.set_xscale("log")
        ax.set(xlabel=xlabel, ylabel="requests (cumulative %)", ylim=(0, 101))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        legend_below(fig, handles, labels)
    return fig


def _lines(ax, ts: pd.DataFrame, columns: dict[str, str]) -> None:
    for i, (col, label) in enumerate(columns.items()):
        style = series_style(i)
        ax.plot(ts.index, ts[col], label=label, color=style["color"], linestyle=style["linestyle"],
                marker=style["marker"], markevery=max(1, len(ts) // 10), markersize=4)
    ax.margins(x=0)
    ax.set_ylim(bottom=0)


def _side_legend(ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


@_themed
def queues_over_time(binned: dict[str, pd.DataFrame]) -> Figure:
    """Per run: running / waiting / swapped groups, and batch size in sequences, over time."""
    fig, axes = _figure(len(binned), 2, row_height=2.6)
    for (label, ts), (left, right) in zip(binned.items(), axes):
        _lines(left, ts, {"running": "running", "waiting": "waiting", "swapped": "swapped"})
        left.set(xlabel="simulated time (s)", ylabel="queue length (groups)", title=f"{label}: queues")
        _lines(right, ts, {"num_prefill_seqs": "prefill", "num_decode_seqs": "decode",
                           "batch_seqs": "batch (total)"})
        right.set(xlabel="simulated time (s)", ylabel="batch size (sequences)",
                  title=f"{label}: batch size")
        _side_legend(left)
        _side_legend(right)
    _shared_time_axis(fig, binned.values())
    return fig


@_themed
def events_over_time(binned: dict[str, pd.DataFrame], swaps: bool = True) -> Figure:
    """Per run: preemptions per second and (with ``swaps``) blocks swapped in / out per second, over time."""
    fig, axes = _figure(len(binned), 2 if swaps else 1, width=9.0 if swaps else 6.0, row_height=2.6)
    for (label, ts), row in zip(binned.items(), axes):
        left = row[0]
        _lines(left, ts, {"preempted": "preemptions"})
        left.set(xlabel="simulated time (s)", ylabel="preemptions (groups/s)",
                 title=f"{label}: preemptions")
        if swaps:
            right = row[1]
            _lines(right, ts, {"blocks_swapped_out": "swapped out", "blocks_swapped_in": "swapped in"})
            right.set(xlabel="simulated time (s)", ylabel="swap traffic (blocks/s)",
                      title=f"{label}: swaps")
            _side_legend(right)
    _shared_time_axis(fig, binned.values())
    return fig


@_themed
def wasted_over_time(ts: pd.DataFrame, capacity: int, windows: pd.DataFrame) -> Figure:
    """Stacked wasted slots (% of capacity) over time, with the worst windows shaded and ranked."""
    fig, axes = _figure(1, 1, row_height=3.4)
    ax = axes[0, 0]
    _stack(ax, ts.index.to_numpy(), {c: ts[c].to_numpy() * (100.0 / capacity) for c in WASTE_CATEGORIES})
    for k, w in enumerate(windows.sort_values("start_s").itertuples()):
        ax.axvspan(w.start_s, w.end_s, color="#000000", alpha=0.12, linewidth=0)
        # Alternate label heights so adjacent windows' ranks do not overlap.
        ax.annotate(f"#{w.rank}", ((w.start_s + w.end_s) / 2, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 2 + 9 * (k % 2)), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8)
    ax.set(xlabel="simulated time (s)", ylabel="wasted KV capacity (%)")
    ax.margins(x=0)
    ax.set_ylim(bottom=0)
    _category_legend(fig, WASTE_CATEGORIES)
    return fig


@_themed
def extent_histogram(dist: pd.DataFrame) -> Figure:
    """Free extents by size class: count of extents and share of free slots (%)."""
    fig, axes = _figure(1, 2, row_height=3.2)
    x = np.arange(len(dist))
    for ax, col, ylabel, i in ((axes[0, 0], "extents", "extents (count, all samples)", 0),
                               (axes[0, 1], "free_share", "free token slots (%)", 1)):
        values = dist[col].to_numpy(dtype=float) * (100.0 if col == "free_share" else 1.0)
        ax.bar(x, values, color=series_style(i)["color"], hatch="//" if i else "",
               edgecolor="#333333", linewidth=0.4)
        ax.set_xticks(x, dist["size_tokens"], rotation=45, ha="right")
        ax.set(xlabel="extent size (token slots)", ylabel=ylabel)
    return fig

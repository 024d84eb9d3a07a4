"""analysis/figures.py: every legend lies inside its figure, however long the labels or narrow the figure."""

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
from rundir_fixtures import synthetic_run

from analysis import figures
from analysis.metrics import memory_fractions, time_binned
from analysis.rundir import MEMORY_CATEGORIES, load_run

LONG_LABELS = ["vllm-prefix x0.25", "orca-oracle x0.5", "orca-pow2 x0.75", "orca-max x1", "static x2",
               "mypkg.policies:MyScheduler x4"]


def _drawn(draw, *args, **kwargs):
    """The figure a drawing function makes (before it becomes PNG bytes), drawn in the theme."""
    with mpl.rc_context(figures._THEME):
        fig = draw.__wrapped__(*args, **kwargs)
        fig.canvas.draw()
    return fig


def _legends_outside(fig) -> list[str]:
    """Legends (figure- or axes-level) whose box crosses the figure's edges, by their first entry."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "the figure has a legend"
    width, height = fig.bbox.width, fig.bbox.height
    out = []
    for legend in legends:
        box = legend.get_window_extent()
        if box.x0 < -0.5 or box.y0 < -0.5 or box.x1 > width + 0.5 or box.y1 > height + 0.5:
            out.append(f"{legend.get_texts()[0].get_text()}...: {box} outside {width}x{height}")
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return {label: load_run(synthetic_run(base / str(i), 400, 60, seed=i)) for i, label in enumerate(LONG_LABELS)}


def _memory_series(runs):
    cols = [f"mem_{c}" for c in MEMORY_CATEGORIES]
    series = {k: time_binned(r.steps, cols).rename(columns=lambda c: c.removeprefix("mem_")) for k, r in runs.items()}
    return series, {k: r.capacity_tokens for k, r in runs.items()}


@pytest.mark.parametrize("n_bars", [1, 2, 6])
def test_memory_bars_keep_every_category_in_the_legend(runs, n_bars):
    rows = pd.DataFrame([{"policy": k, **memory_fractions(r)} for k, r in list(runs.items())[:n_bars]])
    fig = _drawn(figures.memory_bars, rows, "policy")
    assert _legends_outside(fig) == []
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == [figures.CATEGORY_STYLE[c][2] for c in reversed(MEMORY_CATEGORIES)], "all five, top first"


def test_faceted_memory_bars(runs):
    rows = pd.DataFrame([{"policy": k.split()[0], "rate": k.split()[1], **memory_fractions(r)}
                         for k, r in runs.items()])
    assert _legends_outside(_drawn(figures.memory_bars, rows, "policy", "rate")) == []


@pytest.mark.parametrize("n_runs", [1, 6])
def test_time_series_figures(runs, n_runs):
    some = dict(list(runs.items())[:n_runs])
    series, capacity = _memory_series(some)
    assert _legends_outside(_drawn(figures.memory_area, series, capacity)) == []
    assert _legends_outside(_drawn(figures.latency_cdfs, {k: r.requests for k, r in some.items()})) == []
    queues = {k: time_binned(r.steps, ["running", "waiting", "swapped", "num_prefill_seqs", "num_decode_seqs"])
              .assign(batch_seqs=lambda q: q["num_prefill_seqs"] + q["num_decode_seqs"]) for k, r in some.items()}
    assert _legends_outside(_drawn(figures.queues_over_time, queues)) == []
    events = {k: time_binned(r.steps, ["preempted", "blocks_swapped_in", "blocks_swapped_out"], how="rate")
              for k, r in some.items()}
    assert _legends_outside(_drawn(figures.events_over_time, events)) == []


def test_latency_vs_rate_and_wasted_memory(runs):
    df = pd.DataFrame([{"policy": p, "rate": r, "lat": r * (i + 1)} for i, p in enumerate(LONG_LABELS)
                       for r in (0.5, 1.0, 2.0)])
    assert _legends_outside(_drawn(figures.latency_vs_rate, df, "rate", "lat", "rate", "latency")) == []
    run = next(iter(runs.values()))
    ts = time_binned(run.steps, ["mem_reservation", "mem_internal_frag", "mem_external_frag"])
    ts.columns = [c.removeprefix("mem_") for c in ts.columns]
    windows = pd.DataFrame({"rank": [1, 2], "start_s": [1.0, 3.0], "end_s": [2.0, 4.0]})
    assert _legends_outside(_drawn(figures.wasted_over_time, ts, run.capacity_tokens, windows)) == []
    assert np.isfinite(run.capacity_tokens)


def test_latency_vs_rate_turns_logarithmic_when_lines_differ_by_orders_of_magnitude():
    df = pd.DataFrame({"policy": ["a", "a", "b", "b"], "rate": [1, 2, 1, 2], "lat": [0.02, 0.04, 0.03, 6.7]})
    assert _drawn(figures.latency_vs_rate, df, "rate", "lat", "rate", "latency").axes[0].get_yscale() == "log"
    df["lat"] = [0.02, 0.04, 0.03, 0.3]
    assert _drawn(figures.latency_vs_rate, df, "rate", "lat", "rate", "latency").axes[0].get_yscale() == "linear"

"""Where the KV memory was wasted, when, and with which requests resident.

Wasted slots are ``reservation + internal_frag + external_frag`` (token slots that hold no KV
yet cannot take the next request's tokens). The worst windows are the ``top_k`` fixed time
windows with the highest duration-weighted mean of wasted slots; the requests resident in a
window are those first scheduled before it ends and not finished before it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import figures
from analysis.document import Image, Section, Table, write_document
from analysis.metrics import memory_means, time_binned
from analysis.rundir import MEMORY_CATEGORIES, Run, load_run

WASTE_COLUMNS = ("mem_reservation", "mem_internal_frag", "mem_external_frag")
DEFAULT_WINDOWS = 50
#: Resident requests listed per window in the written reports (the DataFrame holds all).
RESIDENTS_SHOWN = 3
#: Below this share of capacity at its worst window, waste is stated in a sentence, not charted.
NEGLIGIBLE_WASTE_FRAC = 0.01
RESIDENT_COLUMNS = (
    "request_id", "arrival_s", "prompt_tokens", "output_tokens", "n",
    "first_scheduled_s", "finish_s", "preemptions",
)


@dataclass(frozen=True)
class FragmentationReport:
    """The tables behind ``fragmentation.md``; ``extents`` is None without free-extent samples."""

    breakdown: pd.DataFrame
    windows: pd.DataFrame
    resident: pd.DataFrame
    extents: pd.DataFrame | None
    md_path: Path | None = None
    html_path: Path | None = None


def breakdown_table(run: Run) -> pd.DataFrame:
    """Time-weighted mean slots and share of capacity per category (rows sum to capacity / 1)."""
    means = memory_means(run)
    return pd.DataFrame({
        "category": list(MEMORY_CATEGORIES),
        "mean_slots": [means[c] for c in MEMORY_CATEGORIES],
        "frac": [means[c] / run.capacity_tokens for c in MEMORY_CATEGORIES],
    })


def default_window_s(run: Run) -> float:
    """The run's span split into ``DEFAULT_WINDOWS`` windows."""
    steps = run.steps
    span = float((steps["start_s"] + steps["duration_s"]).max() - steps["start_s"].min())
    return span / DEFAULT_WINDOWS if span > 0 else 1.0


def worst_windows(run: Run, top_k: int = 5, window_s: float | None = None) -> pd.DataFrame:
    """The ``top_k`` windows of ``window_s`` seconds with the most wasted slots, worst first.

    Columns: ``rank`` (1 = worst), ``start_s``, ``end_s``, ``wasted_slots``, ``wasted_frac``
    (of capacity), the three waste categories' mean slots, and ``resident_requests``.
    Windows without steps are never chosen; ties go to the earlier window.
    """
    if run.steps.empty:
        return pd.DataFrame(columns=["rank", "start_s", "end_s", "wasted_slots", "wasted_frac"])
    width = window_s or default_window_s(run)
    binned = time_binned(run.steps, list(WASTE_COLUMNS), width_s=width)
    binned.columns = [c.removeprefix("mem_") for c in binned.columns]
    binned["wasted_slots"] = binned.sum(axis=1)
    t0 = float(run.steps["start_s"].min())
    # Bin centres are t0 + (i + 0.5) * width; recover i exactly so window edges are multiples of width.
    i = np.rint((binned.index.to_numpy() - t0) / width - 0.5)
    binned["start_s"] = t0 + i * width
    binned["end_s"] = binned["start_s"] + width
    worst = binned.sort_values(["wasted_slots", "start_s"], ascending=[False, True]).head(top_k)
    worst = worst.reset_index(drop=True)
    worst.insert(0, "rank", np.arange(1, len(worst) + 1))
    worst["wasted_frac"] = worst["wasted_slots"] / run.capacity_tokens
    worst["resident_requests"] = [len(_resident(run.requests, w)) for w in worst.itertuples()]
    cols = ["rank", "start_s", "end_s", "wasted_slots", "wasted_frac",
            "reservation", "internal_frag", "external_frag", "resident_requests"]
    return worst[cols]


def _resident(requests: pd.DataFrame, window) -> pd.DataFrame:
    admitted = requests["first_scheduled_s"] < window.end_s
    not_done = requests["finish_s"].isna() | (requests["finish_s"] > window.start_s)
    return requests[admitted & not_done]


def resident_requests(run: Run, windows: pd.DataFrame) -> pd.DataFrame:
    """Requests resident in each window (``window`` = its rank), longest total tokens first."""
    frames = []
    for w in windows.itertuples():
        res = _resident(run.requests, w).loc[:, list(RESIDENT_COLUMNS)]
        res = res.assign(total_tokens=res["prompt_tokens"] + res["output_tokens"] * res["n"])
        res = res.sort_values(["total_tokens", "request_id"], ascending=[False, True])
        frames.append(res.assign(window=w.rank))
    if not frames:
        return pd.DataFrame(columns=["window", *RESIDENT_COLUMNS, "total_tokens"])
    out = pd.concat(frames, ignore_index=True)
    return out[["window", *RESIDENT_COLUMNS, "total_tokens"]]


def extent_distribution(free_extents: pd.DataFrame) -> pd.DataFrame:
    """Free extents grouped in power-of-two size classes, over all samples.

    Columns: ``size_tokens`` (class label, e.g. ``"16-31"``), ``min_tokens``, ``extents``
    (count), ``free_tokens`` (their total slots) and ``free_share`` (of all sampled free slots).
    """
    sizes = free_extents["extent_tokens"].to_numpy(dtype=np.int64)
    sizes = sizes[sizes > 0]
    if len(sizes) == 0:
        return pd.DataFrame(columns=["size_tokens", "min_tokens", "extents", "free_tokens", "free_share"])
    klass = np.floor(np.log2(sizes)).astype(np.int64)
    df = pd.DataFrame({"klass": klass, "tokens": sizes})
    g = df.groupby("klass")["tokens"].agg(extents="size", free_tokens="sum").reset_index()
    lo, hi = 2 ** g["klass"], 2 ** (g["klass"] + 1) - 1
    g.insert(0, "size_tokens", [f"{a}" if a == b else f"{a}-{b}" for a, b in zip(lo, hi)])
    g.insert(1, "min_tokens", lo)
    g["free_share"] = g["free_tokens"] / g["free_tokens"].sum()
    return g.drop(columns="klass")


def _extent_stats(free_extents: pd.DataFrame) -> str:
    per = free_extents.groupby("step")["extent_tokens"].agg(["size", "max", "sum"])
    return (
        f"{len(per)} samples; per sample on average {per['size'].mean():.4g} free extents, "
        f"largest {per['max'].mean():.4g} token slots, {per['sum'].mean():.4g} free slots in all."
    )


def fragmentation_sections(run: Run, rep: FragmentationReport, window_s: float) -> list[Section]:
    """The fragmentation report's sections (also part of a single run's ``report.html``)."""
    allocator = run.config.get("allocator", run.policy)
    sections = [Section("fragmentation-breakdown", "Fragmentation: time-averaged breakdown", [
        (f"Capacity {run.capacity_tokens:,} token slots; policy {run.policy}. "
         "Means are weighted by step duration."),
        Table(rep.breakdown),
    ])]
    worst = float(rep.windows["wasted_frac"].max()) if len(rep.windows) else 0.0
    if worst < NEGLIGIBLE_WASTE_FRAC:
        items: list = [f"Wasted capacity (reservation + internal + external fragmentation) never exceeds "
                       f"{worst:.2%} of the KV cache in any {window_s:.4g} s window: no window stands out."]
    else:
        items = [
            (f"Top {len(rep.windows)} windows of {window_s:.4g} s by mean wasted slots "
             "(reservation + internal + external fragmentation)."),
            Table(rep.windows),
        ]
        if len(run.steps):
            ts = time_binned(run.steps, list(WASTE_COLUMNS))
            ts.columns = [c.removeprefix("mem_") for c in ts.columns]
            items.append(Image(figures.wasted_over_time(ts, run.capacity_tokens, rep.windows),
                               "wasted KV capacity over time with the worst windows shaded",
                               "Wasted capacity over time; shaded: the worst windows, by rank."))
        largest = rep.resident.groupby("window", sort=True).head(RESIDENTS_SHOWN)
        counts = rep.resident["window"].value_counts()
        spans = "; ".join(f"#{w.rank} {w.start_s:.4g}-{w.end_s:.4g} s: {counts.get(w.rank, 0)}"
                          for w in rep.windows.itertuples())
        items.append(Table(largest, f"The {RESIDENTS_SHOWN} resident requests with the most tokens per window "
                                    f"(resident requests per window: {spans})."))
    sections.append(Section("worst-windows", "Fragmentation: worst windows", items))
    extent_items: list
    if rep.extents is None:
        extent_items = [f"Allocator {allocator} records no free extents (paged allocators have none)."]
    else:
        extent_items = [f"Allocator {allocator}: {_extent_stats(run.free_extents)}", Table(rep.extents)]
        if len(rep.extents):
            extent_items.append(Image(figures.extent_histogram(rep.extents),
                                      "distribution of free-extent sizes",
                                      "Free extents by power-of-two size class, over all samples."))
    sections.append(Section("free-extents", "Fragmentation: free-extent sizes", extent_items))
    return sections


def analyze_fragmentation(run: Run, top_k: int = 5, window_s: float | None = None) -> FragmentationReport:
    """The report's tables, without writing anything."""
    windows = worst_windows(run, top_k, window_s)
    extents = extent_distribution(run.free_extents) if run.free_extents is not None else None
    return FragmentationReport(breakdown_table(run), windows, resident_requests(run, windows), extents)


def fragmentation_report(
    run_dir: str | Path, top_k: int = 5, window_s: float | None = None
) -> FragmentationReport:
    """Write ``fragmentation.md`` / ``fragmentation.html`` into ``run_dir`` and return the tables."""
    run = load_run(run_dir)
    window_s = window_s or default_window_s(run)
    rep = analyze_fragmentation(run, top_k, window_s)
    html_path, md_path = write_document(
        run.path, "fragmentation", f"Fragmentation: {run.path.name}",
        fragmentation_sections(run, rep, window_s),
    )
    return FragmentationReport(rep.breakdown, rep.windows, rep.resident, rep.extents, md_path, html_path)

"""``report.html`` and ``report.md`` for a run directory or a ``compare`` directory.

Both kinds of report have the same sections (ids in ``SECTION_IDS``). A compare directory is
recognised by its ``summary.parquet``; its time-series sections show, per policy, the run at
the reference rate scale (the one closest to 1, i.e. the trace's own rate).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.document import Image, Section, Table, write_document
from analysis.fragmentation import (
    analyze_fragmentation,
    default_window_s,
    fragmentation_sections,
)
from analysis.metrics import memory_fractions, run_metrics, time_binned
from analysis.rundir import MEMORY_CATEGORIES, Run, RunDirError, load_run
from analysis.slo import format_slo

COMPARE_SUMMARY = "summary.parquet"
COMPARE_SETUP = "compare.json"
SECTION_IDS = (
    "configuration", "summary", "memory-over-time", "memory-breakdown", "latency-vs-rate",
    "latency-cdf", "queues-over-time", "preemptions-over-time",
)
FRAC_COLUMNS = [f"{c}_frac" for c in MEMORY_CATEGORIES]
_QUEUE_COLUMNS = ["running", "waiting", "swapped", "num_prefill_seqs", "num_decode_seqs"]
_EVENT_COLUMNS = ["preempted", "blocks_swapped_in", "blocks_swapped_out"]
_EVENT_BINS = 120  # coarser than states: per-bin counts of rare events are noisy
_COMPARE_TABLE_COLUMNS = [
    "policy", "rate_scale", "status", "offered_rate_req_s", "requests_per_s", "output_tokens_per_s",
    "goodput_requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s", "e2e_p50_s",
    "norm_latency_mean_s", "preemptions", "swap_outs", "recomputed_tokens", "prefix_hit_rate",
    *FRAC_COLUMNS, "error",
]


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dicts to dotted keys: ``{"a": {"b": 1}} -> {"a.b": 1}``."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return out


def _kv_table(d: dict) -> Table:
    return Table(pd.DataFrame({"key": list(d), "value": [str(v) if isinstance(v, bool) else v for v in d.values()]}))


def _time_sections(runs: dict[str, Run], note: str) -> list[Section]:
    """Sections drawn from per-step and per-request records, one panel/line per run."""
    memory = {label: time_binned(r.steps, [f"mem_{c}" for c in MEMORY_CATEGORIES]).rename(
        columns=lambda c: c.removeprefix("mem_")) for label, r in runs.items()}
    capacity = {label: r.capacity_tokens for label, r in runs.items()}
    queues = {}
    for label, r in runs.items():
        q = time_binned(r.steps, _QUEUE_COLUMNS)
        queues[label] = q.assign(batch_seqs=q["num_prefill_seqs"] + q["num_decode_seqs"])
    events = {label: time_binned(r.steps, _EVENT_COLUMNS, bins=_EVENT_BINS, how="rate")
              for label, r in runs.items()}
    return [
        Section("memory-over-time", "Memory breakdown over time", [
            note, Image(figures.memory_area(memory, capacity), "stacked memory breakdown over time",
                        "Share of GPU KV capacity per category (duration-weighted means per time bin)."),
        ]),
        Section("latency-cdf", "Latency CDFs", [
            note, Image(figures.latency_cdfs({label: r.requests for label, r in runs.items()}),
                        "latency CDFs", "Finished requests only."),
        ]),
        Section("queues-over-time", "Running, waiting, swapped and batch size over time", [
            note, Image(figures.queues_over_time(queues), "queue lengths and batch size over time",
                        "Duration-weighted means per time bin."),
        ]),
        Section("preemptions-over-time", "Preemptions and swaps over time", [
            note, Image(figures.events_over_time(events), "preemptions and swaps over time",
                        "Events per second of simulated time, per time bin."),
        ]),
    ]


def _ordered(sections: list[Section]) -> list[Section]:
    by_id = {s.id: s for s in sections}
    return [by_id[i] for i in SECTION_IDS if i in by_id] + [s for s in sections if s.id not in SECTION_IDS]


def run_sections(run: Run, slo: dict[str, float] | None = None) -> list[Section]:
    """All sections of a single run's report, fragmentation sections included."""
    label = run.policy
    metrics = run_metrics(run, slo)
    if "wall_s" in run.summary:
        metrics["wall_s"] = run.summary["wall_s"]
    facts = {k: run.summary[k] for k in ("version", "num_gpu_blocks", "num_cpu_blocks", "block_size",
                                         "capacity_tokens") if k in run.summary}
    row = pd.DataFrame([{"policy": label, **memory_fractions(run)}])
    rate = pd.DataFrame([{"policy": label, "offered_rate_req_s": metrics["offered_rate_req_s"],
                          "norm_latency_mean_s": metrics["norm_latency_mean_s"]}])
    slo_note = f" Goodput under SLO {format_slo(slo)}." if slo else ""
    sections = [
        Section("configuration", "Configuration", [f"Run directory: {run.path}", _kv_table(facts),
                                                   _kv_table(flatten(run.config))]),
        Section("summary", "Summary", [
            ("Computed from requests.parquet and steps.parquet (as summary.json is); throughput per "
             "second from the first arrival to the end of the last step, latency percentiles over "
             f"finished requests.{slo_note}"),
            Table(pd.DataFrame({"metric": list(metrics), "value": list(metrics.values())})),
        ]),
        Section("memory-breakdown", "Time-averaged memory breakdown", [
            Image(figures.memory_bars(row, "policy"), "time-averaged memory breakdown",
                  "Share of GPU KV capacity, weighted by step duration."),
            Table(row),
        ]),
        Section("latency-vs-rate", "Normalized latency vs request rate", [
            "A single run gives one point; `blocksim compare` sweeps the rate.",
            Image(figures.latency_vs_rate(rate, "offered_rate_req_s", "norm_latency_mean_s",
                                          "request rate (req/s)", "normalized latency (s/token)"),
                  "normalized latency vs request rate"),
        ]),
        *_time_sections({label: run}, f"Run: {label}."),
    ]
    if len(run.steps):
        window_s = default_window_s(run)
        sections += fragmentation_sections(run, analyze_fragmentation(run, window_s=window_s), window_s)
    return _ordered(sections)


def _reference_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """Per policy, its ok run whose rate scale is closest to 1 (lower wins a tie)."""
    ok = summary[summary["status"] == "ok"].copy()
    ok["_dist"] = (ok["rate_scale"] - 1.0).abs()
    ok = ok.sort_values(["_dist", "rate_scale"], kind="stable")
    return ok.drop_duplicates("policy").sort_index().drop(columns="_dist")


def compare_sections(compare_dir: Path) -> list[Section]:
    """All sections of a ``compare`` directory's report."""
    summary = pd.read_parquet(compare_dir / COMPARE_SUMMARY)
    setup_path = compare_dir / COMPARE_SETUP
    setup = json.loads(setup_path.read_text()) if setup_path.is_file() else {}
    ok = summary[summary["status"] == "ok"]
    failed = summary[summary["status"] != "ok"]
    ref = _reference_runs(summary)
    runs = {f"{r.policy} x{r.rate_scale:g}": load_run(compare_dir / r.run_dir) for r in ref.itertuples()}
    config_items: list = [_kv_table(flatten(setup))] if setup else []
    configs = pd.DataFrame([{"run": label, **flatten(r.config)} for label, r in runs.items()])
    if len(configs):
        varying = [c for c in configs.columns if c != "run" and configs[c].astype(str).nunique() > 1]
        common = {c: configs[c].iloc[0] for c in configs.columns if c != "run" and c not in varying}
        config_items += ["Configuration shared by the reference runs:", _kv_table(common)]
        if varying:
            config_items += ["Settings that differ between policies:", Table(configs[["run", *varying]])]
    cols = [c for c in _COMPARE_TABLE_COLUMNS if c in summary.columns]
    summary_items: list = [f"{len(ok)} of {len(summary)} runs ok.", Table(summary[cols])]
    if len(failed):
        summary_items.append(f"Failed runs: {', '.join(f'{p} x{r:g}' for p, r in zip(failed['policy'], failed['rate_scale']))}.")
    note = ("Per policy, the run at the rate scale closest to 1: "
            f"{', '.join(runs) or 'none (no run succeeded)'}.")
    sections = [
        Section("configuration", "Configuration", config_items),
        Section("summary", "Summary", summary_items),
    ]
    if len(ok):
        multi_rate = ok["rate_scale"].nunique() > 1
        bars = ok.assign(rate_scale=ok["rate_scale"].map(lambda r: f"x{r:g}"))
        sections.append(Section("memory-breakdown", "Time-averaged memory breakdown per policy", [
            Image(figures.memory_bars(bars, "policy", "rate_scale" if multi_rate else None),
                  "time-averaged memory breakdown per policy",
                  "Share of GPU KV capacity, weighted by step duration (the PagedAttention paper's Fig. 2 form)."),
        ]))
        x = "offered_rate_req_s" if ok["offered_rate_req_s"].notna().all() else "rate_scale"
        xlabel = "request rate (req/s)" if x == "offered_rate_req_s" else "rate scale (x trace rate)"
        sections.append(Section("latency-vs-rate", "Normalized latency vs request rate", [
            Image(figures.latency_vs_rate(ok, x, "norm_latency_mean_s", xlabel, "normalized latency (s/token)"),
                  "normalized latency vs request rate per policy",
                  "Mean over finished requests of end-to-end latency / output tokens."),
        ]))
        sections += _time_sections(runs, note)
    else:
        for sid, title in (("memory-breakdown", "Time-averaged memory breakdown per policy"),
                           ("latency-vs-rate", "Normalized latency vs request rate"),
                           ("memory-over-time", "Memory breakdown over time"), ("latency-cdf", "Latency CDFs"),
                           ("queues-over-time", "Running, waiting, swapped and batch size over time"),
                           ("preemptions-over-time", "Preemptions and swaps over time")):
            sections.append(Section(sid, title, ["No run succeeded; nothing to plot."]))
    return _ordered(sections)


def write_report(path: str | Path, slo: dict[str, float] | None = None) -> tuple[Path, Path]:
    """Write ``report.html`` (self-contained) and ``report.md`` (+ PNGs) into ``path``.

    ``path`` is a run directory or a ``compare`` output directory. ``slo`` (see
    ``slo.parse_slo``) adds goodput to a single run's summary. Returns (html, md) paths.
    """
    path = Path(path)
    if (path / COMPARE_SUMMARY).is_file():
        sections, title = compare_sections(path), f"blocksim comparison: {path.name}"
    elif path.is_dir():
        run = load_run(path)
        sections, title = run_sections(run, slo), f"blocksim run: {path.name} ({run.policy})"
    else:
        raise RunDirError(f"{path}: not a directory")
    return write_document(path, "report", title, sections)

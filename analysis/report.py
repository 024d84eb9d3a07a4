"""``report.html`` and ``report.md`` for a run directory or a ``compare`` directory.

Both kinds of report have the same sections (ids in ``SECTION_IDS``, in reading order): the
findings and their headline table first, then the memory breakdown and the other figures, and
the full metrics and the configuration last, as an appendix. A figure with nothing to show
(no preemptions, a single rate) is replaced by a sentence saying so. A compare directory is
recognised by its ``summary.parquet``; its time-series sections show, per policy, the run at
the reference rate scale (``compare.json``'s ``reference_rate_scale``, else the one closest to 1,
i.e. the trace's own rate).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.document import Image, Section, Table, write_document
from analysis.fragmentation import (
    analyze_fragmentation,
    default_window_s,
    fragmentation_sections,
)
from analysis.headline import RUN_KEYS, comparison_findings, headline_frame
from analysis.metrics import memory_fractions, run_metrics, time_binned
from analysis.rundir import MEMORY_CATEGORIES, Run, RunDirError, load_run
from analysis.slo import format_slo

COMPARE_SUMMARY = "summary.parquet"
COMPARE_SETUP = "compare.json"
#: The appendix: the full metrics and the configuration, after every other section.
APPENDIX_IDS = ("summary", "configuration")
SECTION_IDS = (
    "headline", "memory-breakdown", "latency-vs-rate", "memory-over-time", "latency-cdf",
    "queues-over-time", "preemptions-over-time", *APPENDIX_IDS,
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
    moved = {label: int(r.steps[_EVENT_COLUMNS].to_numpy().sum()) for label, r in runs.items()}
    if any(moved.values()):
        active = [label for label, n in moved.items() if n]
        swapped = any(int(runs[label].steps[_EVENT_COLUMNS[1:]].to_numpy().sum()) for label in active)
        events = {label: time_binned(runs[label].steps, _EVENT_COLUMNS, bins=_EVENT_BINS, how="rate")
                  for label in active}
        event_items: list = [note]
        quiet = [label for label in runs if label not in active]
        if quiet:
            event_items.append(f"No preemptions or swaps in: {', '.join(quiet)}.")
        if not swapped:
            event_items.append("No block was swapped: every preemption recomputed its sequences.")
        event_items.append(Image(figures.events_over_time(events, swaps=swapped), "preemptions and swaps over time",
                                 "Events per second of simulated time, per time bin."))
    else:
        event_items = [f"{note} No request was preempted and no block swapped"
                       + (" in any run." if len(runs) > 1 else ".")]
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
        Section("preemptions-over-time", "Preemptions and swaps over time", event_items),
    ]


def _ordered(sections: list[Section]) -> list[Section]:
    """Main sections in ``SECTION_IDS`` order, then any others (fragmentation), then the appendix."""
    by_id = {s.id: s for s in sections}
    main = [by_id[i] for i in SECTION_IDS if i in by_id and i not in APPENDIX_IDS]
    rest = [s for s in sections if s.id not in SECTION_IDS]
    return main + rest + [by_id[i] for i in APPENDIX_IDS if i in by_id]


def _percent_row(fracs: dict, label: str) -> pd.DataFrame:
    return pd.DataFrame([{"run": label, **{figures.CATEGORY_STYLE[c][2] + " (%)": round(fracs[f"{c}_frac"] * 100, 1)
                                          for c in MEMORY_CATEGORIES}}])


def run_findings(metrics: dict, requests: pd.DataFrame) -> list[str]:
    """What one run shows, in sentences read off its metrics (and its rejected requests' reasons)."""
    out = [f"{metrics['requests']:,} requests: {metrics['finished']:,} finished, {metrics['rejected']:,} rejected."]
    if metrics["rejected"]:
        reasons = requests.loc[requests["status"].eq("rejected"), "reject_reason"].value_counts()
        out[0] += "".join(f" {n:,} rejected: {r}." for r, n in reasons.head(2).items())
    free, used_share = metrics["free_frac"], metrics.get("token_states_of_used_frac", math.nan)
    if not math.isnan(used_share):
        out.append(f"Of the KV memory in use, {used_share:.0%} held token states (time-averaged); the rest was "
                   "reserved for tokens not generated yet or lost to fragmentation.")
    if free > 0.5 and metrics["preemptions"] == 0:
        out.append(f"Memory was not the bottleneck: on average {free:.0%} of the KV cache stayed free and no "
                   "request was preempted. A higher rate (--rate-scale), a smaller GPU or a larger model puts "
                   "it under pressure (`blocksim demo` shows such a case).")
    elif metrics["preemptions"]:
        out.append(f"{metrics['preemptions']:,} preemptions ({metrics.get('swap_outs', 0):,} by swapping); on "
                   f"average {free:.0%} of the KV cache was free.")
    return out


def run_sections(run: Run, slo: dict[str, float] | None = None) -> list[Section]:
    """All sections of a single run's report, fragmentation sections included."""
    label = run.policy
    metrics = run_metrics(run, slo)
    if "wall_s" in run.summary:
        metrics["wall_s"] = run.summary["wall_s"]
    facts = {k: run.summary[k] for k in ("version", "num_gpu_blocks", "num_cpu_blocks", "block_size",
                                         "capacity_tokens") if k in run.summary}
    fracs = memory_fractions(run)
    slo_note = f" Goodput under SLO {format_slo(slo)}." if slo else ""
    sections = [
        Section("headline", "Findings", [
            *run_findings(metrics, run.requests),
            Table(headline_frame([{"policy": label, **metrics}], RUN_KEYS[:1])),
        ]),
        Section("memory-breakdown", "Time-averaged memory breakdown", [
            Image(figures.memory_bars(pd.DataFrame([{"policy": label, **fracs}]), "policy"),
                  "time-averaged memory breakdown", "Share of GPU KV capacity, weighted by step duration."),
            Table(_percent_row(fracs, label)),
        ]),
        Section("latency-vs-rate", "Normalized latency vs request rate", [
            f"One run is one point: normalized latency {metrics['norm_latency_mean_s']:.4g} s/token at "
            f"{metrics['offered_rate_req_s']:.3g} req/s offered. `blocksim compare --rate-scale 0.5,1,2` "
            "draws the curve.",
        ]),
        *_time_sections({label: run}, f"Run: {label}."),
        Section("summary", "Appendix: all metrics", [
            ("Computed from requests.parquet and steps.parquet (as summary.json is); throughput per "
             "second from the first arrival to the end of the last step, latency percentiles over "
             f"finished requests.{slo_note}"),
            Table(pd.DataFrame({"metric": list(metrics), "value": list(metrics.values())})),
        ]),
        Section("configuration", "Appendix: configuration", [f"Run directory: {run.path}", _kv_table(facts),
                                                             _kv_table(flatten(run.config))]),
    ]
    if "tier_query_tokens" in run.summary:
        sections.append(tier_section(run))
    if len(run.steps):
        window_s = default_window_s(run)
        sections += fragmentation_sections(run, analyze_fragmentation(run, window_s=window_s), window_s)
    return _ordered(sections)


def tier_section(run: Run) -> Section:
    """The KV tiers of a run: per tier, prompt tokens hit, chunks stored and evicted, bytes moved;
    the TTFT split from tier_requests.parquet."""
    s = run.summary
    rows = []
    for name in ("gpu", "host", "disk"):
        if name != "gpu" and f"tier_{name}_capacity_chunks" not in s:
            continue
        rows.append({"tier": name, "hit tokens": s[f"tier_{name}_hit_tokens"],
                     "hit rate": f"{s[f'tier_{name}_hit_rate']:.1%}",
                     "capacity (chunks)": s.get(f"tier_{name}_capacity_chunks", ""),
                     "stored (chunks)": s.get(f"tier_{name}_stored_chunks", ""),
                     "evicted (chunks)": s.get(f"tier_{name}_evictions", ""),
                     "bytes in": sum(v for k, v in s.items() if k.startswith("tier_bytes_") and k.endswith(f"_to_{name}")),
                     "bytes out": sum(v for k, v in s.items() if k.startswith(f"tier_bytes_{name}_to_"))})
    items: list = [f"Prompt tokens looked up: {s['tier_query_tokens']:,}; chunks of {s['tier_chunk_tokens']} tokens; "
                   f"tokens found in a tier but recomputed by the onload mode: {s['tier_onload_skipped_tokens']:,}.",
                   Table(pd.DataFrame(rows))]
    path = Path(run.path) / "tier_requests.parquet"
    if path.is_file():
        t = pd.read_parquet(path)
        split = t[["ttft_queue_s", "ttft_onload_s", "ttft_prefill_s"]].mean()
        items += ["Mean TTFT of finished requests, split (seconds):",
                  Table(pd.DataFrame([{"queueing": split.ttft_queue_s, "onload wait": split.ttft_onload_s,
                                       "prefill": split.ttft_prefill_s}]))]
    return Section("tiers", "KV tiers", items)


def _reference_runs(summary: pd.DataFrame, reference: float | None = None) -> pd.DataFrame:
    """Per policy, its ok run at the ``reference`` rate scale, else the one closest to 1 (lower wins a tie)."""
    ok = summary[summary["status"] == "ok"].copy()
    ok["_dist"] = (ok["rate_scale"] - (1.0 if reference is None else reference)).abs()
    ok = ok.sort_values(["_dist", "rate_scale"], kind="stable")
    return ok.drop_duplicates("policy").sort_index().drop(columns="_dist")


def compare_sections(compare_dir: Path) -> list[Section]:
    """All sections of a ``compare`` directory's report."""
    summary = pd.read_parquet(compare_dir / COMPARE_SUMMARY)
    setup_path = compare_dir / COMPARE_SETUP
    setup = json.loads(setup_path.read_text()) if setup_path.is_file() else {}
    ok = summary[summary["status"] == "ok"]
    failed = summary[summary["status"] != "ok"]
    ref = _reference_runs(summary, setup.get("reference_rate_scale"))
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
    headline: list = [f"{len(ok)} of {len(summary)} runs ok."]
    if len(ref) > 1:
        rate = ref["rate_scale"].iloc[0]
        same_rate = ref[ref["rate_scale"] == rate]
        findings = comparison_findings(same_rate)
        if findings:
            headline.append(f"At x{rate:g} the trace's rate: {findings}")
    if "rejected" in summary and summary["rejected"].fillna(0).gt(0).any():
        worst = summary.loc[summary["rejected"].fillna(0).idxmax()]
        headline.append(f"Runs rejected requests too long for the model, up to {int(worst['rejected']):,} of "
                        f"{int(worst['requests']):,} ({worst['policy']} x{worst['rate_scale']:g}); "
                        "--set clip_to_model=true clips them instead.")
    headline.append(Table(headline_frame(summary, RUN_KEYS)))
    if len(failed):
        names = ", ".join(f"{p} x{r:g}" for p, r in zip(failed["policy"], failed["rate_scale"]))
        headline.append(f"Failed runs: {names} (the appendix's error column and each run's error.txt say why).")
    note = ("Per policy, the run at the reference rate scale: "
            f"{', '.join(runs) or 'none (no run succeeded)'}.")
    sections = [
        Section("headline", "Findings", headline),
        Section("summary", "Appendix: all metrics", [Table(summary[cols])]),
        Section("configuration", "Appendix: configuration", config_items),
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
        if multi_rate:
            rate_items: list = [Image(
                figures.latency_vs_rate(ok, x, "norm_latency_mean_s", xlabel, "normalized latency (s/token)"),
                "normalized latency vs request rate per policy",
                "Mean over finished requests of end-to-end latency / output tokens.")]
        else:
            rate_items = [f"One rate scale (x{ok['rate_scale'].iloc[0]:g}): one point per policy, in the table "
                          "above. --rate-scale 0.5,1,2 draws the curves."]
        sections.append(Section("latency-vs-rate", "Normalized latency vs request rate", rate_items))
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

"""``blocksim demo``: where the KV cache goes, on the bundled Azure conversation slice.

The demo is a comparison (`blocksim.experiments.compare`) chosen so that memory is the
bottleneck: llama-2-7b on one A100-40GB (2,957 KV blocks of 16 tokens) serving the slice at a
quarter, a half and three quarters of its own rate, under paged blocks (``vllm``) and two sizes
of contiguous per-request reservation (``orca-oracle``: exact, ``orca-max``: the model's
maximum). The console shows the headline numbers at half the rate, what they mean, and how the
99th-percentile TTFT grows with the rate; ``OUT/report.html`` holds the figures.

Prefix caching is not part of it: on the bundled Mooncake sample the prefix cache hits 1-2% of
its block lookups at a long-context model's memory, so it would show no difference, at three times
the simulation cost of a plain run.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

import traces
from analysis.headline import RUN_KEYS, comparison_findings, headline_frame, text_table

TRACE = "azure-conv"
MODEL = "llama-2-7b"
GPU = "a100-40gb"
POLICIES = ("vllm", "orca-oracle", "orca-max")
RATE_SCALES = (0.25, 0.5, 0.75)
HEADLINE_RATE = 0.5
POLICY_NOTES = {
    "vllm": "paged KV blocks, allocated as tokens arrive",
    "orca-oracle": "one contiguous reservation per request, of its exact final length",
    "orca-max": "one contiguous reservation per request, of the model's maximum length",
}

DESCRIPTION = (f"Replays the bundled Azure LLM 2023 conversation slice on {MODEL} on one {GPU} under "
               f"{', '.join(POLICIES)} at {', '.join(f'{r:g}x' for r in RATE_SCALES)} the trace's rate, where the "
               f"KV cache is the bottleneck; prints the comparison at {HEADLINE_RATE:g}x and writes OUT/report.html. "
               "Rerunning into the same OUT reuses its runs. `blocksim compare` runs such a comparison on any trace.")


def demo_trace() -> tuple[traces.Trace, int, int]:
    """The bundled slice clipped to the model's context: (trace, requests clipped, max length)."""
    from blocksim.experiments.runner import build_config  # the simulator: loaded when the demo runs

    max_len = build_config(model=MODEL, gpu=GPU).model.max_model_len
    trace, clipped = traces.clip_to_max_len(traces.read_trace(traces.bundled(TRACE)), max_len)
    return trace, clipped, max_len


def _setup_lines(trace: traces.Trace, clipped: int, max_len: int) -> list[str]:
    from blocksim.experiments.runner import build_config

    cfg = build_config(model=MODEL, gpu=GPU)
    rate = (len(trace) - 1) / float(trace.df["arrival_s"].max() - trace.df["arrival_s"].min())
    rates = ", ".join(f"{r:g}x ({r * rate:.1f} req/s)" for r in RATE_SCALES)
    lines = [
        "blocksim demo: where does the KV cache go?",
        f"  trace     {len(trace):,} requests of the Azure LLM 2023 conversation trace (bundled "
        "slice, CC BY 4.0);",
        f"            {clipped} longer than the model's {max_len:,} tokens are clipped to fit",
        f"  serving   {MODEL} on one {GPU}: {cfg.num_gpu_blocks:,} KV blocks of {cfg.cache.block_size} tokens "
        f"({cfg.num_gpu_blocks * cfg.cache.block_size:,} token slots)",
        f"  rates     {rates} of the trace's own {rate:.1f} req/s",
        "  policies",
    ]
    lines += [f"    {p:<12} {POLICY_NOTES[p]}" for p in POLICIES]
    return lines


def ttft_by_rate(summary: pd.DataFrame) -> pd.DataFrame:
    """TTFT p99 (s, formatted) per policy (rows) and rate scale (columns)."""
    ok = summary[summary["status"] == "ok"]
    table = ok.pivot_table(index="policy", columns="rate_scale", values="ttft_p99_s", sort=False)
    table = table.reindex(index=[p for p in POLICIES if p in table.index])
    out = pd.DataFrame({"policy": table.index})
    for r in table.columns:
        out[f"x{r:g} (s)"] = [f"{v:.2f}" for v in table[r]]
    return out


def run_demo(out_dir: str | Path = "blocksim-demo", *, workers: int | None = None, progress: bool = True,
             report: bool = True) -> pd.DataFrame:
    """Run the demo into ``out_dir``, print its story, and return the comparison's summary table."""
    from blocksim.experiments.compare import compare

    trace, clipped, max_len = demo_trace()
    print("\n".join(_setup_lines(trace, clipped, max_len)), flush=True)
    summary = compare(trace, list(POLICIES), list(RATE_SCALES), out_dir, workers, overrides={"model": MODEL,
                      "gpu": GPU}, progress=progress, report=report, reference_rate_scale=HEADLINE_RATE)
    print(f"\nat {HEADLINE_RATE:g}x the trace's rate:")
    print(text_table(headline_frame(summary[summary["rate_scale"] == HEADLINE_RATE], RUN_KEYS[:1])))
    at = summary[(summary["rate_scale"] == HEADLINE_RATE) & (summary["status"] == "ok")]
    print("\n" + textwrap.fill(comparison_findings(at), width=100))
    print("\nTTFT p99 as the rate grows:")
    print(text_table(ttft_by_rate(summary)))
    failed = summary[summary["status"] != "ok"]
    for row in failed.itertuples():
        print(f"  {row.policy} x{row.rate_scale:g} failed: {row.error}")
    out = Path(out_dir)
    reused = int((summary["attempts"] == 0).sum()) if "attempts" in summary else 0
    if reused:
        print(f"\n{reused} of {len(summary)} runs reused from an earlier demo in {out} (delete it to run them again)")
    if report:
        print(f"\nreport:  {out / 'report.html'} (figures: memory breakdown, latency vs rate, queues, CDFs)")
    print(f"runs:    {out}/<policy>_x<rate>/   table: {out / 'summary.parquet'}")
    print(f"your trace: blocksim compare TRACE --policy vllm --policy orca-max --rate-scale 0.5,1 \\\n"
          f"              --model {MODEL} --gpu {GPU} --out DIR")
    return summary

"""Replay speed: the full Azure LLM 2023 conversation trace (19,366 requests) on llama-2-7b / h100-80gb.

    python benchmarks/replay.py [TRACE] [--model M --gpu G --block-size B --repeat N --no-spans]
                                [--cost-model auto|roofline|profiled --cost-profile FILE]

Steps are priced by the roofline with its built-in constants unless ``--cost-profile`` says otherwise.
Prints wall seconds and the process's CPU seconds (medians of the repeats; on a shared machine CPU
seconds vary less) and simulated tokens (prompt + output) per wall second.
The trace defaults to ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv beside the
repository, falling back to the bundled 2,000-request slice.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import traces
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.policies import make_cost_model

ROOFLINE_DEFAULTS = Path(__file__).resolve().parent / "roofline_defaults.json"
FULL = Path(__file__).resolve().parents[2] / "shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", default=str(FULL) if FULL.exists() else str(traces.bundled("azure-conv")))
    p.add_argument("--model", default="llama-2-7b")
    p.add_argument("--gpu", default="h100-80gb")
    p.add_argument("--block-size", type=int, default=None, help="default 16 (the sglang preset: its page size, 1)")
    p.add_argument("--policy", default="vllm")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-spans", action="store_true", help="step one by one (the exact reference)")
    p.add_argument("--cost-model", default=None, help="auto (default), roofline or profiled")
    p.add_argument("--cost-profile", default=str(ROOFLINE_DEFAULTS), metavar="FILE",
                   help="a profile or roofline parameters (default: the roofline's built-in constants, "
                        "benchmarks/roofline_defaults.json, so the measured work does not change when a "
                        "profile ships; 'shipped' for the run's default cost model)")
    a = p.parse_args()
    t0 = time.perf_counter()
    tr = traces.read_trace(a.trace)
    read_s = time.perf_counter() - t0
    cfg = build_config(a.policy, model=a.model, gpu=a.gpu, block_size=a.block_size, cost_model=a.cost_model)
    walls, cpus, res = [], [], None
    for _ in range(a.repeat):
        t, c = time.perf_counter(), time.process_time()
        profile = None if a.cost_profile == "shipped" else a.cost_profile
        res = Engine(cfg, tr, make_cost_model(cfg, profile), spans=not a.no_spans).run()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    s = res.summary
    fin = res.requests[res.requests.status == "finished"]
    tokens = int((fin.prompt_tokens + fin.output_tokens * fin.n).sum())
    wall = statistics.median(walls)
    print(f"trace {Path(a.trace).name}: {len(tr)} requests, read in {read_s:.2f} s")
    print(f"{a.model} / {a.gpu} / block {cfg.cache.block_size} / policy {a.policy}: {s['steps']} steps, "
          f"{s['finished']} finished, {s['rejected']} rejected, {s['simulated_s']:.0f} simulated s, "
          f"cost model {s['cost_model']['name']} ({s['cost_model'].get('profile') or 'default constants'})")
    print(f"wall {wall:.2f} s (median of {a.repeat}: {', '.join(f'{w:.2f}' for w in walls)}), "
          f"CPU {statistics.median(cpus):.2f} s, "
          f"{tokens / wall:,.0f} simulated tokens per wall-second, {s['steps'] / wall:,.0f} steps/s")


if __name__ == "__main__":
    main()

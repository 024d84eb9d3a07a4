"""Prefix caching compared across engines on one trace and equal KV memory: vLLM v0's automatic
prefix caching (vllm-prefix), vLLM V1 (vllm-v1) and SGLang's radix cache (sglang).

    python benchmarks/compare_prefix.py [TRACE] [--model M] [--gpu G] [--blocks N] [--clip T] [--rate-scale X]
        [--engine PRESET[:OPTION=VALUE,...]]... [--json FILE]

Every engine gets the same KV memory: `--blocks` blocks of 16 tokens for vLLM (default: what
vllm-prefix derives for the model and GPU), the same tokens as pages of 1 token for SGLang; each
keeps its own batch defaults. The trace is clipped to `--clip` tokens (default the model's length).
Prints one Markdown row per engine: prompt tokens served from the cache (saved: not prefilled; hit
rate: saved / prompt tokens admitted, re-admissions after preemption included), TTFT, TPOT,
throughput (prompt and output tokens per simulated second), cached tokens evicted (vLLM: blocks x
16), preemptions (SGLang: retractions). `--engine` replaces the three engines (repeatable; options
are `build_config`'s, e.g. `vllm-0.6:prefix_caching=true` or `sglang:schedule_policy=lpm`); `--json`
adds one object per run to a JSON list in FILE (replacing the runs of the same settings), with the
cost model that priced them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import traces
from analysis.fidelity import append_rows
from analysis.rundir import RunDirError
from blocksim.config import ConfigError
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config

MOONCAKE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/synthetic_trace.jsonl"
ENGINES = ("vllm-prefix", "vllm-v1", "sglang")
#: the settings that name a run in the `--json` list: a new run replaces the one of the same settings
SETTINGS = ("trace", "model", "gpu", "kv_tokens", "rate_scale", "clip", "preset", "options")


def engine_spec(text: str) -> tuple[str, dict]:
    """`PRESET[:OPTION=VALUE,...]` as the preset and its options (values read as JSON where they
    parse: true, 8192; else as strings)."""
    preset, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--engine {text}: {item!r} is not OPTION=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return preset, options


def page(preset: str) -> int:
    """Tokens of a GPU block: SGLang's pages of one token get the same KV memory as 16-token blocks."""
    return 1 if preset == "sglang" else 16


def label(preset: str, options: dict) -> str:
    return " ".join([f"`{preset}`", *(f"{k}={v}" for k, v in options.items())])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", default=str(MOONCAKE))
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--gpu", default="h100-80gb")
    p.add_argument("--blocks", type=int, default=None, help="GPU blocks of 16 tokens (SGLang: x16 one-token pages)")
    p.add_argument("--clip", type=int, default=None)
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--engine", type=engine_spec, action="append", dest="engines", metavar="PRESET[:OPTION=VALUE,...]")
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args()
    engines = a.engines or [(e, {}) for e in ENGINES]
    try:  # every configuration and the trace checked before the first run
        base = build_config("vllm-prefix", model=a.model, gpu=a.gpu)
        blocks = a.blocks or base.num_gpu_blocks
        configs = [build_config(policy, model=a.model, gpu=a.gpu, num_gpu_blocks=blocks * 16 // page(policy), **options)
                   for policy, options in engines]
        tr = traces.read_trace(a.trace)
    except (ConfigError, traces.TraceError) as e:
        p.exit(2, f"compare_prefix.py: {e}\n")
    tr, clipped = traces.clip_to_max_len(tr, a.clip or base.model.max_model_len)
    if a.rate_scale != 1.0:
        tr = traces.scale_rate(tr, a.rate_scale)
    print(f"{Path(a.trace).name}: {len(tr)} requests ({clipped} clipped), {a.model} / {a.gpu}, {blocks} blocks "
          f"of 16 tokens ({blocks * 16} tokens), rate x{a.rate_scale:g}\n")
    print("| engine | hit rate | prompt tokens saved | TTFT p50 / p99 (s) | TPOT p50 (ms) | throughput (tok/s) "
          "| cached tokens evicted | preemptions |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for (policy, options), cfg in zip(engines, configs):
        t = time.perf_counter()
        eng = Engine(cfg, tr)
        res = eng.run()
        wall = time.perf_counter() - t
        s, r = res.summary, res.requests
        saved = sum(g.prefix_hit_tokens for g in eng.groups)
        admitted = sum(g.prompt_tokens * (1 + g.preemptions) for g in eng.groups if g.status != "rejected")
        evicted = s["radix_evicted_tokens"] if "radix_evicted_tokens" in s else s.get("prefix_cache_evictions", 0) * 16
        fin = r[r.status == "finished"]
        row = {"trace": Path(a.trace).name, "model": a.model, "gpu": a.gpu, "kv_tokens": blocks * 16,
               "rate_scale": a.rate_scale, "clip": a.clip, "preset": policy, "options": options,
               "cost_model": s.get("cost_model"), "hit_rate": saved / max(admitted, 1), "prompt_tokens_saved": saved,
               "ttft_p50_s": fin.ttft_s.quantile(0.5), "ttft_p99_s": fin.ttft_s.quantile(0.99),
               "tpot_p50_s": fin.tpot_s.quantile(0.5), "throughput_tok_s": s["total_tokens_per_s"],
               "cached_tokens_evicted": int(evicted), "preemptions": int(s["preemptions"])}
        rows.append(row)
        print(f"| {label(policy, options)} | {row['hit_rate']:.2%} | {saved:,} | {row['ttft_p50_s']:.3f} / "
              f"{row['ttft_p99_s']:.3f} | {row['tpot_p50_s'] * 1e3:.2f} | {row['throughput_tok_s']:,.0f} | "
              f"{evicted:,} | {s['preemptions']} | <!-- wall {wall:.1f} s -->", flush=True)
    if a.json:
        try:
            append_rows(Path(a.json), rows, identity=SETTINGS)
        except RunDirError as e:
            p.exit(2, f"compare_prefix.py: {e}\n")


if __name__ == "__main__":
    main()

"""The `blocksim` command line. Every command that writes does so under `--out DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blocksim.config import PREEMPTION_MODES, ConfigError
from blocksim.experiments.runner import DEFAULT_GPU, DEFAULT_MODEL, build_config, replay

SUMMARY_ROWS = [
    ("requests", "requests", "{:.0f}"), ("finished", "finished", "{:.0f}"), ("rejected", "rejected", "{:.0f}"),
    ("throughput", "requests_per_s", "{:.2f} req/s"), ("output tokens", "output_tokens_per_s", "{:.0f} tok/s"),
    ("TTFT p50 / p99", ("ttft_p50_s", "ttft_p99_s"), "{:.3f} / {:.3f} s"),
    ("TPOT p50 / p99", ("tpot_p50_s", "tpot_p99_s"), "{:.1f} / {:.1f} ms"),
    ("end-to-end p50 / p99", ("e2e_p50_s", "e2e_p99_s"), "{:.2f} / {:.2f} s"),
    ("normalized latency", "norm_latency_mean_s", "{:.4f} s/token"),
    ("preemptions", "preemptions", "{:.0f}"), ("blocks swapped out", "blocks_swapped_out", "{:.0f}"),
    ("prefix cache hits", ("prefix_cache_hits", "prefix_cache_queries"), "{:.0f} of {:.0f} blocks"),
    ("GPU blocks", "num_gpu_blocks", "{:.0f}"), ("engine steps", "steps", "{:.0f}"),
    ("simulated", "simulated_s", "{:.1f} s"), ("wall", "wall_s", "{:.2f} s"),
]


def format_summary(s: dict) -> str:
    lines = []
    for label, key, fmt in SUMMARY_ROWS:
        keys = key if isinstance(key, tuple) else (key,)
        if any(k not in s for k in keys) and label.startswith("prefix"):
            continue
        vals = [s.get(k, float("nan")) for k in keys]
        if "ms" in fmt:
            vals = [v * 1e3 for v in vals]
        lines.append(f"  {label:<22} {fmt.format(*vals)}")
    return "\n".join(lines)


def add_config_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model, GPU and cache")
    g.add_argument("--model", default=None, help=f"model name from the catalog (default {DEFAULT_MODEL})")
    g.add_argument("--gpu", default=None, help=f"GPU name from the catalog (default {DEFAULT_GPU})")
    g.add_argument("--catalog", action="append", default=[], metavar="FILE",
                   help="YAML/TOML file adding models and GPUs; repeatable")
    g.add_argument("--tensor-parallel", "--tp", dest="tensor_parallel", type=int, default=None)
    g.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default 16)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None, help="default 0.9")
    g.add_argument("--swap-space", dest="swap_space_gib", type=float, default=None, help="CPU swap GiB (default 4)")
    g.add_argument("--watermark", type=float, default=None, help="fraction of GPU blocks kept free (default 0.01)")
    g.add_argument("--num-gpu-blocks", type=int, default=None, help="fix the GPU block count")
    s = p.add_argument_group("scheduler")
    s.add_argument("--max-num-seqs", type=int, default=None, help="default 256")
    s.add_argument("--max-num-batched-tokens", type=int, default=None, help="per-step token budget, decodes included; default max(max_model_len, 2048) + max_num_seqs "
                        "(512 with chunked prefill)")
    s.add_argument("--preemption", choices=PREEMPTION_MODES, default=None, help="default auto (vLLM's rule)")
    s.add_argument("--cost-profile", default=None, metavar="JSON", help="calibrated cost-model parameters")
    k = p.add_argument_group("policy knobs (override the --policy preset; names or 'package.module:Class')")
    k.add_argument("--allocator", default=None, help="paged | contiguous")
    k.add_argument("--free-order", choices=("lifo", "fifo"), default=None, help="paged free-list reuse order")
    k.add_argument("--reservation", choices=("max", "pow2", "oracle"), default=None, help="contiguous reservation size")
    k.add_argument("--address-space", choices=("buddy", "first-fit"), default=None, help="contiguous placement")
    k.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    k.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    k.add_argument("--scheduler", default=None, help="fcfs | priority | sjf | orca | static")
    k.add_argument("--victim", default=None, help="preemption victim: newest | largest | fewest-blocks")
    k.add_argument("--watermark-blocks", type=int, default=None, help="absolute watermark (replaces --watermark)")
    k.add_argument("--cost-model", default=None, help="roofline, or a plugin")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="YAML/TOML file of the options above (policy, model, block_size, ...); flags override it")


CONFIG_KEYS = ("model", "gpu", "tensor_parallel", "block_size", "gpu_memory_utilization", "swap_space_gib",
               "watermark", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "preemption", "cost_profile",
               "allocator", "free_order", "reservation", "address_space", "prefix_caching", "chunked_prefill",
               "scheduler", "victim", "watermark_blocks", "cost_model")


RUN_KEYS = ("max_requests", "rate_scale", "clip_to_model")


def read_config_file(path: str) -> dict:
    """Options from a YAML or TOML file: the option names of `blocksim replay` with underscores."""
    from blocksim.catalog import _read_file
    data = _read_file(Path(path), "config file")
    known = set(CONFIG_KEYS) | set(RUN_KEYS) | {"policy", "catalog"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"config file {path}: unknown option(s) {sorted(unknown)}; known: {sorted(known)}")
    if isinstance(data.get("catalog"), str):
        data["catalog"] = [data["catalog"]]
    return data


def settings_from_args(args: argparse.Namespace) -> tuple[str, dict]:
    """(policy, options) from the --config file, then the command-line flags over it."""
    o = read_config_file(args.config) if getattr(args, "config", None) else {}
    policy = getattr(args, "policy", None) or o.pop("policy", None) or "vllm"
    o.pop("policy", None)
    o.update({k: getattr(args, k) for k in CONFIG_KEYS + RUN_KEYS if getattr(args, k, None) is not None})
    if getattr(args, "catalog", None):
        o["catalog"] = tuple(args.catalog)
    elif "catalog" in o:
        o["catalog"] = tuple(o["catalog"])
    return policy, o


def positive_float(text: str) -> float:
    v = float(text)
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return v


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def _run_and_report(trace, args, out: Path, *, progress: bool) -> int:
    policy, options = settings_from_args(args)
    summary = replay(trace, out, policy=policy, overrides=options, progress=progress,
                     record_plan=getattr(args, "record_plan", False))
    print(f"\nblocksim: {summary['config']['model']['name']} on {summary['config']['gpu']['name']}, "
          f"policy {summary['config']['policy']}, block size {summary['block_size']}")
    print(format_summary(summary))
    reasons = summary.get("reject_reasons") or {}
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:3]:
        print(f"  rejected x{count}: {reason}")
    if not args.no_report:
        from analysis import write_report
        html, md = write_report(out)
        print(f"\nreport: {html}\n        {md}")
    print(f"run directory: {out}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from traces.cli import read_trace_from_args
    trace = read_trace_from_args(args.trace, args)
    return _run_and_report(trace, args, Path(args.out), progress=not args.quiet)


def cmd_demo(args: argparse.Namespace) -> int:
    import traces
    path = traces.bundled("azure-conv")
    print(f"blocksim demo: replaying {path.name} (Azure LLM inference 2023, conversation; CC BY 4.0)")
    trace = traces.read_trace(path)
    args.clip_to_model = None if args.no_clip else True
    return _run_and_report(trace, args, Path(args.out), progress=not args.quiet)


def cmd_catalog(args: argparse.Namespace) -> int:
    from blocksim.catalog import Catalog
    cat = Catalog(args.catalog)
    print("models:")
    for m in cat.models.values():
        print(f"  {m.name:<14} layers={m.num_layers:<3} heads={m.num_heads:<3} kv_heads={m.num_kv_heads:<3} "
              f"head_size={m.head_size} params={m.num_params / 1e9:.1f}B max_len={m.max_model_len}")
    print("gpus:")
    for g in cat.gpus.values():
        print(f"  {g.name:<12} memory={g.memory_bytes / 2**30:.0f}GiB hbm={g.hbm_bw_gbps:.0f}GB/s "
              f"fp16={g.fp16_tflops:.0f}TFLOP/s host_link={g.host_link_gbps:.0f}GB/s")
    if args.model:
        cfg = build_config(model=args.model, gpu=args.gpu, catalog=tuple(args.catalog))
        print(f"\n{args.model} on {cfg.gpu.name}: {cfg.num_gpu_blocks} GPU blocks, {cfg.num_cpu_blocks} CPU blocks "
              f"of {cfg.block_bytes / 2**20:.1f} MiB")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    from blocksim import plugins
    from blocksim.policies import PRESETS, policy_config
    print("presets:")
    for name in PRESETS:
        p = policy_config(name)
        knobs = ", ".join(f"{k}={v}" for k, v in vars(p).items() if v != getattr(type(p)(), k)) or "defaults"
        print(f"  {name:<13} {knobs}")
    for kind in ("allocator", "scheduler", "victim", "cost_model"):
        print(f"{kind}: {', '.join(plugins.names(kind))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="blocksim", description="KV-cache memory management simulator for LLM serving")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("replay", help="replay a trace through the simulated engine")
    r.add_argument("trace", help="trace file (Azure, BurstGPT, Mooncake, generic CSV/JSONL/Parquet)")
    r.add_argument("--out", required=True, metavar="DIR")
    r.add_argument("--policy", default=None, help="preset: vllm (default), vllm-prefix, vllm-chunked, orca-max, "
                                                   "orca-pow2, orca-oracle, static (`blocksim policies`)")
    r.add_argument("--max-requests", type=positive_int, default=None, help="replay only the first N requests")
    r.add_argument("--rate-scale", type=positive_float, default=None, help="multiply the request rate (default 1)")
    r.add_argument("--clip-to-model", action="store_true", default=None,
                   help="clip requests longer than the model's max length (reports how many) instead of rejecting them")
    r.add_argument("--no-report", action="store_true", help="skip report.html / report.md")
    r.add_argument("--record-plan", action="store_true",
                   help="write the execution plan (plan/) for `blocksim validate`; steps one by one")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_options(r)
    from traces.cli import add_trace_read_options
    add_trace_read_options(r)
    r.set_defaults(func=cmd_replay)

    d = sub.add_parser("demo", help="replay the bundled Azure conversation trace slice and write a report")
    d.add_argument("--out", default="blocksim-demo", metavar="DIR", help="default ./blocksim-demo")
    d.add_argument("--policy", default=None, help="preset (default vllm)")
    d.add_argument("--no-report", action="store_true")
    d.add_argument("--no-clip", action="store_true",
                   help="reject requests longer than the model instead of clipping them")
    d.add_argument("--quiet", action="store_true")
    add_config_options(d)
    d.set_defaults(func=cmd_demo)

    c = sub.add_parser("catalog", help="list built-in and user models and GPUs")
    c.add_argument("--catalog", action="append", default=[], metavar="FILE")
    c.add_argument("--model", default=None, help="also print this model's block counts")
    c.add_argument("--gpu", default=DEFAULT_GPU)
    c.set_defaults(func=cmd_catalog)

    pol = sub.add_parser("policies", help="list policy presets and the registered plug-ins")
    pol.set_defaults(func=cmd_policies)

    from traces.cli import add_traces_command
    add_traces_command(sub)
    from analysis.cli import add_analysis_commands
    add_analysis_commands(sub)
    from blocksim.experiments.sweep import add_sweep_command
    add_sweep_command(sub)
    from validation.validate import add_validate_command  # imports torch only when a validation runs
    add_validate_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except ConfigError as e:
        print(f"blocksim: configuration error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # errors that carry a user-facing message
        from blocksim.engine import EngineError
        from traces import TraceError
        if isinstance(e, (TraceError, FileNotFoundError, EngineError)):
            print(f"blocksim: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

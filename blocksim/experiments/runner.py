"""Build a configuration from names and options, run one replay, write its run directory.

`replay()` is the one entry point the CLI, `blocksim.experiments.compare` and sweeps call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blocksim.catalog import Catalog
from blocksim.config import CacheConfig, ConfigError, SchedulerConfig, SimConfig
from blocksim.cost import CostParams
from blocksim.engine import Engine
from blocksim.records.result import RunResult
from blocksim.policies import POLICY_KEYS, make_cost_model, policy_config

DEFAULT_MODEL = "llama-2-7b"
DEFAULT_GPU = "h100-80gb"

# Option name -> where it goes. Every knob a replay accepts, with its default.
DEFAULTS: dict[str, Any] = {
    "model": DEFAULT_MODEL,
    "gpu": DEFAULT_GPU,
    "catalog": (),
    "tensor_parallel": 1,
    "block_size": 16,
    "gpu_memory_utilization": 0.9,
    "swap_space_gib": 4.0,
    "watermark": 0.01,
    "num_gpu_blocks": None,
    "max_num_seqs": 256,
    "max_num_batched_tokens": None,  # None: max(max_model_len, 2048) + max_num_seqs (512 with chunked prefill)
    "preemption": "auto",
    "cost_profile": None,
    # policy knobs (see blocksim.config.PolicyConfig); None keeps the preset's value
    "allocator": None,
    "free_order": None,
    "reservation": None,
    "address_space": None,
    "prefix_caching": None,
    "chunked_prefill": None,
    "scheduler": None,
    "victim": None,
    "watermark_blocks": None,
    "cost_model": None,
}
CHUNKED_BUDGET_TOKENS = 512


def build_config(policy: str = "vllm", **options: Any) -> SimConfig:
    """A validated `SimConfig` from option names (see `DEFAULTS`); unknown names are refused."""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    o = {**DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    catalog = Catalog(list(o["catalog"]))
    model = catalog.model(o["model"])
    policy_cfg = policy_config(policy, **{k: o[k] for k in POLICY_KEYS})
    # Default step budget: a prompt of the model's full length must fit beside a full decode batch,
    # since prefills and decodes share a step here (vLLM 0.1's relation: 2560 >= 2048 + 256 + ...).
    seqs = o["max_num_seqs"] if isinstance(o["max_num_seqs"], int) else 0  # SchedulerConfig refuses a non-int
    max_tokens = o["max_num_batched_tokens"] or (
        CHUNKED_BUDGET_TOKENS if policy_cfg.chunked_prefill else max(model.max_model_len, 2048) + seqs)
    return SimConfig(
        model=model,
        gpu=catalog.gpu(o["gpu"]),
        cache=CacheConfig(block_size=o["block_size"], gpu_memory_utilization=o["gpu_memory_utilization"],
                          swap_space_gib=o["swap_space_gib"], watermark=o["watermark"],
                          num_gpu_blocks_override=o["num_gpu_blocks"]),
        scheduler=SchedulerConfig(max_num_seqs=o["max_num_seqs"], max_num_batched_tokens=max_tokens,
                                  preemption_mode=o["preemption"]),
        tensor_parallel=o["tensor_parallel"],
        policy=policy,
        policy_config=policy_cfg,
    )


RUN_OPTIONS = ("max_requests", "clip_to_model", "rate_scale")  # shape the trace, not the configuration


def check_options(policy: str, overrides: dict[str, Any]) -> SimConfig:
    """Validate a policy and replay options as `replay` would, without running anything."""
    return build_config(policy, **{k: v for k, v in overrides.items() if k not in RUN_OPTIONS})


def load_trace(trace, *, rate_scale: float = 1.0, max_requests: int | None = None,
               clip_max_len: int | None = None):
    """A `traces.Trace` from a path (any supported format) or a Trace, shaped by count, rate and length.

    With `clip_max_len`, requests longer than that are clipped (prompt first kept, output cut), and
    how many changed is printed, never silent.
    """
    import traces
    if isinstance(trace, (str, Path)):
        trace = traces.read_trace(trace)
    if max_requests is not None:
        trace = traces.head(trace, max_requests)
    if rate_scale != 1.0:
        trace = traces.scale_rate(trace, rate_scale)
    if clip_max_len is not None:
        trace, changed = traces.clip_to_max_len(trace, clip_max_len)
        if changed:
            print(f"blocksim: clipped {changed} of {len(trace)} requests to the model's {clip_max_len} tokens")
    return trace


def simulate(trace, config: SimConfig, *, cost_profile: str | None = None, progress: bool = False,
             check_invariants: bool = False, plan_dir: str | Path | None = None) -> RunResult:
    params = CostParams.from_json(cost_profile) if cost_profile else None
    return Engine(config, trace, make_cost_model(config, params), progress=progress,
                  check_invariants=check_invariants, plan_dir=plan_dir).run()


def replay(trace, out_dir: str | Path, *, policy: str = "vllm", rate_scale: float = 1.0,
           overrides: dict[str, Any] | None = None, progress: bool = False, write_report: bool = False,
           max_requests: int | None = None, record_plan: bool = False, clip_to_model: bool = False) -> dict:
    """Run one replay into `out_dir` and return its summary (the content of summary.json)."""
    options = dict(overrides or {})
    max_requests = options.pop("max_requests", max_requests)
    clip_to_model = options.pop("clip_to_model", clip_to_model)
    rate_scale = options.pop("rate_scale", rate_scale)
    cost_profile = options.get("cost_profile")
    config = build_config(policy, **options)
    tr = load_trace(trace, rate_scale=rate_scale, max_requests=max_requests,
                    clip_max_len=config.model.max_model_len if clip_to_model else None)
    result = simulate(tr, config, cost_profile=cost_profile, progress=progress,
                      plan_dir=out_dir if record_plan else None)
    result.summary["rate_scale"] = rate_scale
    result.summary["trace"] = str(trace) if isinstance(trace, (str, Path)) else getattr(trace, "name", "")
    result.save(out_dir)
    if write_report:
        from analysis import write_report as _write
        _write(out_dir)
    return result.summary

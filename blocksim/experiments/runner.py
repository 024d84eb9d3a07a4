"""Build a configuration from names and options, run one replay, write its run directory.

`replay()` is the one entry point the CLI, `blocksim.experiments.compare` and sweeps call.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import traces
from blocksim.catalog import Catalog
from blocksim.config import GiB, CacheConfig, ConfigError, SchedulerConfig, SimConfig, TierConfig
from blocksim.engine import Engine
from blocksim.experiments.rundir import check_out_dir, staged
from blocksim.options import (BY_NAME, CHUNKED_BUDGET_TOKENS, DEFAULT_POLICY, DEFAULTS, POLICY_KEYS, RUN_DEFAULTS,
                              RUN_OPTIONS, TIER_KEYS, V1_DEFAULTS)
from blocksim.policies import make_cost_model, policy_config, refuse_ignored_knobs
from blocksim.records.result import RunResult


def build_config(policy: str = DEFAULT_POLICY, **options: Any) -> SimConfig:
    """A validated `SimConfig` from option names (`blocksim.options.CONFIG_OPTIONS`; a None value
    keeps the default). Unknown names are refused, and so is a knob set here that the chosen
    allocator or scheduler ignores."""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    given = {k: v for k, v in options.items() if v is not None}
    o = {**DEFAULTS, **given}
    catalog = Catalog(list(o["catalog"]))
    model = catalog.model(o["model"])
    policy_cfg = policy_config(policy, **{k: o[k] for k in POLICY_KEYS})
    refuse_ignored_knobs(policy, policy_cfg, given)
    gpu = catalog.gpu(o["gpu"])
    if policy_cfg.allocator == "v1":  # vLLM V1's server defaults for the GPU
        large = gpu.memory_bytes >= 70 * GiB and "a100" not in gpu.name.lower()
        v1_tokens, v1_seqs = V1_DEFAULTS["large" if large else "small"]
        o["max_num_seqs"] = given.get("max_num_seqs", v1_seqs)
        o["max_num_batched_tokens"] = given.get("max_num_batched_tokens", v1_tokens)
    # Default step budget: a prompt of the model's full length must fit beside a full decode batch,
    # since prefills and decodes share a step here (vLLM 0.1's relation: 2560 >= 2048 + 256 + ...).
    seqs = o["max_num_seqs"] if isinstance(o["max_num_seqs"], int) else 0  # SchedulerConfig refuses a non-int
    if o["max_num_batched_tokens"]:
        max_tokens = o["max_num_batched_tokens"]
    elif policy_cfg.chunked_prefill:
        max_tokens = CHUNKED_BUDGET_TOKENS
    elif policy_cfg.v0_release != "0.1":  # prompt-only steps: vLLM 0.2-0.6's default, decodes never share a step
        max_tokens = max(model.max_model_len, 2048)
    else:
        max_tokens = max(model.max_model_len, 2048) + seqs
    block_size = o["block_size"]
    if policy_cfg.allocator == "radix":  # SGLang: pages of page_size tokens; the largest prefill batch sizes
        block_size = policy_cfg.page_size  # the activation estimate
        chunk = policy_cfg.chunked_prefill_size
        max_tokens = min(chunk, policy_cfg.max_prefill_tokens) if chunk > 0 else policy_cfg.max_prefill_tokens
    return SimConfig(
        model=model,
        gpu=gpu,
        cache=CacheConfig(block_size=block_size, gpu_memory_utilization=o["gpu_memory_utilization"],
                          swap_space_gib=o["swap_space_gib"], watermark=o["watermark"],
                          num_gpu_blocks_override=o["num_gpu_blocks"]),
        scheduler=SchedulerConfig(max_num_seqs=o["max_num_seqs"], max_num_batched_tokens=max_tokens,
                                  preemption_mode=o["preemption"],
                                  long_prefill_token_threshold=o["long_prefill_token_threshold"] or 0),
        tensor_parallel=o["tensor_parallel"],
        policy=policy,
        policy_config=policy_cfg,
        tiers=tier_config(o),
    )


def tier_config(o: dict[str, Any]) -> TierConfig | None:
    """The tiers of options `o` (by option name), or None when no tier has a capacity (tier
    options set without a capacity are refused: they would change nothing)."""
    fields = {k[len("tier_"):]: o[k] for k in TIER_KEYS}
    t = TierConfig(**fields)
    if t.enabled:
        return t
    changed = [k for k in TIER_KEYS if o[k] != DEFAULTS[k]]
    if changed:
        flag = BY_NAME[changed[0]].flag
        raise ConfigError(f"{changed[0]} ({flag}): no tier is on, so it changes nothing; add --tier-host-gib or "
                          f"--tier-disk-gib, or drop {flag}")
    return None


def check_options(policy: str, overrides: dict[str, Any]) -> SimConfig:
    """Validate a policy and replay options as `replay` would, without running anything."""
    unknown = set(overrides) - set(DEFAULTS) - set(RUN_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)}; known: {sorted({*DEFAULTS, *RUN_OPTIONS})}")
    return build_config(policy, **{k: v for k, v in overrides.items() if k not in RUN_OPTIONS})


log = logging.getLogger(__name__)


def _log_executor_totals(path: Path) -> None:
    """One line on how an executed run was timed, from the executor's `executor.json` (where it
    writes one): its steps with a late segment (the host behind the sleep queued before it), those
    timed again, and where the sleeps settled (validation/VALIDATION.md)."""
    try:
        t = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if "late_steps" not in t:
        return
    line = (f"executor: {t.get('steps', 0)} steps ({t.get('graph_steps', 0)} graph replays), "
            f"{t['late_steps']} with a late segment, {t.get('retimed_steps', 0)} timed again")
    if "graph_lead_s" in t:
        line += (f"; sleeps settled at {t['graph_lead_s'] * 1e6:.0f} us before a graph replay, "
                 f"{t['eager_lead_s'] * 1e3:.2f} ms before an eager segment")
    log.info(line)

#: Share of a trace's requests above which `rejection_warning` speaks.
REJECTION_WARNING_SHARE = 0.01


def rejected_on_arrival(trace, config: SimConfig) -> tuple[int, int]:
    """How many of `trace`'s requests the scheduler will reject as never schedulable, by its own
    `NEVER` rules: (prompt + output longer than the model's max_model_len, prompt over the step's
    token budget without chunked prefill). A request counts once, under the first rule it breaks.
    SGLang's scheduler has no budget rule: it truncates a long prompt into chunks, and without
    chunking admits a batch's first request over `max_prefill_tokens`."""
    df = trace.arrays if hasattr(trace, "arrays") else trace.df  # a Trace's columns, without its frame
    too_long = (df["prompt_tokens"] + df["output_tokens"]) > config.model.max_model_len
    over_budget = too_long & False
    if not config.policy_config.chunked_prefill and config.policy_config.scheduler != "sglang":
        limit = min(config.model.max_model_len, config.scheduler.max_num_batched_tokens)
        over_budget = ~too_long & (df["prompt_tokens"] > limit)
    return int(too_long.sum()), int(over_budget.sum())


def rejection_warning(trace, policy: str = DEFAULT_POLICY, overrides: dict[str, Any] | None = None,
                      clip_hint: str = "--clip-to-model", model_hint: str = "--model") -> str | None:
    """A one-line warning when more than 1% of `trace`'s requests will be rejected under these
    options, naming the fixes (`clip_hint` and `model_hint` spell the options where it is read);
    None otherwise, and always with `clip_to_model` set."""
    overrides = dict(overrides or {})
    if overrides.get("clip_to_model") or len(trace) == 0:
        return None
    config = check_options(policy, overrides)
    if overrides.get("max_requests"):
        trace = traces.head(trace, overrides["max_requests"])
    too_long, over_budget = rejected_on_arrival(trace, config)
    rejected = too_long + over_budget
    if rejected <= REJECTION_WARNING_SHARE * len(trace):
        return None
    model = config.model
    why = []
    if too_long:
        why.append(f"{too_long:,} longer than {model.name}'s {model.max_model_len:,}-token context")
    if over_budget:
        why.append(f"{over_budget:,} with prompts over the step budget of "
                   f"{config.scheduler.max_num_batched_tokens:,} tokens (raise --max-num-batched-tokens)")
    fixes = f"; {clip_hint} clips them to fit, or a longer-context model ({model_hint}) serves them" if too_long else ""
    return (f"warning: {rejected:,} of {len(trace):,} requests ({rejected / len(trace):.1%}) will be rejected: "
            f"{', '.join(why)}{fixes}")


def load_trace(trace, *, rate_scale: float = 1.0, max_requests: int | None = None,
               clip_max_len: int | None = None):
    """A `traces.Trace` from a path (any supported format) or a Trace, shaped by count, rate and length.

    With `clip_max_len`, requests longer than that are clipped (prompt first kept, output cut), and
    how many changed is printed, never silent.
    """
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
             check_invariants: bool = False, plan_dir: str | Path | None = None, executor=None) -> RunResult:
    """One engine run; `executor` (a `blocksim.engine.executor.StepExecutor`) executes every step."""
    return Engine(config, trace, make_cost_model(config, cost_profile), progress=progress,
                  check_invariants=check_invariants, plan_dir=plan_dir, executor=executor).run()


def replay(trace, out_dir: str | Path, *, policy: str = DEFAULT_POLICY, rate_scale: float | None = None,
           overrides: dict[str, Any] | None = None, progress: bool = False, write_report: bool = False,
           max_requests: int | None = None, record_plan: bool = False, clip_to_model: bool | None = None,
           overwrite: bool = False, executor=None) -> dict:
    """Run one replay into `out_dir` and return its summary (the content of summary.json).

    The run directory is built in a temporary sibling and renamed to `out_dir` when complete
    (`blocksim.experiments.rundir.staged`): an error or Ctrl-C leaves `out_dir` as it was. An
    existing non-empty `out_dir` is refused (`ConfigError`) unless `overwrite`, which replaces it whole.

    `executor`: a factory `config -> StepExecutor` (`blocksim.engine.executor`); each step is then
    executed and lasts its measured time, and the executor writes its records into `out_dir`.

    The run options (`blocksim.options.RUN_OPTIONS`) come from `overrides` when present there, else
    from the keywords, else from their defaults (all requests, rate x1, no clipping).
    """
    options = dict(overrides or {})
    given = {"max_requests": max_requests, "rate_scale": rate_scale, "clip_to_model": clip_to_model}
    run = dict(RUN_DEFAULTS)
    for k in RUN_OPTIONS:
        value = options.pop(k, None)
        value = given[k] if value is None else value
        if value is not None:
            run[k] = value
    max_requests, rate_scale, clip_to_model = run["max_requests"], run["rate_scale"], run["clip_to_model"]
    cost_profile = options.get("cost_profile")
    config = build_config(policy, **options)
    check_out_dir(out_dir, overwrite)
    tr = load_trace(trace, rate_scale=rate_scale, max_requests=max_requests,
                    clip_max_len=config.model.max_model_len if clip_to_model else None)
    log.info("replay: %d requests, policy %s, %s on %s (TP %d), %d GPU and %d CPU blocks of %d tokens",
             len(tr), policy, config.model.name, config.gpu.name, config.tensor_parallel, config.num_gpu_blocks,
             config.num_cpu_blocks, config.cache.block_size)
    step_executor = executor(config) if executor is not None else None
    with staged(out_dir, overwrite=overwrite) as tmp:
        log.info("writing %s (in %s until complete)", out_dir, tmp.parent)
        result = simulate(tr, config, cost_profile=cost_profile, progress=progress,
                          plan_dir=tmp if record_plan else None, executor=step_executor)
        result.summary["rate_scale"] = rate_scale
        result.summary["trace"] = str(trace) if isinstance(trace, (str, Path)) else getattr(trace, "name", "")
        if step_executor is not None:
            result.summary["executor"] = getattr(step_executor, "describe", {})
        result.save(tmp)
        if step_executor is not None:
            step_executor.save(tmp)
            _log_executor_totals(tmp / "executor.json")
        if write_report:
            from analysis import write_report as _write  # loads matplotlib: only when a report is drawn
            _write(tmp)
    log.info("wrote %s", out_dir)
    return result.summary

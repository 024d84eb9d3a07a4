"""Built-in policies, presets, and the factories that turn a `SimConfig` into engine parts.

Presets (each knob overridable from the CLI or a config file):

=============  =====================================================================================
vllm           paged blocks, LIFO free list, FCFS, preemption by vLLM's rule, victim = newest
vllm-prefix    vllm + automatic prefix caching
vllm-chunked   vllm + chunked prefill (Sarathi-style; 512-token step budget unless set)
vllm-0.6       vllm with vLLM 0.6.4-0.6.6's step rules (v0_release 0.6.4): prompt-only steps, swap-ins
               charged to the token budget, admission on uncached tokens under prefix caching
vllm-v1        vLLM V1 (v0.11): its KV cache manager and scheduler, prefix caching and chunked prefill on
orca-max       contiguous reservation of max_model_len per request, buddy allocator, never preempts
orca-pow2      reservation = next power of two of prompt + output
orca-oracle    reservation = exactly prompt + output
static         FasterTransformer-like static batching over max-length reservations
sglang         SGLang's scheduler and radix cache: token-granular pool (page size 1), fcfs order,
               admission by the new-token-ratio estimate, retraction, chunked prefill of 8192
=============  =====================================================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from blocksim import plugins
from blocksim.config import ConfigError, PolicyConfig, SimConfig
from blocksim.cost import BUILTIN_COST_MODELS, ProfiledCostModel, RooflineCostModel, build_cost_model, load_cost_file
from blocksim.memory.kv_cache_manager import KVCacheManager
from blocksim.memory.paged import BlockSpaceManager
from blocksim.memory.prefix_cache import PrefixCachingBlockManager
from blocksim.memory.radix_manager import RadixCacheManager
from blocksim.options import BLOCKS, BY_NAME, CONTIGUOUS, PAGED, PREEMPTING, SGLANG, V0, V1, VLLM_ENGINE
from blocksim.scheduling import variants
from blocksim.scheduling.scheduler import Scheduler
from blocksim.scheduling.sglang_scheduler import SGLangScheduler
from blocksim.scheduling.v1_scheduler import V1PriorityScheduler, V1Scheduler

PRESETS: dict[str, dict[str, Any]] = {
    "vllm": {},
    "vllm-prefix": {"prefix_caching": True},
    "vllm-chunked": {"chunked_prefill": True},
    "vllm-0.6": {"v0_release": "0.6.4"},
    "vllm-v1": {"allocator": "v1", "scheduler": "v1", "prefix_caching": True, "chunked_prefill": True},
    "orca-max": {"allocator": "contiguous", "reservation": "max", "scheduler": "orca"},
    "orca-pow2": {"allocator": "contiguous", "reservation": "pow2", "scheduler": "orca"},
    "orca-oracle": {"allocator": "contiguous", "reservation": "oracle", "scheduler": "orca"},
    "static": {"allocator": "contiguous", "reservation": "max", "scheduler": "static"},
    "sglang": {"allocator": "radix", "scheduler": "sglang"},
}
#: What SGLang calls a vLLM knob, for the message refusing it under the sglang preset.
SGLANG_EQUIVALENT = {
    "block_size": "--page-size", "max_num_seqs": "--max-running-requests",
    "max_num_batched_tokens": "--chunked-prefill-size or --max-prefill-tokens",
    "chunked_prefill": "--chunked-prefill-size (-1 disables chunking)",
    "prefix_caching": "nothing: the radix cache always shares prefixes",
    "preemption": "nothing: SGLang retracts (recomputes) running requests, it never swaps",
    "victim": "nothing: SGLang retracts the request with the fewest outputs",
    "swap_space_gib": "nothing: SGLang never swaps, it retracts",
    "v0_release": "nothing: the sglang preset follows SGLang v0.4's scheduler",
    "watermark": "--init-new-token-ratio (admission keeps room by estimating outputs, not by a watermark)",
    "watermark_blocks": "--init-new-token-ratio (admission keeps room by estimating outputs, not by a watermark)",
}
PLUGGABLE = ("allocator", "scheduler", "victim", "cost_model")


def policy_config(preset: str, **knobs: Any) -> PolicyConfig:
    """A preset with knobs overridden (None keeps the preset's value).

    An unknown preset lists the known ones; an unknown built-in allocator, scheduler, victim or
    cost-model name lists the registered ones (plugin strings resolve when the engine is built).
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown policy {preset!r}; known presets: {', '.join(PRESETS)}")
    fields = {**PRESETS[preset], **{k: v for k, v in knobs.items() if v is not None}}
    for kind in PLUGGABLE:
        if isinstance(fields.get(kind), str):  # PolicyConfig refuses a name that is not a string
            plugins.check_name(kind, fields[kind])
    return PolicyConfig(**fields)


def _presets_where(allocator: str) -> str:
    return ", ".join(name for name, knobs in PRESETS.items() if knobs.get("allocator", "paged") == allocator)


def _preempts(scheduler_name: str) -> bool:
    return getattr(plugins.resolve("scheduler", scheduler_name), "preempts", True)


def _why_ignored(applies_to: str, policy: str, config: PolicyConfig, name: str = "") -> tuple[str, str] | None:
    """(reason, fix) when the chosen allocator or scheduler is not the part a knob `applies_to`, else None."""
    radix = config.allocator == "radix"
    if applies_to == SGLANG and not radix:
        return (f"it is an SGLang server argument and policy {policy!r} does not use SGLang's scheduler and "
                f"radix cache", "choose --policy sglang")
    if radix and applies_to in (PAGED, CONTIGUOUS, PREEMPTING, VLLM_ENGINE, BLOCKS, V0, V1):
        return (f"policy {policy!r} is SGLang's scheduler and radix cache, which ignore this vLLM knob",
                f"use SGLang's {SGLANG_EQUIVALENT.get(name, 'server arguments')}")
    v1 = config.allocator == "v1"
    if v1 and applies_to in (PAGED, PREEMPTING, V0):
        return (f"policy {policy!r} follows vLLM V1, whose KV cache manager has no watermark, free-list order or "
                f"swap space and whose scheduler preempts only the last running request by recomputation, "
                f"so it ignores it", f"choose a vLLM v0 policy ({_presets_where('paged')})")
    if applies_to == V1 and not v1:
        return (f"policy {policy!r} is not vLLM V1's engine; only vLLM V1's scheduler reads it",
                f"choose a vLLM V1 policy (vllm-v1)")
    if applies_to in (PAGED, BLOCKS) and config.allocator == "contiguous":
        return (f"policy {policy!r} uses the contiguous allocator, which reserves each request's memory up front "
                f"and ignores it", f"choose a paged policy ({_presets_where('paged')})")
    if applies_to == CONTIGUOUS and config.allocator == "paged":
        return (f"policy {policy!r} uses the paged allocator, which ignores it",
                f"choose a contiguous policy ({_presets_where('contiguous')})")
    if applies_to == PREEMPTING and not plugins.is_plugin(config.scheduler):
        if not _preempts(config.scheduler):
            preempting = [n for n in plugins.names("scheduler") if _preempts(n)]
            return (f"scheduler {config.scheduler!r} never preempts, so it ignores it",
                    f"choose a preempting scheduler ({', '.join(preempting)})")
    return None


def refuse_ignored_knobs(policy: str, config: PolicyConfig, knobs: Iterable[str]) -> None:
    """Refuse a knob in `knobs` (the options the user set) that the chosen allocator or scheduler ignores.

    Pass only options the user set: a preset's own values and the defaults are never refused.
    Plugin allocators and schedulers declare nothing, so nothing is refused for them.
    """
    for name in knobs:
        option = BY_NAME.get(name)
        if option is None or option.applies_to is None:
            continue
        why = _why_ignored(option.applies_to, policy, config, name)
        if why:
            reason, fix = why
            raise ConfigError(f"{name} ({option.flag}): {reason}; drop {option.flag}, or {fix}")


# --- factories -------------------------------------------------------------------------------
def make_paged(config: SimConfig):
    p, c = config.policy_config, config.cache
    cls = PrefixCachingBlockManager if p.prefix_caching else BlockSpaceManager
    return cls(c.block_size, config.num_gpu_blocks, config.num_cpu_blocks, config.watermark_blocks, p.free_order)


def make_v1(config: SimConfig):
    return KVCacheManager(config.cache.block_size, config.num_gpu_blocks, config.model.max_model_len,
                          config.policy_config.prefix_caching)


def make_contiguous(config: SimConfig):
    from blocksim.memory.reservation import ContiguousManager  # imported by contiguous runs only
    p = config.policy_config
    return ContiguousManager(config.cache.block_size, config.num_gpu_blocks, p.reservation, p.address_space,
                             config.model.max_model_len)


def make_radix(config: SimConfig):
    """SGLang's pool: `num_gpu_blocks` pages of `page_size` tokens (the cache's block size)."""
    return RadixCacheManager(config.cache.block_size, config.num_gpu_blocks)


def make_memory_manager(config: SimConfig):
    return plugins.resolve("allocator", config.policy_config.allocator)(config)


def make_scheduler(config: SimConfig, memory_manager):
    cls = plugins.resolve("scheduler", config.policy_config.scheduler)
    return cls(config.scheduler, memory_manager, config.model.max_model_len, config.policy_config)


def make_cost_model(config: SimConfig, cost_profile=None):
    """The configured cost model; `cost_profile` is a --cost-profile path, a loaded `Profile` or
    `CostParams`, or None (`blocksim.cost.build_cost_model` says how they combine). A plugin is
    built as ``Class(config, loaded)`` with the loaded file (or None)."""
    name = config.policy_config.cost_model
    if name in BUILTIN_COST_MODELS:
        return build_cost_model(config, name, cost_profile)
    loaded = load_cost_file(cost_profile) if isinstance(cost_profile, (str, Path)) else cost_profile
    return plugins.resolve("cost_model", name)(config, loaded)


for _name, _obj in (("paged", make_paged), ("v1", make_v1), ("contiguous", make_contiguous),
                    ("radix", make_radix)):
    plugins.register("allocator", _name, _obj)
for _name, _obj in (("fcfs", Scheduler), ("priority", variants.PriorityScheduler),
                    ("sjf", variants.SJFScheduler), ("orca", variants.OrcaScheduler),
                    ("static", variants.StaticScheduler), ("v1", V1Scheduler),
                    ("v1-priority", V1PriorityScheduler), ("sglang", SGLangScheduler)):
    plugins.register("scheduler", _name, _obj)
for _name, _obj in (("roofline", RooflineCostModel), ("profiled", ProfiledCostModel), ("auto", build_cost_model)):
    plugins.register("cost_model", _name, _obj)

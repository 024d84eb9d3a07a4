"""Built-in policies, presets, and the factories that turn a `SimConfig` into engine parts.

Presets (each knob overridable from the CLI or a config file):

=============  =====================================================================================
vllm           paged blocks, LIFO free list, FCFS, preemption by vLLM's rule, victim = newest
vllm-prefix    vllm + automatic prefix caching
vllm-chunked   vllm + chunked prefill (Sarathi-style; 512-token step budget unless set)
orca-max       contiguous reservation of max_model_len per request, buddy allocator, never preempts
orca-pow2      reservation = next power of two of prompt + output
orca-oracle    reservation = exactly prompt + output
static         FasterTransformer-like static batching over max-length reservations
=============  =====================================================================================
"""

from __future__ import annotations

from typing import Any

from blocksim import plugins
from blocksim.scheduling import scheduler
from blocksim.memory.paged import BlockSpaceManager
from blocksim.config import ConfigError, PolicyConfig, SimConfig
from blocksim.cost import CostParams, RooflineCostModel

PRESETS: dict[str, dict[str, Any]] = {
    "vllm": {},
    "vllm-prefix": {"prefix_caching": True},
    "vllm-chunked": {"chunked_prefill": True},
    "orca-max": {"allocator": "contiguous", "reservation": "max", "scheduler": "orca"},
    "orca-pow2": {"allocator": "contiguous", "reservation": "pow2", "scheduler": "orca"},
    "orca-oracle": {"allocator": "contiguous", "reservation": "oracle", "scheduler": "orca"},
    "static": {"allocator": "contiguous", "reservation": "max", "scheduler": "static"},
}
POLICY_KEYS = ("allocator", "free_order", "reservation", "address_space", "prefix_caching", "chunked_prefill",
               "scheduler", "victim", "watermark_blocks", "cost_model")


def policy_config(preset: str, **knobs: Any) -> PolicyConfig:
    """A preset with knobs overridden; an unknown preset lists the known ones."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown policy {preset!r}; known presets: {', '.join(PRESETS)}")
    return PolicyConfig(**{**PRESETS[preset], **{k: v for k, v in knobs.items() if v is not None}})


# --- factories -------------------------------------------------------------------------------
def make_paged(config: SimConfig):
    p, c = config.policy_config, config.cache
    if p.prefix_caching:
        from blocksim.memory.prefix_cache import PrefixCachingBlockManager
        return PrefixCachingBlockManager(c.block_size, config.num_gpu_blocks, config.num_cpu_blocks, c.watermark,
                                         p.watermark_blocks, p.free_order)
    return BlockSpaceManager(c.block_size, config.num_gpu_blocks, config.num_cpu_blocks, c.watermark,
                             p.watermark_blocks, p.free_order)


def make_contiguous(config: SimConfig):
    from blocksim.memory.reservation import ContiguousManager
    p = config.policy_config
    return ContiguousManager(config.cache.block_size, config.num_gpu_blocks, p.reservation, p.address_space,
                             config.model.max_model_len)


def make_memory_manager(config: SimConfig):
    return plugins.resolve("allocator", config.policy_config.allocator)(config)


def make_scheduler(config: SimConfig, memory_manager):
    cls = plugins.resolve("scheduler", config.policy_config.scheduler)
    return cls(config.scheduler, memory_manager, config.model.max_model_len, config.policy_config)


def make_cost_model(config: SimConfig, params: CostParams | None = None):
    return plugins.resolve("cost_model", config.policy_config.cost_model)(config, params)


for _name, _obj in (("paged", make_paged), ("contiguous", make_contiguous)):
    plugins.register("allocator", _name, _obj)
for _name, _obj in (("fcfs", scheduler.Scheduler), ("priority", scheduler.PriorityScheduler),
                    ("sjf", scheduler.SJFScheduler), ("orca", scheduler.OrcaScheduler),
                    ("static", scheduler.StaticScheduler)):
    plugins.register("scheduler", _name, _obj)
for _name, _obj in (("newest", scheduler.newest), ("largest", scheduler.largest),
                    ("fewest-blocks", scheduler.fewest_blocks)):
    plugins.register("victim", _name, _obj)
plugins.register("cost_model", "roofline", RooflineCostModel)

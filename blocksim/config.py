"""Configuration: model, GPU, cache and scheduler specs, validated at construction.

Every dataclass here is frozen. A bad value raises :class:`ConfigError` naming the field and the fix,
so an impossible configuration never reaches the engine. This module is a leaf: it imports nothing
from blocksim. The fixed value sets (preemption modes, free orders, reservation modes, address
spaces) are declared here and imported by the modules that implement them; names that resolve
through the plug-in registries (allocator, scheduler, victim, cost model) are checked where a
configuration is built from names (`blocksim.policies.policy_config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

GiB = 1024**3


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field and how to fix it."""


def _require(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def _typed(where: str, value, kind: type) -> None:
    """Refuse a value of the wrong type (a YAML string "8", a float block count, "false" for a flag)."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:  # float: any real number
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise ConfigError(f"{where}: expected {'true/false' if kind is bool else 'a number' if kind is float else 'an integer'}"
                          f", got {value!r} ({type(value).__name__})")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as KV memory and step time need it.

    `num_params` counts all weights (embeddings included); the weight bytes are
    `num_params * dtype_bytes`. `intermediate_size` is the MLP width, `vocab_size` the logits width.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    num_params: float
    max_model_len: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        w = f"model {self.name!r}"
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_size", "max_model_len",
                  "intermediate_size", "vocab_size"):
            v = getattr(self, f)
            _require(isinstance(v, int) and v > 0, f"{w}.{f}", f"must be a positive integer, got {v!r}")
        _typed(f"{w}.num_params", self.num_params, float)
        _require(self.num_params > 0, f"{w}.num_params", f"must be positive, got {self.num_params!r}")
        _require(self.dtype_bytes in (1, 2, 4), f"{w}.dtype_bytes", f"must be 1, 2 or 4, got {self.dtype_bytes!r}")
        _require(self.num_heads % self.num_kv_heads == 0, f"{w}.num_kv_heads",
                 f"{self.num_kv_heads} must divide num_heads={self.num_heads} (GQA groups)")

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: memory, HBM bandwidth, dense fp16/bf16 tensor rate, and its host link.

    `host_link_gbps` is the pinned host<->device bandwidth in GB/s (1e9 bytes/s) one way;
    `transfer_latency_s` is the fixed cost of one copy call (one per block in a vLLM v0 swap).
    `gpu_link_gbps` is the GPU-to-GPU link's bandwidth in GB/s one way, per GPU (NVLink, else
    PCIe), what an all-reduce's bus bandwidth is bounded by under tensor parallelism;
    `allreduce_latency_s` the fixed time of one all-reduce (a small message's time).
    `num_sms` its streaming multiprocessors (0: not known), where a cost profile does not say:
    the profiled cost model places a multi-prompt step's prefill attention on them
    (`blocksim.cost.placement`).
    """

    name: str
    memory_bytes: int
    hbm_bw_gbps: float
    fp16_tflops: float
    host_link_gbps: float
    transfer_latency_s: float = 10e-6
    gpu_link_gbps: float = 32.0
    allreduce_latency_s: float = 20e-6
    num_sms: int = 0

    def __post_init__(self) -> None:
        w = f"gpu {self.name!r}"
        for f in ("memory_bytes", "hbm_bw_gbps", "fp16_tflops", "host_link_gbps", "transfer_latency_s",
                  "gpu_link_gbps", "allreduce_latency_s"):
            _typed(f"{w}.{f}", getattr(self, f), float)
        _require(self.memory_bytes > 0, f"{w}.memory_bytes", "must be positive")
        for f in ("hbm_bw_gbps", "fp16_tflops", "host_link_gbps", "gpu_link_gbps"):
            _require(getattr(self, f) > 0, f"{w}.{f}", f"must be positive, got {getattr(self, f)!r}")
        _require(self.transfer_latency_s >= 0, f"{w}.transfer_latency_s", "must be >= 0")
        _require(self.allreduce_latency_s >= 0, f"{w}.allreduce_latency_s", "must be >= 0")
        _require(isinstance(self.num_sms, int) and not isinstance(self.num_sms, bool) and self.num_sms >= 0,
                 f"{w}.num_sms", f"must be a whole number >= 0, got {self.num_sms!r}")


@dataclass(frozen=True)
class CacheConfig:
    """KV cache: block size in tokens, the share of GPU memory vLLM may use, CPU swap space, watermark.

    `watermark` is a fraction of the GPU blocks kept free at admission and swap-in (vLLM's
    `watermark_blocks = int(watermark * num_gpu_blocks)`). `num_gpu_blocks_override` fixes the
    block count (as vLLM's option of that name does), bypassing the memory computation.
    """

    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    swap_space_gib: float = 4.0
    watermark: float = 0.01
    num_gpu_blocks_override: int | None = None

    def __post_init__(self) -> None:
        for f in ("gpu_memory_utilization", "swap_space_gib", "watermark"):
            _typed(f"cache.{f}", getattr(self, f), float)
        _require(isinstance(self.block_size, int) and _is_pow2(self.block_size), "cache.block_size",
                 f"must be a positive power of two (e.g. 16), got {self.block_size!r}")
        _require(0 < self.gpu_memory_utilization <= 1, "cache.gpu_memory_utilization",
                 f"must be in (0, 1], got {self.gpu_memory_utilization!r}")
        _require(self.swap_space_gib >= 0, "cache.swap_space_gib", f"must be >= 0, got {self.swap_space_gib!r}")
        _require(0 <= self.watermark < 1, "cache.watermark",
                 f"must be a fraction in [0, 1) (e.g. {CacheConfig.watermark}), got {self.watermark!r}")
        if self.num_gpu_blocks_override is not None:
            _typed("cache.num_gpu_blocks", self.num_gpu_blocks_override, int)
            _require(self.num_gpu_blocks_override > 0, "cache.num_gpu_blocks", "must be positive")


PREEMPTION_MODES = ("auto", "recompute", "swap")
V1_SCHEDULERS = ("v1", "v1-priority")
V0_RELEASES = ("0.1", "0.2", "0.4", "0.6.4")
FREE_ORDERS = ("lifo", "fifo")
RESERVATION_MODES = ("max", "pow2", "oracle")
ADDRESS_SPACES = ("buddy", "first-fit")
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")  # SGLang's --schedule-policy


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits (vLLM's names) and the preemption mode.

    `preemption_mode="auto"` is vLLM v0's rule: RECOMPUTE for single-sequence groups, SWAP otherwise.
    `long_prefill_token_threshold` (vLLM V1): when > 0, a request gets at most that many prompt
    tokens per step.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    preemption_mode: str = "auto"
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        _typed("scheduler.max_num_seqs", self.max_num_seqs, int)
        _typed("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, int)
        _require(self.max_num_seqs > 0, "scheduler.max_num_seqs", "must be positive")
        _require(self.max_num_batched_tokens > 0, "scheduler.max_num_batched_tokens", "must be positive")
        _typed("scheduler.long_prefill_token_threshold", self.long_prefill_token_threshold, int)
        _require(self.long_prefill_token_threshold >= 0, "scheduler.long_prefill_token_threshold",
                 "must be >= 0 (0 turns it off)")
        _require(self.preemption_mode in PREEMPTION_MODES, "scheduler.preemption_mode",
                 f"must be one of {', '.join(PREEMPTION_MODES)}, got {self.preemption_mode!r}")


@dataclass(frozen=True)
class PolicyConfig:
    """The plug points of one run; presets in `blocksim.policies` fill these.

    `allocator`: paged (vLLM v0), v1 (vLLM V1's KV cache manager) or contiguous (reservation per
    request); `free_order` is the paged
    free list's reuse order; `reservation` (max / pow2 / oracle) and `address_space` (buddy /
    first-fit) apply to contiguous. `prefix_caching` is vLLM's automatic prefix caching (paged
    only); `chunked_prefill` splits prompts under the max_num_batched_tokens budget (Sarathi).
    `scheduler`: fcfs (vLLM v0), priority, sjf (oracle output length), orca (iteration-level, never
    preempts), static (a batch runs until its longest request ends), v1 / v1-priority (vLLM V1's
    scheduler, which needs allocator v1 and the reverse). `victim`: newest (vLLM),
    largest, fewest-blocks. `watermark_blocks`, when set, replaces the fractional watermark
    (`SimConfig.watermark_blocks` merges the two). Names may also be plugins,
    `"package.module:Class"`; they are resolved, and unknown built-in names refused, by
    `blocksim.policies`. `v0_release` is the vLLM v0 release whose step rules the fcfs, priority
    and sjf schedulers follow (`blocksim.scheduling.scheduler`).
    """

    allocator: str = "paged"
    free_order: str = "lifo"
    reservation: str = "max"
    address_space: str = "buddy"
    prefix_caching: bool = False
    chunked_prefill: bool = False
    scheduler: str = "fcfs"
    victim: str = "newest"
    watermark_blocks: int | None = None
    cost_model: str = "auto"
    # SGLang (allocator=radix, scheduler=sglang): its server arguments and their defaults
    schedule_policy: str = "fcfs"
    page_size: int = 1
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    v0_release: str = "0.1"

    def __post_init__(self) -> None:
        self._check_sglang()
        for f in ("prefix_caching", "chunked_prefill"):
            _typed(f"policy.{f}", getattr(self, f), bool)
        for f in ("allocator", "free_order", "reservation", "address_space", "scheduler", "victim", "cost_model"):
            _require(isinstance(getattr(self, f), str), f"policy.{f}", f"expected a name, got {getattr(self, f)!r}")
        _require(self.free_order in FREE_ORDERS, "policy.free_order",
                 f"must be one of {', '.join(FREE_ORDERS)}, got {self.free_order!r}")
        _require(self.v0_release in V0_RELEASES, "policy.v0_release",
                 f"must be one of {', '.join(V0_RELEASES)}, got {self.v0_release!r}")
        _require(self.reservation in RESERVATION_MODES, "policy.reservation",
                 f"must be one of {', '.join(RESERVATION_MODES)}, got {self.reservation!r}")
        _require(self.address_space in ADDRESS_SPACES, "policy.address_space",
                 f"must be one of {', '.join(ADDRESS_SPACES)}, got {self.address_space!r}")
        if self.watermark_blocks is not None:
            _typed("policy.watermark_blocks", self.watermark_blocks, int)
            _require(self.watermark_blocks >= 0, "policy.watermark_blocks", "must be >= 0")
        contiguous = self.allocator == "contiguous"
        _require(not (self.prefix_caching and contiguous), "policy.prefix_caching",
                 "prefix caching shares paged blocks between requests; it cannot work with the contiguous "
                 "allocator (use allocator=paged, or turn prefix caching off)")
        _require(not (self.chunked_prefill and self.scheduler == "static"), "policy.chunked_prefill",
                 "static batching runs whole prompts as one batch; chunked prefill needs continuous batching "
                 "(use scheduler=fcfs, or turn chunked prefill off)")
        v1_alloc, v1_sched = self.allocator == "v1", self.scheduler in V1_SCHEDULERS
        if v1_alloc != v1_sched and ":" not in self.allocator + self.scheduler:
            raise ConfigError(f"policy.{'scheduler' if v1_alloc else 'allocator'}: vLLM V1's scheduler and KV cache "
                              f"manager work only together (allocator=v1 with scheduler={' or '.join(V1_SCHEDULERS)}); "
                              f"got allocator={self.allocator}, scheduler={self.scheduler} (use --policy vllm-v1)")
        _require(not (v1_alloc and not self.chunked_prefill), "policy.chunked_prefill",
                 "vLLM V1 always chunks prefills; drop --no-chunked-prefill or choose a vLLM v0 policy")
        if self.scheduler in ("orca", "static") and self.allocator == "paged":
            raise ConfigError(f"policy.scheduler: {self.scheduler} never preempts, so it needs an allocator that "
                              f"reserves each request's maximum up front (allocator=contiguous)")


    def _check_sglang(self) -> None:
        _require(self.schedule_policy in SCHEDULE_POLICIES, "policy.schedule_policy",
                 f"must be one of {', '.join(SCHEDULE_POLICIES)}, got {self.schedule_policy!r}")
        for f in ("page_size", "chunked_prefill_size", "max_prefill_tokens", "new_token_ratio_decay_steps"):
            _typed(f"policy.{f}", getattr(self, f), int)
        for f in ("init_new_token_ratio", "min_new_token_ratio_factor"):
            _typed(f"policy.{f}", getattr(self, f), float)
        _require(_is_pow2(self.page_size), "policy.page_size",
                 f"must be a positive power of two (1 is SGLang's token-granular pool), got {self.page_size!r}")
        _require(self.chunked_prefill_size == -1 or self.chunked_prefill_size >= self.page_size,
                 "policy.chunked_prefill_size",
                 f"must be -1 (no chunking) or at least the page size {self.page_size}, got {self.chunked_prefill_size!r}")
        _require(self.max_prefill_tokens > 0, "policy.max_prefill_tokens", "must be positive")
        _require(self.new_token_ratio_decay_steps > 0, "policy.new_token_ratio_decay_steps", "must be positive")
        _require(0 < self.init_new_token_ratio <= 1, "policy.init_new_token_ratio",
                 f"must be in (0, 1] (SGLang's default 0.7), got {self.init_new_token_ratio!r}")
        _require(0 < self.min_new_token_ratio_factor <= 1, "policy.min_new_token_ratio_factor",
                 f"must be in (0, 1] (SGLang's default 0.14), got {self.min_new_token_ratio_factor!r}")
        if self.max_running_requests is not None:
            _typed("policy.max_running_requests", self.max_running_requests, int)
            _require(self.max_running_requests > 0, "policy.max_running_requests", "must be positive")
        radix, sglang = self.allocator == "radix", self.scheduler == "sglang"
        if radix != sglang and ":" not in self.allocator + self.scheduler:
            raise ConfigError("policy.scheduler: the sglang scheduler and the radix allocator only work together "
                              "(SGLang's scheduler admits through the radix tree); use --policy sglang, or neither")


EVICTION_POLICIES = ("lru", "lfu", "arc")
WRITE_POLICIES = ("write-through", "write-through-selective", "write-back")
ONLOAD_MODES = ("wait", "deadline", "recompute")


@dataclass(frozen=True)
class TierConfig:
    """The KV tiers below the GPU: pinned host DRAM and a disk, each off at 0 GiB.

    A tier holds chunks of `chunk_tokens` tokens (a multiple of the block size; None: one block),
    evicts by `*_eviction` (lru, lfu, arc) and is written by `*_write`: write-through stores a chunk
    when it becomes computed in the tier above (for the disk: when the host stores it),
    write-through-selective after `write_hits` hits in the tier above, write-back when the tier above
    evicts it. Disk transfers take `disk_latency_s` plus bytes over `disk_read_gbps` /
    `disk_write_gbps`; the host link is the GPU's `host_link_gbps` each way. `onload`: wait (a request
    waits until its chunks are on the GPU), deadline (chunks landing within `onload_deadline_ms` are
    loaded, the rest recomputed) or recompute (load or recompute, whichever the cost model prices
    lower). `disk_path` is where an executor keeps the disk tier (checked writable, not used by the
    simulator).
    """

    host_gib: float = 0.0
    host_eviction: str = "lru"
    host_write: str = "write-through"
    disk_gib: float = 0.0
    disk_eviction: str = "lru"
    disk_write: str = "write-back"
    disk_read_gbps: float = 5.0
    disk_write_gbps: float = 3.0
    disk_latency_s: float = 100e-6
    disk_path: str | None = None
    write_hits: int = 2
    chunk_tokens: int | None = None
    onload: str = "wait"
    onload_deadline_ms: float = 50.0

    def __post_init__(self) -> None:
        for f in ("host_gib", "disk_gib", "disk_read_gbps", "disk_write_gbps", "disk_latency_s",
                  "onload_deadline_ms"):
            _typed(f"tiers.{f} (--tier-{f.replace('_', '-')})", getattr(self, f), float)
        for f in ("host_gib", "disk_gib", "disk_latency_s"):
            _require(getattr(self, f) >= 0, f"tiers.{f} (--tier-{f.replace('_', '-')})", "must be >= 0")
        for f in ("disk_read_gbps", "disk_write_gbps", "onload_deadline_ms"):
            _require(getattr(self, f) > 0, f"tiers.{f} (--tier-{f.replace('_', '-')})", "must be positive")
        for f, allowed in (("host_eviction", EVICTION_POLICIES), ("disk_eviction", EVICTION_POLICIES),
                           ("host_write", WRITE_POLICIES), ("disk_write", WRITE_POLICIES), ("onload", ONLOAD_MODES)):
            _require(getattr(self, f) in allowed, f"tiers.{f} (--tier-{f.replace('_', '-')})",
                     f"must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        _typed("tiers.write_hits (--tier-write-hits)", self.write_hits, int)
        _require(self.write_hits >= 1, "tiers.write_hits (--tier-write-hits)", "must be >= 1")
        if self.chunk_tokens is not None:
            _typed("tiers.chunk_tokens (--tier-chunk-tokens)", self.chunk_tokens, int)
            _require(self.chunk_tokens > 0, "tiers.chunk_tokens (--tier-chunk-tokens)", "must be positive")

    @property
    def enabled(self) -> bool:
        return self.host_gib > 0 or self.disk_gib > 0


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulated run needs besides the trace."""

    model: ModelSpec
    gpu: GPUSpec
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    tensor_parallel: int = 1
    policy: str = "vllm"
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    tiers: TierConfig | None = None

    def __post_init__(self) -> None:
        tp = self.tensor_parallel
        _require(isinstance(tp, int) and tp >= 1, "tensor_parallel", f"must be a positive integer, got {tp!r}")
        _require(self.model.num_heads % tp == 0, "tensor_parallel",
                 f"{tp} does not divide {self.model.name}'s {self.model.num_heads} attention heads; "
                 f"choose a divisor of {self.model.num_heads}")
        _require(self.model.num_kv_heads % tp == 0 or tp % self.model.num_kv_heads == 0, "tensor_parallel",
                 f"{tp} neither divides nor is a multiple of {self.model.num_kv_heads} KV heads")
        wm = self.policy_config.watermark_blocks
        if wm is not None:
            _require(wm < self.num_gpu_blocks, "policy.watermark_blocks",
                     f"{wm} blocks leave nothing of the {self.num_gpu_blocks} GPU blocks to admit requests into; "
                     f"use fewer (vLLM's {CacheConfig.watermark:.0%} would be "
                     f"{int(CacheConfig.watermark * self.num_gpu_blocks)})")
        if self.cache.num_gpu_blocks_override is None:
            free = self.kv_memory_bytes
            _require(free >= self.block_bytes, "gpu",
                     f"{self.gpu.name} ({self.gpu.memory_bytes / GiB:.0f} GiB x utilization "
                     f"{self.cache.gpu_memory_utilization}) cannot hold {self.model.name}'s weights "
                     f"({self.model.weight_bytes / tp / GiB:.1f} GiB per GPU) plus activations and one KV block; "
                     f"use a larger GPU, raise tensor_parallel, or raise gpu_memory_utilization")
        if self.tiers is not None:
            self._check_tiers(self.tiers)

    def _check_tiers(self, t: TierConfig) -> None:
        """Refuse tiers the run cannot use: no prefix caching, a chunk that is not whole blocks, a
        tier smaller than one chunk, a disk path that cannot be written."""
        p = self.policy_config
        where = "tiers (--tier-host-gib / --tier-disk-gib)"
        _require(p.prefix_caching or p.allocator == "radix", where,
                 f"policy {self.policy!r} runs without prefix caching, so no chunk is ever looked up in a tier; "
                 f"choose vllm-prefix, vllm-v1 or sglang (or add --prefix-caching), or drop the tier options")
        _require(p.allocator in ("v1", "paged", "radix"), where,
                 f"tiers are modelled on the prefix caches of vllm-prefix, vllm-v1 and sglang, and policy "
                 f"{self.policy!r} uses the {p.allocator} allocator; choose one of those, or drop the tier options")
        bs = self.cache.block_size
        chunk = self.tier_chunk_tokens
        _require(chunk % bs == 0, "tiers.chunk_tokens (--tier-chunk-tokens)",
                 f"{chunk} is not a multiple of the block size {bs}; use a multiple of {bs} (e.g. {bs * max(1, chunk // bs)})")
        chunk_bytes = chunk * self.kv_bytes_per_token
        for name in ("host", "disk"):
            gib = getattr(t, f"{name}_gib")
            if gib:
                _require(gib * GiB >= chunk_bytes, f"tiers.{name}_gib (--tier-{name}-gib)",
                         f"{gib:g} GiB cannot hold one {chunk}-token chunk of {self.model.name}'s KV "
                         f"({chunk_bytes / GiB:.4f} GiB); give at least {chunk_bytes / GiB:.4f} GiB, or 0 to turn "
                         f"the {name} tier off")
        if t.disk_path is not None:
            import os
            d = t.disk_path
            ok = os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)
            _require(ok, "tiers.disk_path (--tier-disk-path)",
                     f"{d!r} is not a writable directory; create it or name a directory you can write")

    @property
    def tier_chunk_tokens(self) -> int:
        """Tokens per tier chunk: the configured chunk, else one block (64 tokens, at least a page,
        under the radix allocator)."""
        t = self.tiers
        if t is not None and t.chunk_tokens is not None:
            return t.chunk_tokens
        if self.policy_config.allocator == "radix":  # a token-granular pool: SGLang HiCache's 64-token pages
            return max(self.cache.block_size, 64)
        return self.cache.block_size

    # --- derived sizes -------------------------------------------------------------------------
    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads each GPU stores (replicated when TP exceeds the KV head count, as vLLM does)."""
        return max(1, self.model.num_kv_heads // self.tensor_parallel)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token on one GPU, all layers."""
        m = self.model
        return 2 * m.num_layers * self.kv_heads_per_gpu * m.head_size * m.dtype_bytes

    @property
    def block_bytes(self) -> int:
        """2 x layers x kv_heads x head_size x block_size x dtype_bytes (per GPU)."""
        return self.kv_bytes_per_token * self.cache.block_size

    @property
    def activation_bytes(self) -> float:
        """Peak activation estimate, standing in for vLLM's profiling run.

        max_num_batched_tokens x (4 x hidden + 2 x intermediate / TP) x dtype_bytes for the largest
        prefill batch, plus float32 logits for max_num_seqs sequences.
        """
        m, s = self.model, self.scheduler
        per_token = (4 * m.hidden_size + 2 * m.intermediate_size / self.tensor_parallel) * m.dtype_bytes
        return s.max_num_batched_tokens * per_token + s.max_num_seqs * m.vocab_size * 4

    @property
    def kv_memory_bytes(self) -> float:
        """GPU memory x utilization - weights per GPU - activation estimate."""
        return (self.gpu.memory_bytes * self.cache.gpu_memory_utilization
                - self.model.weight_bytes / self.tensor_parallel - self.activation_bytes)

    @property
    def num_gpu_blocks(self) -> int:
        if self.cache.num_gpu_blocks_override is not None:
            return self.cache.num_gpu_blocks_override
        return int(self.kv_memory_bytes // self.block_bytes)

    @property
    def watermark_blocks(self) -> int:
        """GPU blocks kept free at admission and swap-in: `policy_config.watermark_blocks` when set,
        else vLLM's `int(cache.watermark * num_gpu_blocks)`."""
        wm = self.policy_config.watermark_blocks
        return int(self.cache.watermark * self.num_gpu_blocks) if wm is None else wm

    @property
    def num_cpu_blocks(self) -> int:
        """Swap space // block bytes."""
        return int(self.cache.swap_space_gib * GiB // self.block_bytes)

    def replace(self, **changes: Any) -> "SimConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["num_gpu_blocks"] = self.num_gpu_blocks
        d["num_cpu_blocks"] = self.num_cpu_blocks
        d["block_bytes"] = self.block_bytes
        return d

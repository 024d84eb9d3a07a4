"""Every option of a replay, declared once.

Each :class:`Option` has its name (the config-file key, the `build_config` keyword and the sweep
axis name), its type, default, help, group, fixed choices, CLI spellings and the short name sweep
run directories use. The CLI flags of ``blocksim replay`` / ``demo``, the config-file keys, the
runner's defaults, the sweep's short names and the policy keys are all read from :data:`OPTIONS`.

Groups: ``preset`` (the policy preset), ``model`` (model, GPU and cache), ``scheduler``,
``policy`` (knobs overriding the preset; their default ``None`` keeps the preset's value) and
``run`` (options that shape the trace, not the configuration). Defaults of the model, cache and
scheduler options are the `blocksim.config` dataclasses' own field defaults.

`applies_to` names the part of the engine that reads a knob: set by the user while the chosen
allocator or scheduler ignores it, the knob is refused (`blocksim.policies.refuse_ignored_knobs`).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from blocksim.config import (
    ADDRESS_SPACES,
    EVICTION_POLICIES,
    FREE_ORDERS,
    PREEMPTION_MODES,
    RESERVATION_MODES,
    ONLOAD_MODES,
    SCHEDULE_POLICIES,
    WRITE_POLICIES,
    V0_RELEASES,
    CacheConfig,
    SchedulerConfig,
    SimConfig,
    TierConfig,
)

DEFAULT_POLICY = "vllm"
DEFAULT_MODEL = "llama-2-7b"
DEFAULT_GPU = "h100-80gb"
#: Step budget of chunked prefill when max_num_batched_tokens is not set.
CHUNKED_BUDGET_TOKENS = 512
#: vLLM V1's defaults for its OpenAI server (v0.11 `EngineArgs.get_batch_defaults`):
#: (max_num_batched_tokens, max_num_seqs) on GPUs of >= 70 GiB other than A100s ("large"), else "small".
V1_DEFAULTS = {"large": (8192, 1024), "small": (2048, 256)}

#: `Option.applies_to` values: the engine part that reads the knob.
PAGED = "paged"            # the paged block manager (allocator=paged)
CONTIGUOUS = "contiguous"  # the contiguous reservation manager (allocator=contiguous)
PREEMPTING = "preempting"  # a scheduler that preempts (not orca, not static) by vLLM v0's rules
BLOCKS = "blocks"          # a paged manager: vLLM v0's (allocator=paged) or vLLM V1's (allocator=v1)
V0 = "v0"                  # anything but vLLM V1's engine (allocator=v1), which neither swaps nor watermarks
V1 = "v1"                  # vLLM V1's engine only
VLLM_ENGINE = "vllm-engine"  # vLLM's engine parts (v0 and V1): every preset but sglang
SGLANG = "sglang"          # SGLang's scheduler and radix cache (allocator=radix, scheduler=sglang)

GROUP_TITLES = {
    "preset": "policy preset",
    "model": "model, GPU and cache",
    "scheduler": "scheduler",
    "policy": "policy knobs (override the --policy preset; names or 'package.module:Class')",
    "tiers": "KV tiers below the GPU (prefix-caching presets; docs/tiers.md)",
    "run": "run shaping",
}


def positive_float(text: str) -> float:
    """Argparse type: a finite number > 0."""
    v = float(text)
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return v


def positive_int(text: str) -> int:
    """Argparse type: an integer >= 1."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


@dataclass(frozen=True)
class Option:
    """One option. `type` is int, float, str, bool or tuple (a repeatable file list).

    `flags` are the CLI spellings (default ``--`` + the name with dashes); `parse` replaces `type`
    when argparse reads the flag; `negatable` gives a bool a ``--no-`` form; `short` is the
    sweep run-directory prefix (the full name when absent).
    """

    name: str
    type: type
    default: Any
    help: str | None
    group: str
    choices: tuple[str, ...] | None = None
    short: str | None = None
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    negatable: bool = True
    applies_to: str | None = None

    @property
    def cli_flags(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    @property
    def help_text(self) -> str:
        """`help`, ending with the default: the value, or for a policy knob the preset's."""
        text = self.help or ""
        if "default" in text:
            return text
        if self.group == "policy":
            default = "the --policy preset's"
        elif self.type is bool:
            default = "off" if not self.default else "on"
        elif self.default in (None, ()):
            default = "none"
        else:
            default = f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        return f"{text} (default {default})" if text else f"default {default}"

    @property
    def flag(self) -> str:
        """The main CLI spelling, for messages."""
        return self.cli_flags[0]


def _field_default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


_cache = CacheConfig()
_sched = SchedulerConfig()
_tp = _field_default(SimConfig, "tensor_parallel")
_tier = TierConfig()

OPTIONS: tuple[Option, ...] = (
    Option("policy", str, DEFAULT_POLICY, "preset: vllm (default), vllm-prefix, vllm-chunked, vllm-0.6, vllm-v1, "
           "orca-max, "
           "orca-pow2, orca-oracle, static, sglang (`blocksim policies`)", "preset"),
    # model, GPU and cache
    Option("model", str, DEFAULT_MODEL, f"model name from the catalog (default {DEFAULT_MODEL})", "model"),
    Option("gpu", str, DEFAULT_GPU, f"GPU name from the catalog (default {DEFAULT_GPU})", "model"),
    Option("catalog", tuple, (), "YAML/TOML file adding models and GPUs; repeatable", "model", metavar="FILE"),
    Option("tensor_parallel", int, _tp, f"GPUs the model is split over; each holds 1/TP of the weights and KV heads, "
           f"and a step adds two all-reduces per layer (t_comm_s) (default {_tp})", "model", short="tp", flags=("--tensor-parallel", "--tp")),
    Option("block_size", int, _cache.block_size, f"tokens per KV block (default {_cache.block_size})", "model",
           short="bs", applies_to=VLLM_ENGINE),
    Option("gpu_memory_utilization", float, _cache.gpu_memory_utilization,
           f"share of GPU memory for weights, activations and the KV cache (default {_cache.gpu_memory_utilization:g})",
           "model", short="util"),
    Option("swap_space_gib", float, _cache.swap_space_gib, f"CPU swap GiB (default {_cache.swap_space_gib:g})",
           "model", short="swap", flags=("--swap-space-gib", "--swap-space"), metavar="GIB", applies_to=V0),
    Option("watermark", float, _cache.watermark, f"fraction of GPU blocks kept free (default {_cache.watermark:g})",
           "model", short="wm", applies_to=PAGED),
    Option("num_gpu_blocks", int, _cache.num_gpu_blocks_override, "fix the GPU block count (default: derived from GPU memory as vLLM does)", "model",
           short="gpub"),
    # scheduler
    Option("max_num_seqs", int, _sched.max_num_seqs, f"most sequences running in one step (default {_sched.max_num_seqs}; vllm-v1: vLLM V1's default for the GPU, "
           f"{V1_DEFAULTS['large'][1]} on >= 70 GiB, else {V1_DEFAULTS['small'][1]})", "scheduler", short="seqs",
           applies_to=VLLM_ENGINE),
    Option("max_num_batched_tokens", int, None, "per-step token budget, decodes included; default "
           f"max(max_model_len, 2048) + max_num_seqs ({CHUNKED_BUDGET_TOKENS} with chunked prefill; vllm-v1: "
           f"{V1_DEFAULTS['large'][0]} on GPUs of >= 70 GiB but A100s, else {V1_DEFAULTS['small'][0]})", "scheduler",
           short="mbt", applies_to=VLLM_ENGINE),
    Option("long_prefill_token_threshold", int, None, "vllm-v1: most prompt tokens a request gets per step "
           "(default 0: no cap)", "scheduler", short="lpt", applies_to=V1),
    Option("preemption", str, _sched.preemption_mode, "how a preempted group gives back its memory: recompute, swap, or auto (vLLM's rule: recompute a "
           f"single sequence, swap a group of several) (default {_sched.preemption_mode})",
           "scheduler", choices=PREEMPTION_MODES, short="pre", applies_to=PREEMPTING),
    Option("cost_profile", str, None, "a measured profile (format blocksim-profile/1, from `blocksim profile`) "
           "for the profiled cost model, or roofline parameters (no format key, or blocksim-roofline/1); "
           "with --cost-model roofline a profile is fitted, not interpolated", "scheduler", metavar="FILE"),
    # policy knobs: None keeps the preset's value (see blocksim.config.PolicyConfig)
    Option("allocator", str, None, "paged | v1 | contiguous", "policy"),
    Option("free_order", str, None, "paged free-list reuse order", "policy", choices=FREE_ORDERS,
           applies_to=PAGED),
    Option("reservation", str, None, "contiguous reservation size", "policy", choices=RESERVATION_MODES,
           applies_to=CONTIGUOUS),
    Option("address_space", str, None, "contiguous placement", "policy", choices=ADDRESS_SPACES,
           applies_to=CONTIGUOUS),
    Option("prefix_caching", bool, None, "share full prompt blocks with equal prefix hashes "
           "(automatic prefix caching)", "policy", applies_to=BLOCKS),
    Option("chunked_prefill", bool, None, "split long prompts over steps under the token budget", "policy",
           applies_to=VLLM_ENGINE),
    Option("scheduler", str, None, "fcfs | priority | sjf | orca | static | v1 | v1-priority | sglang", "policy"),
    Option("victim", str, None, "preemption victim: newest | largest | fewest-blocks", "policy",
           applies_to=PREEMPTING),
    Option("watermark_blocks", int, None, "absolute watermark (replaces --watermark)", "policy", applies_to=PAGED),
    Option("cost_model", str, None, "auto (default: the shipped profile of the run's model, GPU, dtype and TP "
           "when blocksim/profiles has one, else roofline) | roofline | profiled | a plugin", "policy"),
    # SGLang's server arguments (policy sglang); defaults are SGLang's (blocksim.config.PolicyConfig)
    Option("schedule_policy", str, None, "SGLang waiting-queue order (default fcfs)", "policy",
           choices=SCHEDULE_POLICIES, short="sp", applies_to=SGLANG),
    Option("page_size", int, None, "SGLang tokens per KV page (default 1: token-granular)", "policy", short="ps",
           parse=positive_int, applies_to=SGLANG),
    Option("chunked_prefill_size", int, None, "SGLang chunk budget in tokens, -1 disables (default 8192)", "policy",
           short="cps", applies_to=SGLANG),
    Option("max_prefill_tokens", int, None, "SGLang input tokens per prefill batch (default 16384)", "policy",
           short="mpt", parse=positive_int, applies_to=SGLANG),
    Option("max_running_requests", int, None, "SGLang running-batch limit (default from the pool size)", "policy",
           short="mrr", parse=positive_int, applies_to=SGLANG),
    Option("init_new_token_ratio", float, None, "SGLang initial new-token ratio (default 0.7)", "policy",
           short="ntr", parse=positive_float, applies_to=SGLANG),
    Option("min_new_token_ratio_factor", float, None, "SGLang minimum ratio as a fraction of the initial one "
           "(default 0.14)", "policy", short="ntrmin", parse=positive_float, applies_to=SGLANG),
    Option("new_token_ratio_decay_steps", int, None, "SGLang decode steps from the initial to the minimum ratio "
           "(default 600)", "policy", short="ntrdecay", parse=positive_int, applies_to=SGLANG),
    Option("v0_release", str, None, "vLLM v0 release whose step rules apply: 0.1 (mixed steps), 0.2 (prompt-only "
           "steps), 0.4 (+ swap-ins charged to the token budget), 0.6.4 (+ admission on uncached tokens)", "policy",
           choices=V0_RELEASES, short="rel", applies_to=PREEMPTING),
    # KV tiers below the GPU (blocksim.config.TierConfig); a capacity above 0 turns a tier on
    Option("tier_host_gib", float, _tier.host_gib, "pinned host DRAM tier capacity in GiB (default 0: off)", "tiers",
           short="host", metavar="GIB"),
    Option("tier_host_eviction", str, _tier.host_eviction, "host tier eviction", "tiers",
           choices=EVICTION_POLICIES, short="hev"),
    Option("tier_host_write", str, _tier.host_write, "when a chunk is written to the host tier: when computed on "
           "the GPU, after --tier-write-hits GPU hits, or when the GPU evicts it", "tiers", choices=WRITE_POLICIES,
           short="hwr"),
    Option("tier_disk_gib", float, _tier.disk_gib, "disk tier capacity in GiB (default 0: off)", "tiers",
           short="disk", metavar="GIB"),
    Option("tier_disk_eviction", str, _tier.disk_eviction, "disk tier eviction", "tiers",
           choices=EVICTION_POLICIES, short="dev"),
    Option("tier_disk_write", str, _tier.disk_write, "when a chunk is written to the disk: when the tier above "
           "stores it, after --tier-write-hits hits there, or when it evicts it", "tiers", choices=WRITE_POLICIES,
           short="dwr"),
    Option("tier_disk_read_gbps", float, _tier.disk_read_gbps, f"disk read bandwidth, GB/s (default "
           f"{_tier.disk_read_gbps:g}, an assumed NVMe figure; a cost profile's measured tier tables replace the "
           f"transfer options)", "tiers", parse=positive_float, short="drbw"),
    Option("tier_disk_write_gbps", float, _tier.disk_write_gbps, f"disk write bandwidth, GB/s (default "
           f"{_tier.disk_write_gbps:g}, an assumed NVMe figure)", "tiers", parse=positive_float, short="dwbw"),
    Option("tier_disk_latency_s", float, _tier.disk_latency_s, f"fixed cost of one disk read or write, s (default "
           f"{_tier.disk_latency_s:g})", "tiers", short="dlat"),
    Option("tier_disk_path", str, _tier.disk_path, "directory the GPU tier executor keeps the disk tier in "
           "(checked writable)", "tiers", metavar="DIR"),
    Option("tier_write_hits", int, _tier.write_hits, "hits before write-through-selective writes a chunk "
           f"(default {_tier.write_hits})", "tiers", parse=positive_int, short="wh"),
    Option("tier_chunk_tokens", int, _tier.chunk_tokens, "tokens per tier chunk, a multiple of the block size "
           "(default: one block; 64 tokens under sglang)", "tiers", short="chunk"),
    Option("tier_onload", str, _tier.onload, "a request whose prefix is in a tier: waits for it (wait), waits at "
           "most --tier-onload-deadline-ms and recomputes the rest (deadline), or loads as much as the cost model "
           "says beats recomputing (recompute)", "tiers", choices=ONLOAD_MODES, short="onl"),
    Option("tier_onload_deadline_ms", float, _tier.onload_deadline_ms, "deadline of --tier-onload deadline, ms "
           f"(default {_tier.onload_deadline_ms:g})", "tiers", parse=positive_float, short="ddl"),
    # run shaping: applied to the trace by `replay`, not part of the configuration
    Option("max_requests", int, None, "replay only the first N requests (default: all)", "run", short="n", parse=positive_int),
    Option("rate_scale", float, 1.0, "multiply the request rate (default 1)", "run", short="x",
           parse=positive_float),
    Option("clip_to_model", bool, False, "clip requests longer than the model's max length (reports how many) "
           "instead of rejecting them", "run", negatable=False),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def names(*groups: str) -> tuple[str, ...]:
    """Option names of the given groups, in table order."""
    return tuple(o.name for o in OPTIONS if o.group in groups)


#: `build_config` keywords (everything but the preset and the run options).
CONFIG_OPTIONS = names("model", "scheduler", "policy", "tiers")
#: `TierConfig` fields by option name (``tier_`` + field).
TIER_KEYS = names("tiers")
#: `PolicyConfig` fields a user may set over the preset.
POLICY_KEYS = names("policy")
#: Options that shape the trace (count, rate, length clipping), not the configuration.
RUN_OPTIONS = names("run")
#: Keys a config file may hold.
FILE_KEYS = names("preset", "model", "scheduler", "policy", "tiers", "run")
#: `build_config` defaults, by option name.
DEFAULTS: dict[str, Any] = {name: BY_NAME[name].default for name in CONFIG_OPTIONS}
#: `replay` defaults of the run options.
RUN_DEFAULTS: dict[str, Any] = {name: BY_NAME[name].default for name in RUN_OPTIONS}
#: Short names in sweep run-directory names.
SHORT_NAMES: dict[str, str] = {o.name: o.short for o in OPTIONS if o.short}

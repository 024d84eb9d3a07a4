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
    FREE_ORDERS,
    PREEMPTION_MODES,
    RESERVATION_MODES,
    CacheConfig,
    SchedulerConfig,
    SimConfig,
)

DEFAULT_POLICY = "vllm"
DEFAULT_MODEL = "llama-2-7b"
DEFAULT_GPU = "h100-80gb"
#: Step budget of chunked prefill when max_num_batched_tokens is not set.
CHUNKED_BUDGET_TOKENS = 512

#: `Option.applies_to` values: the engine part that reads the knob.
PAGED = "paged"            # the paged block manager (allocator=paged)
CONTIGUOUS = "contiguous"  # the contiguous reservation manager (allocator=contiguous)
PREEMPTING = "preempting"  # a scheduler that preempts (not orca, not static)

GROUP_TITLES = {
    "preset": "policy preset",
    "model": "model, GPU and cache",
    "scheduler": "scheduler",
    "policy": "policy knobs (override the --policy preset; names or 'package.module:Class')",
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

OPTIONS: tuple[Option, ...] = (
    Option("policy", str, DEFAULT_POLICY, "preset: vllm (default), vllm-prefix, vllm-chunked, orca-max, "
           "orca-pow2, orca-oracle, static (`blocksim policies`)", "preset"),
    # model, GPU and cache
    Option("model", str, DEFAULT_MODEL, f"model name from the catalog (default {DEFAULT_MODEL})", "model"),
    Option("gpu", str, DEFAULT_GPU, f"GPU name from the catalog (default {DEFAULT_GPU})", "model"),
    Option("catalog", tuple, (), "YAML/TOML file adding models and GPUs; repeatable", "model", metavar="FILE"),
    Option("tensor_parallel", int, _tp, f"GPUs the model is split over; each holds 1/TP of the weights and KV heads "
           f"(default {_tp})", "model", short="tp", flags=("--tensor-parallel", "--tp")),
    Option("block_size", int, _cache.block_size, f"tokens per KV block (default {_cache.block_size})", "model",
           short="bs"),
    Option("gpu_memory_utilization", float, _cache.gpu_memory_utilization,
           f"share of GPU memory for weights, activations and the KV cache (default {_cache.gpu_memory_utilization:g})",
           "model", short="util"),
    Option("swap_space_gib", float, _cache.swap_space_gib, f"CPU swap GiB (default {_cache.swap_space_gib:g})",
           "model", short="swap", flags=("--swap-space-gib", "--swap-space"), metavar="GIB"),
    Option("watermark", float, _cache.watermark, f"fraction of GPU blocks kept free (default {_cache.watermark:g})",
           "model", short="wm", applies_to=PAGED),
    Option("num_gpu_blocks", int, _cache.num_gpu_blocks_override, "fix the GPU block count (default: derived from GPU memory as vLLM does)", "model",
           short="gpub"),
    # scheduler
    Option("max_num_seqs", int, _sched.max_num_seqs, f"most sequences running in one step (default {_sched.max_num_seqs})", "scheduler", short="seqs"),
    Option("max_num_batched_tokens", int, None, "per-step token budget, decodes included; default "
           f"max(max_model_len, 2048) + max_num_seqs ({CHUNKED_BUDGET_TOKENS} with chunked prefill)", "scheduler",
           short="mbt"),
    Option("preemption", str, _sched.preemption_mode, "how a preempted group gives back its memory: recompute, swap, or auto (vLLM's rule: recompute a "
           f"single sequence, swap a group of several) (default {_sched.preemption_mode})",
           "scheduler", choices=PREEMPTION_MODES, short="pre", applies_to=PREEMPTING),
    Option("cost_profile", str, None, "calibrated cost-model parameters, e.g. from python -m validation.profile (default: the "
           "catalog's roofline numbers)", "scheduler", metavar="JSON"),
    # policy knobs: None keeps the preset's value (see blocksim.config.PolicyConfig)
    Option("allocator", str, None, "paged | contiguous", "policy"),
    Option("free_order", str, None, "paged free-list reuse order", "policy", choices=FREE_ORDERS,
           applies_to=PAGED),
    Option("reservation", str, None, "contiguous reservation size", "policy", choices=RESERVATION_MODES,
           applies_to=CONTIGUOUS),
    Option("address_space", str, None, "contiguous placement", "policy", choices=ADDRESS_SPACES,
           applies_to=CONTIGUOUS),
    Option("prefix_caching", bool, None, "share full prompt blocks with equal prefix hashes (automatic prefix "
           "caching)", "policy", applies_to=PAGED),
    Option("chunked_prefill", bool, None, "split long prompts over steps under the token budget", "policy"),
    Option("scheduler", str, None, "fcfs | priority | sjf | orca | static", "policy"),
    Option("victim", str, None, "preemption victim: newest | largest | fewest-blocks", "policy",
           applies_to=PREEMPTING),
    Option("watermark_blocks", int, None, "absolute watermark (replaces --watermark)", "policy", applies_to=PAGED),
    Option("cost_model", str, None, "roofline, or a plugin", "policy"),
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
CONFIG_OPTIONS = names("model", "scheduler", "policy")
#: `PolicyConfig` fields a user may set over the preset.
POLICY_KEYS = names("policy")
#: Options that shape the trace (count, rate, length clipping), not the configuration.
RUN_OPTIONS = names("run")
#: Keys a config file may hold.
FILE_KEYS = names("preset", "model", "scheduler", "policy", "run")
#: `build_config` defaults, by option name.
DEFAULTS: dict[str, Any] = {name: BY_NAME[name].default for name in CONFIG_OPTIONS}
#: `replay` defaults of the run options.
RUN_DEFAULTS: dict[str, Any] = {name: BY_NAME[name].default for name in RUN_OPTIONS}
#: Short names in sweep run-directory names.
SHORT_NAMES: dict[str, str] = {o.name: o.short for o in OPTIONS if o.short}

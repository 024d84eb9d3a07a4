"""Roofline cost model: predicted time of one engine step, by component.

All times are seconds; rates come from the `GPUSpec` (GB/s = 1e9 B/s, TFLOP/s = 1e12 FLOP/s) derated
by efficiency factors. Per GPU under tensor parallelism (weights and heads divided by TP).

Components of a step (each a column `t_<name>_s` in steps.parquet):

* ``linear``: all matrix multiplies of the weights for T = prefill tokens + decoding sequences:
  ``max(2 * params / TP * T / (peak_flops * flops_eff), weight_bytes / TP / (hbm_bw * bw_eff))``
  (zero when T = 0).
* ``attn_prefill``: causal attention of the prefilled tokens: for a sequence with ``p`` new tokens
  after ``c`` cached ones, ``4 * layers * heads/TP * head_size * p * (c + p / 2)`` FLOPs at
  ``peak_flops * flops_eff``.
* ``attn_decode``: decode attention reads every context token's K and V once:
  ``ctx_tokens * kv_bytes_per_token / (hbm_bw * bw_eff)``.
* ``swap``: ``blocks * block_bytes / host_link_bw + copies * transfer_latency``; vLLM v0 issues one
  copy per block per layer for K and for V (``copies = blocks * 2 * layers``), which is why small
  blocks swap slowly. With ``swap_batched`` (one launch per cache tensor for all blocks, as
  `kernels.swap_blocks` does) ``copies = 2 * layers`` whatever the block count.
* ``copy``: copy-on-write block copies on the GPU: ``blocks * block_bytes * 2 / (hbm_bw * bw_eff)``
  (read + write), plus one launch.
* ``overhead``: a fixed per-step cost (scheduling, launches, sampling) when the step runs anything.
* ``comm`` (tensor_parallel N > 1 only; the column ``t_comm_s``): Megatron-style tensor parallelism
  all-reduces the hidden states twice per layer, after attention's output projection and after the
  MLP's down projection (both row-parallel), each message ``T * hidden * dtype_bytes`` bytes. One
  all-reduce takes ``allreduce_latency + 2 (N - 1) / N * bytes / (gpu_link_bw * link_eff)``: the
  ring algorithm of NCCL, whose reduce-scatter and all-gather phases each move ``(N - 1) / N`` of
  the message over every GPU's link (what nccl-tests calls bus bandwidth: ``busbw = algbw * 2 (N -
  1) / N``), bounded by the GPU-to-GPU link's one-way bandwidth; the latency is the catalog GPU's
  ``allreduce_latency_s`` (or `CostParams`'s, fitted on a profile's ``allreduce`` table), whatever
  N. The embedding and the LM head are taken as replicated (no all-reduce or gather of their own).

The factors come from `CostParams` (defaults below); ``--cost-profile`` reads them from a JSON of
parameters, or fits them on a measured profile's grids (`blocksim.cost.fit`).

The engine passes what a step holds beyond each component's own size (sampled sequences, the decode
batch, whether the step is decode-only, swap direction); the roofline ignores it, the profiled model
(`blocksim.cost.profiled`) reads it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from blocksim.config import ConfigError, SimConfig

COMPONENTS = ("linear", "attn_prefill", "attn_decode", "swap", "copy", "overhead")
#: All-reduces per layer under tensor parallelism (attention output, MLP output).
ALLREDUCES_PER_LAYER = 2


@dataclass(frozen=True)
class CostParams:
    """Efficiency factors and fixed costs; a cost profile JSON overrides any of them."""

    flops_efficiency: float = 0.6
    bw_efficiency: float = 0.8
    step_overhead_s: float = 0.003
    transfer_latency_s: float | None = None  # None: the GPU spec's value
    launch_s: float = 5e-6
    swap_batched: bool = False
    link_efficiency: float = 0.8  # share of the GPU-to-GPU link an all-reduce's bus bandwidth reaches
    allreduce_latency_s: float | None = None  # None: the GPU spec's value
    # Multipliers fitted by calibration, one per component (1.0 = the roofline as is).
    scale_linear: float = 1.0
    scale_attn_prefill: float = 1.0
    scale_attn_decode: float = 1.0
    scale_swap: float = 1.0
    scale_copy: float = 1.0

    def __post_init__(self) -> None:
        from blocksim.config import _typed
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "swap_batched":
                _typed(f"cost.{f.name}", v, bool)
            elif v is not None:
                _typed(f"cost.{f.name}", v, float)
        for f in ("flops_efficiency", "bw_efficiency", "link_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise ConfigError(f"cost.{f}: must be in (0, 1], got {v!r}")
        if self.step_overhead_s < 0:
            raise ConfigError("cost.step_overhead_s: must be >= 0")

    @classmethod
    def from_json(cls, path: str | Path) -> "CostParams":
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"cost profile {p}: not found")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"cost profile {p}: not valid JSON ({e})") from e
        return cls.from_dict(data, p)

    @classmethod
    def from_dict(cls, data, p: str | Path) -> "CostParams":
        """Parameters from a parsed parameter file: ``{"params": {...}}`` (other keys ignored) or a flat object."""
        params = data.get("params", data) if isinstance(data, dict) else data
        if not isinstance(params, dict):
            raise ConfigError(f"cost profile {p}: expected an object of parameters (or {{\"params\": {{...}}}}), "
                              f"got {type(params).__name__}")
        known = {f.name for f in fields(cls)}
        if "params" not in data:  # a flat object: its keys are the parameters
            params = {k: v for k, v in params.items() if k not in ("format", "source")}
        unknown = set(params) - known
        if unknown:
            raise ConfigError(f"cost profile {p}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        try:
            return cls(**params)
        except ConfigError as e:
            raise ConfigError(f"cost profile {p}: {e}") from None

    def to_dict(self) -> dict:
        return asdict(self)


class RooflineCostModel:
    """Predicts step times from a `SimConfig`. Methods accept numpy arrays for spans of decode steps."""

    name = "roofline"

    def __init__(self, config: SimConfig, params: CostParams | None = None, source: str | None = None) -> None:
        self.params = p = params or CostParams()
        self.source = source  # the file the parameters came from (a parameter file or a fitted profile)
        m, g, tp = config.model, config.gpu, config.tensor_parallel
        self.flops = g.fp16_tflops * 1e12 * p.flops_efficiency
        self.bw = g.hbm_bw_gbps * 1e9 * p.bw_efficiency
        self.link_bw = g.host_link_gbps * 1e9
        self.transfer_latency_s = g.transfer_latency_s if p.transfer_latency_s is None else p.transfer_latency_s
        self.linear_flops_per_token = 2.0 * m.num_params / tp
        self.weight_time_s = m.weight_bytes / tp / self.bw
        self.attn_flops_coef = 4.0 * m.num_layers * (m.num_heads // tp) * m.head_size
        self.kv_bytes_per_token = config.kv_bytes_per_token
        self.block_bytes = config.block_bytes
        self.copies_per_block = 2 * m.num_layers
        self.allreduces_per_step = ALLREDUCES_PER_LAYER * m.num_layers if tp > 1 else 0
        self.allreduce_bytes_per_token = m.hidden_size * m.dtype_bytes
        self.allreduce_latency_s = g.allreduce_latency_s if p.allreduce_latency_s is None else p.allreduce_latency_s
        self.ring_s_per_byte = 2 * (tp - 1) / tp / (g.gpu_link_gbps * 1e9 * p.link_efficiency)

    # --- components ------------------------------------------------------------------------------
    def linear(self, tokens: int, sequences: int = 0, decode_only: bool = False) -> float:
        """Weights' matrix multiplies for `tokens` tokens (`sequences` sampled, decode-only step: unused)."""
        if tokens <= 0:
            return 0.0
        return max(tokens * self.linear_flops_per_token / self.flops, self.weight_time_s) * self.params.scale_linear

    def attn_prefill(self, new_tokens: np.ndarray, cached_tokens: np.ndarray | None = None) -> float:
        if len(new_tokens) == 1:  # one prompt (most prompt steps): the same arithmetic on Python floats
            p = float(new_tokens[0])
            c = 0.0 if cached_tokens is None else float(cached_tokens[0])
            return float(self.attn_flops_coef * (p * (c + p / 2)) / self.flops) * self.params.scale_attn_prefill
        p = np.asarray(new_tokens, dtype=np.float64)
        c = 0.0 if cached_tokens is None else np.asarray(cached_tokens, dtype=np.float64)
        return float(self.attn_flops_coef * np.sum(p * (c + p / 2)) / self.flops) * self.params.scale_attn_prefill

    def attn_decode(self, ctx_tokens, batch: int = 0, decode_only: bool = False):
        """Seconds to read the KV of `ctx_tokens` context tokens (an int, or an array for a span) of
        `batch` decoding sequences (unused here)."""
        return ctx_tokens * (self.kv_bytes_per_token / self.bw) * self.params.scale_attn_decode

    def swap(self, blocks_in: int, blocks_out: int = 0) -> float:
        """Swap-in plus swap-out of the step, priced alike (the host link is symmetric here)."""
        blocks = blocks_in + blocks_out
        if blocks <= 0:
            return 0.0
        copies = self.copies_per_block * (1 if self.params.swap_batched else blocks)
        t = blocks * self.block_bytes / self.link_bw + copies * self.transfer_latency_s
        return t * self.params.scale_swap

    def copy(self, blocks: int) -> float:
        if blocks <= 0:
            return 0.0
        return (blocks * self.block_bytes * 2 / self.bw + self.params.launch_s) * self.params.scale_copy

    def allreduce(self, nbytes: float) -> float:
        """Seconds of one all-reduce of `nbytes` bytes (ring: latency + 2 (N - 1) / N * bytes / bus bandwidth)."""
        return self.allreduce_latency_s + nbytes * self.ring_s_per_byte

    def comm(self, tokens: int) -> float:
        """The step's tensor-parallel all-reduces for `tokens` tokens (0 at tensor_parallel 1)."""
        if tokens <= 0 or not self.allreduces_per_step:
            return 0.0
        return self.allreduces_per_step * self.allreduce(tokens * self.allreduce_bytes_per_token)

    def overhead(self, active: bool, decode_only: bool = False) -> float:
        return self.params.step_overhead_s if active else 0.0

    def describe(self) -> dict:
        """What summary.json records of this cost model (it has no grid for steps to leave, so no `report`)."""
        return {"name": self.name, "params": self.params.to_dict(), "profile": self.source}


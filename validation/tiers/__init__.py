"""Tiered KV cache on a real device: chunks moved between GPU blocks, page-locked host memory and
a disk file, checksummed, and timed (`TierExecutor`); a plan's ``tier_ops`` table read, checked
and replayed (`read_tier_ops`, `check_tier_ops`, `TierReplay`); transfer bandwidths measured
(`validation.tiers.bench`). ``docs/tier_executor.md`` describes the design and the figures."""

from validation.tiers.executor import TierExecutor
from validation.tiers.ops import MOVES, TierOpError, TierOps, check_tier_ops, read_tier_ops
from validation.tiers.replay import TierReplay, replay_tier_ops

__all__ = ["MOVES", "TierExecutor", "TierOpError", "TierOps", "TierReplay", "check_tier_ops", "read_tier_ops",
           "replay_tier_ops"]

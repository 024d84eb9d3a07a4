"""How the fast decode kernel is launched: context tokens per thread block (the split), the load
path (register loads or a ring of cp.async shared-memory stages), the cap on resident thread
blocks per SM, and whether each warp takes a whole work item. ``choose_launch`` is the rule;
``kernels/DESIGN.md`` gives the reason for each threshold.

A work item is a (sequence, KV head, group of up to ``HEADS_PER_CTA`` query heads) triple: one
thread block per item and split, or, with warp items, one warp per item and ``WARPS`` items per
thread block.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .layout import FP8

TILE = 16                 # context tokens per tensor-core step
HEADS_PER_CTA = 8         # query heads one thread block serves
WARPS = 4                 # warps per thread block
SMEM_LIMIT = 227 * 1024   # dynamic shared memory one thread block may have on sm_90
MIN_SPLIT_TOKENS = 1024   # shortest split worth a thread block when there is plenty of work ...
MIN_SPLIT_TOKENS_SMALL = 256  # ... and when there is little (under SMALL_TILES_PER_SM), where latency rules
CAPPED_CONTEXT = 2048     # whole contexts from this long run at most 2 thread blocks per SM (choose_launch)
WARP_ITEMS_CONTEXT = 256  # whole contexts from this long may run as warp items (choose_launch, warp_items_fit)
ONE_PER_SM_FILL = 0.9     # this fraction of the SMs busy with one block each: no split (choose_launch)
SMALL_TILES_PER_SM = 64   # fewer 16-token tiles per SM: a latency-bound problem (choose_split_tokens)
ONE_PER_SM_TILES = 16     # fewer tiles per SM: split launches aim at one block per SM (choose_launch)


@functools.lru_cache(maxsize=8)
def device_sms(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index``."""
    return torch.cuda.get_device_properties(index).multi_processor_count


class Tuning(NamedTuple):
    """Device-dependent launch choices of ``choose_launch``: resident blocks per SM that split
    launches aim at (one wave), and the ring depth of whole contexts of ``CAPPED_CONTEXT`` tokens
    or more at one block per SM."""

    split_ctas_per_sm: int = 2
    one_per_sm_stages: int = 3


# The H100 (SXM, about 30% less bandwidth than the H200) streams best with fewer blocks in flight.
# The key also matches the other H100 variants. Devices not listed get the defaults, the H200's.
TUNING = {"H100": Tuning(split_ctas_per_sm=1, one_per_sm_stages=2)}


def tuning_for(device_name: str) -> Tuning:
    """The ``TUNING`` entry whose key is part of ``device_name``, else the defaults."""
    return next((t for key, t in TUNING.items() if key in device_name), Tuning())


@functools.lru_cache(maxsize=8)
def device_tuning(index: int) -> Tuning:
    return tuning_for(torch.cuda.get_device_properties(index).name)


def whole_tokens(max_context_len: int) -> int:
    """The whole context as one split: ``max_context_len`` rounded up to a tile (at least one)."""
    return max(TILE, -(-max_context_len // TILE) * TILE)


def choose_split_tokens(num_seqs: int, num_heads: int, num_kv_heads: int, max_context_len: int,
                        num_sms: int = 132) -> int:
    """Context tokens per thread block, the rule for the register loads (3 blocks per SM). One
    split (the whole context) when the batch already gives at least 4 thread blocks per SM;
    otherwise enough splits for about 16 thread blocks per SM, but none shorter than
    ``MIN_SPLIT_TOKENS`` (``MIN_SPLIT_TOKENS_SMALL`` when the whole problem is under
    ``SMALL_TILES_PER_SM`` 16-token tiles per SM, where latency rules), rounded up to 64 tokens (a
    tile per warp) and at most the whole context. ``choose_launch`` has the rule for the cp.async
    ring."""
    ctas = work_items(num_seqs, num_heads, num_kv_heads)
    whole = whole_tokens(max_context_len)
    if ctas >= 4 * num_sms:
        return whole
    splits = -(-16 * num_sms // ctas)
    tiles_per_sm = ctas * (whole // TILE) / num_sms
    shortest = MIN_SPLIT_TOKENS if tiles_per_sm >= SMALL_TILES_PER_SM else MIN_SPLIT_TOKENS_SMALL
    split = max(shortest, -(-(-(-max_context_len // splits)) // 64) * 64)
    return min(split, whole)


def work_items(num_seqs: int, num_heads: int, num_kv_heads: int) -> int:
    """Thread blocks per split: (sequence, KV head, group of up to 8 query heads)."""
    return max(1, num_seqs * num_kv_heads * -(-(num_heads // num_kv_heads) // HEADS_PER_CTA))


class Launch(NamedTuple):
    """How ``paged_attention`` runs the fast kernel: context tokens per thread block, load path
    (0 = register loads, 2-4 = cp.async ring depth), the cap on resident thread blocks per SM
    (None: as many as fit) and whether each warp takes a whole work item (``warp_items``)."""

    split_tokens: int
    stages: int
    max_ctas_per_sm: int | None
    warp_items: bool = False


def choose_launch(num_seqs: int, num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
                  max_context_len: int, num_sms: int = 132, stages: int | None = None,
                  tuning: Tuning = Tuning()) -> Launch:
    """Split, load path and occupancy as ``paged_attention`` chooses them.

    Where the cp.async ring exists (float16 / bfloat16 caches, heads <= 128) and ``stages`` is
    None, a 2-stage ring at most 2 thread blocks per SM (8 warps per SM streaming, each with one
    tile in flight):

    * more blocks than SMs without splitting: the whole context, capped at 2 per SM from
      ``CAPPED_CONTEXT`` tokens (uncapped below, where each block's start-up weighs more); from
      ``WARP_ITEMS_CONTEXT`` tokens, warp items at most 2 per SM where a thread block per
      ``WARPS`` items makes one even wave that fills the SMs (``warp_items_fit``);
    * close to one block per SM (``ONE_PER_SM_FILL`` of the SMs or more): the whole context, one
      block per SM (no split to combine) with a 3-stage ring (``tuning.one_per_sm_stages`` from
      ``CAPPED_CONTEXT`` tokens);
    * fewer: the splits (multiples of 64 tokens, one tile per warp) that make one wave of
      ``tuning.split_ctas_per_sm`` blocks per SM, capped at that; short contexts thus get short
      splits, where latency rules. The smallest problems (under ``ONE_PER_SM_TILES`` tiles per
      SM) aim at one block per SM.

    Otherwise (float8 caches, heads over 128, or ``stages`` given): ``choose_split_tokens`` and
    ``choose_stages`` (or the given ``stages``), no cap."""
    ring = max_stages(head_size, dtype) >= 2
    if stages is not None or not ring:
        plain = choose_split_tokens(num_seqs, num_heads, num_kv_heads, max_context_len, num_sms)
        return Launch(plain, choose_stages(plain, head_size, dtype) if stages is None else int(stages), None)
    items = work_items(num_seqs, num_heads, num_kv_heads)
    whole = whole_tokens(max_context_len)
    if items > num_sms:
        if whole >= WARP_ITEMS_CONTEXT and warp_items_fit(num_seqs, work_items(1, num_heads, num_kv_heads), 2,
                                                          num_sms):
            return Launch(whole, 2, 2, True)
        return Launch(whole, 2, 2 if whole >= CAPPED_CONTEXT else None)
    if items >= ONE_PER_SM_FILL * num_sms and max_stages(head_size, dtype) >= 3:
        return Launch(whole, tuning.one_per_sm_stages if whole >= CAPPED_CONTEXT else 3, 1)
    small = items * (whole // TILE) < ONE_PER_SM_TILES * num_sms
    per_sm = 1 if small else tuning.split_ctas_per_sm
    return Launch(one_wave_split(items, max_context_len, per_sm, num_sms), 2, per_sm)


def warp_items_fit(num_seqs: int, pairs: int, per_sm: int, num_sms: int = 132) -> bool:
    """Whether whole contexts run as warp items: each warp one (sequence, KV head, head group) and
    every tile of it, a thread block ``WARPS`` consecutive (KV head, head group) ``pairs`` of one
    sequence. Only where every warp has an item (``pairs`` a multiple of ``WARPS``; idle warps
    cost more than the shared reads gain) and the ``num_seqs * pairs / WARPS`` blocks make one
    even wave: ``ONE_PER_SM_FILL`` of the SMs or more with n blocks each, for n up to ``per_sm``,
    and no SM with more (each block holds four whole items, so an uneven wave or a second wave
    leaves SMs idle at the end)."""
    if pairs % WARPS:
        return False
    blocks = num_seqs * pairs // WARPS
    return any(ONE_PER_SM_FILL * n * num_sms <= blocks <= n * num_sms for n in range(1, per_sm + 1))


def one_wave_split(items: int, max_context_len: int, per_sm: int, num_sms: int = 132) -> int:
    """Context tokens per thread block that make one wave of ``per_sm`` blocks per SM out of
    ``items`` (sequence, KV head, head group) triples: the whole context when they fill it
    already, else as many splits as fit, rounded up to 64 tokens (a tile per warp)."""
    whole = whole_tokens(max_context_len)
    if items >= per_sm * num_sms:
        return whole
    per_split = -(-max_context_len // (per_sm * num_sms // items))
    return max(TILE, min(whole, -(-per_split // 64) * 64))


def ring_smem_bytes(head_size: int, stages: int) -> int:
    """Dynamic shared memory of the cp.async variant (float16 / bfloat16 caches, heads <= 128) with
    ``stages`` stages per warp: one tile's key and value rows plus each lane's two block ids per
    warp and stage; at least the warps' combine buffer, which reuses it
    (``kernels/csrc/fast_decode.cuh``, ``Ring``)."""
    stage_bytes = 2 * TILE * head_size * 2 + 32 * 8
    return max(WARPS * stages * stage_bytes, WARPS * HEADS_PER_CTA * head_size * 4)


def max_stages(head_size: int, dtype: torch.dtype) -> int:
    """The deepest ring (2 to 4 stages) that fits a thread block's shared memory; 0 for float8
    caches and head sizes over 128, which use the register loads only."""
    if dtype == FP8 or head_size > 128:
        return 0
    return max((s for s in (2, 3, 4) if ring_smem_bytes(head_size, s) <= SMEM_LIMIT), default=0)


def choose_stages(split_tokens: int, head_size: int, dtype: torch.dtype) -> int:
    """The load path for a given split: a 2-stage cp.async ring wherever the ring exists
    (float16 / bfloat16 caches, heads <= 128), register loads otherwise. The ring is faster than
    the register loads on every headline shape, and 2 stages as fast as 3 at 2 or 3 blocks per
    SM."""
    return 2 if max_stages(head_size, dtype) >= 2 else 0


def choose_prefetch(num_seqs: int, num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
                    num_sms: int = 132) -> bool:
    """A second tile in flight per warp (register loads) when the batch alone gives fewer than one
    thread block per 8 SMs (e.g. one sequence of 8 KV heads: latency-bound); float16 / bfloat16
    with heads <= 128 only (slower with float8)."""
    groups = -(-(num_heads // num_kv_heads) // HEADS_PER_CTA)
    return (num_seqs * num_kv_heads * groups * 8 < num_sms and head_size <= 128
            and dtype in (torch.float16, torch.bfloat16))

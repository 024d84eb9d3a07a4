"""The fast paged decode kernel (issue 8): its cache layout, cache writes, split rule and checked
entry point. ``kernels.paged_attention(..., impl="fast")`` calls ``paged_attention`` here.

Layout (one layer, key and value alike)::

    [num_blocks, block_size, num_kv_heads, head_size]

Token ``t`` of a sequence is row ``t % block_size`` of block ``block_table[t // block_size]``;
its slot is ``block * block_size + offset`` as in the vLLM layout. The kernel reads the caches
through their strides, so several storage orders work: ``"NHD"`` (contiguous as written above,
all KV heads of a token side by side: vLLM's flash layout, and one contiguous row per token for
``reshape_and_cache``), ``"HND"`` (``[num_blocks, num_kv_heads, block_size, head_size]`` storage,
handed over as a transposed view, so one block of one KV head is contiguous) and ``"H2ND"``
(``[num_blocks, num_kv_heads, 2, block_size, head_size]``: one storage for both caches, the keys
and values of one block of one KV head side by side). H2ND is the default of
``allocate_fast_kv_cache``: HND measured 1-5% faster than NHD on every headline shape, and H2ND
0.0-0.8% faster than HND on nine shapes, never slower (kernels/NOTES.md).

Element types: float16 or bfloat16 caches with a query of the same type, or float8_e4m3fn caches
(per-tensor scales ``k_scale``, ``v_scale``: the cache holds ``key / k_scale``) with a float16
query. Block sizes: powers of two from 8 to 256. Head sizes: ``layout.SUPPORTED_HEAD_SIZES``.

Work split: one thread block per (sequence, KV head, group of up to 8 query heads, split of
``split_tokens`` context tokens): each KV head is read once for all the query heads of its GQA
group. When the batch alone gives too few thread blocks to fill the GPU, the context is split and
a second kernel combines the splits, launched as a programmatic dependent launch on Hopper
(``pdl``). With warp items (``warp_items``, on the 2-stage ring) each warp takes a whole item
instead, and a thread block four consecutive KV heads of a sequence, whose parts of each cache
block its warps then read together. Load path: a ring of shared-memory stages per warp filled
with whole-line ``cp.async`` copies (float16 / bfloat16, heads <= 128), else register loads.
``choose_launch`` picks the split, the load path, how many thread blocks may share an SM and
whether warps take whole items.
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import torch

from . import _checks, reference_fast
from .layout import SUPPORTED_HEAD_SIZES

FAST_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
FAST_DTYPES = (torch.float16, torch.bfloat16)
FP8 = reference_fast.FP8
STORAGES = ("NHD", "HND", "H2ND")
DEFAULT_STORAGE = "H2ND"
TILE = 16                 # context tokens per tensor-core step
HEADS_PER_CTA = 8         # query heads one thread block serves
MIN_SPLIT_TOKENS = 1024   # shortest split worth a thread block when there is plenty of work ...
MIN_SPLIT_TOKENS_SMALL = 256  # ... and when there is little (under 64 tiles per SM): see NOTES.md
CAPPED_CONTEXT = 2048     # whole contexts from this long run at most 2 thread blocks per SM (choose_launch)
WARP_ITEMS_CONTEXT = 256  # whole contexts from this long may run as warp items (choose_launch, warp_items_fit)
ONE_PER_SM_FILL = 0.9     # this fraction of the SMs busy with one block each: no split (choose_launch)
SMALL_TILES_PER_SM = 64   # fewer 16-token tiles per SM: a latency-bound problem (choose_split_tokens)
ONE_PER_SM_TILES = 16     # fewer tiles per SM: split launches aim at one block per SM (choose_launch)
PREFETCH = None           # None: choose_prefetch; a second tile in flight per warp helps only latency-bound shapes
PDL = True                # the split reduce as a programmatic dependent launch (Hopper and later)
STAGES = None             # None: choose_launch; 0 = register loads, 2-4 = cp.async shared-memory ring depth
SMEM_LIMIT = 227 * 1024   # dynamic shared memory one thread block may have on sm_90
WARPS = 4


def fast_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
    return (num_blocks, block_size, num_kv_heads, head_size)


def allocate_fast_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           dtype: torch.dtype = torch.float16, device: str | torch.device = "cuda", *,
                           storage: str = DEFAULT_STORAGE) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's ``(key_cache, value_cache)``, each of shape
    ``[num_blocks, block_size, num_kv_heads, head_size]`` (uninitialised), stored ``"H2ND"``
    (the default: views of one ``[num_blocks, num_kv_heads, 2, block_size, head_size]`` storage,
    fastest on the H200), ``"HND"`` (transposed views of ``[num_blocks, num_kv_heads, block_size,
    head_size]`` storages) or ``"NHD"`` (contiguous); see the module docstring."""
    if dtype not in (*FAST_DTYPES, torch.float32, FP8):
        raise ValueError(f"dtype {dtype} not supported; use float16, bfloat16, float32 (CPU) or {FP8}")
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")

    if storage == "H2ND":
        both = torch.empty(num_blocks, num_kv_heads, 2, block_size, head_size, dtype=dtype, device=device)
        return both[:, :, 0].transpose(1, 2), both[:, :, 1].transpose(1, 2)

    def one():
        if storage == "NHD":
            return torch.empty(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype, device=device)
        return torch.empty(num_blocks, num_kv_heads, block_size, head_size, dtype=dtype, device=device).transpose(1, 2)
    return one(), one()


def fp8_scale(x: torch.Tensor) -> float:
    """A per-tensor scale that maps ``x``'s largest magnitude to float8_e4m3fn's largest finite
    value (448); 1.0 for an all-zero tensor."""
    amax = float(x.detach().abs().max()) if x.numel() else 0.0
    return amax / reference_fast.FP8_MAX if amax > 0 else 1.0


@functools.lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class Tuning(NamedTuple):
    """Device-dependent launch choices of ``choose_launch`` where the H200 and the H100 measured
    differently (kernels/BENCHMARKS.md, the H100 run): resident blocks per SM that split launches
    aim at (one wave), and the ring depth of whole contexts of ``CAPPED_CONTEXT`` tokens or more
    at one block per SM."""

    split_ctas_per_sm: int = 2
    one_per_sm_stages: int = 3


# Measured on an H100 80GB HBM3 (SXM; about 30% less bandwidth than the H200): it streamed best
# with fewer blocks in flight. The key also matches the other H100 variants, which have less
# bandwidth still (not measured). Devices not listed get the H200's choices.
TUNING = {"H100": Tuning(split_ctas_per_sm=1, one_per_sm_stages=2)}


def tuning_for(device_name: str) -> Tuning:
    """The ``TUNING`` entry whose key is part of ``device_name``, else the defaults."""
    return next((t for key, t in TUNING.items() if key in device_name), Tuning())


@functools.lru_cache(maxsize=8)
def device_tuning(index: int) -> Tuning:
    return tuning_for(torch.cuda.get_device_properties(index).name)


def choose_split_tokens(num_seqs: int, num_heads: int, num_kv_heads: int, max_context_len: int,
                        num_sms: int = 132) -> int:
    """Context tokens per thread block, the rule for the register loads (3 blocks per SM). One
    split (the whole context) when the batch already gives at least 4 thread blocks per SM;
    otherwise enough splits for about 16 thread blocks per SM, but none shorter than
    ``MIN_SPLIT_TOKENS`` (``MIN_SPLIT_TOKENS_SMALL`` when the whole problem is under 64 16-token
    tiles per SM, where latency rules), rounded up to 64 tokens (a tile per warp).
    ``choose_launch`` has the rule for the cp.async ring."""
    ctas = work_items(num_seqs, num_heads, num_kv_heads)
    whole = max(TILE, -(-max_context_len // TILE) * TILE)
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
    """Split, load path and occupancy as ``paged_attention`` chooses them (kernels/NOTES.md,
    eleventh version, has the measurements behind each branch).

    Where the cp.async ring exists (float16 / bfloat16 caches, heads <= 128) and ``stages`` is
    None, a 2-stage ring, which measured best on the H200 with at most 2 thread blocks per SM
    (8 warps per SM streaming, each with one tile in flight):

    * more blocks than SMs without splitting: the whole context, capped at 2 per SM from
      ``CAPPED_CONTEXT`` tokens (3 per SM below, where each block's start-up weighs more); from
      ``WARP_ITEMS_CONTEXT`` tokens, warp items at most 2 per SM where a thread block per
      ``WARPS`` items makes one even wave that fills the SMs (``warp_items_fit``);
    * close to one block per SM (``ONE_PER_SM_FILL`` of the SMs or more): the whole context, one
      block per SM with a 3-stage ring (``tuning.one_per_sm_stages``; no split to combine);
    * fewer: the splits (multiples of 64 tokens, one tile per warp) that make one wave of 2
      blocks per SM (``tuning.split_ctas_per_sm``), capped at that; short contexts thus get short
      splits, where latency rules. The smallest problems (under ``ONE_PER_SM_TILES`` tiles per
      SM) aim at one block per SM.

    Otherwise (float8 caches, heads over 128, or ``stages`` given): ``choose_split_tokens`` and
    ``choose_stages`` (or the given ``stages``), no cap."""
    ring = max_stages(head_size, dtype) >= 2
    if stages is not None or not ring:
        plain = choose_split_tokens(num_seqs, num_heads, num_kv_heads, max_context_len, num_sms)
        return Launch(plain, choose_stages(plain, head_size, dtype) if stages is None else int(stages), None)
    items = work_items(num_seqs, num_heads, num_kv_heads)
    whole = max(TILE, -(-max_context_len // TILE) * TILE)
    if items > num_sms:
        if whole >= WARP_ITEMS_CONTEXT and warp_items_fit(num_seqs, work_items(1, num_heads, num_kv_heads), 2,
                                                          num_sms):
            return Launch(whole, 2, 2, True)
        return Launch(whole, 2, 2 if whole >= CAPPED_CONTEXT else None)
    if items >= ONE_PER_SM_FILL * num_sms and max_stages(head_size, dtype) >= 3:
        # short contexts keep 3 stages everywhere (16 x 512 on the H100: 3 stages 1.15x SDPA's time, 2 stages 1.21x)
        return Launch(whole, tuning.one_per_sm_stages if whole >= CAPPED_CONTEXT else 3, 1)
    small = items * (whole // TILE) < ONE_PER_SM_TILES * num_sms
    per_sm = 1 if small else tuning.split_ctas_per_sm
    return Launch(one_wave_split(items, max_context_len, per_sm, num_sms), 2, per_sm)


def warp_items_fit(num_seqs: int, pairs: int, per_sm: int, num_sms: int = 132) -> bool:
    """Whether whole contexts run as warp items: each warp one (sequence, KV head, head group) and
    every tile of it, a thread block ``WARPS`` consecutive (KV head, head group) ``pairs`` of one
    sequence. Only where every warp has an item (``pairs`` a multiple of ``WARPS``: with 1, 2 or 5
    KV heads idle warps made it 1-40% slower) and the ``num_seqs * pairs / WARPS`` blocks make one
    even wave: ``ONE_PER_SM_FILL`` of the SMs or more with n blocks each, for n up to ``per_sm``,
    and no SM with more. Measured on the H200: 128 x 2048 and 32 x 4096 (256 blocks) level with
    SDPA instead of 0.6-0.8% slower; 64 x 8192 and 60 x 4096 (128 and 120 blocks) faster; at 1024
    tokens, 32 x 1024 with 32 KV heads and 64 x 1024 with 8 faster by 3.6-5.8%, and at 256 and 512
    tokens by 0.4-3% (shorter contexts not measured). An uneven wave
    loses, since each block holds four whole items (96 x 2048: 192 blocks, 6% slower), as do more
    blocks than one wave (256 x 2048: 512 blocks) and splits; kernels/NOTES.md, thirteenth
    version."""
    if pairs % WARPS:
        return False
    blocks = num_seqs * pairs // WARPS
    return any(ONE_PER_SM_FILL * n * num_sms <= blocks <= n * num_sms for n in range(1, per_sm + 1))


def one_wave_split(items: int, max_context_len: int, per_sm: int, num_sms: int = 132) -> int:
    """Context tokens per thread block that make one wave of ``per_sm`` blocks per SM out of
    ``items`` (sequence, KV head, head group) triples: the whole context when they fill it
    already, else as many splits as fit, rounded up to 64 tokens (a tile per warp)."""
    whole = max(TILE, -(-max_context_len // TILE) * TILE)
    if items >= per_sm * num_sms:
        return whole
    per_split = -(-max_context_len // (per_sm * num_sms // items))
    return max(TILE, min(whole, -(-per_split // 64) * 64))


def ring_smem_bytes(head_size: int, stages: int) -> int:
    """Dynamic shared memory of the cp.async variant (float16 / bfloat16 caches, heads <= 128) with ``stages``
    stages per warp: one tile's key and value rows plus each lane's two block ids per warp and
    stage; at least the warps' combine buffer, which reuses it (kernels/csrc/fast_decode.cuh,
    ``Ring``)."""
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
    (float16 / bfloat16 caches, heads <= 128), register loads otherwise. The ring measured faster
    than the register loads on every headline shape (ninth version in kernels/NOTES.md), and 2
    stages at least as fast as 3 at 2 or 3 blocks per SM (eleventh version)."""
    return 2 if max_stages(head_size, dtype) >= 2 else 0


def choose_prefetch(num_seqs: int, num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
                    num_sms: int = 132) -> bool:
    """A second tile in flight per warp when the batch alone gives fewer than one thread block per
    8 SMs (e.g. one sequence of 8 KV heads: latency-bound, where it was the fastest variant in three
    H200 runs; at 8 sequences x 8 KV heads it measured 3% slower); float16/bfloat16 with heads <= 128
    only (it measured slower with fp8, BENCHMARKS.md)."""
    groups = -(-(num_heads // num_kv_heads) // HEADS_PER_CTA)
    return (num_seqs * num_kv_heads * groups * 8 < num_sms and head_size <= 128
            and dtype in (torch.float16, torch.bfloat16))


def _check_caches(query, key_cache, value_cache, num_kv_heads, block_size) -> int:
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        _checks._tensor(name, c)
        if c.dim() != 4:
            raise ValueError(f"{name} must be [num_blocks, block_size, num_kv_heads, head_size], "
                             f"got shape {tuple(c.shape)}")
    if tuple(key_cache.shape) != tuple(value_cache.shape) or key_cache.dtype != value_cache.dtype:
        raise ValueError(f"key_cache {key_cache.dtype} {tuple(key_cache.shape)} and value_cache "
                         f"{value_cache.dtype} {tuple(value_cache.shape)} must match")
    nb, bs, kvh, hs = key_cache.shape
    qd, cd = query.dtype, key_cache.dtype
    if query.is_cuda:
        ok = cd == qd if qd in FAST_DTYPES else False
        ok = ok or (cd == FP8 and qd == torch.float16)
        if not ok:
            raise ValueError(f"impl='fast' on CUDA takes a float16 or bfloat16 query with caches of the same dtype, "
                             f"or float8_e4m3fn caches with a float16 query; got query {qd}, caches {cd}")
    elif not (cd == qd or cd == FP8):
        raise ValueError(f"caches dtype {cd} differs from query dtype {qd}")
    _checks.check_cache_geometry(hs, bs, kvh, query.shape[2], block_size, num_kv_heads, FAST_BLOCK_SIZES,
                                 " by impl='fast'")
    align = 16 // key_cache.element_size() if key_cache.element_size() > 1 else 8
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        if c.stride(3) != 1 or any(s % align for s in c.stride()[:3]) or c.data_ptr() % 16:
            raise ValueError(f"{name}: each head row must be contiguous and start on a {align * c.element_size()}-byte "
                             f"boundary (strides {c.stride()})")
    if key_cache.device != value_cache.device:
        raise ValueError(f"key_cache is on {key_cache.device} but value_cache on {value_cache.device}")
    if nb >= 2**31:
        raise ValueError(f"{nb} blocks: block ids must fit in int32")
    return nb


def check_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, context_lens,
                    block_size, max_context_len, alibi_slopes, k_scale, v_scale, validate: bool) -> int:
    """Checks ``paged_attention``'s arguments; returns the max context length to use."""
    _checks._tensor("query", query)
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size], got shape {tuple(query.shape)}")
    num_seqs, num_heads, head_size = query.shape
    if query.dtype not in (*FAST_DTYPES, torch.float32):
        raise ValueError(f"query dtype {query.dtype} not supported by impl='fast'")
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise ValueError(f"head_size {head_size} not supported; use one of {SUPPORTED_HEAD_SIZES}")
    nb = _check_caches(query, key_cache, value_cache, num_kv_heads, block_size)
    if num_heads % int(num_kv_heads):
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    for name, v in (("scale", scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(v, (int, float)):
            raise ValueError(f"{name} must be a float, got {type(v).__name__}")
    if key_cache.dtype != FP8 and (k_scale != 1.0 or v_scale != 1.0):
        raise ValueError("k_scale / v_scale apply to float8_e4m3fn caches only")
    _checks.check_sequences(out, query, key_cache, block_tables, context_lens, alibi_slopes)
    return _checks.check_context(block_tables, context_lens, max_context_len, key_cache.shape[1], nb, validate)


def paged_attention(out: torch.Tensor | None, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                    max_context_len: int | None, alibi_slopes: torch.Tensor | None = None, *,
                    k_scale: float = 1.0, v_scale: float = 1.0, split_tokens: int | None = None,
                    prefetch: bool | None = PREFETCH, pdl: bool = PDL, stages: int | None = STAGES,
                    max_ctas_per_sm: int | None = None, warp_items: bool | None = None,
                    validate: bool = True) -> torch.Tensor:
    """Decode attention of one query token per sequence over caches in the fast layout.

    Arguments as ``kernels.paged_attention`` (``ops.py``), except that the caches are
    ``[num_blocks, block_size, num_kv_heads, head_size]`` (module docstring), plus:

    Args:
        k_scale, v_scale: float8_e4m3fn caches hold ``key / k_scale`` and ``value / v_scale``.
        split_tokens: context tokens per thread block (a multiple of 16), or None for
            ``choose_launch`` (with the device's ``device_tuning``). Ignored on CPU.
        stages: 2 to 4: each warp streams its tiles through a ring of that many shared-memory
            stages (cp.async, float16 / bfloat16 caches, heads <= 128), so ``stages - 1`` tiles
            are in flight while one is computed; 0: loads straight into registers; None chooses
            with ``choose_launch`` (``choose_stages`` when ``split_tokens`` is given). The deepest
            ring that fits is ``max_stages(head_size, dtype)``.
        prefetch: with ``stages=0``, keep two tiles in flight per warp in registers (head sizes
            <= 128; larger heads keep one); None chooses with ``choose_prefetch``.
        max_ctas_per_sm: at most this many thread blocks resident per SM (the launch asks for
            enough shared memory that no more fit); None: ``choose_launch``'s cap when
            ``split_tokens`` is None, else as many as fit. Ignored on CPU.
        warp_items: each warp takes a whole work item (sequence, KV head, head group, split), every
            tile of it, and a thread block ``WARPS`` consecutive KV heads (or head groups) of one
            sequence, so the block's warps read the parts of each cache block at about the same
            time; needs the 2-stage ring. None: ``choose_launch``'s choice when ``split_tokens``
            is None, else False. Ignored on CPU.
        pdl: with splits, launch the kernel that combines them as a programmatic dependent launch
            (compute capability 9.0 and later; ignored before): it is scheduled while the attention
            kernel's last wave runs instead of after it, hiding its launch latency.

    Returns:
        ``out``.
    """
    max_context_len = check_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                                      context_lens, block_size, max_context_len, alibi_slopes, k_scale, v_scale,
                                      validate)
    head_size = query.shape[2]
    if stages is not None and stages != 0:
        deepest = max_stages(head_size, key_cache.dtype)
        if deepest == 0:
            raise ValueError(f"stages must be 0 for head_size {head_size} with {key_cache.dtype} caches: the "
                             f"cp.async ring takes float16 / bfloat16 caches with head sizes <= 128, got {stages}")
        if not 2 <= stages <= deepest:
            raise ValueError(f"stages must be 0 or 2 to {deepest} for head_size {head_size} (shared memory), "
                             f"got {stages}")
    if max_ctas_per_sm is not None and not (isinstance(max_ctas_per_sm, numbers.Integral)
                                            and not isinstance(max_ctas_per_sm, bool) and 1 <= max_ctas_per_sm <= 32):
        raise ValueError(f"max_ctas_per_sm must be None or an integer from 1 to 32, got {max_ctas_per_sm!r}")
    if not (warp_items is None or isinstance(warp_items, bool)):
        raise ValueError(f"warp_items must be None, True or False, got {warp_items!r}")
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if not query.is_cuda:
        return reference_fast.paged_attention(out, query, key_cache, value_cache, int(num_kv_heads), float(scale),
                                              block_tables, context_lens, block_size, max_context_len, alibi_slopes,
                                              k_scale=float(k_scale), v_scale=float(v_scale))
    num_seqs, num_heads, head_size = query.shape
    if num_seqs == 0:
        return out
    given_stages = stages
    if split_tokens is None:
        launch = choose_launch(num_seqs, num_heads, int(num_kv_heads), head_size, key_cache.dtype, max_context_len,
                               _num_sms(query.device.index or 0), stages, device_tuning(query.device.index or 0))
        split_tokens, stages = launch.split_tokens, launch.stages
        if max_ctas_per_sm is None:
            max_ctas_per_sm = launch.max_ctas_per_sm
        if warp_items is None:
            warp_items = launch.warp_items
    elif stages is None:
        stages = choose_stages(int(split_tokens), head_size, key_cache.dtype)
    if warp_items and given_stages is None and max_stages(head_size, key_cache.dtype) >= 2:
        stages = 2  # warp items asked for: the ring depth they run on, whatever the rule chose
    split_tokens = int(split_tokens)
    stages = int(stages)
    warp_items = bool(warp_items)
    if warp_items and stages != 2:
        raise ValueError(f"warp_items runs on the 2-stage cp.async ring (float16 / bfloat16 caches, heads <= 128), "
                         f"got {'stages=' + str(stages) if given_stages is not None else 'no ring'} for head_size "
                         f"{head_size} with {key_cache.dtype} caches")
    if prefetch is None:
        prefetch = choose_prefetch(num_seqs, num_heads, int(num_kv_heads), head_size, key_cache.dtype,
                                   _num_sms(query.device.index or 0))
    if split_tokens < TILE or split_tokens % TILE:
        raise ValueError(f"split_tokens must be a positive multiple of {TILE}, got {split_tokens}")
    max_splits = max(1, -(-max_context_len // split_tokens))
    if query.stride(2) != 1 or query.stride(1) != head_size or query.stride(0) % 8 or query.data_ptr() % 16:
        query = query.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.to(torch.float32).contiguous()
    f32 = dict(dtype=torch.float32, device=query.device)
    if max_splits > 1:
        part_out = torch.empty(num_seqs, num_heads, max_splits, head_size, **f32)
        part_max = torch.empty(num_seqs, num_heads, max_splits, **f32)
        part_sum = torch.empty(num_seqs, num_heads, max_splits, **f32)
    else:
        part_out = part_max = part_sum = torch.empty(0, **f32)
    from ._build import extension

    extension().fast_decode(out, part_out, part_max, part_sum, query, key_cache, value_cache, int(num_kv_heads),
                            float(scale) * float(k_scale), float(v_scale), block_tables, context_lens, split_tokens,
                            max_splits, bool(prefetch), bool(pdl), stages, int(max_ctas_per_sm or 0), warp_items,
                            alibi_slopes,
                            torch.cuda.current_stream(query.device).cuda_stream)
    return out


def reshape_and_cache_fast(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                      k_scale: float = 1.0, v_scale: float = 1.0, validate: bool = True) -> None:
    """Writes new tokens' keys and values (``[num_tokens, num_kv_heads, head_size]``) into their
    slots of fast-layout caches (``slot_mapping[i] = block * block_size + offset``, negative =
    padding, skipped). In the NHD storage a token's row is contiguous, so this is one indexed
    copy per cache (torch indexing, CPU or CUDA); float8 caches store ``key / k_scale``,
    ``value / v_scale`` saturated at +-448."""
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        _checks._tensor(name, c)
        if c.dim() != 4:
            raise ValueError(f"{name} must be [num_blocks, block_size, num_kv_heads, head_size]")
    nb, bs, kvh, hs = key_cache.shape
    for name, t in (("key", key), ("value", value)):
        _checks._tensor(name, t)
        if t.dim() != 3 or tuple(t.shape[1:]) != (kvh, hs):
            raise ValueError(f"{name} must be [num_tokens, {kvh}, {hs}] to match the caches, got {tuple(t.shape)}")
    if key.shape[0] != value.shape[0]:
        raise ValueError(f"key has {key.shape[0]} tokens but value has {value.shape[0]}")
    _checks._index_tensor("slot_mapping", slot_mapping, 1)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    if validate and slot_mapping.numel():
        slots = slot_mapping[slot_mapping >= 0]
        if slots.numel():
            if int(slots.max()) >= nb * bs:
                raise ValueError(f"slot {int(slots.max())} is outside the cache ({nb} blocks x {bs} tokens)")
            if slots.unique().numel() != slots.numel():
                raise ValueError("slot_mapping writes a slot twice")
    reference_fast.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                     k_scale=float(k_scale), v_scale=float(v_scale))

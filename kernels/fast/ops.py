"""The fast decode kernel's checked operations: ``paged_attention`` (decode attention over caches
in the fast layout, ``layout.py``) and ``reshape_and_cache_fast``. CUDA tensors run the kernel,
with the split, load path and occupancy of ``launch.choose_launch`` unless given; CPU tensors run
the reference (``reference.py``). ``kernels.paged_attention(..., impl="fast")`` calls
``paged_attention`` here.

Head sizes: ``kernels.vllm.layout.SUPPORTED_HEAD_SIZES``; element types and block sizes: see
``layout.py``. ``kernels/DESIGN.md`` describes the kernel.
"""

from __future__ import annotations

import numbers

import torch

from .. import _checks
from .._build import extension
from ..vllm.layout import SUPPORTED_HEAD_SIZES
from . import reference
from .launch import (TILE, choose_launch, choose_prefetch, choose_stages, device_sms, device_tuning,
                     max_stages)
from .layout import FAST_BLOCK_SIZES, FAST_DTYPES, FP8

PREFETCH = None           # None: choose_prefetch; a second tile in flight per warp helps only latency-bound shapes
PDL = True                # the split reduce as a programmatic dependent launch (Hopper and later)
STAGES = None             # None: choose_launch; 0 = register loads, 2-4 = cp.async shared-memory ring depth


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

    Arguments as ``kernels.paged_attention``, except that the caches are
    ``[num_blocks, block_size, num_kv_heads, head_size]`` (``layout.py``), plus:

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
        return reference.paged_attention(out, query, key_cache, value_cache, int(num_kv_heads), float(scale),
                                              block_tables, context_lens, block_size, max_context_len, alibi_slopes,
                                              k_scale=float(k_scale), v_scale=float(v_scale))
    num_seqs, num_heads, head_size = query.shape
    if num_seqs == 0:
        return out
    given_stages = stages
    if split_tokens is None:
        launch = choose_launch(num_seqs, num_heads, int(num_kv_heads), head_size, key_cache.dtype, max_context_len,
                               device_sms(query.device.index or 0), stages, device_tuning(query.device.index or 0))
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
                                   device_sms(query.device.index or 0))
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
    padding, skipped; slots past the cache are refused with ``validate``, else skipped by the CUDA
    kernel). In the NHD storage a token's row is contiguous: on CUDA one kernel moves each
    head row as 16-byte words from strided sources (such as slices of a fused QKV output), elsewhere
    (CPU, float8 caches, unaligned rows) an indexed copy does; float8 caches store ``key / k_scale``,
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
    if _kernel_writes(key, value, key_cache, value_cache):
        extension().fast_cache_write(key, value, key_cache, value_cache,
                                     slot_mapping.to(key.device, torch.int64).contiguous(),
                                     torch.cuda.current_stream(key.device).cuda_stream)
        return
    reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                     k_scale=float(k_scale), v_scale=float(v_scale))


def _kernel_writes(*tensors: torch.Tensor) -> bool:
    """The CUDA write kernel takes float16 / bfloat16 tensors, all on one GPU and of one dtype, whose
    head rows are contiguous, 16-byte aligned and 16-byte multiples (the indexed copy does the rest)."""
    t0 = tensors[0]
    if not t0.is_cuda or t0.dtype not in FAST_DTYPES:
        return False
    for t in tensors:
        if t.device != t0.device or t.dtype != t0.dtype or t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any(s % 8 for s in t.stride()[:-1]) or t.shape[-1] % 8:
            return False
    return True

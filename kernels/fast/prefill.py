"""Paged prefill attention over fast-layout caches (``layout.py``): ``paged_prefill_attention``.

A varlen batch: sequence ``i`` has ``c_i`` tokens already in the paged cache (prefix-cache hits
or earlier chunks of its prompt) and ``p_i`` new tokens, whose keys and values are written into
the cache first (``reshape_and_cache_fast``). The ``p_i`` queries attend causally over all
``context_lens[i] = c_i + p_i`` keys and values, read through the block table: query ``j`` of
sequence ``i`` sits at position ``c_i + j`` and sees keys ``0 .. c_i + j``. CUDA tensors run the
tensor-core kernel (``kernels/csrc/paged_prefill_wgmma.cuh`` on Hopper where it applies, else
``kernels/csrc/paged_prefill.cuh``), CPU tensors the reference
(``reference.paged_prefill_attention``). ``kernels/DESIGN.md`` describes the kernel.
"""

from __future__ import annotations

import functools
import numbers

import torch

from .. import _checks
from .._build import extension
from . import reference
from .launch import device_sms
from .layout import FP8
from .ops import _check_caches

PREFILL_HEAD_SIZES = (64, 80, 96, 112, 120, 128, 192, 256)
# Tile configurations of the kernel (kernels/csrc/paged_prefill.cuh, kConfigs) at head sizes <= 128,
# as (16-row tiles per warp, keys per tile, ring stages): 0 the large row blocks (128 rows), 1 the
# small ones (64 rows); above head 128 both are (1, 32, 2). 2-5 run float16 at head 128 only, for
# measurements (the bench's prefill_tiles section).
PREFILL_CONFIGS = {0: (2, 32, 4), 1: (1, 64, 2), 2: (2, 32, 2), 3: (2, 32, 3), 4: (1, 32, 3), 5: (2, 64, 2)}
# The warpgroup kernel (kernels/csrc/paged_prefill_wgmma.cuh: wgmma on sm_90a, 128 packed rows per
# thread block, 128 keys per tile, 3 ring stages): float16 or bfloat16 query and caches of the same
# dtype, head size 128, no ALiBi, a Hopper GPU (compute capability 9.0).
WGMMA_CONFIG = 6
# The warp-specialized persistent warpgroup kernel (kernels/csrc/paged_prefill_ws.cuh): where the
# warpgroup kernel runs, on the same arguments.
WS_CONFIG = 7
WARPGROUP_CONFIGS = (WGMMA_CONFIG, WS_CONFIG)
WGMMA_HEAD = 128
LARGE_ROWS = 128          # packed query rows of a thread block in config 0
PADDING_SHARE = 0.25      # config 1 where this share of config 0's rows would be padding
WS_MIN_ROWS = 32          # the warp-specialized kernel from this many packed rows of a sequence


def wgmma_runs(query_dtype: torch.dtype, cache_dtype: torch.dtype, head_size: int, alibi: bool,
               capability: tuple[int, int]) -> bool:
    """Whether the warpgroup kernels (``WARPGROUP_CONFIGS``) run these arguments on a GPU of this
    compute capability."""
    return (tuple(capability) == (9, 0) and query_dtype == cache_dtype and query_dtype in (torch.float16, torch.bfloat16)
            and head_size == WGMMA_HEAD and not alibi)


@functools.lru_cache(maxsize=8)
def device_capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def _wgmma_applies(query: torch.Tensor, key_cache: torch.Tensor, alibi_slopes) -> bool:
    """``wgmma_runs`` for the arguments of a call on the query's CUDA device."""
    return query.is_cuda and wgmma_runs(query.dtype, key_cache.dtype, query.shape[2], alibi_slopes is not None,
                                        device_capability(query.device.index or 0))


def choose_prefill_config(num_seqs: int, max_query_len: int, num_heads: int, num_kv_heads: int, head_size: int,
                          num_sms: int = 132, *, wgmma: bool = False) -> int:
    """The tile configuration ``paged_prefill_attention`` runs. ``wgmma``: the warpgroup kernels can
    run the call (``wgmma_runs``); then the warp-specialized one (``WS_CONFIG``) runs wherever a
    sequence has at least ``WS_MIN_ROWS`` packed rows, and below that where the mma.sync kernel's
    large row blocks would make at most one wave at 2 per SM (few sequences over long contexts);
    config 6 runs only when asked for (kernels/results/h100-dispatch-rows*.json: config 7 within
    1% of config 6 or faster on every shape from 4 packed rows, the mma.sync kernel level with it
    only where its blocks fill the SMs; DESIGN.md, "Dispatch"). Otherwise the mma.sync kernel: the small row blocks (1)
    where the large ones (0) would make at most one wave at 2 per SM (twice the thread blocks fill
    the SMs) or where ``PADDING_SHARE`` of their rows would be padding (short chunks, one new
    token); the large ones otherwise, which share each K/V fragment between two row tiles per warp.
    ``max_query_len * num_heads / num_kv_heads`` is a sequence's packed rows."""
    rows = max(1, max_query_len * (num_heads // num_kv_heads))
    if head_size > 128:
        return 0
    large = -(-rows // LARGE_ROWS)
    one_wave = large * num_kv_heads * num_seqs <= 2 * num_sms
    if wgmma and head_size == WGMMA_HEAD and (rows >= WS_MIN_ROWS or one_wave):
        return WS_CONFIG
    if one_wave:
        return 1
    return 1 if large * LARGE_ROWS - rows >= PADDING_SHARE * rows else 0


def _int_or_none(name: str, v) -> int | None:
    if v is None:
        return None
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{name} must be None or a non-negative integer, got {v!r}")
    return int(v)


def check_prefill(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, query_start_loc,
                  context_lens, block_size, alibi_slopes, k_scale, v_scale, max_query_len, max_context_len,
                  validate: bool) -> tuple[int | None, int | None]:
    """Checks ``paged_prefill_attention``'s arguments (``ValueError`` naming the argument); returns
    ``(max_query_len, max_context_len)``, read from the index tensors when ``validate`` (one device
    synchronisation on CUDA), else as given (None when not given)."""
    _checks._tensor("query", query)
    if query.dim() != 3:
        raise ValueError(f"query must be [total_new_tokens, num_heads, head_size], got shape {tuple(query.shape)}")
    total, num_heads, head_size = query.shape
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"query dtype {query.dtype} not supported; use float16 or bfloat16 (float32 on the CPU)")
    if query.is_cuda and query.dtype == torch.float32:
        raise ValueError("query: float32 runs on the CPU reference only; use float16 or bfloat16 on CUDA")
    if head_size not in PREFILL_HEAD_SIZES:
        raise ValueError(f"head_size {head_size} not supported by paged_prefill_attention; use one of "
                         f"{PREFILL_HEAD_SIZES}")
    nb = _check_caches(query, key_cache, value_cache, num_kv_heads, block_size)
    if num_heads % int(num_kv_heads):
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    for name, v in (("scale", scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError(f"{name} must be a float, got {type(v).__name__}")
    if key_cache.dtype != FP8 and (k_scale != 1.0 or v_scale != 1.0):
        raise ValueError("k_scale / v_scale apply to float8_e4m3fn caches only")
    if out is not None:
        _checks._tensor("out", out)
        if tuple(out.shape) != tuple(query.shape) or out.dtype != query.dtype or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {query.dtype} tensor of shape {tuple(query.shape)}, "
                             f"got {out.dtype} {tuple(out.shape)} (contiguous={out.is_contiguous()})")
    _checks._index_tensor("block_tables", block_tables, 2)
    _checks._index_tensor("query_start_loc", query_start_loc, 1)
    _checks._index_tensor("context_lens", context_lens, 1)
    batch = context_lens.shape[0]
    if query_start_loc.shape[0] != batch + 1:
        raise ValueError(f"query_start_loc must have batch + 1 = {batch + 1} entries (one more than context_lens), "
                         f"got {query_start_loc.shape[0]}")
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows but context_lens {batch} sequences")
    if alibi_slopes is not None:
        _checks._tensor("alibi_slopes", alibi_slopes)
        if tuple(alibi_slopes.shape) != (num_heads,) or not alibi_slopes.is_floating_point():
            raise ValueError(f"alibi_slopes must be a float tensor of shape ({num_heads},), "
                             f"got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
    _checks._same_device({"query": query, "key_cache": key_cache, "out": out, "block_tables": block_tables,
                          "query_start_loc": query_start_loc, "context_lens": context_lens,
                          "alibi_slopes": alibi_slopes})
    max_query_len = _int_or_none("max_query_len", max_query_len)
    max_context_len = _int_or_none("max_context_len", max_context_len)
    if not validate or batch == 0:
        return (0, 0) if batch == 0 else (max_query_len, max_context_len)
    loc = query_start_loc.to(torch.long)
    lens = context_lens.to(torch.long)
    new = loc[1:] - loc[:-1]
    cached = lens - new
    summary = torch.stack([loc[0], loc[-1], new.min(), new.max(), cached.min(), lens.max()]).tolist()
    first, last, fewest, most, least_cached, longest = summary
    if first != 0 or last != total:
        raise ValueError(f"query_start_loc must run from 0 to the {total} query rows, got {first} .. {last}")
    if fewest < 0:
        s = int((new < 0).nonzero()[0])
        raise ValueError(f"query_start_loc must not decrease: entry {s + 1} ({int(loc[s + 1])}) < entry {s} "
                         f"({int(loc[s])})")
    if least_cached < 0:
        s = int((cached < 0).nonzero()[0])
        raise ValueError(f"context_lens[{s}] = {int(lens[s])} is less than sequence {s}'s {int(new[s])} new tokens: "
                         "context_lens counts the cached and the new tokens")
    if max_query_len is not None and max_query_len < most:
        raise ValueError(f"max_query_len {max_query_len} is less than the most new tokens of a sequence ({most})")
    if max_context_len is not None and max_context_len < longest:
        raise ValueError(f"max_context_len {max_context_len} is less than the longest context ({longest})")
    bs = key_cache.shape[1]
    if -(-longest // bs) > block_tables.shape[1]:
        raise ValueError(f"a context of {longest} tokens needs {-(-longest // bs)} blocks but block_tables has "
                         f"{block_tables.shape[1]} columns")
    used = (torch.arange(block_tables.shape[1], device=block_tables.device)[None, :]
            < ((lens + bs - 1) // bs)[:, None])
    bad = used & ((block_tables < 0) | (block_tables >= nb))
    if bool(bad.any()):
        s, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_tables[{s}, {j}] = {int(block_tables[s, j])} is outside the cache's {nb} blocks "
                         f"(sequence {s}, context {int(lens[s])})")
    return (most if max_query_len is None else max_query_len,
            longest if max_context_len is None else max_context_len)


def _check_new_kv(query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
                  num_kv_heads: int) -> None:
    """Checks ``paged_prefill_attention``'s optional new keys and values (``ValueError`` naming
    the argument)."""
    if (key is None) != (value is None):
        raise ValueError("key and value: give the new tokens' keys and values both, or neither")
    if key is None:
        return
    want = (query.shape[0], num_kv_heads, query.shape[2])
    for name, t in (("key", key), ("value", value)):
        _checks._tensor(name, t)
        if tuple(t.shape) != want or t.dtype != query.dtype:
            raise ValueError(f"{name} must be the new tokens' {query.dtype} tensor of shape {want} "
                             f"[total_new_tokens, num_kv_heads, head_size], got {t.dtype} {tuple(t.shape)}")
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query on {query.device}")


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether the kernel can read ``t`` ([tokens, kv_heads, head]) by TMA as it is."""
    return (t.stride(2) == 1 and t.stride(1) == t.shape[2] and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0)


def paged_prefill_attention(out: torch.Tensor | None, query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            context_lens: torch.Tensor, block_size: int,
                            alibi_slopes: torch.Tensor | None = None, *, k_scale: float = 1.0,
                            v_scale: float = 1.0, max_query_len: int | None = None,
                            max_context_len: int | None = None, config: int | None = None,
                            validate: bool = True, key: torch.Tensor | None = None,
                            value: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of a varlen batch of new tokens over their paged caches.

    Args:
        out: ``[total_new_tokens, num_heads, head_size]`` like ``query`` (contiguous), or None
            (allocated).
        query: ``[total_new_tokens, num_heads, head_size]``, float16 or bfloat16 (float32 on the
            CPU); sequence ``i``'s new tokens are rows ``query_start_loc[i]:query_start_loc[i+1]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_size]`` in any of the
            fast layout's storages, the query's dtype or float8_e4m3fn (holding ``key / k_scale``,
            ``value / v_scale``; float16 query), with the new tokens' keys and values written.
        num_kv_heads: KV heads (query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``).
        scale: softmax scale of ``q . k``.
        block_tables: ``[batch, max_blocks]`` int32 / int64 block ids; only the first
            ``ceil(context_lens[i] / block_size)`` of a row are read.
        query_start_loc: ``[batch + 1]`` int32 / int64 offsets of each sequence's rows.
        context_lens: ``[batch]`` int32 / int64, cached plus new tokens ``c_i + p_i``.
        block_size: tokens per cache block (8 to 256, a power of two).
        alibi_slopes: ``[num_heads]`` float slopes or None; the bias of key ``t`` for the query at
            position ``n`` is ``slope * (t - n)``.
        k_scale, v_scale: float8 caches' per-tensor scales.
        max_query_len, max_context_len: the most new tokens of a sequence and the longest context;
            None reads them from the index tensors (one device synchronisation, as does
            ``validate``). Give both with ``validate=False`` to capture the call in a CUDA graph.
        config: the kernel's tile configuration (a key of ``PREFILL_CONFIGS``; 2-5 for float16
            query and caches at head size 128 only; ``WARPGROUP_CONFIGS`` the warpgroup kernels,
            where ``wgmma_runs``), None for ``choose_prefill_config``'s.
        validate: read the index tensors to check them (offsets, lengths, block ids). Without it
            they are trusted: a sequence whose context length is shorter than its new tokens gets
            no defined output (the kernels still finish, and the other sequences' rows are right),
            and a block id outside the cache is read as zeros by the warpgroup kernels.
        key, value: optional, the new tokens' keys and values as written into the caches,
            ``[total_new_tokens, num_kv_heads, head_size]`` in the query's dtype (rows as the
            query's). Given both, the warp-specialized kernel (``WS_CONFIG``) reads the key and
            value tiles that hold only new tokens from them, by TMA, instead of through the block
            table; the cached tokens, and tiles that mix cached and new ones, still come from the
            caches. Their values must equal the cache's (the output is the same either way); other
            configurations, and tensors whose heads are not contiguous or that are not 16-byte
            aligned, read everything from the caches.

    Returns:
        ``out``.
    """
    max_query_len, max_context_len = check_prefill(
        out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, query_start_loc, context_lens,
        block_size, alibi_slopes, k_scale, v_scale, max_query_len, max_context_len, validate)
    _check_new_kv(query, key, value, int(num_kv_heads))
    if config in WARPGROUP_CONFIGS:
        if not _wgmma_applies(query, key_cache, alibi_slopes):
            raise ValueError(f"config {config} (the warpgroup kernels) needs a CUDA device of compute capability "
                             f"9.0, float16 or bfloat16 query and caches of one dtype, head size {WGMMA_HEAD} and no "
                             f"alibi_slopes; got {query.dtype} / {key_cache.dtype} at head size {query.shape[2]} on "
                             f"{query.device}")
    elif config is not None and config not in (0, 1) and not (
            config in PREFILL_CONFIGS and query.dtype == key_cache.dtype == torch.float16 and query.shape[2] == 128):
        raise ValueError(f"config must be None, 0, 1, {WGMMA_CONFIG}, {WS_CONFIG}, or one of {sorted(PREFILL_CONFIGS)[2:]} with "
                         f"float16 query and caches at head size 128; got {config!r} for {query.dtype} / "
                         f"{key_cache.dtype} at head size {query.shape[2]}")
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if not query.is_cuda:
        return reference.paged_prefill_attention(out, query, key_cache, value_cache, int(num_kv_heads), float(scale),
                                                 block_tables, query_start_loc, context_lens, alibi_slopes,
                                                 k_scale=float(k_scale), v_scale=float(v_scale))
    if max_query_len is None or max_context_len is None:
        loc = query_start_loc.to(torch.long)
        most, longest = torch.stack([(loc[1:] - loc[:-1]).max(), context_lens.to(torch.long).max()]).tolist()
        max_query_len = most if max_query_len is None else max_query_len
        max_context_len = longest if max_context_len is None else max_context_len
    if query.shape[0] == 0 or max_query_len == 0:
        return out
    if config is None:
        config = choose_prefill_config(context_lens.shape[0], max_query_len, query.shape[1], int(num_kv_heads),
                                       query.shape[2], device_sms(query.device.index or 0),
                                       wgmma=_wgmma_applies(query, key_cache, alibi_slopes))
    if query.stride(2) != 1 or query.stride(1) != query.shape[2] or query.stride(0) % 8 or query.data_ptr() % 16:
        query = query.clone(memory_format=torch.contiguous_format)  # a fresh allocation: aligned
    into = out
    if out.data_ptr() % 16:  # the kernels store whole 16-byte chunks: run into an aligned tensor, then copy
        into = torch.empty_like(query, memory_format=torch.contiguous_format)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.to(torch.float32).contiguous()
    if key is not None and not (config == WS_CONFIG and _tma_ready(key) and _tma_ready(value)):
        key = value = None
    extension().paged_prefill(into, query, key_cache, value_cache, int(num_kv_heads), float(scale) * float(k_scale),
                              float(v_scale), block_tables.to(torch.int32).contiguous(),
                              query_start_loc.to(torch.int32).contiguous(), context_lens.to(torch.int32).contiguous(),
                              int(max_query_len), int(max_context_len), int(config), alibi_slopes, key, value,
                              torch.cuda.current_stream(query.device).cuda_stream)
    if into is not out:
        out.copy_(into)
    return out

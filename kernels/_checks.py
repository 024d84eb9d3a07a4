"""Argument checks of the public operations. Every problem raises ``ValueError`` naming the
argument, before anything is launched: a block id or slot outside the cache never reaches a
kernel. Data-dependent checks (block ids, slots, context lengths) read the index tensors, which
costs one device synchronisation on CUDA; the operations skip them with ``validate=False``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .vllm.layout import SUPPORTED_BLOCK_SIZES, SUPPORTED_DTYPES, SUPPORTED_HEAD_SIZES, kv_x

_INT_DTYPES = (torch.int32, torch.int64)


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _same_device(named: dict[str, torch.Tensor]) -> torch.device:
    devices = {n: t.device for n, t in named.items() if t is not None}
    first = next(iter(devices.values()))
    for n, d in devices.items():
        if d != first:
            raise ValueError(f"all tensors must be on one device: {n} is on {d}, others on {first}")
    return first


def check_cache_pair(key_cache: torch.Tensor, value_cache: torch.Tensor, *,
                     prefix: str = "") -> tuple[int, int, int, int]:
    """Checks one layer's caches against the layout; returns
    ``(num_blocks, num_kv_heads, head_size, block_size)``."""
    kn, vn = f"{prefix}key_cache", f"{prefix}value_cache"
    _tensor(kn, key_cache)
    _tensor(vn, value_cache)
    if key_cache.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{kn} dtype {key_cache.dtype} not supported; use one of {SUPPORTED_DTYPES}")
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(f"{vn} dtype {value_cache.dtype} differs from {kn} dtype {key_cache.dtype}")
    if value_cache.dim() != 4:
        raise ValueError(f"{vn} must be [num_blocks, num_kv_heads, head_size, block_size], "
                         f"got shape {tuple(value_cache.shape)}")
    nb, kvh, hs, bs = value_cache.shape
    x = kv_x(key_cache.dtype)
    want = (nb, kvh, hs // x, bs, x)
    if hs % x or tuple(key_cache.shape) != want:
        raise ValueError(f"{kn} must be [num_blocks, num_kv_heads, head_size/x, block_size, x] = {want} "
                         f"(x = {x} for {key_cache.dtype}) to match {vn} {tuple(value_cache.shape)}, "
                         f"got {tuple(key_cache.shape)}")
    inner_k = (hs * bs, bs * x, x, 1)
    inner_v = (hs * bs, bs, 1)
    if tuple(key_cache.stride()[1:]) != inner_k or tuple(value_cache.stride()[1:]) != inner_v:
        raise ValueError(f"{kn} / {vn} must be contiguous within a block (strides {inner_k} and {inner_v} "
                         f"after the block dimension); got {key_cache.stride()} and {value_cache.stride()}")
    for name, c in ((kn, key_cache), (vn, value_cache)):
        if c.stride(0) % x or c.data_ptr() % 16:
            raise ValueError(f"{name} blocks must start on 16-byte boundaries")
    if key_cache.device != value_cache.device:
        raise ValueError(f"{kn} is on {key_cache.device} but {vn} on {value_cache.device}")
    return nb, kvh, hs, bs


def _index_tensor(name: str, t, dims: int) -> torch.Tensor:
    _tensor(name, t)
    if t.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                    context_lens, block_size, max_context_len, alibi_slopes, version,
                    validate: bool) -> int:
    """Checks the vLLM-layout ``paged_attention``'s arguments; returns the max context length to use."""
    if version not in (None, "v1", "v2"):
        raise ValueError(f"version must be None (automatic), 'v1' or 'v2', got {version!r}")
    _tensor("query", query)
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size], got shape {tuple(query.shape)}")
    num_seqs, num_heads, head_size = query.shape
    if query.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"query dtype {query.dtype} not supported; use one of {SUPPORTED_DTYPES}")
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise ValueError(f"head_size {head_size} not supported; use one of {SUPPORTED_HEAD_SIZES}")
    nb, kvh, hs, bs = check_cache_pair(key_cache, value_cache)
    if key_cache.dtype != query.dtype:
        raise ValueError(f"key_cache dtype {key_cache.dtype} differs from query dtype {query.dtype}")
    check_cache_geometry(hs, bs, kvh, head_size, block_size, num_kv_heads, SUPPORTED_BLOCK_SIZES)
    if kvh < 1 or num_heads % kvh:
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {kvh}")
    if not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a float, got {type(scale).__name__}")
    check_sequences(out, query, key_cache, block_tables, context_lens, alibi_slopes)
    if nb >= 2**31:
        raise ValueError(f"{nb} blocks: block ids must fit in int32")

    return check_context(block_tables, context_lens, max_context_len, bs, nb, validate)


def check_cache_geometry(hs: int, bs: int, kvh: int, head_size: int, block_size, num_kv_heads,
                         supported_block_sizes, kernel: str = "") -> None:
    """The caches' head size, block size and KV heads against the call's arguments, and the block
    size against those the kernel supports (`kernel`, e.g. " by impl='fast'", names it in the error)."""
    if hs != head_size:
        raise ValueError(f"caches hold head_size {hs} but query has head_size {head_size}")
    if int(block_size) != bs:
        raise ValueError(f"block_size {block_size} does not match the caches' block size {bs}")
    if bs not in supported_block_sizes:
        raise ValueError(f"block_size {bs} not supported{kernel}; use one of {supported_block_sizes}")
    if int(num_kv_heads) != kvh:
        raise ValueError(f"num_kv_heads {num_kv_heads} does not match the caches' {kvh} KV heads")


def check_sequences(out, query, key_cache, block_tables, context_lens, alibi_slopes) -> None:
    """The output, per-sequence index tensors and ALiBi slopes of a decode-attention call."""
    num_seqs, num_heads, _ = query.shape
    if out is not None:
        _tensor("out", out)
        if tuple(out.shape) != tuple(query.shape) or out.dtype != query.dtype or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {query.dtype} tensor of shape {tuple(query.shape)}, "
                             f"got {out.dtype} {tuple(out.shape)} (contiguous={out.is_contiguous()})")
    _index_tensor("block_tables", block_tables, 2)
    _index_tensor("context_lens", context_lens, 1)
    if block_tables.shape[0] != num_seqs or context_lens.shape[0] != num_seqs:
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and context_lens {tuple(context_lens.shape)} "
                         f"must have one row per sequence ({num_seqs})")
    if alibi_slopes is not None:
        _tensor("alibi_slopes", alibi_slopes)
        if tuple(alibi_slopes.shape) != (num_heads,) or not alibi_slopes.is_floating_point():
            raise ValueError(f"alibi_slopes must be a float tensor of shape ({num_heads},), "
                             f"got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
    _same_device({"query": query, "key_cache": key_cache, "out": out, "block_tables": block_tables,
                  "context_lens": context_lens, "alibi_slopes": alibi_slopes})


def check_context(block_tables, context_lens, max_context_len, bs: int, nb: int, validate: bool) -> int:
    """Context lengths against the block tables and the cache's `nb` blocks of `bs` tokens (reads
    the index tensors: one device sync, skipped with validate=False); returns the max context."""
    num_seqs = context_lens.shape[0]
    if max_context_len is None or validate:
        longest = int(context_lens.max()) if num_seqs else 0
    if max_context_len is None:
        max_context_len = longest
    max_context_len = int(max_context_len)
    if validate and num_seqs:
        shortest = int(context_lens.min())
        if shortest < 1:
            raise ValueError(f"context_lens must be >= 1 (got {shortest}): each sequence attends to its "
                             "cached context, which includes the current token")
        if longest > max_context_len:
            raise ValueError(f"max_context_len {max_context_len} is less than the longest context {longest}")
        if -(-longest // bs) > block_tables.shape[1]:
            raise ValueError(f"a context of {longest} tokens needs {-(-longest // bs)} blocks but block_tables "
                             f"has {block_tables.shape[1]} columns")
        used = (torch.arange(block_tables.shape[1], device=block_tables.device)[None, :]
                < ((context_lens.to(torch.long) + bs - 1) // bs)[:, None])
        bad = used & ((block_tables < 0) | (block_tables >= nb))
        if bool(bad.any()):
            s, j = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"block_tables[{s}, {j}] = {int(block_tables[s, j])} is outside the cache's "
                             f"{nb} blocks (sequence {s}, context {int(context_lens[s])})")
    return max_context_len


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, validate: bool) -> None:
    nb, kvh, hs, bs = check_cache_pair(key_cache, value_cache)
    for name, t in (("key", key), ("value", value)):
        _tensor(name, t)
        if t.dim() != 3 or tuple(t.shape[1:]) != (kvh, hs):
            raise ValueError(f"{name} must be [num_tokens, {kvh}, {hs}] to match the caches, got {tuple(t.shape)}")
        if t.dtype != key_cache.dtype:
            raise ValueError(f"{name} dtype {t.dtype} differs from the caches' {key_cache.dtype}")
    if key.shape[0] != value.shape[0]:
        raise ValueError(f"key has {key.shape[0]} tokens but value has {value.shape[0]}")
    _index_tensor("slot_mapping", slot_mapping, 1)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    _same_device({"key": key, "value": value, "key_cache": key_cache, "slot_mapping": slot_mapping})
    if validate and slot_mapping.numel():
        slots = slot_mapping[slot_mapping >= 0]
        if slots.numel():
            top = int(slots.max())
            if top >= nb * bs:
                raise ValueError(f"slot {top} is outside the cache ({nb} blocks x {bs} tokens = {nb * bs} slots)")
            if slots.unique().numel() != slots.numel():
                raise ValueError("slot_mapping writes a slot twice: the result would depend on thread order")


def as_block_mapping(block_mapping, name: str = "block_mapping") -> torch.Tensor:
    """A ``[num_pairs, 2]`` CPU int64 tensor of ``(src, dst)`` rows from a tensor, a sequence of
    pairs, or a mapping ``{src: dst}`` / ``{src: [dst, ...]}`` (vLLM v0's copy-on-write dict)."""
    if isinstance(block_mapping, Mapping):
        pairs = []
        for src, dsts in block_mapping.items():
            for dst in (dsts if isinstance(dsts, Sequence) else [dsts]):
                pairs.append((int(src), int(dst)))
        block_mapping = pairs
    if isinstance(block_mapping, torch.Tensor):
        if block_mapping.dtype not in _INT_DTYPES:
            raise ValueError(f"{name} must hold integers, got {block_mapping.dtype}")
        m = block_mapping.detach().to("cpu", torch.long)
    else:
        m = torch.tensor(list(block_mapping), dtype=torch.long)
    if m.numel() == 0:
        return m.reshape(0, 2)
    if m.dim() != 2 or m.shape[1] != 2:
        raise ValueError(f"{name} must be (src, dst) pairs, shape [num_pairs, 2]; got {tuple(m.shape)}")
    return m.contiguous()


def check_mapping(m: torch.Tensor, num_src: int, num_dst: int, *, same_pool: bool) -> None:
    for col, n, what in ((0, num_src, "source"), (1, num_dst, "destination")):
        ids = m[:, col]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            bad = ids[(ids < 0) | (ids >= n)][0]
            raise ValueError(f"{what} block {int(bad)} is outside the {n} blocks of its cache")
    dst = m[:, 1]
    if dst.unique().numel() != dst.numel():
        raise ValueError("a destination block appears twice in block_mapping")
    if same_pool and bool(torch.isin(dst, m[:, 0]).any()):
        raise ValueError("a block is both copied from and copied to in one call: order-dependent result")


def check_copy_blocks(key_caches, value_caches, m: torch.Tensor) -> None:
    if not isinstance(key_caches, Sequence) or not isinstance(value_caches, Sequence):
        raise ValueError("key_caches and value_caches must be lists of per-layer tensors")
    if len(key_caches) != len(value_caches) or not key_caches:
        raise ValueError(f"need one key and one value cache per layer, got {len(key_caches)} and {len(value_caches)}")
    first = check_cache_pair(key_caches[0], value_caches[0], prefix="layer 0 ")
    ref = key_caches[0]
    for i, (k, v) in enumerate(zip(key_caches, value_caches)):
        shape = check_cache_pair(k, v, prefix=f"layer {i} ")
        if shape != first or k.dtype != ref.dtype or k.device != ref.device:
            raise ValueError(f"layer {i}'s caches differ from layer 0's in shape, dtype or device")
        if k.stride(0) != ref.stride(0) or v.stride(0) != ref.stride(0):
            raise ValueError(f"layer {i}'s caches have a different block stride from layer 0's")
    check_mapping(m, first[0], first[0], same_pool=True)


def check_swap_blocks(src, dst, m: torch.Tensor) -> None:
    _tensor("src", src)
    _tensor("dst", dst)
    if src.dtype != dst.dtype:
        raise ValueError(f"src dtype {src.dtype} differs from dst dtype {dst.dtype}")
    if tuple(src.shape[1:]) != tuple(dst.shape[1:]):
        raise ValueError(f"src blocks {tuple(src.shape[1:])} and dst blocks {tuple(dst.shape[1:])} differ in shape")
    for name, t in (("src", src), ("dst", dst)):
        if t.dim() < 2 or not t[0].is_contiguous() or t.stride(0) != t[0].numel():
            raise ValueError(f"{name} must be a contiguous [num_blocks, ...] cache")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on {t.device}: only CPU and CUDA caches are supported")
    kinds = {src.device.type, dst.device.type}
    if kinds == {"cpu", "cuda"}:
        host = src if src.device.type == "cpu" else dst
        if not host.is_pinned():
            raise ValueError("the CPU side of a GPU<->CPU swap must be pinned memory "
                             "(allocate_kv_cache(..., device='cpu', pin_memory=True))")
    if src.is_cuda and dst.is_cuda and src.device != dst.device:
        raise ValueError(f"GPU-to-GPU swaps must stay on one device, got {src.device} and {dst.device}")
    check_mapping(m, src.shape[0], dst.shape[0], same_pool=src.data_ptr() == dst.data_ptr())

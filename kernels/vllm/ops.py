"""The vLLM-layout operations: paged attention (v1 / v2) and the cache operations, run by the
CUDA kernels for CUDA tensors and by the PyTorch reference (``reference.py``) for CPU tensors.

Every operation checks its arguments first (``_checks.py``) and raises ``ValueError`` on bad
input; ``validate=False`` skips only the checks that read index tensors (one device sync), for
timed loops over inputs already checked once.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._build import extension
from . import reference
from .launch import PARTITION_SIZE, choose_version, v1_max_context_len


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def paged_attention(out: torch.Tensor | None, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                    max_context_len: int | None, alibi_slopes: torch.Tensor | None = None, *,
                    version: str | None = None, validate: bool = True) -> torch.Tensor:
    """Decode attention of one query token per sequence over its paged KV cache in the vLLM layout.

    Args:
        out: ``[num_seqs, num_heads, head_size]`` contiguous output of query's dtype, or None to
            allocate one. Written and returned.
        query: ``[num_seqs, num_heads, head_size]``, float32 / float16 / bfloat16, head_size in
            ``layout.SUPPORTED_HEAD_SIZES``.
        key_cache, value_cache: one layer's caches in the vLLM layout (``layout.py``), query's
            dtype, block size in ``layout.SUPPORTED_BLOCK_SIZES``.
        num_kv_heads: KV heads in the caches; divides num_heads (GQA / MQA share a KV head among
            ``num_heads // num_kv_heads`` query heads).
        scale: softmax scale applied to q . k (usually ``head_size ** -0.5``).
        block_tables: ``[num_seqs, max_blocks_per_seq]`` int32/int64 physical block ids; only the
            first ``ceil(context_lens[s] / block_size)`` entries of row ``s`` are read.
        context_lens: ``[num_seqs]`` int32/int64 cached tokens per sequence (>= 1), the current
            token included.
        block_size: tokens per block (must match the caches).
        max_context_len: an upper bound of context_lens (sizes v1's shared memory and v2's
            partition count), or None to compute it (one device sync).
        alibi_slopes: optional ``[num_heads]`` slopes: logit += slope * (pos - context_len + 1).
        version: None picks v1 or v2 by ``choose_version``; "v1" / "v2" force one. Ignored on CPU.
        validate: False skips the checks that read block_tables / context_lens.

    Returns:
        ``out``.
    """
    max_context_len = _checks.check_attention(out, query, key_cache, value_cache, num_kv_heads, scale,
                                              block_tables, context_lens, block_size, max_context_len,
                                              alibi_slopes, version, validate)
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if not query.is_cuda:
        return reference.paged_attention(out, query, key_cache, value_cache, num_kv_heads, float(scale),
                                         block_tables, context_lens, block_size, max_context_len,
                                         alibi_slopes)
    num_seqs, num_heads, head_size = query.shape
    if num_seqs == 0:
        return out
    version = version or choose_version(num_seqs, num_heads, max_context_len)
    if version == "v1" and max_context_len > v1_max_context_len(query.device, block_size):
        raise ValueError(f"v1 holds at most {v1_max_context_len(query.device, block_size)} tokens of context in "
                         f"shared memory on this GPU; max_context_len is {max_context_len}: use version='v2'")
    x = 16 // query.element_size()
    if query.stride(2) != 1 or query.stride(1) != head_size or query.stride(0) % x or query.data_ptr() % 16:
        query = query.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.to(torch.float32).contiguous()
    ext = extension()
    stream = _stream(query.device)
    if version == "v1":
        ext.paged_attention_v1(out, query, key_cache, value_cache, int(num_kv_heads), float(scale), block_tables,
                               context_lens, int(block_size), max_context_len, alibi_slopes, stream)
    else:
        parts = max(1, -(-max_context_len // PARTITION_SIZE))
        f32 = dict(dtype=torch.float32, device=query.device)
        exp_sums = torch.empty(num_seqs, num_heads, parts, **f32)
        max_logits = torch.empty(num_seqs, num_heads, parts, **f32)
        tmp_out = torch.empty(num_seqs, num_heads, parts, head_size, **f32)
        ext.paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
                               int(num_kv_heads), float(scale), block_tables, context_lens, int(block_size),
                               max_context_len, alibi_slopes, stream)
    return out


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                      validate: bool = True) -> None:
    """Writes new tokens' keys and values (``[num_tokens, num_kv_heads, head_size]``, the head
    dimension contiguous) into their slots (``slot_mapping[i] = block * block_size + offset``).
    A negative slot marks a padding token, which is skipped. Each slot may appear once."""
    _checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, validate)
    if not key_cache.is_cuda:
        reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return
    if key.stride(2) != 1:
        key = key.contiguous()
    if value.stride(2) != 1:
        value = value.contiguous()
    extension().reshape_and_cache(key, value, key_cache, value_cache,
                                  slot_mapping.to(torch.int64).contiguous(), _stream(key_cache.device))


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping) -> None:
    """Copy-on-write for every layer in one launch: for each ``(src, dst)`` pair, block ``dst`` of
    every layer's key and value cache becomes a copy of block ``src``.

    ``block_mapping`` is a ``[num_pairs, 2]`` tensor, a sequence of pairs, or a dict
    ``{src: dst}`` / ``{src: [dst, ...]}``. A destination may appear once and may not also be a
    source in the same call.
    """
    m = _checks.as_block_mapping(block_mapping)
    _checks.check_copy_blocks(key_caches, value_caches, m)
    if m.shape[0] == 0:
        return
    if not key_caches[0].is_cuda:
        reference.copy_blocks(list(key_caches), list(value_caches), m)
        return
    extension().copy_blocks(list(key_caches), list(value_caches), m, _stream(key_caches[0].device))


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping) -> None:
    """Copies blocks between caches: block ``d`` of ``dst`` becomes block ``s`` of ``src`` for each
    ``(s, d)`` pair. GPU -> pinned CPU (swap out), pinned CPU -> GPU (swap in) and GPU -> GPU on one
    device run as one batched kernel for all pairs (one asynchronous copy per block if the pinned
    memory is not mapped into the GPU's address space); CPU -> CPU uses the reference. Call it
    once per cache tensor (the key and the value cache of each layer). Asynchronous on the
    current stream, like a non-blocking copy: synchronise before reading a CPU destination."""
    m = _checks.as_block_mapping(block_mapping)
    _checks.check_swap_blocks(src, dst, m)
    if m.shape[0] == 0:
        return
    if not (src.is_cuda or dst.is_cuda):
        reference.swap_blocks(src, dst, m)
        return
    device = src.device if src.is_cuda else dst.device
    extension().swap_blocks(src, dst, m, _stream(device))

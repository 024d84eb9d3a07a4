"""``kernels.paged_attention``: decode attention over a paged KV cache, run by the vLLM-layout
kernels (``impl="vllm"``, ``vllm/ops.py``) or by the fast decode kernel (``impl="fast"``,
``fast/ops.py``)."""

from __future__ import annotations

import torch

from .fast import ops as fast_ops
from .vllm import ops as vllm_ops


def paged_attention(out: torch.Tensor | None, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                    max_context_len: int | None, alibi_slopes: torch.Tensor | None = None, *,
                    version: str | None = None, impl: str = "vllm",
                    validate: bool = True, k_scale: float = 1.0, v_scale: float = 1.0,
                    split_tokens: int | None = None) -> torch.Tensor:
    """Decode attention of one query token per sequence over its paged KV cache.

    Arguments as ``kernels.vllm.ops.paged_attention`` (caches in the vLLM layout, ``version``
    picks v1 or v2), plus:

    Args:
        impl: "vllm", the vLLM-layout kernels; "fast", the fast decode kernel
            (``kernels.fast.ops.paged_attention``), whose caches are
            ``[num_blocks, block_size, num_kv_heads, head_size]`` and which takes ``k_scale`` /
            ``v_scale`` (float8 caches) and ``split_tokens``; ``version`` must be None.

    Returns:
        ``out``.
    """
    if impl not in ("vllm", "fast"):
        raise ValueError(f"impl must be 'vllm' (the vLLM-layout v1/v2 kernels) or 'fast' (the fast decode kernel), "
                         f"got {impl!r}")
    if impl == "fast":
        if version is not None:
            raise ValueError(f"version applies to impl='vllm' only, got version={version!r} with impl='fast'")
        return fast_ops.paged_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                                        context_lens, block_size, max_context_len, alibi_slopes, k_scale=k_scale,
                                        v_scale=v_scale, split_tokens=split_tokens, validate=validate)
    if k_scale != 1.0 or v_scale != 1.0 or split_tokens is not None:
        raise ValueError("k_scale, v_scale and split_tokens apply to impl='fast' only")
    return vllm_ops.paged_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                                    context_lens, block_size, max_context_len, alibi_slopes, version=version,
                                    validate=validate)

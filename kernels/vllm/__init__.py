"""The vLLM-layout family: v1 / v2 paged attention, ``reshape_and_cache``, ``copy_blocks`` and
``swap_blocks`` over caches in vLLM's paged layout.

``layout`` (shapes, the packing factor ``x``, allocation), ``launch`` (v1 or v2), ``ops`` (the
checked operations, CUDA or the reference) and ``reference`` (plain PyTorch).
"""

"""The fast decode family: paged decode attention on tensor cores over caches laid out
``[num_blocks, block_size, num_kv_heads, head_size]``, float16 / bfloat16 or float8 (e4m3).

``layout`` (storages, allocation, fp8 scales), ``launch`` (the split, load path and occupancy
rule), ``ops`` (the checked operations, CUDA or the reference) and ``reference`` (plain PyTorch).
The design is in ``kernels/DESIGN.md``.
"""

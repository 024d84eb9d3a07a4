"""Attention over restored blocks against the dense reference: the end-to-end check of the tiers.

`restored_attention` writes a sequence's K/V into a paged cache (values from
`validation.kv.ValueGenerator`), stores its prefix chunks down the tiers by every path
(gpu->host, gpu->disk, gpu->host->disk), wipes the whole cache, loads the chunks back into other
GPU blocks (host->gpu, disk->gpu), writes the tail again, and runs the decode kernel
(`kernels.paged_attention`) over the restored block table. It reports the checksum mismatches,
whether every restored block equals its original byte for byte, and the largest difference of
the kernel's output from dense attention over the regenerated K/V (`kernels._reference.attend`,
float32), against the executor's tolerance for the dtype.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from validation.executor import TOLERANCE
from validation.kv import WHICH_K, WHICH_Q, WHICH_V, ValueGenerator
from validation.tiers.executor import TierExecutor


def restored_attention(disk_dir: str | Path, *, device: str = "cuda", dtype: str = "float16", layout: str = "vllm",
                       layers: int = 2, kv_heads: int = 2, heads: int = 8, head_size: int = 128,
                       block_size: int = 16, chunk_blocks: int = 2, tail_tokens: int = 21,
                       direct_io: bool = True, corrupt: bool = False) -> dict:
    """The check's figures (see the module docstring); ``corrupt`` flips bits of one word of the host
    copy of the first chunk before it is loaded (a negative control: a mismatch must be reported)."""
    import torch

    import kernels
    from kernels._reference import attend
    dt, dev = getattr(torch, dtype), torch.device(device)
    prefix_chunks = 3
    prefix = prefix_chunks * chunk_blocks * block_size
    ctx = prefix + tail_tokens
    n_ctx_blocks = -(-ctx // block_size)
    num_blocks = 4 * n_ctx_blocks + 8
    ks, vs = [], []
    for _ in range(layers):
        if layout == "fast":
            k, v = kernels.allocate_fast_kv_cache(num_blocks, block_size, kv_heads, head_size, dt, dev)
        else:
            k, v = kernels.allocate_kv_cache(num_blocks, kv_heads, head_size, block_size, dt, dev)
        k.zero_()
        v.zero_()
        ks.append(k)
        vs.append(v)
    write = kernels.reshape_and_cache_fast if layout == "fast" else kernels.reshape_and_cache
    gen = ValueGenerator(torch, dev, list(range(layers)), head_size, dt)
    seeds = torch.as_tensor(np.arange(ctx, dtype=np.int64) * 7919 + 101, device=dev)
    kv_k = gen.values(seeds, WHICH_K, kv_heads)  # [ctx, layers, kv_heads, head_size]
    kv_v = gen.values(seeds, WHICH_V, kv_heads)

    def put(table: np.ndarray, lo: int, hi: int) -> None:
        pos = np.arange(lo, hi)
        slots = torch.as_tensor(table[pos // block_size] * block_size + pos % block_size, device=dev)
        for j in range(layers):
            write(kv_k[lo:hi, j].contiguous(), kv_v[lo:hi, j].contiguous(), ks[j], vs[j], slots)

    table_a = np.arange(n_ctx_blocks, dtype=np.int64)
    put(table_a, 0, ctx)
    ex = TierExecutor(ks, vs, chunk_blocks=chunk_blocks, host_chunks=4, disk_chunks=4,
                      disk_path=Path(disk_dir) / "restored_attention.kv", direct_io=direct_io)
    chunk = [table_a[c * chunk_blocks:(c + 1) * chunk_blocks] for c in range(prefix_chunks)]
    originals = [[t[chunk[c]].clone() for t in ex.tensors] for c in range(prefix_chunks)]
    ex.apply("store", "gpu", "host", [10], [chunk[0]])
    ex.apply("store", "gpu", "disk", [11], [chunk[1]])
    ex.apply("store", "gpu", "host", [12], [chunk[2]])
    ex.apply("store", "host", "disk", [12])
    ex.drop(12, "host")
    ex.synchronize()
    for t in ex.tensors:  # the blocks are reused by other sequences: nothing of the prefix is left
        t.fill_(0x5A)
    if corrupt:
        ex.host[ex.slots["host"].find(10), 4 * 37:4 * 38] ^= 0x11
    # restored into other blocks, in another order
    table_b = (num_blocks - 1 - np.arange(n_ctx_blocks, dtype=np.int64))
    chunk_b = [table_b[c * chunk_blocks:(c + 1) * chunk_blocks] for c in range(prefix_chunks)]
    ex.apply("load", "host", "gpu", [10], [chunk_b[0]])
    ex.apply("load", "disk", "gpu", [11, 12], [chunk_b[1], chunk_b[2]])
    put(table_b, prefix, ctx)  # the tail is computed again
    ex.synchronize()
    content_equal = all(torch.equal(t[chunk_b[c]], originals[c][j]) for c in range(prefix_chunks)
                        for j, t in enumerate(ex.tensors))
    q = gen.values(torch.as_tensor([424242], device=dev), WHICH_Q, heads)[0]  # [layers, heads, head_size]
    scale = head_size ** -0.5
    bt = torch.as_tensor(table_b.astype(np.int32)[None], device=dev)
    cl = torch.as_tensor([ctx], dtype=torch.int32, device=dev)
    atol, rtol = TOLERANCE[dtype]
    worst, passed = 0.0, True
    for j in range(layers):
        out = kernels.paged_attention(None, q[j][None].contiguous(), ks[j], vs[j], kv_heads, scale, bt, cl,
                                      block_size, ctx, impl=layout)
        ref = attend(q[j].float(), kv_k[:, j].float(), kv_v[:, j].float(), scale)
        err = (out[0].float() - ref).abs()
        worst = max(worst, float(err.max()))
        passed &= bool((err <= atol + rtol * ref.abs()).all())
    result = {"layout": layout, "dtype": dtype, "device": str(dev), "context_tokens": ctx, "restored_tokens": prefix,
              "mismatches": ex.mismatches(), "checked_loads": ex.checked_loads, "content_equal": content_equal,
              "max_abs_err": worst, "atol": atol, "rtol": rtol, "attention_matches": passed,
              "disk_mode": ex.disk_mode, "disk_reason": ex.disk_reason}
    ex.close()
    return result

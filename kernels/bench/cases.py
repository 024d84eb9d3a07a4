"""One benchmark shape's data on the GPU (``Case``): a fast-layout cache of random values, random
block tables and query sets, with the same tokens on demand in the vLLM layout or contiguous, and
the timed calls of each implementation on them."""

from __future__ import annotations

import torch

from ..fast import layout as fast_layout
from ..fast import ops as fast_ops
from ..vllm import layout as vllm_layout
from ..vllm import ops as vllm_ops
from .timing import graph_ms, median_ms, sdpa

HEAD_SIZE = 128
BLOCK_SIZE = 16
DTYPE = torch.float16
STORE = fast_layout.DEFAULT_STORAGE  # the fast kernel's storage in every section but the headline's "fast" column


def gather_contiguous(key_cache, value_cache, block_tables, ctx):
    """[B, kv_heads, ctx, head] K and V gathered from fast-layout caches
    ([num_blocks, block_size, kv_heads, head])."""
    b, nblk = block_tables.shape
    _, bs, kvh, hs = key_cache.shape
    k = key_cache[block_tables].reshape(b, nblk * bs, kvh, hs)[:, :ctx].transpose(1, 2)
    v = value_cache[block_tables].reshape(b, nblk * bs, kvh, hs)[:, :ctx].transpose(1, 2)
    return k, v


class Case:
    """One shape's data: a fast-layout cache (random normal values), random block tables, query
    sets, and on demand the same tokens in the vLLM layout and contiguous."""

    def __init__(self, batch, heads, kv_heads, ctx, *, sets, block_size=BLOCK_SIZE, storage="NHD"):
        self.shape = (batch, heads, kv_heads, ctx)
        self.batch, self.heads, self.kv_heads, self.ctx, self.block_size = batch, heads, kv_heads, ctx, block_size
        gen = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx + block_size)
        self.nblk = -(-ctx // block_size)
        self.num_blocks = batch * self.nblk
        self.kc, self.vc = fast_layout.allocate_fast_kv_cache(self.num_blocks, block_size, kv_heads, HEAD_SIZE, DTYPE,
                                                       "cuda", storage=storage)
        self.kc.normal_(generator=gen)
        self.vc.normal_(generator=gen)
        self.scale = HEAD_SIZE ** -0.5
        self.lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        self.sets = []
        for _ in range(sets):
            q = torch.randn(batch, heads, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
            perm = torch.randperm(self.num_blocks, device="cuda", generator=gen).to(torch.int32)
            self.sets.append((q, perm.view(batch, self.nblk), torch.empty_like(q)))
        self.kv_bytes = 2 * batch * ctx * kv_heads * HEAD_SIZE * 2

    def fast_ms(self, warmup, iters, *, kc=None, vc=None, **kw):
        kc = self.kc if kc is None else kc
        vc = self.vc if vc is None else vc
        q, t, o = self.sets[0]
        fast_ops.paged_attention(o, q, kc, vc, self.kv_heads, self.scale, t, self.lens, self.block_size, self.ctx, **kw)
        return graph_ms([lambda q=q, t=t, o=o: fast_ops.paged_attention(o, q, kc, vc, self.kv_heads, self.scale, t,
                                                                     self.lens, self.block_size, self.ctx,
                                                                     validate=False, **kw)
                         for q, t, o in self.sets], warmup, iters)

    def fast_ms_in_order(self, warmup, iters, **kw):
        """``fast_ms`` with every sequence's blocks consecutive in the cache (block tables in order)
        instead of random: what paging costs in DRAM and TLB locality."""
        random_sets = self.sets
        in_order = torch.arange(self.num_blocks, dtype=torch.int32, device="cuda").view(self.batch, self.nblk)
        self.sets = [(q, in_order, o) for q, _, o in random_sets]
        try:
            return self.fast_ms(warmup, iters, **kw)
        finally:
            self.sets = random_sets

    def fast_out(self, kc=None, vc=None, **kw):
        q, t, _ = self.sets[0]
        return fast_ops.paged_attention(None, q, self.kc if kc is None else kc, self.vc if vc is None else vc,
                                    self.kv_heads, self.scale, t, self.lens, self.block_size, self.ctx, **kw)

    def vllm_caches(self):
        vk, vv = vllm_layout.allocate_kv_cache(self.num_blocks, self.kv_heads, HEAD_SIZE, self.block_size, DTYPE, "cuda")
        slots = torch.arange(self.num_blocks * self.block_size, device="cuda")
        vllm_ops.reshape_and_cache(self.kc.flatten(0, 1), self.vc.flatten(0, 1), vk, vv, slots, validate=False)
        return vk, vv

    def vllm_ms(self, vk, vv, version, warmup, iters):
        q, t, o = self.sets[0]
        vllm_ops.paged_attention(o, q, vk, vv, self.kv_heads, self.scale, t, self.lens, self.block_size, self.ctx,
                            version=version)
        return graph_ms([lambda q=q, t=t, o=o: vllm_ops.paged_attention(o, q, vk, vv, self.kv_heads, self.scale, t,
                                                                    self.lens, self.block_size, self.ctx,
                                                                    version=version, validate=False)
                         for q, t, o in self.sets], warmup, iters)

    def contiguous(self):
        k, v = gather_contiguous(self.kc, self.vc, self.sets[0][1].long(), self.ctx)
        return k.contiguous(), v.contiguous()

    def gather_sdpa_ms(self, backend, warmup, iters):
        """Gather (torch indexing) then SDPA, always from NHD caches (contiguous copies of other
        storages): one contiguous row per token, the layout torch's gather handles best."""
        tables = [s[1].long() for s in self.sets]
        kc, vc = self.kc.contiguous(), self.vc.contiguous()

        def run(q, table):
            k, v = gather_contiguous(kc, vc, table, self.ctx)
            return sdpa(q.unsqueeze(2), k, v, backend)
        return median_ms([lambda q=s[0], t=t: run(q, t) for s, t in zip(self.sets, tables)], min(warmup, 3), iters)

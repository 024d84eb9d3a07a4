"""Executes a recorded plan on real KV caches, step by step, and checks every step.

Per step, in vLLM v0 worker order: swap in (CPU -> GPU), swap out (GPU -> CPU), copy-on-write
copies, then the forward pass: the K/V of the step's new tokens are written with
``reshape_and_cache`` at ``slot = block_table[pos // block_size] * block_size + pos % block_size``
and the decoding sequences run ``paged_attention`` with the plan's block tables and context
lengths. Prefill sequences take a dense path: their K/V are written, and the cache is checked.

Checks, outside the timed regions:

* writes: two tokens of one step written to one slot with different content (e.g. siblings
  sharing a block that should have been copied on write) fail at once;
* cache content, exact: for every scheduled sequence and every position ``< context_len``, the
  K/V read through its block table equal the values regenerated from the position's content key
  (``validate_kv``); the first differing position names the logical and physical block;
* attention: each decode output equals, within the dtype's tolerance, dense attention over the
  regenerated K/V of the sequence.

Timing: CUDA events around each layer's cache writes and attention and around the swaps and the
copies (``time.perf_counter`` on the CPU reference, which is not a GPU timing). An event pair
brackets the call of the operation, so when the GPU has caught up with the CPU the time includes
the Python launch path (argument checks, temporaries) as well as the kernel: what a Python
serving loop calling these operations pays, not the kernel alone (see VALIDATION.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from validation.kv import (
    WHICH_K,
    WHICH_Q,
    WHICH_V,
    ValueGenerator,
    content_seeds,
    query_seeds,
)

COMPONENTS = ("swap", "copy", "write", "attn_decode")
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (2e-3, 1e-2), "bfloat16": (1.5e-2, 2e-2)}  # (atol, rtol)


class ValidationError(RuntimeError):
    """A step whose cache or attention output differs from what the plan's sequences imply."""

    def __init__(self, message: str, *, step: int, seq_id: int | None = None, request_id: int | None = None,
                 logical_block: int | None = None, physical_block: int | None = None,
                 position: int | None = None, layer: int | None = None, check: str = "") -> None:
        where = [f"step {step}"]
        for name, v in (("request", request_id), ("sequence", seq_id), ("position", position),
                        ("logical block", logical_block), ("physical block", physical_block), ("layer", layer)):
            if v is not None:
                where.append(f"{name} {v}")
        super().__init__(f"{', '.join(where)}: {message}")
        self.step, self.seq_id, self.request_id = step, seq_id, request_id
        self.logical_block, self.physical_block = logical_block, physical_block
        self.position, self.layer, self.check = position, layer, check

    def to_dict(self) -> dict:
        return {"message": str(self), "step": self.step, "seq_id": self.seq_id, "request_id": self.request_id,
                "logical_block": self.logical_block, "physical_block": self.physical_block,
                "position": self.position, "layer": self.layer, "check": self.check}


@dataclass
class Subset:
    """What is executed of the model: its layers (model indices), KV heads, query heads, head size."""

    layers: list[int]
    kv_heads: int
    heads: int
    head_size: int
    dtype: str
    check_layers: list[int] = field(default_factory=list)  # model layer indices checked (a subset of layers)
    notes: list[str] = field(default_factory=list)

    def fraction_of(self, meta: dict, dtype_bytes: int) -> float:
        """Bytes of KV moved here per byte the full model would move (for scaling timings)."""
        return (len(self.layers) / meta["num_layers"]) * (self.kv_heads / meta["num_kv_heads"]) \
            * (self.head_size / meta["head_size"]) * (dtype_bytes / 2)

    def describe(self, meta: dict) -> str:
        return (f"{len(self.layers)} of {meta['num_layers']} layers, {self.kv_heads} of {meta['num_kv_heads']} KV heads, "
                f"{self.heads} of {meta['num_heads']} query heads, head size {self.head_size} "
                f"(model {meta['head_size']}), {self.dtype}; checked layers {self.check_layers}")


class _Timer:
    """Sums the time of timed regions per component for one step.

    On CUDA, `lead(n)` first queues a sleep on the stream, long enough for the host to queue the
    next `n` launches behind it: the events around each launch then time the kernel on the GPU,
    not the host's argument checks and launch path. Index tensors are uploaded before the lead,
    so no pageable copy waits behind the sleep.
    """

    LEAD_S_PER_LAUNCH = 150e-6
    CLOCK_HZ = 2.0e9  # sleep cycles per second (Hopper boost clock is about 1.98 GHz)

    def __init__(self, torch, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda
        self.pending: dict[str, list] = {c: [] for c in COMPONENTS}
        self.cpu: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)

    def lead(self, launches: int) -> None:
        if self.cuda and launches > 0:
            self.torch.cuda._sleep(int(launches * self.LEAD_S_PER_LAUNCH * self.CLOCK_HZ))

    def start(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, component: str, start) -> None:
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.pending[component].append((start, e))
        else:
            self.cpu[component] += time.perf_counter() - start

    def collect(self) -> dict[str, float]:
        """Seconds per component since the last collect (synchronizes on CUDA)."""
        if self.cuda:
            self.torch.cuda.synchronize()
            out = {c: sum(a.elapsed_time(b) for a, b in pairs) / 1e3 for c, pairs in self.pending.items()}
            self.pending = {c: [] for c in COMPONENTS}
            return out
        out, self.cpu = self.cpu, dict.fromkeys(COMPONENTS, 0.0)
        return out


class PlanExecutor:
    """Holds the caches of one plan and executes its steps; ``run()`` returns per-step timings."""

    def __init__(self, meta: dict, requests, subset: Subset, device: str, *, timing: bool = True) -> None:
        import torch

        import kernels
        self.torch, self.k = torch, kernels
        self.meta, self.subset, self.device = meta, subset, torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.bs = int(meta["block_size"])
        self.num_gpu_blocks, self.num_cpu_blocks = int(meta["num_gpu_blocks"]), int(meta["num_cpu_blocks"])
        self.dtype = getattr(torch, subset.dtype)
        self.requests = {int(r): (int(p), list(k) if k is not None else [])
                         for r, p, k in zip(requests["request_id"], requests["prompt_tokens"], requests["block_keys"])}
        s = subset
        self.gpu_k, self.gpu_v, self.cpu_k, self.cpu_v = [], [], [], []
        for _ in s.layers:
            k, v = kernels.allocate_kv_cache(self.num_gpu_blocks, s.kv_heads, s.head_size, self.bs, self.dtype,
                                             self.device)
            k.zero_()
            v.zero_()
            self.gpu_k.append(k)
            self.gpu_v.append(v)
            k, v = kernels.allocate_kv_cache(self.num_cpu_blocks, s.kv_heads, s.head_size, self.bs, self.dtype,
                                             "cpu", pin_memory=self.cuda)
            self.cpu_k.append(k)
            self.cpu_v.append(v)
        self.gen = ValueGenerator(torch, self.device, s.layers, s.head_size, self.dtype)
        self.timer = _Timer(torch, self.cuda) if timing else None
        self.scale = s.head_size ** -0.5
        self.atol, self.rtol = TOLERANCE[s.dtype]
        self._seeds: dict[int, np.ndarray] = {}  # seq_id -> content seeds of positions 0..len-1
        self._check_idx = [s.layers.index(layer) for layer in s.check_layers]

    # --- per-sequence content ---------------------------------------------------------------------
    def _content(self, request_id: int, seq_id: int, upto: int) -> np.ndarray:
        """Content seeds of positions [0, upto) of a sequence (cached; they never change)."""
        have = self._seeds.get(seq_id)
        if have is None or len(have) < upto:
            prompt, keys = self.requests[request_id]
            start = 0 if have is None else len(have)
            new = content_seeds(request_id, seq_id, prompt, keys, np.arange(start, upto), self.bs)
            have = new if have is None else np.concatenate([have, new])
            self._seeds[seq_id] = have
        return have[:upto]

    # --- one step -----------------------------------------------------------------------------------
    def _timed(self, component: str):
        return self.timer.start() if self.timer else None

    def _done(self, component: str, t0) -> None:
        if self.timer:
            self.timer.stop(component, t0)

    def _lead(self, launches: int) -> None:
        if self.timer:
            self.timer.lead(launches)

    def _moves(self, step: int, what: str, src, dst, n_src: int, n_dst: int) -> np.ndarray:
        m = np.stack([np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)], axis=1).reshape(-1, 2)
        for col, n, side in ((0, n_src, "source"), (1, n_dst, "destination")):
            bad = (m[:, col] < 0) | (m[:, col] >= n)
            if bad.any():
                raise ValidationError(f"{what}: {side} block {int(m[bad][0, col])} is outside the cache's {n} blocks",
                                      step=step, physical_block=int(m[bad][0, col]), check=what)
        if len(np.unique(m[:, 1])) != len(m):
            d = m[:, 1]
            dup = int(d[np.argmax([np.sum(d == x) > 1 for x in d])])
            raise ValidationError(f"{what}: destination block {dup} appears twice", step=step, physical_block=dup,
                                  check=what)
        return m

    def step(self, step: int, srow: dict, seqs: dict) -> dict[str, float]:
        """Execute and check one step; ``srow`` is the step's row, ``seqs`` column arrays of its sequences."""
        torch, k, s = self.torch, self.k, self.subset
        G, C = self.num_gpu_blocks, self.num_cpu_blocks
        swap_in = self._moves(step, "swap in", srow["swap_in_src"], srow["swap_in_dst"], C, G)
        swap_out = self._moves(step, "swap out", srow["swap_out_src"], srow["swap_out_dst"], G, C)
        copy = self._moves(step, "copy-on-write", srow["copy_src"], srow["copy_dst"], G, G)
        if len(copy) and np.isin(copy[:, 0], copy[:, 1]).any():
            b = int(copy[np.isin(copy[:, 0], copy[:, 1])][0, 0])
            raise ValidationError(f"copy-on-write: block {b} is both copied from and copied to", step=step,
                                  physical_block=b, check="copy")
        if len(swap_in) or len(swap_out):
            self._lead(2 * len(s.layers) * ((len(swap_in) > 0) + (len(swap_out) > 0)))
        t0 = self._timed("swap")
        for mapping, pairs in ((swap_in, (self.cpu_k, self.gpu_k, self.cpu_v, self.gpu_v)),
                               (swap_out, (self.gpu_k, self.cpu_k, self.gpu_v, self.cpu_v))):
            if len(mapping):
                mt = torch.as_tensor(mapping)
                for j in range(len(s.layers)):
                    k.swap_blocks(pairs[0][j], pairs[1][j], mt)
                    k.swap_blocks(pairs[2][j], pairs[3][j], mt)
        self._done("swap", t0)
        if len(copy):
            mt = torch.as_tensor(copy)
            self._lead(1)
            t0 = self._timed("copy")
            k.copy_blocks(self.gpu_k, self.gpu_v, mt)
            self._done("copy", t0)
        self._write(step, seqs)
        out = self._attention(step, seqs)
        self._check(step, seqs, out)
        return self.timer.collect() if self.timer else {}

    def _write(self, step: int, seqs: dict) -> None:
        torch, bs, s = self.torch, self.bs, self.subset
        slots, seeds, owner, positions = [], [], [], []
        for i in range(len(seqs["seq_id"])):
            ns, ne, table = int(seqs["new_start"][i]), int(seqs["new_end"][i]), seqs["block_table"][i]
            if ne <= ns:
                continue
            if ne > len(table) * bs:
                raise ValidationError(f"block table of {len(table)} blocks cannot hold position {ne - 1}", step=step,
                                      request_id=int(seqs["request_id"][i]), seq_id=int(seqs["seq_id"][i]),
                                      position=ne - 1, logical_block=len(table), check="table")
            pos = np.arange(ns, ne)
            blocks = np.asarray(table, dtype=np.int64)[pos // bs]
            bad = (blocks < 0) | (blocks >= self.num_gpu_blocks)
            if bad.any():
                p = int(pos[bad][0])
                raise ValidationError(f"physical block outside the cache's {self.num_gpu_blocks} blocks", step=step,
                                      request_id=int(seqs["request_id"][i]), seq_id=int(seqs["seq_id"][i]),
                                      position=p, logical_block=p // bs, physical_block=int(blocks[bad][0]),
                                      check="table")
            slots.append(blocks * bs + pos % bs)
            seeds.append(self._content(int(seqs["request_id"][i]), int(seqs["seq_id"][i]), ne)[ns:ne])
            owner.append(np.full(len(pos), i))
            positions.append(pos)
        if not slots:
            return
        slots, seeds = np.concatenate(slots), np.concatenate(seeds)
        owner, positions = np.concatenate(owner), np.concatenate(positions)
        order = np.argsort(slots, kind="stable")
        same = slots[order][1:] == slots[order][:-1]
        if same.any():
            clash = same & (seeds[order][1:] != seeds[order][:-1])
            if clash.any():
                j = int(np.argmax(clash))
                a, b = order[j], order[j + 1]
                ia, ib = int(owner[a]), int(owner[b])
                raise ValidationError(
                    f"sequences {int(seqs['seq_id'][ia])} (position {int(positions[a])}) and "
                    f"{int(seqs['seq_id'][ib])} (position {int(positions[b])}) write different K/V to slot "
                    f"{int(slots[a])} in one step: a block shared without copy-on-write, or held by two owners",
                    step=step, request_id=int(seqs["request_id"][ib]), seq_id=int(seqs["seq_id"][ib]),
                    position=int(positions[b]), logical_block=int(positions[b]) // self.bs,
                    physical_block=int(slots[b]) // self.bs, check="write")
            keep = np.ones(len(slots), dtype=bool)
            keep[order[1:][same]] = False
            slots, seeds = slots[keep], seeds[keep]
        slot_t = torch.as_tensor(slots, device=self.device)
        seed_t = torch.as_tensor(seeds, device=self.device)
        n, L = len(slots), len(s.layers)
        per = max(1, (1 << 25) // max(1, n * s.kv_heads * s.head_size))  # layers per generated chunk
        for lo in range(0, L, per):
            chunk = s.layers[lo:lo + per]
            self._lead(len(chunk) + 20)  # the K/V generation kernels queue ahead of the writes too
            kk = self.gen.values(seed_t, WHICH_K, s.kv_heads, chunk)
            vv = self.gen.values(seed_t, WHICH_V, s.kv_heads, chunk)
            for j in range(len(chunk)):
                t0 = self._timed("write")
                self.k.reshape_and_cache(kk[:, j], vv[:, j], self.gpu_k[lo + j], self.gpu_v[lo + j], slot_t,
                                         validate=not self.cuda)
                self._done("write", t0)

    def _decode_rows(self, seqs: dict) -> np.ndarray:
        return np.flatnonzero(~np.asarray(seqs["is_prefill"], dtype=bool))

    def _attention(self, step: int, seqs: dict):
        """Paged attention of the decode sequences, every layer: ``[layers, B, heads, head_size]`` or None."""
        torch, s = self.torch, self.subset
        rows = self._decode_rows(seqs)
        if not len(rows):
            return None
        ctx = np.asarray(seqs["context_len"], dtype=np.int64)[rows]
        nblocks = -(-ctx // self.bs)
        tables = np.zeros((len(rows), int(nblocks.max())), dtype=np.int32)
        for r, i in enumerate(rows):
            t = np.asarray(seqs["block_table"][i], dtype=np.int64)[: nblocks[r]]
            if len(t) < nblocks[r]:
                raise ValidationError(f"block table of {len(t)} blocks for a context of {int(ctx[r])} tokens",
                                      step=step, seq_id=int(seqs["seq_id"][i]), request_id=int(seqs["request_id"][i]),
                                      logical_block=len(t), check="table")
            tables[r, : len(t)] = t
        qseeds = np.concatenate([query_seeds(int(seqs["seq_id"][i]), [int(ctx[r]) - 1]) for r, i in enumerate(rows)])
        q = self.gen.values(torch.as_tensor(qseeds, device=self.device), WHICH_Q, s.heads)  # [B, L, H, D]
        bt = torch.as_tensor(tables, device=self.device)
        cl = torch.as_tensor(ctx.astype(np.int32), device=self.device)
        out = torch.empty(len(s.layers), len(rows), s.heads, s.head_size, dtype=self.dtype, device=self.device)
        maxc = int(ctx.max())
        self._lead(len(s.layers))
        for j in range(len(s.layers)):
            t0 = self._timed("attn_decode")
            self.k.paged_attention(out[j], q[:, j], self.gpu_k[j], self.gpu_v[j], s.kv_heads, self.scale, bt, cl,
                                   self.bs, maxc, validate=not self.cuda)
            self._done("attn_decode", t0)
        return out, q

    # --- checks -------------------------------------------------------------------------------------
    def _check(self, step: int, seqs: dict, attn) -> None:
        torch, bs, s = self.torch, self.bs, self.subset
        n = len(seqs["seq_id"])
        if n == 0 or not self._check_idx:
            return
        ctx = np.asarray(seqs["context_len"], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(ctx)])
        slots, seeds = np.empty(starts[-1], np.int64), np.empty(starts[-1], np.int64)
        for i in range(n):
            c = int(ctx[i])
            pos = np.arange(c)
            table = np.asarray(seqs["block_table"][i], dtype=np.int64)
            if len(table) * bs < c:
                raise ValidationError(f"block table of {len(table)} blocks for a context of {c} tokens", step=step,
                                      seq_id=int(seqs["seq_id"][i]), request_id=int(seqs["request_id"][i]),
                                      logical_block=len(table), check="table")
            slots[starts[i]:starts[i + 1]] = table[pos // bs] * bs + pos % bs
            seeds[starts[i]:starts[i + 1]] = self._content(int(seqs["request_id"][i]), int(seqs["seq_id"][i]), c)
        slot_t = torch.as_tensor(slots, device=self.device)
        blk, off = slot_t // bs, slot_t % bs
        seed_t = torch.as_tensor(seeds, device=self.device)
        rows = self._decode_rows(seqs)
        for j in self._check_idx:
            layer = s.layers[j]
            want_k = self.gen.values(seed_t, WHICH_K, s.kv_heads, [layer])[:, 0]
            want_v = self.gen.values(seed_t, WHICH_V, s.kv_heads, [layer])[:, 0]
            got_k = self.gpu_k[j][blk, :, :, off, :].reshape(len(seeds), s.kv_heads, s.head_size)
            got_v = self.gpu_v[j][blk, :, :, off]
            bad = ((got_k != want_k) | (got_v != want_v)).flatten(1).any(1)
            if bool(bad.any()):
                t = int(torch.nonzero(bad)[0])
                i = int(np.searchsorted(starts, t, side="right") - 1)
                pos = t - int(starts[i])
                kind = "prefill" if seqs["is_prefill"][i] else "decode"
                raise ValidationError(
                    f"cache content differs from the expected K/V ({kind} sequence, context {int(ctx[i])}): "
                    f"the block holds another token's data or was never written",
                    step=step, request_id=int(seqs["request_id"][i]), seq_id=int(seqs["seq_id"][i]), position=pos,
                    logical_block=pos // bs, physical_block=int(slots[t]) // bs, layer=layer, check="content")
            if attn is not None:
                self._check_attention(step, seqs, rows, ctx, starts, want_k, want_v, attn, j)

    def _check_attention(self, step, seqs, rows, ctx, starts, want_k, want_v, attn, j) -> None:
        torch, s = self.torch, self.subset
        out, q = attn
        c = torch.as_tensor(ctx[rows], device=self.device)
        maxc = int(ctx[rows].max())
        ar = torch.arange(maxc, device=self.device)
        idx = torch.as_tensor(starts[rows], device=self.device).view(-1, 1) + ar.view(1, -1)
        valid = ar.view(1, -1) < c.view(-1, 1)
        idx = torch.where(valid, idx, torch.zeros_like(idx))
        kd = want_k[idx].float()                                     # [B, T, kvh, D]
        vd = want_v[idx].float()
        g = s.heads // s.kv_heads
        qd = q[:, j].float().view(len(rows), s.kv_heads, g, s.head_size)
        logits = torch.einsum("bkgd,btkd->bkgt", qd, kd) * self.scale
        logits = logits.masked_fill(~valid.view(len(rows), 1, 1, maxc), float("-inf"))
        ref = torch.einsum("bkgt,btkd->bkgd", torch.softmax(logits, dim=-1), vd).reshape(len(rows), s.heads, -1)
        got = out[j].float()
        err = (got - ref).abs()
        over = (err > self.atol + self.rtol * ref.abs()).flatten(1).any(1)
        if bool(over.any()):
            r = int(torch.nonzero(over)[0])
            i = int(rows[r])
            raise ValidationError(
                f"paged attention output differs from the dense reference by {float(err[r].max()):.3g} "
                f"(tolerance {self.atol:g} + {self.rtol:g}*|ref|) although the cache content matches: "
                f"the kernel read the wrong blocks or computed wrongly",
                step=step, request_id=int(seqs["request_id"][i]), seq_id=int(seqs["seq_id"][i]),
                logical_block=None, physical_block=None, layer=s.layers[j], check="attention")

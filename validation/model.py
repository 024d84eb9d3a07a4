"""The model forward pass at a catalog model's dimensions, with random weights, over a paged KV cache.

One engine step is one call of `ModelRunner.forward` (eager) or `ModelRunner.replay_decode` (a
CUDA graph captured at a padded batch size). A step's tokens come in vLLM v0's order: the new
tokens of each prefill sequence, sequence after sequence, then one token per decoding sequence
(`StepBatch`). Per layer, as a Llama-family decoder computes it:

    h = rms_norm(x); q, k, v = split(h @ Wqkv); q, k = rotary(q, k, positions)
    cache[slot] = k, v                                   (the fast layout, one write per layer)
    a[prefill tokens] = paged prefill attention          (kernels.paged_prefill_attention: its mma.sync
                                                          configurations, or with prefill="wgmma" its
                                                          warpgroup kernels, given the step's own k, v
                                                          for the tiles of new keys; or gather + SDPA)
    a[decode tokens]  = paged decode attention           (the fast kernel; the vLLM-layout v1/v2
                                                          kernels with attention="vllm")
    x = x + a @ Wo; x = x + down(silu(h2 @ Wgate) * (h2 @ Wup)),  h2 = rms_norm(x)

then the final norm, the LM head on the positions that sample and a greedy argmax. Weights are
drawn on the device (normal, std 1/sqrt(fan-in), fixed seed): nothing is downloaded, and the
arithmetic and memory traffic are those of the real model. Attention is over the whole context:
Mistral 7B v0.1's 4096-token sliding window is not applied (the fidelity slices are clipped to
4096 tokens, where it changes nothing).

Caches: one `[num_blocks + 1, block_size, num_kv_heads, head_size]` key and value cache per layer
in the fast layout's default storage (`kernels.allocate_fast_kv_cache`); block `num_blocks` is a
scratch block that padding tokens of a CUDA-graph batch write to, so a captured step needs no
masking (no host synchronisation). With attention="vllm" the caches are in the vLLM layout
(`kernels.allocate_kv_cache`) and the writes go through `kernels.reshape_and_cache`.

Parts: `forward(batch, parts=...)` runs a subset of {"linear", "write", "attn", "sample"}; the
profiler (`validation.profile`) times each part alone with the same code that the executor runs.

Timing: a CUDA-graph step is timed whole (one launch). An eager step is timed segment by segment
with a `SegmentTimer` (embedding, each layer, sampling, block moves): a sleep queued before each
segment lets the host queue the segment's launches, so the events time the GPU's work without
the Python host's launch gaps; the host's time is reported apart.

torch is imported by the caller's process; this module imports it at the top (validation only).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

import kernels

PARTS = ("linear", "write", "attn", "sample")
#: prefill attention: "kernel" the paged prefill kernel's mma.sync tile configurations (those the
#: committed cost profiles measured), "wgmma" the kernel's own choice (its warpgroup kernels where
#: they run: Hopper, head 128, float16 or bfloat16; kernels/DESIGN.md "Dispatch"), "sdpa" gather +
#: torch SDPA; "auto" the kernel's mma.sync configurations where the kernels package has them
PREFILL_IMPLS = ("auto", "kernel", "wgmma", "sdpa")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
#: vLLM's CUDA-graph batch sizes (`_BATCH_SIZES_TO_CAPTURE`): 1, 2, 4, then every multiple of 8 to 256.
GRAPH_BATCH_SIZES = (1, 2, 4, *range(8, 257, 8))
ROPE_THETA = {"llama-3-8b": 500000.0, "llama-3-70b": 500000.0}  # others: 10000 (Llama 2, Mistral 7B v0.1)
RMS_EPS = 1e-5


class SegmentTimer:
    """GPU time of an eager step, segment by segment, without the host's launch gaps.

    Before each segment (the embedding, each layer, the sampling, a block move) `begin` queues a
    sleep on the stream long enough for the host to queue the segment's launches behind it, then
    records an event; `end` records another. The sum of the segments' event times is the GPU's
    time for the step's work: the kernels back to back, as a serving engine whose host keeps
    ahead of its GPU sees them. The host's time is measured apart (perf_counter).

    A segment is *late* when its launches took the host longer than its sleep lasts: the GPU may
    then have waited for the host inside the timed span, and the span holds that gap. Launches
    queued within the sleep cannot leave a gap (the sleep starts no earlier than it is queued and
    lasts at least its length at the clock assumed), so a segment that is not late times the GPU's
    work alone, and a late one holds at most its overrun (the host's time beyond the sleep) of
    waiting. `seconds` leaves the count of late segments it summed in `late` and their overruns'
    sum in `overrun_s`.
    """

    CLOCK_HZ = 2.0e9  # sleep cycles per second (Hopper boost clock is about 1.98 GHz)

    def __init__(self, lead_s: float = 1e-3) -> None:
        self.lead_s = lead_s
        self.pairs: list[tuple] = []
        self._start = None
        self._host0, self._lead = 0.0, math.inf
        self._late, self._overrun = 0, 0.0
        self._host: list[float] = []
        self._own = True
        self.late = 0         # late segments among those the last `seconds` summed
        self.overrun_s = 0.0  # their host time beyond their sleeps: a bound on the GPU's waits in them
        # the host time (the sleep's queuing to the segment's end) of each of those segments that
        # slept the timer's own `lead_s` (`begin()` without a lead of its own, as a block move has)
        self.host_s: list[float] = []

    def begin(self, lead_s: float | None = None) -> None:
        self._lead = self.lead_s if lead_s is None else lead_s
        self._own = lead_s is None  # the timer's own lead (not a block move's fixed one): its host time is kept
        self._host0 = time.perf_counter()  # before the sleep is queued: its start is no earlier
        torch.cuda._sleep(int(self._lead * self.CLOCK_HZ))
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def end(self) -> None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        host = time.perf_counter() - self._host0
        if self._own:
            self._host.append(host)
        over = host - self._lead
        if over > 0:
            self._late += 1
            self._overrun += over
        self.pairs.append((self._start, e))

    def seconds(self) -> float:
        """The segments' total (synchronises); resets, leaving their late segments in `late` and
        `overrun_s`, and their host times in `host_s`."""
        self.late, self.overrun_s, self._late, self._overrun = self._late, self._overrun, 0, 0.0
        self.host_s, self._host = self._host, []
        if not self.pairs:
            return 0.0
        self.pairs[-1][1].synchronize()
        total = sum(a.elapsed_time(b) for a, b in self.pairs) / 1e3
        self.pairs = []
        return total


class EventTimer(SegmentTimer):
    """GPU time of spans inside a timed segment (attention within each layer): events only, no
    sleep, the host being ahead already thanks to the segment's sleep (never late)."""

    def begin(self, lead_s: float | None = None) -> None:
        self._lead, self._host0 = math.inf, time.perf_counter()
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()


class _NoTimer:
    def begin(self, lead_s=None) -> None:
        pass

    def end(self) -> None:
        pass


NO_TIMER = _NoTimer()


def padded_batch_size(n: int, sizes=GRAPH_BATCH_SIZES) -> int | None:
    """The smallest captured size >= n (None when n is larger than every captured size)."""
    for s in sizes:
        if s >= n:
            return s
    return None


@dataclass
class PrefillSeq:
    """One sequence's prompt (chunk) in a step: positions [start, stop) are new, [0, start) cached."""

    start: int
    stop: int
    block_table: np.ndarray
    sample: bool = True  # the chunk ends the prompt: its last position samples


@dataclass
class StepBatch:
    """The tokens of one step in vLLM v0's order (prefill tokens, then one per decode sequence)."""

    token_ids: np.ndarray                 # [T] int64
    positions: np.ndarray                 # [T] int64
    slots: np.ndarray                     # [T] int64, block * block_size + offset
    prefills: list[PrefillSeq] = field(default_factory=list)
    decode_tables: list[np.ndarray] = field(default_factory=list)
    decode_context: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(p.stop - p.start for p in self.prefills)

    @property
    def num_decodes(self) -> int:
        return len(self.decode_tables)

    def sample_indices(self) -> np.ndarray:
        """Token indices whose logits sample: the last new token of each prompt that ends, every decode."""
        idx, at = [], 0
        for p in self.prefills:
            at += p.stop - p.start
            if p.sample:
                idx.append(at - 1)
        return np.concatenate([np.asarray(idx, np.int64), at + np.arange(self.num_decodes, dtype=np.int64)])


@dataclass(frozen=True)
class ModelDims:
    """What the forward pass needs of a `blocksim.config.ModelSpec` (per GPU: tensor parallel 1)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int

    @classmethod
    def of(cls, spec) -> "ModelDims":
        return cls(spec.name, spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_size,
                   spec.intermediate_size, spec.vocab_size, spec.max_model_len)

    def weight_bytes(self, dtype_bytes: int) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_size
        qkv = h * (self.num_heads + 2 * self.num_kv_heads) * d
        per_layer = qkv + self.num_heads * d * h + 3 * h * i + 2 * h
        return dtype_bytes * (self.num_layers * per_layer + 2 * self.vocab_size * h + h)

    def kv_block_bytes(self, block_size: int, dtype_bytes: int) -> int:
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_size * dtype_bytes


class ModelRunner:
    """Weights, paged caches (GPU and pinned CPU) and the forward pass of one model on one device."""

    def __init__(self, dims: ModelDims, *, num_blocks: int, num_cpu_blocks: int = 0, block_size: int = 16,
                 dtype: str = "float16", device: str = "cuda", attention: str = "fast", prefill: str = "auto",
                 seed: int = 0) -> None:
        if attention not in ("fast", "vllm"):
            raise ValueError(f"attention must be 'fast' or 'vllm', got {attention!r}")
        if prefill not in PREFILL_IMPLS:
            raise ValueError(f"prefill must be one of {', '.join(repr(x) for x in PREFILL_IMPLS)}, got {prefill!r}")
        self.dims, self.block_size, self.num_blocks = dims, block_size, num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.dtype = DTYPES[dtype]
        self.attention = attention
        self.prefill_impl = self._choose_prefill(prefill)
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count if self.cuda else 132
        self.scale = dims.head_size ** -0.5
        self.pad_slot = num_blocks * block_size  # the scratch block's first slot
        g = torch.Generator(device=self.device).manual_seed(seed)
        self._init_weights(g)
        self._init_caches()
        self._init_rotary()
        self.graphs: dict[int, tuple] = {}
        self._graph_pool = None
        self._static = None

    # --- set-up -------------------------------------------------------------------------------------
    def _choose_prefill(self, prefill: str) -> str:
        try:
            kernels.paged_prefill_attention  # noqa: B018 (the kernels package loads its names on first use)
            has_kernel = True
            if self.cuda:
                from kernels._build import extension
                has_kernel = hasattr(extension(), "paged_prefill")
        except (AttributeError, ImportError):
            has_kernel = False
        if prefill in ("kernel", "wgmma") and not has_kernel:
            raise ValueError(f"prefill={prefill!r}: kernels.paged_prefill_attention is not available in this tree")
        if prefill == "auto":
            return "kernel" if has_kernel and self.attention == "fast" else "sdpa"
        return prefill

    def _param(self, g, *shape, fan_in: int | None = None, ones: bool = False):
        if ones:
            return torch.ones(*shape, dtype=self.dtype, device=self.device)
        w = torch.empty(*shape, dtype=self.dtype, device=self.device)
        return w.normal_(0.0, 1.0 / math.sqrt(fan_in or shape[-1]), generator=g)

    def _init_weights(self, g) -> None:
        d = self.dims
        h, i = d.hidden_size, d.intermediate_size
        qkv_out = (d.num_heads + 2 * d.num_kv_heads) * d.head_size
        self.embed = self._param(g, d.vocab_size, h, fan_in=1)
        self.layers = []
        for _ in range(d.num_layers):
            self.layers.append({
                "attn_norm": self._param(g, h, ones=True),
                "qkv": self._param(g, qkv_out, h),
                "o": self._param(g, h, d.num_heads * d.head_size),
                "mlp_norm": self._param(g, h, ones=True),
                "gate_up": self._param(g, 2 * i, h),
                "down": self._param(g, h, i),
            })
        self.final_norm = self._param(g, h, ones=True)
        self.lm_head = self._param(g, d.vocab_size, h)

    def _init_caches(self) -> None:
        d, bs = self.dims, self.block_size
        self.k_caches, self.v_caches, self.gpu_stores, self.cpu_stores = [], [], [], []
        for _ in range(d.num_layers):
            if self.attention == "fast":
                k, v = kernels.allocate_fast_kv_cache(self.num_blocks + 1, bs, d.num_kv_heads, d.head_size,
                                                      self.dtype, self.device)
                store = k._base if k._base is not None else k  # one [blocks, kv_heads, 2, bs, head] storage
                stores = (store,)
            else:
                k, v = kernels.allocate_kv_cache(self.num_blocks + 1, d.num_kv_heads, d.head_size, bs, self.dtype,
                                                 self.device)
                stores = (k, v)
            for s in stores:
                s.zero_()
            self.k_caches.append(k)
            self.v_caches.append(v)
            self.gpu_stores.append(stores)
            if self.num_cpu_blocks:
                self.cpu_stores.append(tuple(
                    torch.empty((self.num_cpu_blocks, *s.shape[1:]), dtype=s.dtype, pin_memory=self.cuda)
                    for s in stores))

    def _init_rotary(self) -> None:
        d = self.dims
        theta = ROPE_THETA.get(d.name, 10000.0)
        inv = 1.0 / (theta ** (torch.arange(0, d.head_size, 2, dtype=torch.float32, device=self.device) / d.head_size))
        t = torch.arange(d.max_model_len, dtype=torch.float32, device=self.device)
        freqs = torch.outer(t, inv)
        self.cos, self.sin = freqs.cos(), freqs.sin()  # [max_len, head/2], float32

    # --- pieces of a layer --------------------------------------------------------------------------
    def _rotary(self, x, cos, sin):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def _norm(self, x, w):
        return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)

    def _write(self, j: int, k, v, slots) -> None:
        """K/V of the step's tokens into their slots (padding tokens write the scratch block): the
        fast layout's write kernel (strided K/V straight from the QKV output), or the vLLM layout's."""
        if self.attention == "fast":
            kernels.reshape_and_cache_fast(k, v, self.k_caches[j], self.v_caches[j], slots, validate=False)
        else:
            kernels.reshape_and_cache(k.contiguous(), v.contiguous(), self.k_caches[j], self.v_caches[j], slots,
                                      validate=False)

    def _decode_attention(self, j: int, out, q, meta) -> None:
        tables, ctx, max_ctx = meta
        kernels.paged_attention(out, q, self.k_caches[j], self.v_caches[j], self.dims.num_kv_heads, self.scale,
                                tables, ctx, self.block_size, max_ctx, impl=self.attention, validate=not self.cuda)

    def _prefill_attention(self, j: int, out, q, k_new, v_new, meta) -> None:
        d = self.dims
        if self.prefill_impl in ("kernel", "wgmma"):
            tables, qsl, ctx = meta["tables"], meta["qsl"], meta["ctx"]
            kernels.paged_prefill_attention(out, q, self.k_caches[j], self.v_caches[j], d.num_kv_heads, self.scale,
                                            tables, qsl, ctx, self.block_size, max_query_len=meta["max_new"],
                                            max_context_len=meta["max_ctx"], validate=not self.cuda,
                                            config=meta["config"], key=k_new, value=v_new)
            return
        self._prefill_sdpa(j, out, q, k_new, v_new, meta)

    def _prefill_sdpa(self, j: int, out, q, k_new, v_new, meta) -> None:
        """The gather + SDPA prefill path: per sequence, its cached keys and values gathered from the
        paged cache through its block table, then the new ones; causal attention of the new queries."""
        d = self.dims
        for i, (lo, hi, start, gather) in enumerate(meta["seqs"]):
            qs = q[lo:hi].transpose(0, 1).unsqueeze(0)                   # [1, H, n, D]
            if start:
                kc = self.k_caches[j][gather].flatten(0, 1)[:start]
                vc = self.v_caches[j][gather].flatten(0, 1)[:start]
                ks = torch.cat([kc, k_new[lo:hi]], 0)
                vs = torch.cat([vc, v_new[lo:hi]], 0)
            else:
                ks, vs = k_new[lo:hi], v_new[lo:hi]
            ks = ks.transpose(0, 1).unsqueeze(0)
            vs = vs.transpose(0, 1).unsqueeze(0)
            if start:
                n, total = hi - lo, start + hi - lo
                mask = (torch.arange(total, device=q.device).view(1, -1)
                        <= (start + torch.arange(n, device=q.device)).view(-1, 1))
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.scale,
                                                   enable_gqa=d.num_heads != d.num_kv_heads)
            else:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale,
                                                   enable_gqa=d.num_heads != d.num_kv_heads)
            out[lo:hi] = o[0].transpose(0, 1)

    # --- inputs -------------------------------------------------------------------------------------
    def _as(self, a, dtype=torch.int64):
        return torch.as_tensor(np.asarray(a), dtype=dtype).to(self.device, non_blocking=True)

    def _tables(self, tables: list[np.ndarray], width: int | None = None):
        width = width or max((len(t) for t in tables), default=1) or 1
        out = np.full((len(tables), width), self.num_blocks, dtype=np.int32)  # padding: the scratch block
        for r, t in enumerate(tables):
            out[r, :len(t)] = t[:width]
        return out

    def prepare(self, batch: StepBatch) -> dict:
        """Device tensors of a step's inputs (uploaded before the step is timed)."""
        inp = {"ids": self._as(batch.token_ids), "pos": self._as(batch.positions),
               "slots": self._as(batch.slots), "sample": self._as(batch.sample_indices()),
               "num_prefill_tokens": batch.num_prefill_tokens}
        if batch.prefills:
            starts = np.asarray([p.start for p in batch.prefills], np.int64)
            stops = np.asarray([p.stop for p in batch.prefills], np.int64)
            qsl = np.concatenate([[0], np.cumsum(stops - starts)])
            meta = {"tables": self._as(self._tables([p.block_table[:-(-p.stop // self.block_size)]
                                                     for p in batch.prefills]), torch.int32),
                    "qsl": self._as(qsl, torch.int32), "ctx": self._as(stops, torch.int32),
                    "max_new": int((stops - starts).max()), "max_ctx": int(stops.max())}
            if self.prefill_impl == "kernel":  # the mma.sync tile configurations, which the shipped cost
                d = self.dims                      # profiles measured (the kernels' own choice may differ)
                meta["config"] = kernels.choose_prefill_config(len(batch.prefills), meta["max_new"], d.num_heads,
                                                               d.num_kv_heads, d.head_size, self.num_sms)
            elif self.prefill_impl == "wgmma":  # the kernels' own choice: the warpgroup kernels where they run
                meta["config"] = None
            if self.prefill_impl == "sdpa":
                meta["seqs"] = [(int(qsl[i]), int(qsl[i + 1]), int(p.start),
                                 self._as(p.block_table[:-(-p.start // self.block_size)]) if p.start else None)
                                for i, p in enumerate(batch.prefills)]
            inp["prefill"] = meta
        if batch.num_decodes:
            ctx = np.asarray(batch.decode_context, np.int64)
            inp["decode"] = (self._as(self._tables(batch.decode_tables), torch.int32), self._as(ctx, torch.int32),
                             int(ctx.max()))
        return inp

    # --- the forward pass ---------------------------------------------------------------------------
    def forward(self, inp: dict, parts=PARTS, timer=NO_TIMER, num_layers: int | None = None, attn_timer=NO_TIMER):
        """One step, eager; returns the sampled token ids (a device tensor) or None without "sample".
        `timer` (a `SegmentTimer`) times the embedding, each layer and the sampling on the GPU;
        `attn_timer` (an `EventTimer`) the attention inside each layer; `num_layers` runs only the
        first layers (`prime`)."""
        d = self.dims
        ids, pos, slots = inp["ids"], inp["pos"], inp["slots"]
        T, P = ids.shape[0], inp["num_prefill_tokens"]
        linear, write, attn = "linear" in parts, "write" in parts, "attn" in parts
        H, K, D = d.num_heads, d.num_kv_heads, d.head_size
        timer.begin()
        x = self.embed[ids] if linear else None
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        # attention, writes or the linear layers alone (profiling): unit-normal stand-ins for the
        # queries and keys, or for the attention output the output projection reads
        scratch = None if (linear and attn) else self._scratch(T)
        timer.end()
        for j, w in enumerate(self.layers[:num_layers]):
            timer.begin()
            if linear:
                h = self._norm(x, w["attn_norm"])
                qkv = F.linear(h, w["qkv"]).view(T, H + 2 * K, D)
                qk = self._rotary(qkv[:, :H + K], cos, sin)
                q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + K:]
            else:
                q, k = scratch
                v = k
            if write:
                self._write(j, k, v, slots)
            a = torch.empty(T, H, D, dtype=self.dtype, device=self.device) if attn else (scratch[0] if linear else None)
            if attn:
                attn_timer.begin()
                if P:
                    self._prefill_attention(j, a[:P], q[:P], k[:P], v[:P], inp["prefill"])
                if "decode" in inp:
                    self._decode_attention(j, a[P:], q[P:], inp["decode"])
                attn_timer.end()
            if linear:
                x = x + self._reduce(F.linear(a.view(T, H * D), w["o"]))
                h = self._norm(x, w["mlp_norm"])
                gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
                x = x + self._reduce(F.linear(F.silu(gate) * up, w["down"]))
            timer.end()
        if "sample" not in parts:
            return None
        timer.begin()
        if x is None:
            x = torch.zeros(T, d.hidden_size, dtype=self.dtype, device=self.device)
        out = self.sample(x, inp["sample"])
        timer.end()
        return out

    def _reduce(self, y):
        """The sum over tensor-parallel ranks of a row-parallel layer's output (`validation.sharded`);
        one GPU holds the whole sum."""
        return y

    def _scratch(self, T: int):
        """Queries and keys of T tokens for attention or writes timed alone, and the attention output
        of the linear layers timed alone: unit normal, like the projections of normed activations by
        the fan-in-scaled weights. Real-valued operands matter: the GEMMs of a 4096-token step ran
        9% faster on the uninitialised attention output than on real values (less power drawn, so
        higher clocks under the power cap). Kept for the next call of the same T; zeros inside a
        CUDA graph capture (small, memory-bound steps), which owns them."""
        d = self.dims
        if self.cuda and torch.cuda.is_current_stream_capturing():  # a graph keeps its own, from its pool
            return tuple(torch.zeros(T, h, d.head_size, dtype=self.dtype, device=self.device)
                         for h in (d.num_heads, d.num_kv_heads))
        if getattr(self, "_scratch_qk", None) is None or self._scratch_qk[0].shape[0] != T:
            g = torch.Generator(device=self.device).manual_seed(T)
            self._scratch_qk = tuple(torch.randn(T, h, d.head_size, generator=g, device=self.device).to(self.dtype)
                                     for h in (d.num_heads, d.num_kv_heads))
        return self._scratch_qk

    def prime(self, inp: dict) -> None:
        """The step's embedding, first layer and sampling, untimed: the host's first calls of a new
        shape (GEMM heuristics, allocator growth) happen here, not inside a timed segment, as in an
        engine that has run the shape before. The first layer writes the same keys and values the
        step writes, so the step's results do not change."""
        self.forward(inp, PARTS, NO_TIMER, num_layers=1)

    def sample(self, x, sample_idx):
        """Final norm, LM head on the sampled positions, greedy argmax."""
        h = self._norm(x[sample_idx], self.final_norm)
        return torch.argmax(F.linear(h, self.lm_head), dim=-1)

    def warm_up(self, max_tokens: int) -> None:
        """Eager prompt steps of `max_tokens` down to one token that touch only the scratch block
        (every slot and block-table entry points at it): the caching allocator and the GEMM
        heuristics are primed before the first timed step, as a serving engine's start-up run does.
        Then one copy-on-write copy of the scratch block onto itself and, with a CPU cache, one swap
        of it out and back: a process's first block copy costs 50-70 ms on an H200 (its kernels'
        first load), once in a server's life, not in each step that copies."""
        n = max(1, int(max_tokens))
        while True:
            table = np.full(-(-n // self.block_size), self.num_blocks, dtype=np.int64)
            b = StepBatch(np.zeros(n, np.int64), np.arange(n) % self.dims.max_model_len,
                          np.full(n, self.pad_slot, np.int64), [PrefillSeq(0, n, table)])
            self.forward(self.prepare(b))
            if n == 1:
                break
            n = max(1, n // 4)
        scratch = self.num_blocks
        self.copy(np.array([[scratch, scratch]], np.int64))
        if self.cpu_stores:  # CPU block 0 holds nothing yet: the swap in restores the scratch block
            self.swap(np.array([[scratch, 0]], np.int64), False)
            self.swap(np.array([[0, scratch]], np.int64), True)
        if self.cuda:
            torch.cuda.synchronize()

    # --- CUDA graphs of pure-decode steps -------------------------------------------------------------
    def capture_decode_graphs(self, max_batch: int, sizes=GRAPH_BATCH_SIZES, parts=PARTS) -> list[int]:
        """Capture a pure-decode step at each size <= the padded `max_batch`, largest first, in one
        memory pool (as vLLM does); contexts up to the model's length. Returns the captured sizes."""
        if not self.cuda:
            return []
        top = padded_batch_size(max_batch, sizes) or max(sizes)
        todo = sorted((s for s in sizes if s <= top), reverse=True)
        width = -(-self.dims.max_model_len // self.block_size)
        if self._static is None or self._static["ids"].shape[0] < todo[0]:
            n = todo[0]
            self._static = {"ids": torch.zeros(n, dtype=torch.int64, device=self.device),
                            "pos": torch.zeros(n, dtype=torch.int64, device=self.device),
                            "slots": torch.full((n,), self.pad_slot, dtype=torch.int64, device=self.device),
                            "tables": torch.full((n, width), self.num_blocks, dtype=torch.int32, device=self.device),
                            "ctx": torch.ones(n, dtype=torch.int32, device=self.device),
                            "sample": torch.arange(n, dtype=torch.int64, device=self.device)}
        s = self._static
        key = tuple(sorted(parts))
        for b in todo:
            if (b, key) in self.graphs:
                continue
            inp = {"ids": s["ids"][:b], "pos": s["pos"][:b], "slots": s["slots"][:b], "sample": s["sample"][:b],
                   "num_prefill_tokens": 0, "decode": (s["tables"][:b], s["ctx"][:b], self.dims.max_model_len)}
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward(inp, parts)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                out = self.forward(inp, parts)
            self.graphs[(b, key)] = (graph, out)
        torch.cuda.synchronize()
        return todo

    def load_decode(self, batch: StepBatch, padded: int) -> None:
        """Copy a pure-decode step's inputs into the static buffers of the `padded`-size graph
        (padding rows: token 0 at position 0 writing the scratch block, a one-token context in it)."""
        s, n = self._static, batch.num_decodes
        width = s["tables"].shape[1]
        ids = np.zeros(padded, np.int64)
        pos = np.zeros(padded, np.int64)
        slots = np.full(padded, self.pad_slot, np.int64)
        ctx = np.ones(padded, np.int32)
        ids[:n], pos[:n], slots[:n], ctx[:n] = batch.token_ids, batch.positions, batch.slots, batch.decode_context
        tables = self._tables(batch.decode_tables + [np.zeros(0, np.int64)] * (padded - n), width)
        for name, a in (("ids", ids), ("pos", pos), ("slots", slots), ("ctx", ctx), ("tables", tables)):
            s[name][:padded].copy_(torch.from_numpy(a), non_blocking=False)

    def replay_decode(self, padded: int, parts=PARTS):
        graph, out = self.graphs[(padded, tuple(sorted(parts)))]
        graph.replay()
        return out

    # --- block moves --------------------------------------------------------------------------------
    def swap(self, mapping: np.ndarray, to_gpu: bool, timer=NO_TIMER) -> None:
        """Swap blocks between the GPU caches and the pinned CPU caches: `mapping` rows (src, dst),
        one batched copy per cache tensor (`kernels.swap_blocks`)."""
        if not len(mapping):
            return
        m = torch.as_tensor(np.asarray(mapping, np.int64))
        timer.begin(6e-3)  # covers the host's checks and launches of one copy per cache tensor
        for gpu, cpu in zip(self.gpu_stores, self.cpu_stores):
            for g_, c_ in zip(gpu, cpu):
                kernels.swap_blocks(c_, g_, m) if to_gpu else kernels.swap_blocks(g_, c_, m)
        timer.end()

    def copy(self, mapping: np.ndarray, timer=NO_TIMER) -> None:
        """Copy-on-write: GPU block dst becomes a copy of src in every layer, rows (src, dst)."""
        if not len(mapping):
            return
        if self.attention == "vllm":
            m = torch.as_tensor(np.asarray(mapping, np.int64))
            timer.begin(2e-3)  # a block move's own sleep, as below
            kernels.copy_blocks(self.k_caches, self.v_caches, m)
            timer.end()
            return
        src = self._as(np.asarray(mapping)[:, 0])
        dst = self._as(np.asarray(mapping)[:, 1])
        timer.begin(2e-3)
        for (store,) in self.gpu_stores:
            store.index_copy_(0, dst, store.index_select(0, src))
        timer.end()

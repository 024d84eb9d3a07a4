"""``blocksim profile --model M``: measure a model's step components on a GPU and write a cost
profile (format "blocksim-profile/1", read by the profiled cost model, ``blocksim/cost/``).

    blocksim profile --model llama-3-8b --out blocksim/profiles/llama-3-8b__h200-141gb__float16__tp1.json

Every table is measured with the code the GPU-in-the-loop executor runs (`validation.model`), on
synthetic inputs, never on a trace: each point is timed with CUDA events after the GPU has
drained (as the executor starts each step), and the median of its repetitions is written.

Tables (seconds, whole model, one GPU):

* ``linear`` by tokens (every 16 from 256 to 4096: `LINEAR_TOKENS`): everything but attention, cache
  writes and sampling (embedding, norms, QKV, rotary, output projection, gated MLP), eager, its
  points timed smallest and largest in turn (`interleaved`); on CUDA, the points above
  ``in_step_above_tokens`` (`LINEAR_IN_STEP_ABOVE`) inside whole steps;
  ``graph_seconds`` the same captured as a CUDA graph on ``grid.graph_tokens`` (batch sizes the
  executor captures);
* ``attn_prefill`` by (batch, new tokens, cached tokens): the paged prefill attention of all
  layers, ``batch`` sequences alike, timed inside whole steps over keys and values the model wrote
  (on CUDA; `Profiler.attn_prefill` says why);
* ``attn_decode`` by (batch, context): the decode attention of all layers, eager;
* ``cache_write`` by tokens, ``sample`` by sequences (final norm, LM head, argmax);
* ``swap_out``, ``swap_in`` (pinned host memory) and ``copy`` (copy-on-write) by blocks;
* ``tier_<src>_<dst>`` by (chunk bytes, chunks), with ``--tier-dir``: the five tier moves
  (`validation.tiers.bench`);
* ``decode_step_longest`` by (batch, context, longest): a whole pure-decode step replayed as the
  CUDA graph of that padded batch size, its rows holding ``batch * context`` context tokens in all,
  the longest row ``longest`` times the mean and the others falling from it in equal steps
  (`spread_contexts`; the table's ``rows`` says ``spread``); a cell whose longest row the model's
  length caps holds the line through its row's two longest rows measured (listed under
  ``capped``); ``decode_step`` by (batch, context) is its slice of equal rows (``longest`` 1);
  both are measured in ``passes`` (`DECODE_PASSES`) through the grid, each cell the mean of its
  passes' medians;
* ``decode_step_shared`` by (batch, context): a whole graph step of equal rows in pairs, the second
  row of each reading the first's blocks but its last (`paired`: the prompt two samples of one
  request share), with ``own_seconds`` (the same rows on their own blocks, measured alongside) and
  ``shared_fraction`` (the share of the step's context tokens read from shared blocks), each the
  median of ``pairs`` (`SHARED_PAIRS`) measurements taken in pairs whose order alternates; ``--add-table
  decode_step_shared`` measures it alone into an existing profile of this device;
* ``decode_step_padded`` by (batch, real, context): a whole graph step whose real rows are the
  fraction ``real`` of the graph's padded batch, holding ``batch * context`` context tokens in
  equal rows (`padded_rows`), the other rows the executor's padding (one token each), with
  ``spread_seconds`` (its twin: the same tokens over all the batch's rows, spread as
  ``decode_step_longest``'s below a longest row as long as a real row) measured alongside, each
  the median of ``pairs`` (`PADDED_PAIRS`) measurements taken in pairs whose order alternates;
  ``--add-table decode_step_padded`` measures it alone into an existing profile of this device;
* ``overhead``: ``eager_s``, the median of (a whole eager step) - (the sum of its components:
  attention timed inside the step, the others alone) over a few mixed steps, at least 0;
  ``eager_cases_s`` the differences, whose median (negative where the components timed alone add
  up to more than the whole step) the profiled cost model reads;
  ``graph_s`` 0 (a graph step is measured whole).

With ``--tensor-parallel N`` the model is split over N GPUs, one process each (`validation.sharded`,
this process rank 0, which times its own GPU). Every table above but ``decode_step`` is then measured
without communication (the row-parallel outputs are not all-reduced), and the ``allreduce`` table
holds one all-reduce among the N GPUs by message bytes (1 KiB to 256 MiB, in the model's dtype:
the median of rounds of back-to-back all-reduces); ``decode_step`` replays whole steps with their
all-reduces. The profiled cost model adds ``2 * layers`` all-reduces per step from that table.

Eager tables are GPU time, timed as the executor times an eager step (`SegmentTimer`: a sleep
before each segment keeps the host's launch gaps out), so the components of a step add up. The
sleeps before eager segments and graph replays rise to keep ahead of a slow host as the
executor's do (`validation.sleeps.Lead`); on a host that keeps ahead they stay at 1.2 ms and 50 us.

``measure_s`` (top level) holds the wall seconds each table, or group of tables measured together,
took to measure on this device, so that a run of the command can be planned. Written over a profile
measured with the same settings (model, GPU, dtypes, degree, block size, decode attention, grid),
or with ``--add-table``, the command says on stderr (not with ``--quiet``) how each table moved
against the one it replaces (`table_change`: the ratios of its cells): the machine's, or the
lease's, offset from the old profile's, and any change in how the table is measured.

Sequences of a synthetic batch take distinct blocks of a KV cache of at most 40 GiB (`CACHE_BYTES`;
the profile's ``cache_blocks``), in order. A point that needs more blocks than the cache holds
reads it again, each later pass in a shuffled order of its own (`Profiler._blocks`): in order, a
row one cache's length after another would read the same blocks at the same time and the L2 would
serve them. ``--add-table`` measures ``attn_decode``, ``decode_step`` (with
``decode_step_longest``), ``decode_step_shared``, ``decode_step_padded`` or ``linear`` again into
an existing profile of this device, each under a ``measured`` key naming its lease and cache.
``--calibrate`` carries a profile measured on another machine of this device's name to this one by a
sample of its cells measured here, each seconds table scaled by its median ratio
(`validation.profile_calibrate`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

PROFILE_FORMAT = "blocksim-profile/1"
#: The catalog's GPU for a CUDA device name containing the key.
DEVICE_GPUS = {"H200": "h200-141gb", "H100": "h100-80gb", "A100-SXM4-80GB": "a100-80gb", "A100": "a100-40gb",
               "L4": "l4"}

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: ``linear``'s token counts: every 16 from 256 to 4096, every 512 up to 8192. An eager step's GEMMs
#: pick their tiles by the exact row count, so their time is jagged, not a smooth climb: on an H100
#: the multiples of 64 are 1-2% above the counts around them on average and up to 19% above in
#: places (llama-3-8b: 25.8 ms at 832 tokens, 21.7 ms at 824, 23.8 ms at 840), so a table every 64
#: tokens priced the counts between its points 1.6% (llama-3-8b) and 2.5% (llama-2-7b) long on
#: average and up to 16% long (`benchmarks/linear_grid.py`, every 8 tokens from 512,
#: benchmarks/results/linear_grid/linear-grid-step8-h100-80gb-*.json). Every 16 tokens, the
#: interpolation is 1.7% from the counts between (mean +0.7% for llama-3-8b, +1.3% for llama-2-7b)
#: at twice the measuring time of every 64 and half that of every 8.
LINEAR_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 192, *range(256, 4097, 16), *range(4608, 8193, 512), 16384)
#: Above this many tokens the linear layers of an eager step run long enough for the GPU's power
#: limit to lower its clock, and they run faster inside a whole step (its attention between them)
#: than alone: on an H100, llama-3-8b's linear layers at 8,191-8,192 tokens took 1.1-2.2% less
#: inside whole steps of one, two or four prompts than alone, and within 0.6% of alone at 2,048 and
#: 4,096 (`benchmarks/wide_steps.py`, benchmarks/results/fidelity-h100-grid/wide-steps.json). So
#: the linear table's points above it are timed inside whole steps (on CUDA): the step less its
#: attention timed inside it, its cache writes and its sampling (`Profiler._linear_in_step`).
LINEAR_IN_STEP_ABOVE = 4096
GRAPH_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_BATCH = (1, 2, 4, 8)
#: new tokens of a prefill, up to the model's length (`Profiler`): 8192 covers a v0 engine's whole
#: prompts of llama-3-8b and mistral-7b, which steps beyond the grid would extrapolate. 128 and 512
#: are chunked prefill's common chunk sizes: without them the power law between 256 and 1024 priced
#: llama-3-8b's 511-token chunks over 3,000 cached tokens 5.6% long on an H100 (docs/cost_models.md)
PREFILL_NEW = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_CACHED = (0, 512, 2048, 8192)
DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Contexts of ``attn_decode``, ``decode_step`` and ``decode_step_longest``: every power of two from
#: 64. Without 128 and 512 (points four times apart there), the executed H100 runs' graph steps of
#: one row were priced short between 64 and 1,024 tokens of context, most at 512-640 (-1.3% to
#: -1.6%), up to -0.7% at 128-256, on the lease-6 and lease-7 sets alike, each priced by its own
#: lease's profile (benchmarks/results/fidelity-h100-lease7/graph-steps-by-context.json); with them,
#: the lease-8 set's were priced +0.4% to +0.7% at 256-768 against +0.0% below 192, rising smoothly
#: with the context (benchmarks/results/fidelity-h100-lease8/graph-steps-by-context.json).
DECODE_CONTEXT = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
STEP_BATCH = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
#: The longest row's context over the mean context of a graph step's rows (`spread_contexts`).
LONGEST = (1.0, 1.5, 2.0, 3.0, 5.0, 8.0)
#: Passes through the ``decode_step`` / ``decode_step_longest`` grid, every other one in reverse
#: order; a cell holds the mean of its passes' medians. Two measurements of the table, one pass
#: each, back to back on one H100 differed by a median 0.21% a cell (90th percentile 0.89%), in
#: runs of one sign and size over consecutive cells (lag-1 correlation 0.65 in measuring order): the
#: device drifts over the course of a pass, which passes at different times average and more
#: repetitions of a cell in a row cannot (`benchmarks/decode_step_repeat.py`,
#: benchmarks/results/fidelity-h100-decode-repeat/). On another H100, two two-pass measurements of
#: the equal-row slice were 0.23% apart at the 90th percentile of cells, two single-pass ones 0.46%
#: (`benchmarks/decode_step_passes.py`, the same directory's passes/).
DECODE_PASSES = 2
#: ``decode_step_shared``'s grid: padded batches (even: rows in pairs) and contexts.
SHARED_BATCH = (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SHARED_CONTEXT = (64, 256, 1024, 2048, 4096, 8192)
#: ``decode_step_padded``'s grid: padded batches (graph sizes whose fractions below are whole
#: rows), the fraction of their rows that are real, and contexts (the mean over the padded rows; a
#: real row holds the context over the fraction: contexts up to the model's length times the
#: smallest fraction).
PADDED_BATCH = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
PADDED_REAL = (0.5, 0.75)
PADDED_CONTEXT = (16, 64, 256, 1024, 2048, 4096)
#: Pairs of a padded step and its twin per cell, the pair's order alternating (medians of each).
PADDED_PAIRS = 3
#: Pairs of a paired step and its own-blocks twin per ``decode_step_shared`` cell, as above.
SHARED_PAIRS = 3
SEQUENCES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUICK = {"TOKENS": (1, 16, 256), "LINEAR_TOKENS": (1, 16, 256), "GRAPH_TOKENS": (1, 8), "PREFILL_BATCH": (1, 2),
         "PREFILL_NEW": (16, 64), "PREFILL_CACHED": (0, 32), "DECODE_BATCH": (1, 4), "DECODE_CONTEXT": (16, 64), "STEP_BATCH": (1, 4),
         "LONGEST": (1.0, 2.0), "DECODE_PASSES": 1, "SHARED_BATCH": (2, 4), "SHARED_CONTEXT": (32, 64), "PADDED_BATCH": (4,),
         "PADDED_REAL": (0.5, 0.75), "PADDED_CONTEXT": (16, 64), "PADDED_PAIRS": 1, "SHARED_PAIRS": 1, "SEQUENCES": (1, 4),
         "BLOCKS": (1, 4)}
CACHE_BYTES = 40 << 30  # the KV cache the profiler allocates (at most)


def interleaved(values) -> list:
    """`values` (in rising order) smallest and largest in turn: the order `Profiler.linear` times
    its points in, so that the heat of a sweep spreads over the table instead of landing on its
    largest points. On an H100, llama-3-8b's linear layers alone, timed within a rising sweep of the
    table's counts up to 8,192, take +0.33% (4,096 tokens) and +0.92% (8,192) against the same
    points after 3 s idle, and within this order +0.22% and +0.30%; the small points +0.14% and
    +0.22% at 512, +0.03% and +0.09% at 2,048 (`benchmarks/wide_steps.py --sweep`, one sweep,
    benchmarks/results/fidelity-h100-lease5/wide-steps-sweep-h100-80gb.json). The profiler times its
    points above 4,096 tokens inside whole steps, not alone as that sweep does."""
    values = list(values)
    return [x for pair in zip(values, reversed(values)) for x in pair][:len(values)]


def in_passes(cells: list, passes: int, measure) -> dict:
    """`measure(cell)` of every cell in `passes` passes through `cells`, every other pass in
    reverse order (a cell measured early in one pass is measured late in the next): the mean of
    each cell's measurements."""
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    got: dict = {cell: [] for cell in cells}
    for n in range(passes):
        for cell in (cells if n % 2 == 0 else cells[::-1]):
            got[cell].append(measure(cell))
    return {cell: float(np.mean(v)) for cell, v in got.items()}


class ProfileError(RuntimeError):
    """A profile that cannot be measured here (no GPU, unknown device, too little memory)."""


def catalog_gpu(device: str) -> str | None:
    """The catalog name of the GPU whose key is part of ``device`` (e.g. "NVIDIA H200")."""
    return next((name for key, name in DEVICE_GPUS.items() if key in device), None)


class _Clock:
    """Median GPU time of `fn(timer)`: a `SegmentTimer` per repetition after a full drain, as the
    executor times a step (perf_counter on the CPU)."""

    def __init__(self, torch, cuda: bool, budget_s: float = 0.15, max_reps: int = 9) -> None:
        from validation.sleeps import leads
        self.torch, self.cuda, self.budget_s, self.max_reps = torch, cuda, budget_s, max_reps
        # the sleeps before graph replays and eager segments, kept ahead of the host as the executor's
        self.graph_lead, self.eager_lead = leads()

    def once(self, fn) -> float:
        from validation.model import NO_TIMER, SegmentTimer
        if self.cuda:
            self.torch.cuda.synchronize()
            lead = self.graph_lead if getattr(fn, "graph", False) else self.eager_lead
            timer = SegmentTimer(lead.s)
            fn(timer)
            seconds = timer.seconds()
            lead.observe(timer.host_s)
            return seconds
        t0 = time.perf_counter()
        fn(NO_TIMER)
        return time.perf_counter() - t0

    def median(self, fn) -> float:
        first = self.once(fn)  # warm-up (allocator, autotuning); also sizes the repetitions
        reps = int(min(self.max_reps, max(3, self.budget_s / max(first, 1e-6))))
        return float(np.median([self.once(fn) for _ in range(reps)]))

    def median_attention(self, fn) -> float:
        """Median GPU time of the attention inside a whole step `fn(timer, attn_timer)` (CUDA)."""
        from validation.model import EventTimer, SegmentTimer

        def once() -> tuple[float, float]:
            self.torch.cuda.synchronize()
            timer, attn = SegmentTimer(self.eager_lead.s), EventTimer()
            fn(timer, attn)
            whole = timer.seconds()
            self.eager_lead.observe(timer.host_s)
            return whole, attn.seconds()
        whole, _ = once()
        reps = int(min(self.max_reps, max(3, self.budget_s / max(whole, 1e-6))))
        return float(np.median([once()[1] for _ in range(reps)]))


def _graph(runner, b: int, parts=None):
    """`fn(timer)` replaying the captured graph of batch `b`, timed whole after the timer's sleep
    (`_Clock` gives it the graph replays' lead: `fn.graph`)."""
    from validation.model import PARTS

    def fn(timer):
        timer.begin()
        runner.replay_decode(b, parts or PARTS)
        timer.end()
    fn.graph = True
    return fn


def device_name(device: str) -> str:
    """The CUDA device's name for a ``cuda`` device that is there, else ``cpu``."""
    import torch
    return torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else "cpu"


def retable(batch, tables, bs: int):
    """`batch` (a StepBatch of decode rows) with its rows reading `tables`, each row's new token in
    its slot of its table's block."""
    from validation.model import StepBatch
    slots = batch.slots.copy()
    for i, t in enumerate(tables):
        p = int(batch.positions[i])
        slots[i] = t[p // bs] * bs + p % bs
    return StepBatch(batch.token_ids, batch.positions.copy(), slots, batch.prefills, tables, batch.decode_context)


def paired(batch, bs: int):
    """`batch` (a StepBatch of decode rows) with its rows in pairs: the second row of each pair reads
    the first's blocks but its last (its own: the new token's), as two samples of one request share
    their prompt's full blocks; and the context tokens the second rows read from those shared blocks."""
    tables = [t.copy() for t in batch.decode_tables]
    shared = 0
    for i in range(1, len(tables), 2):
        tables[i][:-1] = tables[i - 1][:-1]
        shared += min(int(batch.decode_context[i]), (len(tables[i]) - 1) * bs)
    return retable(batch, tables, bs), shared


def longest_row(batch: int, context: int, longest: float, max_len: int) -> int:
    """The first row of a synthetic graph step of `batch` rows of mean `context`: `longest` times
    the mean, at most the model's length and the total less one token per other row (a point beyond
    those holds the longest row it can), never below the mean."""
    if batch == 1 or longest <= 1.0:
        return context
    return max(context, min(int(round(longest * context)), max_len, batch * context - (batch - 1)))


def uneven_contexts(batch: int, context: int, longest: float, max_len: int) -> list[int]:
    """The rows' contexts of a synthetic graph step: `batch * context` tokens in all, the first row
    `longest_row`, the others sharing the rest evenly."""
    first = longest_row(batch, context, longest, max_len)
    if first == context:
        return [context] * batch
    base, extra = divmod(batch * context - first, batch - 1)
    return [first] + [base + 1] * extra + [base] * (batch - 1 - extra)


def spread_contexts(batch: int, context: int, longest: float, max_len: int) -> list[int]:
    """The rows' contexts of a synthetic graph step spread evenly below its longest row:
    `batch * context` tokens in all, the first row `longest_row`, the others falling in equal
    steps from it, the shortest ones at one token (padding-like) where the ramp must reach below
    zero to keep the total. At `longest` 1 every row holds `context`; at 2 the rows fall evenly to
    nothing."""
    top = longest_row(batch, context, longest, max_len)
    if top == context:  # no room above the mean
        return [context] * batch
    total = batch * context
    j = np.arange(batch, dtype=np.float64)

    def rows(low: float) -> np.ndarray:
        return np.maximum(1.0, top - j * (top - low) / (batch - 1))
    lo, hi = -float(top) * batch, float(top)  # the lowest row's value before the floor at one token
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rows(mid).sum() < total else (lo, mid)
    x = rows(hi)
    x[0] = top
    out = np.minimum(np.floor(x), top).astype(np.int64)
    short = total - int(out.sum())  # the rounding's remainder: a token more to the rows cut most
    order = 1 + np.argsort(-(x[1:] - out[1:]), kind="stable")
    for k in order:
        if short <= 0:
            break
        if out[k] < top:
            out[k] += 1
            short -= 1
    while short < 0:  # the bisection's last ulp: a token less from the longest of the other rows
        k = int(np.argmax(out[1:])) + 1
        out[k] -= 1
        short += 1
    return [int(v) for v in out]


def padded_rows(batch: int, real: float, context: int) -> list[int]:
    """The real rows of a synthetic padded graph step: `round(real * batch)` rows (at least one)
    sharing `batch * context` tokens as evenly as tokens allow; the graph's other rows are the
    executor's padding."""
    n = max(1, int(round(real * batch)))
    base, extra = divmod(batch * context, n)
    return [base + 1] * extra + [base] * (n - extra)


def capped_cell(measured: list[tuple[float, float]], longest: float) -> float:
    """The seconds a `decode_step_longest` cell holds at `longest` when `longest_row` caps its
    longest row (the model's length, or the batch's total): the line through the last two points `measured` (the actual ratio of each
    measured step's longest row over its mean, its seconds, in rising ratio) carried to `longest`,
    so that interpolating between grid points gives the measured time at the capped ratio (the
    last point's own seconds when only one ratio was reachable)."""
    if len(measured) < 2:
        return measured[-1][1]
    (r1, t1), (r2, t2) = measured[-2], measured[-1]
    return max(t2, t2 + (t2 - t1) * (longest - r2) / (r2 - r1))  # a longer row never makes a step faster


def pass_blocks(logical, num_blocks: int, orders: dict | None = None) -> np.ndarray:
    """The cache blocks of logical blocks `logical` (numbered across a synthetic step's rows) in a
    cache of `num_blocks`: in order on the first pass over the cache, and on each later pass `k` in
    the cache's blocks shuffled by a generator seeded with `k` (`Profiler._blocks` says why);
    `orders` keeps each pass's order once drawn."""
    logical = np.asarray(logical, np.int64)
    orders = {} if orders is None else orders
    out = logical % num_blocks
    passes = logical // num_blocks
    for k in np.unique(passes[passes > 0]):
        k = int(k)
        if k not in orders:
            orders[k] = np.random.default_rng(k).permutation(num_blocks).astype(np.int64)
        at = passes == k
        out[at] = orders[k][out[at]]
    return out


class Profiler:
    """Measures the tables of one model on one device with a `validation.model.ModelRunner`."""

    def __init__(self, spec, *, dtype: str = "float16", block_size: int = 16, device: str = "cuda",
                 attention: str = "fast", prefill: str = "auto", quick: bool = False, cache_bytes: int = CACHE_BYTES,
                 progress: bool = True, tensor_parallel: int = 1, leave_out=()) -> None:
        import torch

        from validation.model import GRAPH_BATCH_SIZES, ModelDims
        self.torch = torch
        self.dims = d = ModelDims.of(spec)
        self.tp = tensor_parallel
        from validation.sharded import ShardError, make_runner, per_rank_dims
        try:
            per_gpu = per_rank_dims(d, tensor_parallel)  # what one GPU holds
        except ShardError as e:
            raise ProfileError(f"--tensor-parallel {tensor_parallel}: {e}") from None
        self.cuda = device.startswith("cuda")
        self.progress = progress
        dtype_bytes = torch.finfo(getattr(torch, dtype)).bits // 8
        self.grid = {k: globals()[k] for k in QUICK}
        if quick:
            self.grid.update(QUICK)
        # contexts and prompts up to the model's length (a captured graph attends to at most that many tokens)
        self.grid["DECODE_CONTEXT"] = tuple(c for c in self.grid["DECODE_CONTEXT"] if c <= d.max_model_len)
        self.grid["PREFILL_NEW"] = tuple(p for p in self.grid["PREFILL_NEW"] if p <= d.max_model_len)
        block_bytes = per_gpu.kv_block_bytes(block_size, dtype_bytes)
        if self.cuda:
            if not torch.cuda.is_available():
                raise ProfileError("blocksim profile: no CUDA device is visible to this torch")
            if torch.cuda.device_count() < tensor_parallel:
                raise ProfileError(f"--tensor-parallel {tensor_parallel}: this machine has "
                                   f"{torch.cuda.device_count()} GPUs")
            free = torch.cuda.mem_get_info()[0]
            weights = per_gpu.weight_bytes(dtype_bytes)
            room = free - weights - (10 << 30)
            if room < 256 * block_bytes:
                raise ProfileError(f"blocksim profile: {d.name} needs {weights / 2**30:.1f} GiB of weights per GPU "
                                   f"+ 10 GiB of workspace + a KV cache; the GPU has {free / 2**30:.1f} GiB free")
            cache_bytes = min(cache_bytes, room)
        else:
            cache_bytes = min(cache_bytes, 64 << 20)  # the CPU path is for tiny models
        num_blocks = max(64, int(cache_bytes // block_bytes))
        num_cpu = max(self.grid["BLOCKS"])
        kw = dict(num_blocks=num_blocks, num_cpu_blocks=num_cpu, block_size=block_size, dtype=dtype,
                  attention=attention, prefill=prefill)
        self.runner = make_runner(d, tensor_parallel, device, **kw)  # at TP > 1 one process per GPU, this one rank 0
        self.bs, self.num_blocks = block_size, num_blocks
        self.clock = _Clock(torch, self.cuda, max_reps=3 if quick else 9)
        self.graph_sizes = list(GRAPH_BATCH_SIZES)
        self._next_block = 0
        self._orders: dict[int, np.ndarray] = {}
        self.measure_s: dict[str, float] = {}  # wall seconds each table took to measure (`_timed`)
        self.leave_out = frozenset(leave_out)  # of OPTIONAL: not measured

    def _say(self, msg: str) -> None:
        if self.progress:
            print(f"profile {self.dims.name}: {msg}", file=sys.stderr, flush=True)

    # --- synthetic batches ----------------------------------------------------------------------------
    def _table(self, tokens: int) -> np.ndarray:
        n = -(-tokens // self.bs)
        t = self._blocks(self._next_block + np.arange(n))
        self._next_block += n
        return t

    def _blocks(self, logical: np.ndarray) -> np.ndarray:
        """The cache blocks of a synthetic step's logical blocks (numbered across all its rows): the
        cache's blocks in order on the first pass over it, and on each later pass (a step that needs
        more blocks than the cache holds) the cache's blocks in a shuffled order of that pass's own.
        In order on every pass, a row that wraps would read the blocks of a row one cache's length
        before it, at the same positions and so at the same time in the step, and the L2 would serve
        those reads (blocksim/profiles/README.md gives the cells that timed too fast). Shuffled, a
        row's block at a position is a given earlier row's block at that position with probability
        one in the cache's block count."""
        return pass_blocks(logical, self.num_blocks, self._orders)

    def batch(self, prefills=(), decodes=()):
        """A StepBatch: `prefills` as (new, cached) pairs, `decodes` as context lengths."""
        from validation.model import PrefillSeq, StepBatch
        self._next_block = 0
        rng = np.random.default_rng(0)
        ids, pos, slots, pf, tables = [], [], [], [], []
        for new, cached in prefills:
            table = self._table(cached + new)
            p = np.arange(cached, cached + new)
            ids.append(rng.integers(0, self.dims.vocab_size, new))
            pos.append(p)
            slots.append(table[p // self.bs] * self.bs + p % self.bs)
            pf.append(PrefillSeq(cached, cached + new, table))
        for ctx in decodes:
            table = self._table(ctx)
            p = ctx - 1
            ids.append(rng.integers(0, self.dims.vocab_size, 1))
            pos.append(np.asarray([p]))
            slots.append(np.asarray([table[p // self.bs] * self.bs + p % self.bs]))
            tables.append(table)
        cat = (lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64))
        return StepBatch(cat(ids), np.minimum(cat(pos), self.dims.max_model_len - 1), cat(slots), pf, tables,
                         np.asarray(list(decodes), np.int64))

    def _tokens_batch(self, n: int):
        """n tokens as one prompt of positions [0, n) (positions wrap at the model's length)."""
        return self.batch(prefills=[(n, 0)])

    def _forward(self, batch, parts):
        inp = self.runner.prepare(batch)
        return lambda timer: self.runner.forward(inp, parts, timer)

    # --- tables ---------------------------------------------------------------------------------------
    def linear(self) -> dict:
        g = self.grid
        timed = {n: self._linear_point(n) for n in interleaved(g["LINEAR_TOKENS"])}
        secs = [timed[n] for n in g["LINEAR_TOKENS"]]
        self._say(f"linear {['%.3g' % s for s in secs[::8]]} (every 8th of {len(secs)})")
        out = {"axes": ["tokens"], "grid": {"tokens": list(g["LINEAR_TOKENS"])}, "seconds": secs}
        if self.cuda:
            out["in_step_above_tokens"] = LINEAR_IN_STEP_ABOVE
            sizes = list(g["GRAPH_TOKENS"])
            self.runner.capture_decode_graphs(max(sizes), sizes=sizes, parts=("linear",))
            gsecs = []
            for b in sizes:
                self.runner.load_decode(self.batch(decodes=[16] * b), b)
                gsecs.append(self.clock.median(_graph(self.runner, b, ("linear",))))
            out["grid"]["graph_tokens"] = sizes
            out["graph_seconds"] = gsecs
        return out

    def _linear_point(self, n: int) -> float:
        """The linear layers of one prompt of `n` tokens: alone, or inside a whole step above
        `LINEAR_IN_STEP_ABOVE` tokens on CUDA."""
        if self.cuda and n > LINEAR_IN_STEP_ABOVE:
            return self._linear_in_step(self._tokens_batch(n))
        return self.linear_alone(n)

    def linear_alone(self, n: int) -> float:
        """The linear layers of one prompt of `n` tokens timed alone (a median)."""
        return self.clock.median(self._forward(self._tokens_batch(n), ("linear",)))

    def _linear_in_step(self, batch) -> float:
        """The linear layers of a whole step of `batch`: the step less its attention timed inside
        it (`_attention_in_step`), its cache writes and its sampling, each a median."""
        from validation.model import PARTS
        whole = self.clock.median(self._forward(batch, PARTS))
        rest = sum(self.clock.median(self._forward(batch, (p,))) for p in ("write", "sample"))
        return whole - self._attention_in_step(batch) - rest

    def _prefix_tables(self, b: int, tokens: int) -> list[np.ndarray]:
        """Block tables of `b` sequences of up to `tokens` tokens, each its own run of blocks
        (past the cache's end, its blocks again in a shuffled order: `_blocks`)."""
        span = -(-tokens // self.bs)
        return [self._blocks(i * span + np.arange(span)) for i in range(b)]

    def _prefill_batch(self, tables: list[np.ndarray], start: int, stop: int, seed: int):
        """A StepBatch prefilling positions [start, stop) of each sequence through its table."""
        from validation.model import PrefillSeq, StepBatch
        rng = np.random.default_rng(seed)
        pos = np.arange(start, stop)
        n = len(tables)
        return StepBatch(rng.integers(0, self.dims.vocab_size, n * len(pos)).astype(np.int64),
                         np.tile(np.minimum(pos, self.dims.max_model_len - 1), n),
                         np.concatenate([t[pos // self.bs] * self.bs + pos % self.bs for t in tables]),
                         [PrefillSeq(start, stop, t) for t in tables], [], np.zeros(0, np.int64))

    def write_cached(self, batch) -> None:
        """The cached keys and values of `batch`'s prompts (positions [0, start) of each) written by
        the model itself, untimed, as an earlier chunk or a prefix hit leaves them: the attention's
        online softmax rescales only where a row's running max moves, so its time may depend on the
        keys (`attn_prefill` measures its table so)."""
        from validation.model import PrefillSeq, StepBatch
        top = self.dims.max_model_len
        for i, s in enumerate(x for x in batch.prefills if x.start > 0):
            pos = np.arange(s.start)
            ids = np.random.default_rng(i).integers(0, self.dims.vocab_size, len(pos)).astype(np.int64)
            slots = s.block_table[pos // self.bs] * self.bs + pos % self.bs
            self.runner.forward(self.runner.prepare(StepBatch(ids, np.minimum(pos, top - 1), slots,
                                                              [PrefillSeq(0, s.start, s.block_table)])))

    def _attention_in_step(self, batch) -> float:
        """The attention of a whole step of `batch`, timed inside it (see `attn_prefill`)."""
        r = self.runner
        inp = r.prepare(batch)
        return self.clock.median_attention(lambda timer, attn: r.forward(inp, timer=timer, attn_timer=attn))

    def attn_prefill(self) -> dict:
        """On CUDA, timed inside whole steps of the model (an event pair around each layer's
        attention) over keys and values the model itself wrote, the cached ones prefilled first,
        untimed, as a prefix hit or an earlier chunk leaves them: the kernel's online softmax
        rescales its output only where a row's running max moves, so its time may depend on the
        keys. At no cached tokens it measured within 1% of attention timed alone over unit-normal
        stand-ins (`benchmarks/results/eager_gap/`)."""
        g = self.grid
        if not self.cuda:
            secs = [[[self.clock.median(self._forward(self.batch(prefills=[(p, c)] * b), ("attn",)))
                      for c in g["PREFILL_CACHED"]] for p in g["PREFILL_NEW"]] for b in g["PREFILL_BATCH"]]
        else:
            r, pmax = self.runner, max(g["PREFILL_NEW"])
            secs = [[[0.0] * len(g["PREFILL_CACHED"]) for _ in g["PREFILL_NEW"]] for _ in g["PREFILL_BATCH"]]
            for bi, b in enumerate(g["PREFILL_BATCH"]):
                for ci, c in enumerate(g["PREFILL_CACHED"]):
                    tables = self._prefix_tables(b, c + pmax)
                    if c:
                        r.forward(r.prepare(self._prefill_batch(tables, 0, c, seed=c)))
                    for pi, p in enumerate(g["PREFILL_NEW"]):
                        secs[bi][pi][ci] = self._attention_in_step(self._prefill_batch(tables, c, c + p, seed=c + p))
        self._say("attn_prefill done")
        return {"axes": ["batch", "new_tokens", "cached_tokens"],
                "grid": {"batch": list(g["PREFILL_BATCH"]), "new_tokens": list(g["PREFILL_NEW"]),
                         "cached_tokens": list(g["PREFILL_CACHED"])}, "seconds": secs}

    def attn_decode(self) -> dict:
        g = self.grid
        secs = [[self.clock.median(self._forward(self.batch(decodes=[c] * b), ("attn",)))
                 for c in g["DECODE_CONTEXT"]] for b in g["DECODE_BATCH"]]
        self._say("attn_decode done")
        return {"axes": ["batch", "context"], "grid": {"batch": list(g["DECODE_BATCH"]),
                                                       "context": list(g["DECODE_CONTEXT"])}, "seconds": secs}

    def cache_write(self) -> dict:
        g = self.grid
        secs = [self.clock.median(self._forward(self._tokens_batch(n), ("write",))) for n in g["TOKENS"]]
        return {"axes": ["tokens"], "grid": {"tokens": list(g["TOKENS"])}, "seconds": secs}

    def sample(self) -> dict:
        g = self.grid
        secs = [self.clock.median(self._forward(self.batch(decodes=[16] * n), ("sample",))) for n in g["SEQUENCES"]]
        return {"axes": ["sequences"], "grid": {"sequences": list(g["SEQUENCES"])}, "seconds": secs}

    def moves(self) -> dict:
        g, r = self.grid, self.runner
        out = {}
        for name in ("swap_out", "swap_in", "copy"):
            secs = []
            for n in g["BLOCKS"]:
                if name == "copy":
                    m = np.stack([np.arange(n), n + np.arange(n)], axis=1)
                    secs.append(self.clock.median(lambda t, m=m: r.copy(m, t)))
                else:
                    m = np.stack([np.arange(n), np.arange(n)], axis=1)
                    secs.append(self.clock.median(lambda t, m=m, to=(name == "swap_in"): r.swap(m, to, t)))
            out[name] = {"axes": ["blocks"], "grid": {"blocks": list(g["BLOCKS"])}, "seconds": secs}
        self._say("swaps and copies done")
        return out

    def decode_step(self) -> tuple[dict, dict] | None:
        """(``decode_step``, ``decode_step_longest``): whole graph-replayed decode steps."""
        if not self.cuda:
            return None
        g, r = self.grid, self.runner
        sizes, contexts, longest = list(g["STEP_BATCH"]), list(g["DECODE_CONTEXT"]), list(g["LONGEST"])
        passes = int(g["DECODE_PASSES"])
        r.capture_decode_graphs(max(sizes))
        cells = [(b, c, x) for b in sizes for c in contexts for x in longest]
        rows_of = {cell: spread_contexts(*cell, self.dims.max_model_len) for cell in cells}

        def measure(cell) -> float:
            r.load_decode(self.batch(decodes=rows_of[cell]), cell[0])
            return self.clock.median(_graph(r, cell[0]))
        mean = in_passes(cells, passes, measure)
        secs, capped = [], []
        for b in sizes:
            plane = []
            for c in contexts:
                row, measured = [], []  # measured: (the longest row's actual ratio, seconds)
                for x in longest:
                    rows, t = rows_of[(b, c, x)], mean[(b, c, x)]
                    ratio = max(rows) / c
                    if not measured or ratio > measured[-1][0] + 1e-9:
                        measured.append((ratio, t))
                    if ratio < x - 1e-9:  # the longest row the point asks for does not fit
                        row.append(capped_cell(measured, x))
                        capped.append([b, c, x])
                    else:
                        row.append(t)
                plane.append(row)
            secs.append(plane)
        self._say("decode_step done")
        flat = [[plane[ci][longest.index(1.0)] for ci in range(len(contexts))] for plane in secs]
        return ({"axes": ["batch", "context"], "grid": {"batch": sizes, "context": contexts}, "seconds": flat,
                 "passes": passes},
                {"axes": ["batch", "context", "longest"],
                 "grid": {"batch": sizes, "context": contexts, "longest": longest}, "seconds": secs,
                 "rows": "spread", "capped": capped, "passes": passes})

    def decode_step_shared(self) -> dict | None:
        """``decode_step_shared``: whole graph-replayed decode steps of equal rows in pairs sharing
        their blocks but the last (`paired`), each beside the same rows on their own blocks."""
        if not self.cuda:
            return None
        g, r = self.grid, self.runner
        from kernels.bench.stats import alternate
        sizes = [b for b in g["SHARED_BATCH"] if b in g["STEP_BATCH"]]
        # a row of one block shares nothing (its last block is its own): such contexts are left out
        contexts = [c for c in g["SHARED_CONTEXT"] if self.bs < c <= self.dims.max_model_len]
        if not contexts:
            self._say(f"decode_step_shared left out: no context of the grid spans more than one block of {self.bs}")
            return None
        n_pairs = int(g["SHARED_PAIRS"])
        r.capture_decode_graphs(max(sizes))
        secs, own, frac = [], [], []
        for b in sizes:
            row_s, row_own, row_f = [], [], []
            for c in contexts:
                plain = self.batch(decodes=[c] * b)
                pairs, shared = paired(plain, self.bs)
                own_t, paired_t = alternate(self._graph_timing(plain, b), self._graph_timing(pairs, b), n_pairs)
                row_own.append(float(np.median(own_t)))
                row_s.append(float(np.median(paired_t)))
                row_f.append(shared / (b * c))
            secs.append(row_s)
            own.append(row_own)
            frac.append(row_f)
        self._say("decode_step_shared done")
        return {"axes": ["batch", "context"], "grid": {"batch": sizes, "context": contexts}, "seconds": secs,
                "own_seconds": own, "shared_fraction": frac, "pairs": n_pairs}

    def decode_step_padded(self) -> dict | None:
        """``decode_step_padded``: whole graph-replayed decode steps whose real rows fill a fraction
        of the graph's batch (equal rows holding all the context; the executor's padding rows, of one
        token each, the rest), each beside its spread twin: the same total context over all the
        batch's rows, falling in equal steps from a longest row as long as a real row
        (`spread_contexts`, the rows ``decode_step_longest`` is measured on)."""
        if not self.cuda:
            return None
        from kernels.bench.stats import alternate  # pairs in alternating order, as the kernel benchmarks take them
        g, r = self.grid, self.runner
        sizes = [b for b in g["PADDED_BATCH"] if b in self.graph_sizes]
        fractions = list(g["PADDED_REAL"])
        contexts = [c for c in g["PADDED_CONTEXT"] if c <= self.dims.max_model_len * min(fractions)]
        r.capture_decode_graphs(max(sizes))
        pairs = int(g["PADDED_PAIRS"])
        secs, spread = [], []
        for b in sizes:
            plane_s, plane_t = [], []
            for f in fractions:
                row_s, row_t = [], []
                for c in contexts:
                    real = padded_rows(b, f, c)
                    steps = (self.batch(decodes=real),
                             self.batch(decodes=spread_contexts(b, c, max(real) / c, self.dims.max_model_len)))
                    padded, twin = alternate(*(self._graph_timing(step, b) for step in steps), pairs)
                    row_s.append(float(np.median(padded)))
                    row_t.append(float(np.median(twin)))
                plane_s.append(row_s)
                plane_t.append(row_t)
            secs.append(plane_s)
            spread.append(plane_t)
        self._say("decode_step_padded done")
        return {"axes": ["batch", "real", "context"], "grid": {"batch": sizes, "real": fractions, "context": contexts},
                "seconds": secs, "spread_seconds": spread, "pairs": pairs,
                "rows": "equal real rows, one-token padding rows"}

    def _graph_timing(self, step, b: int):
        """A measurement of `step` replayed as the graph of `b` rows: loads it, then times the graph."""
        def measure() -> float:
            self.runner.load_decode(step, b)
            return self.clock.median(_graph(self.runner, b))
        return measure

    def overhead(self) -> dict:
        """Whole eager steps against the sum of their components timed alone."""
        cases = [([(256, 0)], [1024] * 32), ([(64, 512)], [256] * 8), ([(1024, 0), (512, 0)], []),
                 ([(16, 0)], [2048] * 64)]
        if self.grid["TOKENS"] == QUICK["TOKENS"]:
            cases = [([(16, 0)], [32] * 2)]
        diffs = []
        for pf, dec in cases:
            b = self.batch(prefills=pf, decodes=dec)
            whole = self.clock.median(self._forward(b, ("linear", "write", "attn", "sample")))
            parts = sum(self.clock.median(self._forward(b, (p,))) for p in ("linear", "write", "sample"))
            parts += self._attention_in_step(b) if self.cuda else self.clock.median(self._forward(b, ("attn",)))
            diffs.append(whole - parts)
        self._say(f"overhead whole - parts {['%.3g' % x for x in diffs]}")
        if self.cuda:  # a longer sleep before each segment must not change an eager time (no host gap leaks in)
            from validation.model import SegmentTimer
            from validation.sleeps import LEAD_S
            fn = self._forward(self.batch(prefills=[(16, 0)], decodes=[256] * 4), ("linear", "write", "attn", "sample"))
            lead = {}
            for s in (LEAD_S, 3e-3):
                self.torch.cuda.synchronize()
                vals = []
                for _ in range(5):
                    t = SegmentTimer(s)
                    fn(t)
                    vals.append(t.seconds())
                lead[s] = float(np.median(vals))
            self._say(f"eager step with a sleep of {LEAD_S * 1e3:.1f} ms / 3 ms per segment: "
                      f"{lead[LEAD_S]:.5f} / {lead[3e-3]:.5f} s")
        return {"eager_s": max(0.0, float(np.median(diffs))), "graph_s": 0.0, "eager_cases_s": diffs,
                **({"lead_check_s": list(lead.values())} if self.cuda else {})}

    def allreduce(self) -> dict:
        """One all-reduce among the tensor-parallel ranks by message bytes, in the model's dtype."""
        from validation.sharded import ALLREDUCE_BYTES
        sizes = list(ALLREDUCE_BYTES[:4] if self.grid["TOKENS"] == QUICK["TOKENS"] else ALLREDUCE_BYTES)
        secs = self.runner.allreduce_seconds(sizes)
        self._say(f"allreduce {['%.3g' % x for x in secs]}")
        return {"axes": ["bytes"], "grid": {"bytes": sizes}, "seconds": secs}

    def _timed(self, name: str, measure):
        """`measure()`, its wall seconds kept in `measure_s` under `name`."""
        t0 = time.perf_counter()
        out = measure()
        self.measure_s[name] = round(time.perf_counter() - t0, 3)
        return out

    def run(self) -> dict:
        t0 = time.perf_counter()
        tp = self.tp > 1
        if tp:  # components on one rank without communication; the all-reduces in their own table
            self.runner.set_communicate(False)
        comps = {name: self._timed(name, getattr(self, name))
                 for name in ("linear", "attn_prefill", "attn_decode", "cache_write", "sample")}
        comps.update(self._timed("swap_out, swap_in, copy", self.moves))
        comps["overhead"] = self._timed("overhead", self.overhead)
        if tp:  # a whole decode step holds its all-reduces
            self.runner.set_communicate(True)
            comps["allreduce"] = self._timed("allreduce", self.allreduce)
        if self.cuda and "decode_step" not in self.leave_out:  # whole graph-replayed steps
            comps["decode_step"], comps["decode_step_longest"] = self._timed("decode_step, decode_step_longest",
                                                                             self.decode_step)
        if self.cuda:
            if "decode_step_shared" not in self.leave_out:
                shared = self._timed("decode_step_shared", self.decode_step_shared)
                if shared is not None:  # None: no context of the grid spans two blocks
                    comps["decode_step_shared"] = shared
            if "decode_step_padded" not in self.leave_out:
                comps["decode_step_padded"] = self._timed("decode_step_padded", self.decode_step_padded)
        self._say(f"measured in {time.perf_counter() - t0:.0f} s: "
                  + ", ".join(f"{k} {v:.0f} s" for k, v in self.measure_s.items()))
        return comps


def profile(model: str, *, gpu: str = "auto", dtype: str = "float16", tensor_parallel: int = 1, block_size: int = 16,
            device: str = "cuda", attention: str = "fast", prefill: str = "auto", quick: bool = False,
            catalog=(), command: str = "", progress: bool = True, tier_dir: str | None = None, leave_out=()) -> dict:
    """Measure and return a profile dict (format "blocksim-profile/1"); with ``tier_dir``, the tier
    transfer tables too (`validation.tiers.bench`, the disk tier's file in that directory)."""
    import torch

    from blocksim.catalog import Catalog
    cat = Catalog(list(catalog))
    spec = cat.model(model)
    if tensor_parallel < 1:
        raise ProfileError(f"--tensor-parallel {tensor_parallel}: expected a positive number of GPUs")
    if tier_dir is not None and not (Path(tier_dir).is_dir() and os.access(tier_dir, os.W_OK)):
        raise ProfileError(f"--tier-dir {tier_dir}: not a writable directory; create it or name another")
    if tier_dir is not None and tensor_parallel > 1:
        raise ProfileError(f"--tier-dir with --tensor-parallel {tensor_parallel}: tier transfers are measured on one "
                           f"GPU; profile them at --tensor-parallel 1")
    name = device_name(device)
    if gpu == "auto":
        gpu = catalog_gpu(name)
        if gpu is None:
            raise ProfileError(f"--gpu-name auto: device {name!r} is none of the catalog's GPUs "
                               f"({', '.join(DEVICE_GPUS)}); name one with --gpu-name")
    cat.gpu(gpu)
    p = Profiler(spec, dtype=dtype, block_size=block_size, device=device, attention=attention, prefill=prefill,
                 quick=quick, progress=progress, tensor_parallel=tensor_parallel, leave_out=leave_out)
    comps = p.run()
    tiers, prefill_impl, sms = {}, p.runner.prefill_impl, p.runner.num_sms if p.cuda else 0
    if tier_dir is not None:
        from validation.tiers.bench import measure_tiers
        d, prefill_impl = p.dims, p.runner.prefill_impl
        del p.runner  # the model's caches make room for the tier buffers
        tiers = p._timed("tier moves", lambda: measure_tiers(
            num_layers=d.num_layers, num_kv_heads=d.num_kv_heads, head_size=d.head_size, block_size=block_size,
            dtype=dtype, device=device, disk_dir=tier_dir,
            **({"chunk_tokens": (16, 64), "chunks": (1, 4), "reps": 2} if quick else {}),
            progress=p._say if progress else None))
        comps.update(tiers["components"])
    return {
        "format": PROFILE_FORMAT, "model": model, "gpu": gpu, "dtype": dtype, "kv_dtype": dtype,
        "tensor_parallel": tensor_parallel, "block_size": block_size, "device": name, "torch": torch.__version__,
        "command": command, "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "decode_attention": attention, "prefill_attention": prefill_impl, "quick": quick,
        **({"num_sms": sms} if sms else {}),
        "cuda_graph_batch_sizes": p.graph_sizes if p.cuda else [], "cache_blocks": p.num_blocks,
        "measure_s": p.measure_s, "components": comps,
        **({"tier_disk_io": f"{tiers['disk_mode']} ({tiers['disk_reason']})"} if tiers else {}),
    }


#: Tables `--add-table` measures into an existing profile of this device, replacing them where the
#: profile holds them: the whole-step tables (``decode_step`` is measured with, and adds,
#: ``decode_step_longest``) and the eager decode attention, none of which the profile's other
#: tables are measured against (the shared and padded tables each beside a twin of their own); and
#: ``linear`` on the grid of `LINEAR_TOKENS`, against which the profile's eager overhead was
#: measured (the whole eager steps less their components): a profile measured whole keeps the two
#: of one lease.
ADDABLE = ("attn_decode", "decode_step", "decode_step_shared", "decode_step_padded", "linear")
#: Tables `--leave-out` skips: the cost model prices without them (docs/cost_models.md), and a later
#: `--add-table` can add them (on the lease it names).
OPTIONAL = ("decode_step", "decode_step_shared", "decode_step_padded")


def add_table(path: Path, tables, *, model: str | None = None, device: str = "cuda", catalog=(), command: str = "",
              progress: bool = True) -> dict:
    """The profile at `path` with `tables` (names of `ADDABLE`; one name alone too) measured on this
    device and put in, each with its provenance (device, torch, command, time, the cache's blocks)
    under its ``measured`` key; measured with the profile's own model, dtype, block size, decode
    attention and grid (`model`, where given, must be the profile's). Nothing is put in unless every
    table was measured."""
    import torch
    tables = [tables] if isinstance(tables, str) else list(dict.fromkeys(tables))
    label = " ".join(f"--add-table {t}" for t in tables)
    unknown = [t for t in tables if t not in ADDABLE]
    if unknown:
        raise ProfileError(f"{label}: {', '.join(unknown)} cannot be added; name one of {', '.join(ADDABLE)}")
    prof = read_own_profile(path, label, model=model, device=device, gpu_only=True, fix="--out")
    p = profiler_for(prof, path, label, device=device, catalog=catalog, progress=progress)
    name = device_name(device)
    for table in tables:
        out = p._timed(table, getattr(p, table))
        if out is None:
            raise ProfileError(f"{label}: {table} has no cell to measure with {path}'s grid and block size "
                               f"{prof['block_size']}; the profile is left as it was")
        names = ("decode_step", "decode_step_longest") if table == "decode_step" else (table,)
        for key, measured in zip(names, out if table == "decode_step" else (out,)):
            moved = table_change(prof["components"].get(key), measured)
            if moved:
                p._say(f"{key} against the table it replaces: {moved}")
            measured["measured"] = {"device": name, "torch": torch.__version__, "command": command,
                                    "utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                    "measure_s": p.measure_s[table], "cache_blocks": p.num_blocks}
            prof["components"][key] = measured
    return prof


def read_own_profile(path: Path, label: str, *, model: str | None, device: str, gpu_only: bool,
                     fix: str) -> dict:
    """The profile at `path`, checked to be one this device can measure into or against: readable,
    of the profile format, naming its model, device, dtype, block size and graph sizes, of `model`
    (where given), measured on this device's name and at tensor-parallel 1 (and, with `gpu_only`,
    this device a GPU). Each refusal a ProfileError of one line starting with `label`; `fix` is the
    option that names the file."""
    try:
        prof = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"{label}: cannot read the profile {path} ({e}); name an existing profile with {fix}")
    if not isinstance(prof, dict) or prof.get("format") != PROFILE_FORMAT or not isinstance(prof.get("components"), dict):
        raise ProfileError(f"{label}: {path} is not a {PROFILE_FORMAT} file; name a profile with {fix}")
    missing = [k for k in ("model", "device", "dtype", "block_size", "cuda_graph_batch_sizes") if k not in prof]
    if missing:
        raise ProfileError(f"{label}: {path} lacks {', '.join(missing)}; measure a whole profile with blocksim profile")
    if model is not None and model != prof.get("model"):
        raise ProfileError(f"{label}: {path} is a profile of {prof.get('model')!r}, --model names {model!r}; "
                           f"name the profile of {model} with {fix}, or --model {prof.get('model')}")
    name = device_name(device)
    if gpu_only and name == "cpu":
        raise ProfileError(f"{label}: measured on a GPU only")
    if name != prof.get("device"):
        raise ProfileError(f"{label}: {path} was measured on {prof.get('device')!r}, this device is {name!r}; "
                           f"run it on a {prof.get('device')}, or name a profile of this device with {fix}")
    if prof.get("tensor_parallel", 1) != 1:
        raise ProfileError(f"{label}: {path} is a tensor-parallel profile; measure it whole with blocksim profile")
    return prof


def profiler_for(prof: dict, path: Path, label: str, *, device: str, catalog=(), progress: bool = True,
                 **kw) -> Profiler:
    """A Profiler of `prof`'s model with its dtype, block size, decode attention and grid (quick or
    not) on this device (`kw`: more of the Profiler's options); refused (ProfileError) where the
    executor here captures CUDA graphs of other batch sizes than the profile's."""
    from blocksim.catalog import Catalog
    spec = Catalog(list(catalog)).model(prof["model"])
    p = Profiler(spec, dtype=prof["dtype"], block_size=prof["block_size"], device=device,
                 attention=prof.get("decode_attention", "fast"), quick=bool(prof.get("quick")), progress=progress,
                 **kw)
    sizes = p.graph_sizes if p.cuda else []
    if sizes != list(prof["cuda_graph_batch_sizes"]):
        raise ProfileError(f"{label}: {path} holds CUDA graphs of sizes {prof['cuda_graph_batch_sizes']}, the "
                           f"executor captures {sizes}; measure a whole profile with blocksim profile")
    return p


def table_change(before: dict | None, after: dict) -> str | None:
    """How a table measured again moved against the one it replaces, cell by cell (its seconds,
    after / before): the median and the 10%-90% range of the ratios, or that the grid changed; None
    where there was no table before."""
    if not isinstance(before, dict):
        return None
    if before.get("grid") != after.get("grid"):
        return "its grid differs from the old table's (no cell-by-cell comparison)"
    try:
        old, new = np.asarray(before["seconds"], float), np.asarray(after["seconds"], float)
    except (KeyError, TypeError, ValueError):
        return None
    if old.shape != new.shape:
        return None
    ok = np.isfinite(old) & np.isfinite(new) & (old > 0)
    if not ok.any():
        return None
    r = new[ok] / old[ok]
    lo, mid, hi = np.percentile(r, [10, 50, 90])
    return f"after / before, by cell: median {mid:.3f} (10%-90%: {lo:.3f}-{hi:.3f}) over {r.size} cells"


def shipped_name(model: str, gpu: str, dtype: str, tensor_parallel: int) -> str:
    return f"{model}__{gpu}__{dtype}__tp{tensor_parallel}.json"


# --- CLI ------------------------------------------------------------------------------------------------
def add_profile_command(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("profile", help="measure a model's step components on this GPU into a cost profile",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="catalog model")
    p.add_argument("--gpu-name", default="auto", help="catalog GPU the profile is for (default: from the device)")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                   help="weights, activations and KV cache (default float16)")
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="GPUs the model is split over, one process each; adds the all-reduce table (default 1)")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size in tokens (default 16)")
    p.add_argument("--attention", choices=("fast", "vllm"), default="fast",
                   help="decode attention kernels: the fast kernel (default fast) or the vLLM-layout v1/v2")
    p.add_argument("--prefill", choices=("auto", "kernel", "wgmma", "sdpa"), default="auto",
                   help="prefill attention: the paged prefill kernel's mma.sync configurations (kernel), its own "
                        "choice with the warpgroup kernels on Hopper (wgmma), or gather + SDPA (default auto: "
                        "kernel); an executed run prices well only by a profile of its own --executor-prefill")
    p.add_argument("--catalog", action="append", default=[], metavar="FILE",
                   help="extra models/GPUs (YAML/TOML/JSON); repeatable (default: the built-in catalog only)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (the same code, for tiny models)")
    p.add_argument("--quick", action="store_true", help="a tiny grid, 3 repetitions a point (tests)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="where to write (default: blocksim/profiles/<model>__<gpu>__<dtype>__tp<N>.json)")
    p.add_argument("--tier-dir", default=None, metavar="DIR",
                   help="also measure the tier transfer tables (GPU, host memory, a disk file in DIR) "
                        "(default: not measured)")
    p.add_argument("--add-table", action="append", default=None, choices=ADDABLE,
                   help="measure only this table into the profile --out names, replacing it there, with that "
                        "profile's dtype, block size, attention and grid; repeatable (default: a whole profile)")
    p.add_argument("--leave-out", action="append", default=[], choices=OPTIONAL, metavar="TABLE",
                   help=f"do not measure this table ({', '.join(OPTIONAL)}: the cost model prices without it; "
                        f"--add-table adds it later); repeatable (default: every table)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure a sample of the base profile's cells here and write it with each seconds table "
                        "scaled by its median ratio, to the file --out names (validation/profile_calibrate.py)")
    p.add_argument("--from", dest="base", default=None, metavar="FILE",
                   help="with --calibrate: the base profile (default: the shipped one of --model, this device's "
                        "GPU or --gpu-name, --dtype, tensor-parallel 1)")
    p.add_argument("--quiet", action="store_true", help="no progress lines (default: progress on stderr)")
    p.set_defaults(func=cmd_profile)
    return p


def _write_whole(path: Path, prof: dict) -> None:
    """The profile at `path`, written beside it first and moved into place: an interrupt leaves the
    file as it was (a shipped profile included), never half-written. A profile the simulator's
    loader would refuse is not put in place: it goes to ``<path>.rejected`` (its measurements kept)
    and a ProfileError names the loader's complaint."""
    from blocksim.config import ConfigError
    from blocksim.cost.profile_file import parse_profile
    from kernels.bench.output import write_json
    try:
        parse_profile(json.loads(json.dumps(prof)), str(path))
    except ConfigError as e:
        rejected = path.with_name(path.name + ".rejected")
        try:
            write_json(rejected, prof)
        except OSError as w:
            raise ProfileError(f"{e}; {path} left as it was, and the measured profile could not be kept in "
                               f"{rejected} ({w.strerror})") from None
        raise ProfileError(f"{e}; {path} left as it was, the measured profile is in {rejected}") from None
    write_json(path, prof)


def cmd_profile(args: argparse.Namespace) -> int:
    command = " ".join(["blocksim profile", *args.cli_argv[1:]])  # the command line as parsed
    if args.calibrate or args.base:
        return cmd_calibrate(args, command)
    if args.add_table:
        if not args.out:
            print(f"--add-table {' '.join(args.add_table)}: name the profile to add it to with --out", file=sys.stderr)
            return 2
        try:
            prof = add_table(Path(args.out), args.add_table, model=args.model, device=args.device, catalog=args.catalog,
                             command=command, progress=not args.quiet)
            _write_whole(Path(args.out), prof)
        except ProfileError as e:
            print(str(e), file=sys.stderr)
            return 2
        print(f"profile: {', '.join(args.add_table)} measured into {args.out}")
        return 0
    try:
        prof = profile(args.model, gpu=args.gpu_name, dtype=args.dtype, tensor_parallel=args.tensor_parallel,
                       block_size=args.block_size, device=args.device, attention=args.attention, prefill=args.prefill,
                       quick=args.quick, catalog=args.catalog, command=command, progress=not args.quiet,
                       tier_dir=args.tier_dir, leave_out=args.leave_out)
    except ProfileError as e:
        print(str(e), file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else (Path(__file__).resolve().parents[1] / "blocksim" / "profiles"
                                           / shipped_name(prof["model"], prof["gpu"], prof["dtype"],
                                                          prof["tensor_parallel"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    changes = [] if args.quiet else replaced_changes(out, prof)  # against the profile it replaces
    try:
        _write_whole(out, prof)
    except ProfileError as e:
        print(str(e), file=sys.stderr)
        return 2
    for line in changes:
        print(f"profile {prof['model']}: {line}", file=sys.stderr)
    print(f"profile: {prof['model']} on {prof['gpu']} ({prof['device']}), written to {out}")
    return 0


def cmd_calibrate(args: argparse.Namespace, command: str) -> int:
    """``--calibrate``: the base profile carried to this device (`validation.profile_calibrate`)."""
    from validation import profile_calibrate as cal
    mixed = [opt for opt, on in (("--add-table", args.add_table), ("--leave-out", args.leave_out),
                                 ("--tier-dir", args.tier_dir), ("--tensor-parallel", args.tensor_parallel != 1))
             if on]
    if not args.calibrate:
        problem = "--from names the base of --calibrate; add --calibrate"
    elif mixed:
        problem = f"--calibrate with {', '.join(mixed)}: a calibration scales the base's own tables; run them apart"
    elif not args.out:
        problem = "--calibrate: name the file to write with --out (the base is left as it is)"
    else:
        problem = None
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        base = Path(args.base) if args.base else cal.default_base(args.model, args.gpu_name, args.dtype, args.device)
        if Path(args.out).resolve() == base.resolve():
            raise ProfileError(f"--calibrate: --out names the base {base} itself; write the calibrated profile "
                               f"beside it")
        prof = cal.read_base(base, model=args.model, device=args.device, gpu=args.gpu_name, dtype=args.dtype,
                             block_size=args.block_size)
        prof = cal.calibrate(base, prof, device=args.device, catalog=args.catalog, command=command,
                             progress=not args.quiet)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        _write_whole(Path(args.out), prof)
    except ProfileError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"profile: {base} calibrated on {prof['calibrated']['device']}, written to {args.out}")
    return 0


def replaced_changes(path: Path, prof: dict) -> list[str]:
    """Where `prof` replaces a profile of the same model, GPU, dtypes, tensor-parallel degree, block
    size, decode attention and grid at `path`: how each of its tables moved against the old one's
    (`table_change`)."""
    try:
        old = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    keys = ("model", "gpu", "dtype", "kv_dtype", "tensor_parallel", "block_size", "decode_attention", "quick")
    if not isinstance(old, dict) or any(old.get(k) != prof.get(k) for k in keys) \
            or not isinstance(old.get("components"), dict):
        return []
    out = []
    for name, table in prof["components"].items():
        moved = table_change(old["components"].get(name), table) if isinstance(table, dict) else None
        if moved:
            out.append(f"{name} against the profile it replaces: {moved}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.profile")
    sub = ap.add_subparsers(dest="command", required=True)
    add_profile_command(sub)
    argv = ["profile", *(sys.argv[1:] if argv is None else argv)]
    args = ap.parse_args(argv)
    args.cli_argv = argv
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

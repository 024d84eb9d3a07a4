"""Spans of identical decode steps, advanced in one jump.

After a plain decode step (decodes only: no prefill, block move, preemption or rejection) in
which every decoding group has one running sequence and no group is mid-prompt, each further
step is the same batch with every context one token longer, until a sequence finishes, a
request arrives or free blocks run low: waiting and swapped groups stay blocked (free blocks only
shrink and the batch is constant) and no copy-on-write can occur. With KV tiers a waiting request
plans the loads of its prefix beyond its GPU hit and reserves blocks for them, so a new block that
evicts a block of that hit can lower what it needs: there the span also ends before the first
take that evicts prefix-cached content, or a block of that hit where the memory manager knows it
(`clean_takes` of the memory manager). `find_span` finds
how many steps such a span has, `run_span` advances the clock over them, applies their appends and
records their steps. Step records, block tables and times are exactly those of stepping one by
one (`Engine(spans=False)` steps one by one, for checking that claim).

What the parts contribute: the scheduler whether its policy allows a span (`allows_span`); the
cost model the steps' times; the memory manager whether a decoded token may take a new block
(`allocates_on_append`: then a sequence takes one each time its K/V crosses a block boundary, and
the span is cut while one free block per sequence remains, vLLM's `can_append_slots`), its state
at the span's first step (`memory_breakdown`) and the appends of the further steps
(`append_span_slots`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate, chain
from operator import sub
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from blocksim.cost.step import decode_attention
from blocksim.interfaces import MemoryManager
from blocksim.records.steps import DeferredColumns
from blocksim.scheduling.outputs import SchedulerOutputs
from blocksim.sequence import Sequence, SeqStatus

if TYPE_CHECKING:
    from blocksim.engine.engine import Engine
    from blocksim.scheduling.scheduler import Scheduler

MAX_SPAN_STEPS = 4096


class Span(NamedTuple):
    steps: int                # steps in the span, the one just scheduled included
    seqs: list[Sequence]      # the decoding sequences, in running order
    takers: list[int]         # the sequences (indices into `seqs`) taking a new block: step order, then running order
    new_blocks: list[int] | None  # blocks taken at each step (0 at the first); None when none are
    starts_s: np.ndarray      # start time of each step
    durations_s: np.ndarray
    ctx_tokens: np.ndarray    # decode context tokens of each step
    longest: np.ndarray | None  # the longest sequence's context of each step, where the cost model prices it
    times: dict               # the cost model's components: t_linear_s, t_attn_decode_s, t_comm_s, t_overhead_s
    end_s: float              # when the last step ends
    finishes: bool            # whether a sequence reaches its output length at the last step


def decode_batch(sched: Scheduler, out: SchedulerOutputs):
    """The sequences of a possible span after a plain decode step and its length bound.

    Returns `(seqs, lens, k)`, `lens` their token counts (a list) and `k` the number of steps (this one
    included) before the first sequence finishes (it finishes at step `k`); None when a group is
    mid-prompt, a group decodes several sequences, or a sequence finishes within two steps.
    """
    groups = out.decode_groups
    if len(groups) != len(sched.running):
        return None  # a group is mid-prompt (chunked prefill) and would resume
    seqs = [one[0] for g in groups if len(one := g.seqs) == 1]
    if len(seqs) != len(groups):
        return _decode_batch_forked(groups)
    lens = [s.num_tokens for s in seqs]
    k = min(map(sub, [g.prompt_tokens + g.output_tokens for g in groups], lens), default=1 << 62)
    if k < 2:
        return None
    return seqs, lens, k


def _decode_batch_forked(groups: list):
    """`decode_batch` where some group holds several sequences: a span when each decodes one."""
    seqs, lens = [], []
    k = 1 << 62
    for g in groups:
        run = g.seqs if len(g.seqs) == 1 else [s for s in g.seqs if s.status is SeqStatus.RUNNING]
        if len(run) != 1:
            return None
        s = run[0]
        seqs.append(s)
        lens.append(s.num_tokens)
        rem = g.output_tokens - (s.num_tokens - g.prompt_tokens)
        if rem < k:
            k = rem
    if k < 2:
        return None
    return seqs, lens, k


def shared_tokens(groups, block_size: int) -> int:
    """Context tokens that decoding rows read from blocks another row of the step reads too: the
    prompt's full blocks, which a request's samples share, once for each running sample but the first."""
    tokens = 0
    for g in groups:
        if len(g.seqs) > 1:
            running = sum(1 for s in g.seqs if s.status is SeqStatus.RUNNING)
            if running > 1:
                tokens += (running - 1) * (g.prompt_tokens // block_size * block_size)
    return tokens


def decode_times(cost, out: SchedulerOutputs, k: int, comm=None, longest: int | None = None, shared: int = 0):
    """Durations of `k` decode steps of the batch, each context one token longer, their components,
    the steps' context tokens and longest contexts (None without `longest`, the first step's).
    `comm(tokens)`: the tensor-parallel all-reduces' time (None on one GPU), added in the order a
    single step sums its components. `shared`: `shared_tokens` of the batch, for a cost model that
    prices it (`prices_shared_rows`)."""
    n = out.num_decode_seqs
    c0 = out.decode_ctx_tokens
    ctx = np.arange(c0, c0 + n * k, n, dtype=np.int64) if n else np.full(k, c0, np.int64)
    top = None if longest is None else np.arange(longest, longest + k, dtype=np.int64)
    attn = decode_attention(cost, ctx, n, True, top, shared)
    times = {"t_linear_s": cost.linear(n, n, True), "t_attn_decode_s": attn,
             "t_comm_s": comm(n) if comm is not None else 0.0, "t_overhead_s": cost.overhead(True, n)}
    if comm is None:
        durations = times["t_linear_s"] + times["t_attn_decode_s"] + times["t_overhead_s"]
    else:
        durations = times["t_linear_s"] + times["t_attn_decode_s"] + times["t_comm_s"] + times["t_overhead_s"]
    return durations, times, ctx, top


def block_crossings(bm: MemoryManager, lens: list[int], k: int, clean=None, room: int | None = None):
    """Blocks each further step of a `k`-step span takes; `k` cut where free blocks run low (at
    most `room` takes: by default all free blocks but one), and with `clean` (`clean(limit)`: how
    many of the next `limit` new blocks evict no prefix-cached content) before the first take that
    would evict some.

    Returns `(k, takers, new_blocks)`: `takers` the sequences (indices into `lens`) that take a
    new block, in step order, then running order; `new_blocks[j]` how many step j takes (None
    when the manager takes none). Step j writes the K/V of position `lens[i] - 1 + j`, which needs
    a new block when it is a multiple of the block size: at steps `block_size - (lens[i] - 1) %
    block_size`, then every `block_size` steps (every step for blocks of one token). A manager that
    reserved every slot at admission takes none.
    """
    if not bm.allocates_on_append:
        return k, [], None
    if clean is not None:  # the span's takes, then as many of them as are clean
        k, takers, new_blocks = block_crossings(bm, lens, k, None, room)
        c = clean(len(takers)) if takers else 0
        if c == len(takers):
            return k, takers, new_blocks
        return block_crossings(bm, lens, k, None, c)
    bs = bm.block_size
    if room is None:
        room = bm.num_free_gpu_blocks - 1  # keeps vLLM's one-free-block-per-sequence check true
    n = len(lens)
    if bs == 1:  # take t is sequence t % n's at step t // n + 1
        if (k - 1) * n > room:  # the span ends before the step of the take that finds no room
            k = room // n + 1 if room >= 0 else 1
        return k, list(range(n)) * (k - 1), [0] + [n] * (k - 1)
    firsts = [bs - (m - 1) % bs for m in lens]  # each sequence's first take
    if k <= bs + 1:  # no sequence takes twice: takers by first take, ties in running order
        takers = sorted([i for i, j in enumerate(firsts) if j < k], key=firsts.__getitem__)
        if len(takers) > room:
            k = firsts[takers[room]] if room >= 0 else 1
            takers = [i for i in takers if firsts[i] < k]
        new_blocks = [0] * k
        for i in takers:
            new_blocks[firsts[i]] += 1
        return k, takers, new_blocks
    takes = []
    for i, j in enumerate(firsts):
        while j < k:  # a span longer than a block: more takes
            takes.append((j, i))
            j += bs
    takes.sort()
    if len(takes) > room:
        k = takes[room][0] if room >= 0 else 1
        takes = [t for t in takes if t[0] < k]
    new_blocks = [0] * k
    for j, _ in takes:
        new_blocks[j] += 1
    return k, [i for _, i in takes], new_blocks


def find_span(sched: Scheduler, bm: MemoryManager, cost, out: SchedulerOutputs, now_s: float,
              next_arrival_s: float, comm=None, clean=None) -> Span | None:
    """The span that the step `out`, scheduled at `now_s`, starts; None when it starts none
    (fewer than two steps before a finish, an arrival or a shortage of free blocks). `comm` as
    in `decode_times`. `clean`, given under KV tiers while a request waits: the memory manager's
    `clean_takes` (a new block that evicts a block of that request's GPU hit can lower what its
    onload plan needs, so the span ends before the first take that evicts prefix-cached content,
    or one of that hit's blocks where the manager knows them)."""
    if not out.is_plain_decode or not sched.allows_span():
        return None
    batch = decode_batch(sched, out)
    if batch is None:
        return None
    seqs, lens, finish = batch
    k = min(finish, MAX_SPAN_STEPS)
    # Times for the steps that can start before the next arrival, estimated from the first step's
    # duration (all of them again if every estimated step starts before it: the cut stays exact).
    n = out.num_decode_seqs  # priced as `decode_times` prices each step
    longest = max(lens) if getattr(cost, "prices_longest_row", False) else None
    shared = shared_tokens(out.decode_groups, bm.block_size) if getattr(cost, "prices_shared_rows", False) else 0
    attn = decode_attention(cost, out.decode_ctx_tokens, n, True, longest, shared)
    first_s = cost.linear(n, n, True) + attn + cost.overhead(True, n)
    if comm is not None:
        first_s += comm(n)
    guess = k if first_s <= 0 or next_arrival_s == math.inf else min(k, int((next_arrival_s - now_s) / first_s) + 2)
    while True:
        durations, times, ctx, top = decode_times(cost, out, guess, comm, longest, shared)
        step_s = durations.tolist()
        starts = list(accumulate(step_s[:-1], initial=now_s))
        before = bisect_left(starts, next_arrival_s)  # steps starting before the arrival
        if before < guess or guess == k:
            break
        guess = k
    k = min(k, before)
    if k <= 1:
        return None
    k, takers, new_blocks = block_crossings(bm, lens, k, clean)
    if k <= 1:
        return None
    return Span(k, seqs, takers, new_blocks, np.array(starts[:k]), durations, ctx, top, times,
                starts[k - 1] + step_s[k - 1], k == finish)


def _span_steps(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For spans of `steps` steps laid end to end: each step's index within its span, and each
    span's first row."""
    first = np.cumsum(steps) - steps
    return np.arange(int(steps.sum()), dtype=np.int64) - np.repeat(first, steps), first


def _taking_columns(args: list, steps: np.ndarray) -> dict[str, np.ndarray]:
    """`TAKING_MEMORY`'s columns of spans described by `(blocks used, breakdown, decoding sequences,
    block size, new blocks per step)` at their first steps: step j has written `n * j` more slots
    out of the unfilled part of the last blocks, and each block taken by then moved `block_size`
    slots from free to that unfilled part."""
    used, token_states, internal, free, n, bs = (np.repeat(np.array([a[i] for a in args], np.int64), steps)
                                                 for i in range(6))
    j, first = _span_steps(steps)
    new = np.fromiter(chain.from_iterable(a[6] for a in args), np.int64, len(j))
    total = np.cumsum(new)
    taken = total - np.repeat(total[first] - new[first], steps)  # blocks taken by steps 1..j of its span
    written, slots = n * j, bs * taken
    return {"gpu_blocks_used": used + taken, "mem_token_states": token_states + written,
            "mem_internal_frag": internal + slots - written, "mem_free": free - slots}


def _reserved_columns(args: list, steps: np.ndarray) -> dict[str, np.ndarray]:
    """`RESERVED_MEMORY`'s columns of spans described by `(token states, reservation, decoding
    sequences)` at their first steps: step j has written `n * j` more slots out of the reservation."""
    token_states, reservation, n = (np.repeat(np.array([a[i] for a in args], np.int64), steps) for i in range(3))
    written = n * _span_steps(steps)[0]
    return {"mem_token_states": token_states + written, "mem_reservation": reservation - written}


#: The memory columns of a span under a manager that takes blocks as sequences grow, and under
#: one that reserved every slot at admission.
TAKING_MEMORY = DeferredColumns(("gpu_blocks_used", "mem_token_states", "mem_internal_frag", "mem_free"),
                                _taking_columns)
RESERVED_MEMORY = DeferredColumns(("mem_token_states", "mem_reservation"), _reserved_columns)


def span_memory(bm: MemoryManager, n: int, new_blocks: list[int] | None, next_group) -> tuple[dict, tuple]:
    """The memory columns of a span of `n` decoding sequences, from the state after its first
    step: `(constant, deferred)`, the columns that keep one value and the description of those that
    change (`TAKING_MEMORY` or `RESERVED_MEMORY` with its arguments, for the step records).

    Each step writes `n` slots: out of the reservation where every slot was reserved at
    admission, else out of the unfilled part of the last blocks (internal fragmentation), each
    new block (`new_blocks[j]` taken at step j) moving `block_size` slots from free to that unfilled part.
    """
    mem = bm.memory_breakdown(next_group, 0)
    if new_blocks is None:
        return ({"gpu_blocks_used": bm.num_gpu_blocks_used, "mem_internal_frag": mem.internal_frag,
                 "mem_external_frag": mem.external_frag, "mem_free": mem.free},
                (RESERVED_MEMORY, (mem.token_states, mem.reservation, n)))
    return ({"mem_reservation": mem.reservation, "mem_external_frag": mem.external_frag},
            (TAKING_MEMORY, (bm.num_gpu_blocks_used, mem.token_states, mem.internal_frag, mem.free, n,
                             bm.block_size, new_blocks)))


def exact_delay(now_s: float, end_s: float) -> float | None:
    """A delay `d >= 0` with `now_s + d == end_s` in floating point (SimPy's clock sets `now + d`),
    or None when no delay within a few ulps of `end_s - now_s` lands there."""
    d = end_s - now_s
    for _ in range(4):
        reached = now_s + d
        if reached == end_s:
            return d if d >= 0 else None
        d = math.nextafter(d, math.inf if reached < end_s else -math.inf)
    return None


def run_span(engine: Engine, out: SchedulerOutputs, span: Span):
    """Advance the engine over a span (a SimPy process body): the appends of its further steps,
    the clock step by step, the scheduler's outcome at its end, and its step records."""
    env, sched, bm = engine.env, engine.sched, engine.bm
    k, seqs = span.steps, span.seqs
    n = out.num_decode_seqs
    constant, memory = span_memory(bm, n, span.new_blocks, sched.waiting[0] if sched.waiting else None)
    if engine.tiers is not None:  # the moves its scheduling issued are the first step's, as stepping records them
        engine._tier_record(1)
    bm.append_span_slots(seqs, k - 1, span.takers)  # step order, then running order
    # The clock adds each step's time, exactly as stepping does: one timeout to that sum when one
    # delay reaches it exactly from now (almost always), else one timeout per step.
    delay = exact_delay(env.now, span.end_s)
    if delay is not None:
        yield env.timeout(delay)
    else:
        for d in span.durations_s[:k].tolist():
            yield env.timeout(d)
    sched.on_span_steps(k - 1)
    finished = sched.complete_span(out, seqs, k, env.now, span.finishes)
    if engine.tiers is not None:  # the further steps move nothing
        engine.tiers.now_s = env.now
        engine._tier_record(k - 1)
    times = span.times
    if span.longest is not None:
        engine.cost.count_longest(span.ctx_tokens[:k], n, span.longest[:k])
    constant.update(num_decode_seqs=n, running=len(out.decode_groups), waiting=len(sched.waiting),
                    swapped=len(sched.swapped), cpu_blocks_used=bm.num_cpu_blocks_used,
                    t_linear_s=times["t_linear_s"], t_comm_s=times["t_comm_s"],
                    t_overhead_s=times["t_overhead_s"])  # the other columns are 0
    varying = {"start_s": span.starts_s, "duration_s": span.durations_s[:k], "decode_ctx_tokens": span.ctx_tokens[:k],
               "t_attn_decode_s": times["t_attn_decode_s"][:k]}
    if finished:  # requests finish at the last step only
        fin = np.zeros(k, dtype=np.int64)
        fin[-1] = len(finished)
        varying["finished"] = fin
    engine.rec.add_many(k, constant, varying, memory)
    if engine.check:
        bm.check_invariants(sched.live_seqs())

"""The SimPy engine: an arrival process and the engine's step loop on one environment.

The scheduler decides each step; the cost model prices it; SimPy only advances the clock. Swap
transfers hold the host link (a `simpy.Resource`) for their duration, inside the step that
issued them, as vLLM v0 waits for its swaps before running the model.

Executor: with a `blocksim.engine.executor.StepExecutor`, every step is also executed (spans
off) and lasts the executor's measured seconds; the step's `t_*_s` columns keep the cost model's
prediction.

Spans: after a plain decode step whose groups each decode one sequence, the next steps are the
same batch with contexts one token longer until a request finishes, a request arrives or free
blocks run low; `spans` finds such a span and advances it in one jump, with the step records,
block tables and times of stepping one by one (`spans=False` steps one by one).

The memory manager is any `blocksim.interfaces.MemoryManager`; the engine reads its capability
flags (clock, extents, prefix hashes, prefill reservation) and calls nothing else, but for KV tiers.

KV tiers (`config.tiers`, `blocksim.memory.tiers`): the engine builds the `TierStore`, attaches it to
the manager, prices its moves by a measured profile's tier tables when the cost model has them
(by the executor's measurements of each move when an executor performs them),
keeps its clock, reports each step's computed prompt chunks at the step's end, delays a step for
write-back copies and for loads it outlasts (`TierStore.take_wait`), idles until the next load
lands when every admitted request waits for one, ends spans before it, and records the tier
counters per step (`tier_steps.parquet`) and the moves for the plan.
"""

from __future__ import annotations

import functools
import gc
import math
import time
from typing import TYPE_CHECKING

import numpy as np
import simpy

from blocksim.config import ConfigError, SimConfig
from blocksim.cost import cost_record
from blocksim.cost.step import step_times
from blocksim.cost.tier_transfer import tier_chunk_seconds
from blocksim.engine.executor import StepExecutor
from blocksim.engine.spans import exact_delay, find_span, run_span, shared_tokens
from blocksim.interfaces import MemoryManager
from blocksim.policies import make_cost_model, make_memory_manager, make_scheduler
from blocksim.records.schema import FREE_EXTENT_COLUMNS, FREE_EXTENT_DTYPES
from blocksim.records.steps import StepRecorder, StepRow
from blocksim.records.tier_records import TierStepRecorder
from blocksim.scheduling.outputs import SchedulerOutputs
from blocksim.sequence import GroupStatus, SequenceGroup, SeqStatus

if TYPE_CHECKING:
    import pandas as pd

    from blocksim.records.result import RunResult

REQUIRED_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


class EngineError(RuntimeError):
    pass


def request_arrays(trace) -> dict[str, np.ndarray]:
    """Normalize a trace (a `traces.Trace` or a DataFrame) to the engine's columns, validated, sorted by
    arrival and rebased so the first request arrives at 0 s (as `traces.read_trace` reads files):
    request_id, arrival_s, prompt_tokens, output_tokens, n, priority and `_row` (the trace's row)."""
    df = getattr(trace, "arrays", None)  # a Trace's canonical columns, without its frame
    if df is None:
        df = getattr(trace, "df", trace)
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"expected a traces.Trace or a pandas DataFrame, got {type(trace).__name__}")
        missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
        if missing:
            raise EngineError(f"trace lacks column(s) {missing}; it needs {list(REQUIRED_COLUMNS)} "
                              f"(read files with traces.read_trace)")
    n_rows = len(df["arrival_s"])
    out = {
        "request_id": np.asarray(df["request_id"], np.int64) if "request_id" in df else np.arange(n_rows),
        "arrival_s": np.asarray(df["arrival_s"], np.float64),
        "prompt_tokens": np.asarray(df["prompt_tokens"], np.int64),
        "output_tokens": np.asarray(df["output_tokens"], np.int64),
        "n": np.asarray(df["n"], np.int64) if "n" in df else np.ones(n_rows, np.int64),
        "priority": np.asarray(df["priority"], np.int64) if "priority" in df else np.zeros(n_rows, np.int64),
        "_row": np.arange(n_rows),
    }
    arrival = out["arrival_s"]
    bad = {"prompt_tokens": out["prompt_tokens"] < 1, "output_tokens": out["output_tokens"] < 1, "n": out["n"] < 1,
           "arrival_s": ~np.isfinite(arrival) | (arrival < 0)}
    for col, mask in bad.items():
        if mask.any():
            i = int(np.argmax(mask))
            raise EngineError(f"trace row {i + 1} (request_id {out['request_id'][i].item()}): "
                              f"{col}={out[col][i].item()!r} is invalid (lengths and n must be >= 1, arrivals "
                              f"finite and >= 0); remove the row (traces.read_trace skips such rows with --lenient)")
    if (np.diff(arrival) < 0).any():
        order = np.argsort(arrival, kind="stable")
        out = {c: v[order] for c, v in out.items()}
        arrival = out["arrival_s"]
    if n_rows and arrival[0] != 0.0:  # rebased as traces.read_trace does: every path alike
        out["arrival_s"] = arrival - arrival[0]
    return out


def prefill_seconds(cm, start_tokens: int, new_tokens: int) -> float:
    """Cost model `cm`'s time to prefill `new_tokens` after `start_tokens` of prefix, alone."""
    return (cm.linear(new_tokens, 1, False)
            + cm.attn_prefill(np.array([new_tokens], np.int64), np.array([start_tokens], np.int64)))


def requests_frame(trace) -> pd.DataFrame:
    """`request_arrays` as a frame."""
    import pandas as pd

    return pd.DataFrame(request_arrays(trace))


class Engine:
    def __init__(self, config: SimConfig, trace, cost_model=None, *, spans: bool = True,
                 check_invariants: bool = False, progress: bool = False, plan_dir=None,
                 block_manager=None, executor: StepExecutor | None = None, log_tier_events: bool = False) -> None:
        self.config = config
        self.reqs = request_arrays(trace)
        self.cost = cost_model or make_cost_model(config)
        self.plan = None
        if plan_dir is not None:
            from blocksim.records.plan import PlanRecorder
            self.plan = PlanRecorder(plan_dir, config)
            spans = False  # a plan records every step's block tables
        self.executor = executor
        if executor is not None:
            spans = False  # every step is executed
        self.spans = spans
        self.check = check_invariants
        self.progress = progress
        # `block_manager`: a ready instance, or a factory taking the config (for plugged-in managers).
        if block_manager is None:
            self.bm: MemoryManager = make_memory_manager(config)
        else:
            self.bm = block_manager(config) if callable(block_manager) else block_manager
        if (self.plan is not None or executor is not None) and getattr(self.bm, "defer_unique_hashes", False):
            self.bm.defer_unique_hashes = False  # plans and executors read every prompt block's content key
        self.sched = make_scheduler(config, self.bm)
        self.tiers = None
        if config.tiers is not None:
            from blocksim.memory.tiers import make_tier_store  # imported by runs with tiers only
            self.tiers = make_tier_store(config, log_tier_events)
            self.tiers.ops_on = log_tier_events or self.plan is not None or executor is not None
            if not hasattr(self.bm, "attach_tiers"):
                raise ConfigError(f"tiers (--tier-host-gib / --tier-disk-gib): allocator "
                                  f"{config.policy_config.allocator!r} with scheduler {config.policy_config.scheduler!r} "
                                  f"has no KV tiers; choose vllm-prefix, vllm-v1 or sglang, or drop the tier options")
            self.bm.attach_tiers(self.tiers)
            self.tiers.prefill_s = functools.partial(prefill_seconds, self.cost)  # not a bound method: no cycle
            profile = getattr(self.cost, "profile", None)  # a measured profile's tier tables price the moves
            measured = tier_chunk_seconds(profile, self.tiers.chunk_bytes) if profile is not None else None
            if measured is not None:
                self.tiers.use_measured(measured, f"profile {profile.path}")
            self.tier_rec = TierStepRecorder()
            self._onloading = getattr(self.sched, "onloading", ())  # requests holding blocks for tier loads
            if executor is not None:  # the executor performs the moves: it needs the tiers' sizes
                attach = getattr(executor, "attach_tiers", None)
                if attach is None:
                    raise ConfigError(f"tiers with an executor: {type(executor).__name__} has no attach_tiers, so "
                                      f"it cannot perform the tier moves; drop the tier options or the executor")
                attach(self.tiers)
            if self.tiers.wants_gpu_evictions:
                self.spans = False  # a step that evicts from the GPU waits for its write-backs
        # Allocators with address-space extents (contiguous) get their free extents sampled.
        self._extents: list[tuple[int, float, np.ndarray]] | None = [] if self.bm.has_extents else None
        self._next_extent_s = 0.0
        # tensor-parallel communication: a cost model's `comm(tokens)`, recorded as t_comm_s when TP > 1
        self._comm = getattr(self.cost, "comm", None) if config.tensor_parallel > 1 else None
        # a cost model that prices a graph step by its longest row (a profile with `decode_step_longest`)
        self._longest = bool(getattr(self.cost, "prices_longest_row", False))
        # and by the blocks its rows share (a profile with `decode_step_shared`)
        self._shared = self._longest and bool(getattr(self.cost, "prices_shared_rows", False))
        self.rec = StepRecorder(comm=config.tensor_parallel > 1)
        self.groups: list[SequenceGroup] = []
        self._arrivals = self.reqs["arrival_s"]
        self._arrival_list = self._arrivals.tolist() + [math.inf]  # for the step loop: floats, then inf
        self._next_arrival_idx = 0
        self._wake: simpy.Event | None = None
        r = self.reqs
        self._cols = tuple(r[c] for c in ("request_id", "prompt_tokens", "output_tokens", "n", "priority"))
        self._hashes = None
        has_hashes = trace.has_hashes if hasattr(trace, "has_hashes") else \
            "prefix_hashes" in getattr(trace, "df", trace).columns
        if has_hashes and self.bm.hashes_prefixes:
            h, bs = getattr(trace, "hash_block_tokens", None), self.bm.block_size
            self.bm.hash_block_tokens = h  # a manager may refuse it with its own reason (the radix pool's page size)
            if h and h % bs and bs % h:
                raise ConfigError(f"block_size (--block-size) {bs} neither divides nor is a multiple of the "
                                  f"{h} tokens each of the trace's prefix hashes covers, so no block's content is "
                                  f"known; choose a block size that divides {h}")
            self.bm.hash_block_tokens = h
            if self.bm.hash_block_tokens:
                order = self.reqs["_row"]
                hashes = getattr(trace, "df", trace)["prefix_hashes"].tolist()
                self._hashes = [hashes[i] for i in order]
                if self.tiers is not None and hasattr(self.bm, "tier_trace_hashes"):
                    self.bm.tier_trace_hashes(self._hashes)  # content one request alone has: private chunks
        self._seq_id = 0
        self.env = simpy.Environment()
        self.link = simpy.Resource(self.env, capacity=1)
        self.capacity_slots = self.bm.num_total_gpu_blocks * self.bm.block_size

    # --- processes -----------------------------------------------------------------------------
    def _arrivals_proc(self):
        """The arrival stream: wakes the idle engine at each arrival time (reached exactly, or the
        least later time the clock can reach: a clock left an ulp short of an arrival would wake an
        engine that finds nothing arrived, and nothing would wake it again)."""
        env = self.env
        for t in np.unique(self._arrivals).tolist():
            if t > env.now:
                d = exact_delay(env.now, t)
                if d is None:
                    d = t - env.now
                    while env.now + d < t:
                        d = math.nextafter(d, math.inf)
                yield env.timeout(d)
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def _drain_arrivals(self, now: float) -> None:
        """Hand every request that has arrived by `now` (inclusive) to the scheduler."""
        i, arr = self._next_arrival_idx, self._arrival_list
        r = self._cols
        while arr[i] <= now:  # arr ends with inf
            g = SequenceGroup(int(r[0][i]), i, arr[i], int(r[1][i]), int(r[2][i]), int(r[3][i]),
                              int(r[4][i]), self._seq_id, None if self._hashes is None else self._hashes[i])
            self._seq_id += len(g.seqs)
            self.groups.append(g)
            self.sched.add_request(g)
            i += 1
        self._next_arrival_idx = i

    def _engine_proc(self):
        env, sched, bm, tiers = self.env, self.sched, self.bm, self.tiers
        clocked = bm.uses_clock
        bar = self._progress_bar()
        arrivals = self._arrival_list
        while True:
            if arrivals[self._next_arrival_idx] <= env.now:
                self._drain_arrivals(env.now)
            if not sched.has_unfinished():
                if self._next_arrival_idx >= len(self._arrivals):
                    break
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            now = env.now
            if clocked:
                bm.set_clock(now)
            if tiers is not None:
                tiers.now_s = now
                tiers.step = self.rec.num_steps
            out = sched.schedule()
            for p in out.prefills:
                g = p.group
                if g.first_scheduled_s != g.first_scheduled_s:
                    g.first_scheduled_s = now
            if self.spans:
                next_event = arrivals[self._next_arrival_idx]
                if tiers is not None:  # a request whose chunks land may be admitted: the span ends before
                    landing = sched.next_onload_s() if hasattr(sched, "next_onload_s") else None
                    if landing is not None and landing < next_event:
                        next_event = landing
                clean = bm.clean_takes if tiers is not None and sched.waiting else None
                span = find_span(sched, bm, self.cost, out, now, next_event, self._comm, clean)
            else:
                span = None
            if span is not None:
                yield from run_span(self, out, span)
                if bar:
                    bar.update(int(env.now) - bar.n)
                continue
            if not out.has_work and not (out.blocks_to_swap_out or out.blocks_to_swap_in):
                if not (out.preempted or out.rejected):
                    ready = getattr(sched, "next_onload_s", lambda: None)() if tiers is not None else None
                    if ready is None:
                        raise EngineError(self._stall_message())
                    yield from self._sleep_until(ready)  # every admitted request waits for its chunks
                    continue
            yield from self._run_step(out)
            if bar and self.rec.num_steps % 256 == 0:
                bar.update(int(env.now) - bar.n)
        if bar:
            bar.total = max(bar.total, int(env.now))
            bar.update(int(env.now) - bar.n)
            bar.close()

    def _sleep_until(self, t: float):
        """Idle until `t` or the next arrival, whichever comes first."""
        env = self.env
        self._wake = env.event()
        yield env.any_of([env.timeout(max(0.0, t - env.now)), self._wake])
        self._wake = None

    # --- steps ---------------------------------------------------------------------------------
    def _step_times(self, out: SchedulerOutputs) -> dict[str, float]:
        cm = self.cost
        if out.prefills:
            new = np.array([stop - start for _, start, stop in out.prefills], np.int64)
            cached = np.array([start for _, start, _ in out.prefills], np.int64)
        else:
            new = cached = None
        # decode-only: no prompt and no block move, the steps a CUDA graph replays
        decode_only = not (out.prefills or out.blocks_to_swap_in or out.blocks_to_swap_out or out.blocks_to_copy)
        n = out.num_decode_seqs
        # sequences that sample a token: every decode, and each prompt (chunk) that reaches its end
        sampled = n + sum(1 for g, _, stop in out.prefills if stop >= g.seqs[0].num_tokens)
        longest, shared = None, 0
        if self._longest and n:  # a graph step by its longest row (and shared blocks); an eager one's uneven rows
            longest = max(max((s.num_tokens for g in out.decode_groups for s in g.seqs
                               if s.status is SeqStatus.RUNNING), default=0), out.padding_longest)
            if decode_only:
                shared = shared_tokens(out.decode_groups, self.bm.block_size) if self._shared else 0
            cm.count_longest(out.decode_ctx_tokens, n, longest, decode_only)
        return step_times(cm, new, cached, n, out.decode_ctx_tokens, decode_only=decode_only, sampled=sampled,
                          active=out.has_work, longest=longest, shared=shared,
                          swapped_in=len(out.blocks_to_swap_in), swapped_out=len(out.blocks_to_swap_out),
                          copied=len(out.blocks_to_copy), comm=self._comm)

    def _tier_wait(self, out: SchedulerOutputs, duration: float):
        """Wait before a step of `duration` for the write-back copies of blocks it overwrites and
        the loads it outlasts (an onload wait of the requests loaded inside it)."""
        env = self.env
        wait = self.tiers.take_wait(duration)
        if wait > 0:
            now = env.now
            for g, _, _ in out.prefills:
                if g.onload_issue_s == now:  # loaded inside this step: the wait is its onload wait
                    g.onload_wait_s += wait
                    if g.first_token_s != g.first_token_s:
                        g.onload_ttft_s += wait
            yield env.timeout(wait)

    def _run_step(self, out: SchedulerOutputs):
        env, sched, tiers = self.env, self.sched, self.tiers
        times = self._step_times(out)
        duration = sum(times.values())
        if self.executor is not None:  # executed (tier moves were performed as they were issued)
            if tiers is not None:
                self._tier_moves(tiers.take_ops())
            duration = float(self.executor.execute(self.rec.num_steps, out, times))
        if tiers is not None:
            yield from self._tier_wait(out, duration)
        start = env.now
        head = sched.waiting[0] if sched.waiting else None
        pending = self._pending_prefill(out) if sched.chunked and not self.bm.reserves_prefill else 0
        mem = self.bm.memory_breakdown(head, pending)
        running, waiting, swapped = len(sched.running), len(sched.waiting), len(sched.swapped)
        if self.plan is not None:
            self.plan.on_step(self.rec.num_steps, out, times)
        if self._extents is not None and start >= self._next_extent_s:
            self._sample_extents(start)
        gpu_blocks_used, cpu_blocks_used = self.bm.num_gpu_blocks_used, self.bm.num_cpu_blocks_used
        if times["t_swap_s"] > 0 and self.executor is None:
            with self.link.request() as req:
                yield req
                yield env.timeout(times["t_swap_s"])
            rest = duration - times["t_swap_s"]
            if rest > 0:
                yield env.timeout(rest)
        elif duration > 0:
            yield env.timeout(duration)
        if tiers is not None:
            self._tier_step_end(out)
        finished = sched.complete_step(out, env.now)
        self.rec.add(StepRow(
            start_s=start, duration_s=duration, num_prefill_seqs=len(out.prefills),
            prefill_tokens=out.prefill_tokens, num_decode_seqs=out.num_decode_seqs,
            decode_ctx_tokens=out.decode_ctx_tokens, running=running, waiting=waiting, swapped=swapped,
            gpu_blocks_used=gpu_blocks_used, cpu_blocks_used=cpu_blocks_used,
            blocks_swapped_in=len(out.blocks_to_swap_in), blocks_swapped_out=len(out.blocks_to_swap_out),
            blocks_copied=len(out.blocks_to_copy), preempted=len(out.preempted), finished=len(finished),
            rejected=len(out.rejected), **times, mem_token_states=mem.token_states,
            mem_reservation=mem.reservation, mem_internal_frag=mem.internal_frag,
            mem_external_frag=mem.external_frag, mem_free=mem.free))
        if self.check:
            self.bm.check_invariants(sched.live_seqs())
            if tiers is not None:
                tiers.check()

    def _tier_step_end(self, out: SchedulerOutputs) -> None:
        """Report the prompt chunks this step computed to the tiers; record the step's tier moves."""
        tiers, bm = self.tiers, self.bm
        tiers.now_s = self.env.now
        for g, start, stop in out.prefills:
            bm.tier_computed(g, start, stop)
        self._tier_record(1)

    def _tier_record(self, steps: int) -> None:
        """The tier counters after `steps` steps; the moves they issued go to the plan."""
        tiers = self.tiers
        self.tier_rec.add(tiers.totals(), len(self._onloading), steps)
        if tiers.ops:  # moves are recorded only for a plan or an executor
            self._tier_moves(tiers.take_ops())

    def _tier_moves(self, ops) -> None:
        """Tier moves, in issue order, to the plan (an executor performed them as they were issued)."""
        if ops and self.plan is not None:
            self.plan.on_tier_ops(ops)

    def _pending_prefill(self, out: SchedulerOutputs) -> int:
        """Paged slots allocated to prompt positions a chunked prefill has not written yet (counted
        once per group: its sequences share the prompt blocks); for managers that do not count
        them as reservation themselves (`reserves_prefill`)."""
        stops = {id(g): stop for g, _, stop in out.prefills}
        pending = 0
        for g in self.sched.running:
            if g.prefill_pos is not None:
                done = stops.get(id(g), max(g.prefill_pos, g.hit_tokens))
                pending += max(0, g.seqs[0].num_tokens - max(done, g.hit_tokens))
        return pending

    EXTENT_SAMPLE_S = 1.0

    def _sample_extents(self, now: float) -> None:
        self._extents.append((self.rec.num_steps, now, self.bm.free_extents()))
        self._next_extent_s = now + self.EXTENT_SAMPLE_S

    def extents_frame(self) -> pd.DataFrame | None:
        """Free extents sampled about every EXTENT_SAMPLE_S simulated seconds (contiguous allocators)."""
        if self._extents is None:
            return None
        import pandas as pd

        rows = [(step, t, int(x)) for step, t, ext in self._extents for x in ext]
        return pd.DataFrame(rows, columns=list(FREE_EXTENT_COLUMNS)).astype(FREE_EXTENT_DTYPES)

    def _stall_message(self) -> str:
        s = self.sched
        return (f"scheduler made no progress at t={self.env.now:.3f}s: waiting={len(s.waiting)} "
                f"running={len(s.running)} swapped={len(s.swapped)} free GPU blocks={self.bm.num_free_gpu_blocks}")

    def _progress_bar(self):
        if not self.progress:
            return None
        from tqdm.auto import tqdm
        total = float(self._arrivals[-1]) if len(self._arrivals) else 0.0
        return tqdm(total=math.ceil(total), unit="sim-s", desc="replay", dynamic_ncols=True, mininterval=0.5,
                    disable=None)  # None: drawn only when stderr is a terminal

    # --- run -----------------------------------------------------------------------------------
    def __del__(self) -> None:
        """Unlink each sequence from its request (`Sequence.group`, a cycle with `SequenceGroup.seqs`)
        so that reference counting frees the run's requests with the engine: the cyclic garbage
        collector would hold them, and their block tables, until it next runs. The engine holds no
        cycle of its own, so this runs when the last reference to it goes; a request kept beyond
        the engine (`groups`) keeps its sequences, whose `group` is then None."""
        for g in getattr(self, "groups", ()):  # () when __init__ failed
            for s in g.seqs:
                s.group = None

    def run(self) -> "RunResult":
        from blocksim.records.result import RunResult
        t0 = time.perf_counter()
        self.env.process(self._arrivals_proc())
        self.env.process(self._engine_proc())
        # The step loop allocates objects by the million and leaves no reference cycles behind (its
        # requests and sequences refer to each other while the engine lives; `__del__` unlinks them),
        # so the cyclic garbage collector would only walk them again and again: it pauses for the run.
        # What the run leaves lives as long as the engine: it joins the oldest generation without a
        # pass (`gc.freeze` then `gc.unfreeze`), where a full collection still finds any cycle,
        # instead of a pass over every container the run made (the tiers' tables by position).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.env.run()
        finally:
            if collecting:
                gc.freeze()
                gc.unfreeze()
                gc.enable()
        if self.plan is not None:
            self.plan.close()
        wall = time.perf_counter() - t0
        lost = [g for g in self.groups if g.status not in (GroupStatus.FINISHED, GroupStatus.REJECTED)]
        num_requests = len(self.reqs["request_id"])
        if lost or len(self.groups) != num_requests:
            raise EngineError(f"{len(lost)} requests neither finished nor rejected; "
                              f"{len(self.groups)} of {num_requests} arrived")
        result = RunResult.build(self, wall)
        result.summary["cost_model"] = cost_record(self.cost, result.step_columns)  # warns of extrapolated steps
        return result

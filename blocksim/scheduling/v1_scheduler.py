"""vLLM V1's scheduler: one token budget, running requests first, chunked prefill always on.

Follows `vllm/v1/core/sched/scheduler.py` of vLLM v0.11 (no speculative decoding, encoder inputs,
KV transfer or structured output). Each `schedule()` spends one budget of
`max_num_batched_tokens` tokens:

1. Running requests, in queue order while tokens remain: each gets `num_tokens -
   num_computed_tokens` new tokens (1 for a decoding request, the rest of its prompt for a
   prefilling one), capped by `long_prefill_token_threshold` (when > 0), by the tokens left and
   by `max_model_len - 1 - num_computed_tokens`. When the KV cache manager cannot allocate them,
   the last request of the running queue is preempted (under the priority policy, the one of
   lowest priority, latest arrival among equals; if it was scheduled this step its tokens return
   to the budget), by recomputation only: its blocks are freed, its computed tokens reset to 0
   and it goes to the front of the waiting queue. Preempting the request itself ends the loop.
2. Only if nothing was preempted: waiting requests, in queue order while tokens remain and fewer
   than `max_num_seqs` run: the prefix cache's hit gives its computed tokens, the rest is capped
   as above, and the first request the manager cannot allocate stops admission.

A request's `num_computed_tokens` is its sequence's `kv_len` between steps (`prefill_pos` while
its prompt is in progress). Requests run in arrival order of admission (V1 appends to the
running queue). Parallel sampling (n > 1) is refused per request: V1's front end fans it out into
n requests before they reach the scheduler.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque

from blocksim.config import PolicyConfig, SchedulerConfig
from blocksim.memory.kv_cache_manager import KVCacheManager, cdiv
from blocksim.scheduling.outputs import ScheduledPrefill, SchedulerOutputs
from blocksim.scheduling.scheduler import Scheduler
from blocksim.sequence import ONLOADED, ONLOADING, GroupStatus, SequenceGroup, SeqStatus

RUNNING, WAITING = GroupStatus.RUNNING, GroupStatus.WAITING


class V1Scheduler(Scheduler):
    """FCFS (vLLM V1's default policy)."""

    preempts = True
    priority_policy = False

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager, max_model_len: int,
                 policy: PolicyConfig | None = None) -> None:
        super().__init__(config, kv_cache_manager, max_model_len, policy)
        if not isinstance(kv_cache_manager, KVCacheManager):
            raise TypeError("the v1 scheduler needs vLLM V1's KV cache manager (allocator v1)")
        self.kv: KVCacheManager = kv_cache_manager
        self.chunked = True
        self.prompt_limit = max_model_len
        self.long_prefill_token_threshold = config.long_prefill_token_threshold
        self.waiting: deque[SequenceGroup] | list[SequenceGroup] = [] if self.priority_policy else deque()
        self._order: list[SequenceGroup] = []  # the last step's requests in scheduling order
        self.onloading: list[SequenceGroup] = []  # holding blocks for tier loads (loading, or loaded and waiting)
        self._landings: list[tuple[float, int, SequenceGroup]] = []  # heap of (ready, index) of loading requests

    # --- queues ------------------------------------------------------------------------------
    def sort_key(self, group: SequenceGroup) -> tuple:
        if self.priority_policy:
            return (group.priority, group.arrival_s, group.index)
        return (group.arrival_s, group.index)

    def add_request(self, group: SequenceGroup) -> None:
        group.sort_key = self.sort_key(group)
        group.status = WAITING
        self._to_waiting(group, front=False)

    def _to_waiting(self, group: SequenceGroup, front: bool) -> None:
        if self.priority_policy:  # V1's priority queue: a heap on (priority, arrival)
            bisect.insort(self.waiting, group, key=lambda g: g.sort_key)
        elif front:
            self.waiting.appendleft(group)
        else:
            self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.onloading)

    def live_seqs(self):
        return [s for g in self.running for s in g.seqs if s.status is SeqStatus.RUNNING] + \
            [g.seqs[0] for g in self.onloading]

    def next_onload_s(self) -> float | None:
        """When the next loading request's chunks land (None when none is loading)."""
        h = self._landings
        while h and (h[0][2].onload_state != ONLOADING or h[0][2].onload_ready_s != h[0][0]):  # released
            heapq.heappop(h)
        return h[0][0] if h else None

    def _pop_waiting(self) -> SequenceGroup:
        return self.waiting.pop(0) if self.priority_policy else self.waiting.popleft()

    def _never_reason(self, group: SequenceGroup, num_tokens: int) -> str:
        if len(group.seqs) > 1:
            return (f"n={len(group.seqs)} parallel samples: vLLM V1 fans them out into separate requests "
                    f"before scheduling; give the trace one row per sample")
        reason = super()._never_reason(group, num_tokens)
        if reason:
            return reason
        kv = self.kv
        need = cdiv(group.prompt_tokens + group.output_tokens - 1, kv.block_size)
        if need > kv.num_total_gpu_blocks - 1:
            return (f"needs {need} KV blocks, more than the cache's {kv.num_total_gpu_blocks - 1} (its null block "
                    f"aside); use a larger GPU or a smaller model")
        return ""

    # --- preemption --------------------------------------------------------------------------
    def _victim(self) -> SequenceGroup:
        if self.priority_policy:
            return max(self.running, key=lambda g: (g.priority, g.arrival_s, g.index))
        return self.running[-1]

    def _preempt_v1(self, group: SequenceGroup, num_computed: int, out: SchedulerOutputs) -> None:
        seq = group.seqs[0]
        self.kv.free_request(seq, num_computed)
        seq.status = SeqStatus.WAITING
        group.prefill_pos = None
        group.status = WAITING
        group.preemptions += 1
        out.preempted.append(group)
        self._to_waiting(group, front=True)

    # --- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutputs:
        out = SchedulerOutputs()
        self._order = []
        budget = self.config.max_num_batched_tokens
        self.kv.refused_hit = None
        if self._landings:
            self._land_onloads()
        budget = self._schedule_running(budget, out)
        if not out.preempted:
            self._schedule_waiting(budget, out)
        return out

    def complete_step(self, out: SchedulerOutputs, end_s: float) -> list[SequenceGroup]:
        """As `Scheduler.complete_step`, walking the step's requests in scheduling order (as vLLM's
        `update_from_output` does), so requests finishing in one step free their blocks in that order."""
        if len(self._order) != len(out.prefills) + len(out.decode_groups):  # a span's last step: decodes only
            self._order = out.decode_groups
        finished: list[SequenceGroup] = []
        if not out.prefills:  # decodes only
            self._complete_decodes(self._order, end_s, finished)
        else:
            stops = {id(p.group): p.stop for p in out.prefills}
            seq_running = SeqStatus.RUNNING
            for group in self._order:
                if group.status is not RUNNING:
                    continue
                stop = stops.get(id(group))
                if stop is None:
                    seq = group.seqs[0]  # one sequence per request under V1
                    if seq.status is seq_running and seq.num_tokens + 1 - group.prompt_tokens < group.output_tokens:
                        seq.num_tokens += 1  # `_advance` of a decode that does not finish
                        continue
                    self._advance(group, end_s, finished)
                elif self._prompt_done(group, stop, end_s):
                    self._advance(group, end_s, finished)
        if finished:
            self.running = [g for g in self.running if g.status is RUNNING]
        return finished

    def _num_new(self, num_tokens: int, num_computed: int, budget: int) -> int:
        n = num_tokens - num_computed
        t = self.long_prefill_token_threshold
        if 0 < t < n:
            n = t
        return min(n, budget, self.max_model_len - 1 - num_computed)

    def _schedule_running(self, budget: int, out: SchedulerOutputs) -> int:
        kv, running = self.kv, self.running
        decode = out.decode_groups
        i = 0
        while i < len(running) and budget > 0:
            j, ctx = kv.allocate_decode_slots(running, i, len(running), budget)  # the common case
            if j != i:
                decode += running[i:j]
                self._order += running[i:j]
                out.num_decode_seqs += j - i
                out.decode_ctx_tokens += ctx
                budget -= j - i
                i = j
                if i == len(running) or budget <= 0:
                    break
            group = running[i]
            seq = group.seqs[0]
            computed = seq.kv_len
            n = self._num_new(seq.num_tokens, computed, budget)
            if n <= 0:
                i += 1
                continue
            while not kv.allocate_slots(seq, computed, n):
                victim = self._victim()
                k = running.index(victim)
                del running[k]
                victim_computed = victim.seqs[0].kv_len
                if k < i:  # scheduled earlier this step: its tokens go back to the budget
                    self._order.remove(victim)
                    done = self._unschedule(victim, out)
                    budget += done
                    victim_computed += done
                    i -= 1
                self._preempt_v1(victim, victim_computed, out)
                if victim is group:
                    return budget
            self._order.append(group)
            if group.prefill_pos is not None:
                out.prefills.append(ScheduledPrefill(group, computed, computed + n))
                out.prefill_tokens += n
            else:
                decode.append(group)
                out.num_decode_seqs += 1
                out.decode_ctx_tokens += seq.num_tokens
            budget -= n
            i += 1
        return budget

    @staticmethod
    def _unschedule(group: SequenceGroup, out: SchedulerOutputs) -> int:
        """Take a group's tokens out of this step's outputs; returns how many it had."""
        for p in out.prefills:
            if p.group is group:
                out.prefills.remove(p)
                out.prefill_tokens -= p.stop - p.start
                return p.stop - p.start
        out.decode_groups.remove(group)
        out.num_decode_seqs -= 1
        out.decode_ctx_tokens -= group.seqs[0].num_tokens
        return 1

    def _schedule_waiting(self, budget: int, out: SchedulerOutputs) -> None:
        kv, waiting, running = self.kv, self.waiting, self.running
        tiers = kv.tiers
        while waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            group = waiting[0]
            seq = group.seqs[0]
            reason = self._never_reason(group, seq.num_tokens)
            if reason:
                self._pop_waiting()
                self._reject(group, reason, out)
                continue
            if group.onload_state == ONLOADED:  # its tier chunks have landed: they count as computed
                self._pop_waiting()
                budget -= self._admit_landed(group, budget, out)
                continue
            blocks, hit = kv.get_computed_blocks(group)
            if tiers is not None:
                gpu_hit = blocks
                blocks, keys, found = kv.tier_match(group, blocks)
                hit = len(blocks) * kv.block_size
                n_load = tiers.plan_onload(keys, found, hit) if found else 0
                if n_load:
                    # blocks for the loads and for the first prefill chunk after them, so that a
                    # request whose chunks have landed can always run
                    ext = n_load * tiers.chunk_tokens
                    first = self._num_new(seq.num_tokens, hit + ext, budget)
                    if not kv.allocate_slots(seq, hit, ext + first, blocks, cache=False):
                        self._refused(gpu_hit, tiers.onload == "wait")
                        self._unblock_landed(budget, out)
                        break
                    kv.filled_slots -= first  # reserved: no K/V in them before the request runs
                    self._pop_waiting()
                    self._start_onload(group, blocks, hit, keys, found, n_load)
                    continue
            n = self._num_new(seq.num_tokens, hit, budget)
            if not kv.allocate_slots(seq, hit, n, blocks):
                if tiers is not None:
                    self._refused(gpu_hit, not found)
                    self._unblock_landed(budget, out)
                break
            self._pop_waiting()
            kv.record_hit(group, hit)
            group.prefix_hit_tokens += hit
            if tiers is not None:
                self._tier_lookup(group, blocks, hit, keys, found, 0)
            self._admit(group, hit, n, out)
            budget -= n

    def _refused(self, gpu_hit: list[int], fixed_plan: bool) -> None:
        """The head of the waiting queue, its GPU hit `gpu_hit`, could not get blocks. Where its plan
        depends on that hit alone (`fixed_plan`: no load, or every found chunk loaded, the tiers
        unchanged until a step computes or loads), only a new block that evicts one of the hit's
        blocks can change what it needs; the KV cache manager's `clean_takes` counts the new blocks
        before that (a span of decode steps runs until then, `blocksim.engine.spans`)."""
        if fixed_plan:
            self.kv.refused_hit = gpu_hit

    def _admit_landed(self, group: SequenceGroup, budget: int, out: SchedulerOutputs) -> int:
        """Admit a request (out of the waiting queue) whose tier chunks have landed: they count as
        computed, and the blocks it holds suffice for its first chunk. A chunk shorter than the one
        its blocks were reserved for (less budget left now) gives the rest back: a table covers
        the K/V its request has computed or runs now, as in vLLM V1. Returns the tokens scheduled."""
        kv, seq = self.kv, group.seqs[0]
        hit = group.hit_tokens
        n = self._num_new(seq.num_tokens, hit, budget)
        if not kv.allocate_slots(seq, hit, n):
            n = min(n, len(seq.block_table) * kv.block_size - hit)  # the blocks it holds suffice
            kv.allocate_slots(seq, hit, n)
        kv.release_reserved(seq, hit + n)
        self.onloading.remove(group)
        group.onload_state = 0
        self._admit(group, hit, n, out)
        return n

    def _unblock_landed(self, budget: int, out: SchedulerOutputs) -> None:
        """The head of the waiting queue cannot get blocks. When nothing runs (no step would free
        any), a request further back whose chunks have landed holds blocks the head may be waiting
        for, and would wait for the head in turn: it runs first, on the blocks it holds."""
        if self.running or out.prefills:
            return
        for group in self.waiting:
            if group.onload_state == ONLOADED:
                self.waiting.remove(group)
                self._admit_landed(group, budget, out)
                return

    def _admit(self, group: SequenceGroup, hit: int, n: int, out: SchedulerOutputs) -> None:
        seq = group.seqs[0]
        self.running.append(group)
        group.status = RUNNING
        seq.status = SeqStatus.RUNNING
        group.num_cached_tokens = group.hit_tokens = hit
        if group.preemptions:
            group.recomputed_tokens += seq.num_tokens - hit
        group.prefill_pos = hit
        self._order.append(group)
        out.prefills.append(ScheduledPrefill(group, hit, hit + n))
        out.prefill_tokens += n

    # --- KV tiers -----------------------------------------------------------------------------
    def _tier_lookup(self, group: SequenceGroup, blocks: list[int], hit: int, keys, found,
                     n_load: int) -> tuple[float, int]:
        """Account an admission's lookup in the tiers and load up to `n_load` chunks into the blocks
        that follow the GPU hit; returns (when they land, chunks loaded)."""
        kv, tiers = self.kv, self.kv.tiers
        seq = group.seqs[0]
        skipped = tiers.skipped_tokens
        tiers.count_query(hit, seq.num_tokens)
        kv.tier_gpu_hits(group, blocks)
        dest = seq.block_table[len(blocks):]
        ready, host, disk, n_load = tiers.commit(keys, found, n_load, dest)
        if n_load:
            kv.tier_loaded(seq, keys[:n_load], len(blocks))
        if group.tier_tokens is None:
            group.tier_tokens = [0, 0, 0]
        t = group.tier_tokens
        t[0] += hit
        t[1] += host
        t[2] += disk
        group.onload_skipped_tokens += tiers.skipped_tokens - skipped
        return ready, n_load

    def _start_onload(self, group: SequenceGroup, blocks: list[int], hit: int, keys, found, n_load: int) -> None:
        """vLLM V1's WAITING_FOR_REMOTE_KVS: the request holds its blocks, out of the waiting queue,
        until its chunks land; then it goes back to the front of the queue with them computed."""
        self.kv.record_hit(group, hit)
        group.prefix_hit_tokens += hit
        ready, loaded = self._tier_lookup(group, blocks, hit, keys, found, n_load)
        ct = self.kv.tiers.chunk_tokens
        self.kv.filled_slots -= (n_load - loaded) * ct  # chunks gone from the tiers meanwhile: prefilled
        total = hit + loaded * ct
        group.hit_tokens = group.num_cached_tokens = total
        group.prefill_pos = total
        group.onload_state = ONLOADING
        group.onload_issue_s = self.kv.tiers.now_s
        group.onload_ready_s = ready
        self.onloading.append(group)
        heapq.heappush(self._landings, (ready, group.index, group))

    def _land_onloads(self) -> None:
        """Requests whose chunks have landed go back to the front of the waiting queue, in order."""
        now, h = self.kv.tiers.now_s, self._landings
        if h[0][0] > now:  # none has landed (most steps; the caller's heap is not empty)
            return
        landed = []
        while h and h[0][0] <= now:
            ready, _, g = heapq.heappop(h)
            if g.onload_state == ONLOADING and g.onload_ready_s == ready:
                landed.append(g)
        for g in sorted(landed, key=lambda g: g.sort_key, reverse=True):
            g.onload_state = ONLOADED
            g.onload_wait_s += g.onload_ready_s - g.onload_issue_s
            if g.first_token_s != g.first_token_s:  # no token yet: the wait is part of its TTFT
                g.onload_ttft_s += g.onload_ready_s - g.onload_issue_s
            self._to_waiting(g, front=True)

    def _finish_seq(self, seq) -> None:
        self.kv.free(seq)
        seq.status = SeqStatus.FINISHED


class V1PriorityScheduler(V1Scheduler):
    """vLLM V1's priority policy, in vLLM's convention that a smaller `priority` value is served
    first: waiting ordered by (priority, arrival), the victim the running request of the largest
    value, latest arrival among equals. (blocksim's v0 `priority` scheduler serves larger values first.)"""

    priority_policy = True

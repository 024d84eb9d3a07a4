"""vLLM v0's continuous-batching scheduler: waiting, running and swapped queues.

Each `schedule()` call decides one step, in the order of vLLM 0.1's scheduler, which (like vLLM's
later chunked-prefill scheduler) mixes prefills and decodes in one step; vLLM 0.2-0.6's default
path instead runs prompt-only steps first. Per step:

(a) every running group gets its next slot, in queue order (FCFS: oldest first); when one cannot,
    a victim among the groups not yet served is preempted (vLLM: the newest), or the group
    itself if it is the last: RECOMPUTE for single-sequence groups and groups still in their
    prompt (blocks freed, group back to the *front* of waiting), SWAP for groups of several
    sequences. `preemption_mode` may force RECOMPUTE or SWAP (a decoding multi-sequence group is
    always swapped: it cannot be recomputed, as in vLLM);
(b) if nothing was preempted, swapped groups that fit are swapped in, in queue order;
(c) only if nothing is swapped, waiting groups are admitted in order while `can_allocate` is OK
    and the max_num_seqs / max_num_batched_tokens budgets (decode tokens included) allow.
    NEVER rejects the group and records why; nothing is retried forever.

With chunked prefill (Sarathi-style, vLLM's `enable_chunked_prefill`), prompts are processed in
chunks under the per-step token budget after all decodes: partially prefilled running groups
first, then newly admitted ones; a group's blocks are allocated whole at admission.

The decision is a plain `SchedulerOutputs`; `complete_step()` applies the step's outcome (one new
token per decoding sequence and per completed prompt, finished requests freed). Neither knows
about time or SimPy. Subclasses at the end change the queue order (priority, SJF), forbid
preemption (Orca) or hold a static batch.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from blocksim.memory.paged import BlockSpaceManager
from blocksim.memory.blocks import AllocStatus
from blocksim.config import PolicyConfig, SchedulerConfig
from blocksim.sequence import SequenceGroup, SeqStatus


class SchedulerError(RuntimeError):
    pass


@dataclass
class SchedulerOutputs:
    prefill_groups: list[SequenceGroup] = field(default_factory=list)
    prefill_ranges: list[tuple[int, int]] = field(default_factory=list)  # token positions prefilled
    decode_groups: list[SequenceGroup] = field(default_factory=list)
    prefill_tokens: int = 0
    num_decode_seqs: int = 0
    decode_ctx_tokens: int = 0
    blocks_to_swap_in: dict[int, int] = field(default_factory=dict)
    blocks_to_swap_out: dict[int, int] = field(default_factory=dict)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    rejected: list[SequenceGroup] = field(default_factory=list)

    @property
    def has_work(self) -> bool:
        return bool(self.prefill_groups or self.decode_groups)

    @property
    def is_plain_decode(self) -> bool:
        """Decode only, with no block moves, preemptions or rejections: a span may follow."""
        return (not self.prefill_groups and bool(self.decode_groups) and not self.blocks_to_swap_in
                and not self.blocks_to_swap_out and not self.blocks_to_copy and not self.preempted
                and not self.rejected)


def newest(candidates: list[SequenceGroup]) -> int:
    """vLLM's victim: the last group in queue order."""
    return len(candidates) - 1


def _blocks(group: SequenceGroup) -> int:
    return len({b for s in group.seqs for b in s.block_table})


def largest(candidates: list[SequenceGroup]) -> int:
    """The group holding the most blocks (the newest among equals)."""
    sizes = [_blocks(g) for g in candidates]
    return max(range(len(sizes)), key=lambda i: (sizes[i], i))


def fewest_blocks(candidates: list[SequenceGroup]) -> int:
    """The group holding the fewest blocks (the newest among equals): the cheapest to recompute."""
    sizes = [_blocks(g) for g in candidates]
    return min(range(len(sizes)), key=lambda i: (sizes[i], -i))


class Scheduler:
    """FCFS, vLLM v0."""

    preempts = True

    def __init__(self, config: SchedulerConfig, block_manager, max_model_len: int,
                 policy: PolicyConfig | None = None) -> None:
        from blocksim import plugins
        self.config = config
        self.policy = policy or PolicyConfig()
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.chunked = self.policy.chunked_prefill
        self.prompt_limit = max_model_len if self.chunked else min(max_model_len, config.max_num_batched_tokens)
        self.victim = plugins.resolve("victim", self.policy.victim)
        # The inlined single-sequence append below is the stock paged manager's append_slots.
        self._fast = (type(block_manager) is BlockSpaceManager and self.victim is newest and not self.chunked)
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []

    # --- queues ------------------------------------------------------------------------------
    def sort_key(self, group: SequenceGroup) -> tuple:
        return (group.arrival_s, group.index)

    def add_request(self, group: SequenceGroup) -> None:
        group.sort_key = self.sort_key(group)
        group.status = "waiting"
        self.waiting.append(group)

    def _requeue(self, group: SequenceGroup) -> None:
        """A recompute-preempted group goes back to the front of waiting (vLLM)."""
        self.waiting.appendleft(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def live_seqs(self):
        return [s for g in self.running + self.swapped for s in g.seqs
                if s.status in (SeqStatus.RUNNING, SeqStatus.SWAPPED)]

    def _reject(self, group: SequenceGroup, reason: str, out: SchedulerOutputs) -> None:
        for s in group.seqs:
            if s.status is not SeqStatus.FINISHED:
                self.bm.free(s)
                s.status = SeqStatus.FINISHED
        group.status = "rejected"
        group.reject_reason = reason
        out.rejected.append(group)

    # --- preemption --------------------------------------------------------------------------
    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        if not self.preempts:
            raise SchedulerError(f"{type(self).__name__} never preempts, but request {group.request_id} "
                                 f"has no room to grow: its allocator must reserve the maximum up front")
        mode = self.config.preemption_mode
        in_prompt = group.prefill_pos is not None
        can_swap = getattr(self.bm, "supports_swap", True)
        recompute = in_prompt or not can_swap or (group.num_unfinished() == 1 and mode in ("auto", "recompute"))
        group.preemptions += 1
        out.preempted.append(group)
        if recompute:
            for s in group.seqs_with(SeqStatus.RUNNING):
                self.bm.free(s)
                s.status = SeqStatus.WAITING
            group.prefill_pos = None
            group.status = "waiting"
            self._requeue(group)
            return
        if not self.bm.can_swap_out(group):
            self._reject(group, "preempted by swap but CPU swap space is exhausted; raise --swap-space", out)
            return
        out.blocks_to_swap_out.update(self.bm.swap_out(group))
        group.swaps += 1
        group.status = "swapped"
        bisect.insort(self.swapped, group, key=_key)

    def _make_room(self, group, queue, i, end, out, fits) -> tuple[int, bool]:
        """Preempt victims among queue[i:end] until `fits()`; preempt `group` itself as a last resort."""
        while not fits():
            if i < end:
                j = i + self.victim(queue[i:end])
                victim = queue.pop(j)
                queue.insert(end - 1, victim)  # keep indices of the unserved part stable
                end -= 1
                self._preempt(victim, out)
            else:
                self._preempt(group, out)
                return end, False
        return end, True

    def _append(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        for s in group.seqs:
            if s.status is SeqStatus.RUNNING:
                cow = self.bm.append_slots(s)
                if cow is not None:
                    out.blocks_to_copy.append(cow)
                out.num_decode_seqs += 1
                out.decode_ctx_tokens += s.num_tokens
        out.decode_groups.append(group)

    # --- one step ----------------------------------------------------------------------------
    def _before_schedule(self, out: SchedulerOutputs) -> None:
        """Hook for policies that act before the running queue is served (priority preemption)."""

    def _may_admit(self) -> bool:
        return True

    def schedule(self) -> SchedulerOutputs:
        out = SchedulerOutputs()
        bm = self.bm
        self._before_schedule(out)

        # (a) running groups in queue order; preempt a victim when a slot is missing
        queue = self.running
        self.running = kept = []
        prefilling = []
        i, end = 0, len(queue)
        if self._fast:
            gpu, bs = bm.gpu, bm.block_size
            refs, decode = gpu.ref_counts, out.decode_groups
        while i < end:
            group = queue[i]
            i += 1
            if group.prefill_pos is not None:
                prefilling.append(group)
                kept.append(group)
                continue
            seqs = group.seqs
            if self._fast and len(seqs) == 1 and seqs[0].block_table and refs[seqs[0].block_table[-1]] == 1:
                # Inlined append_slots for one sequence whose last block is its own (no CoW).
                while not gpu._free:
                    if i < end:
                        end -= 1
                        self._preempt(queue[end], out)
                    else:
                        self._preempt(group, out)
                        break
                else:
                    s = seqs[0]
                    table = s.block_table
                    if len(table) * bs < s.num_tokens:
                        table.append(gpu.allocate())
                    bm.gpu_filled_slots += 1
                    out.num_decode_seqs += 1
                    out.decode_ctx_tokens += s.num_tokens
                    decode.append(group)
                    kept.append(group)
                continue
            end, ok = self._make_room(group, queue, i, end, out, lambda g=group: bm.can_append_slots(g))
            if ok:
                self._append(group, out)
                kept.append(group)
        prefilling = [g for g in prefilling if g.status == "running"]
        kept[:] = [g for g in kept if g.status == "running"]

        budget = self.config.max_num_batched_tokens - out.num_decode_seqs
        for group in prefilling:  # chunked prefill: continue partial prompts first
            if budget <= 0:
                break
            start = group.prefill_pos
            stop = min(group.seqs[0].num_tokens, start + budget)
            self._prefill(group, start, stop, out)
            bm.add_filled(group, start, stop)
            budget -= stop - start

        # (b) swap in, in queue order, only if nothing was preempted
        num_seqs = sum(len(g.seqs_with(SeqStatus.RUNNING)) for g in self.running) if self.swapped or self.waiting else 0
        if not out.preempted:
            while self.swapped:
                group = self.swapped[0]
                status = bm.can_swap_in(group)
                if status is AllocStatus.NEVER:
                    self.swapped.pop(0)
                    self._reject(group, "swapped group can never fit back in GPU memory", out)
                    continue
                n = len(group.seqs_with(SeqStatus.SWAPPED))
                if status is AllocStatus.LATER or num_seqs + n > self.config.max_num_seqs:
                    break
                self.swapped.pop(0)
                out.blocks_to_swap_in.update(bm.swap_in(group))
                group.status = "running"
                self._append(group, out)
                budget -= n
                num_seqs += n
                bisect.insort(self.running, group, key=_key)

        # (c) admit waiting groups, only if nothing is swapped
        if not self.swapped and self._may_admit():
            while self.waiting and budget > 0:
                group = self.waiting[0]
                if group.preemptions and group in out.preempted:
                    break
                seqs = group.seqs_with(SeqStatus.WAITING)
                num_tokens = seqs[0].num_tokens
                reason = self._never_reason(group, num_tokens)
                if reason:
                    self.waiting.popleft()
                    self._reject(group, reason, out)
                    continue
                status = bm.can_allocate(group)
                if status is AllocStatus.NEVER:
                    self.waiting.popleft()
                    self._reject(group, "prompt needs more blocks than the GPU cache holds "
                                        f"({bm.num_total_gpu_blocks} blocks minus a watermark of "
                                        f"{bm.watermark_blocks}); use a larger GPU or a smaller model", out)
                    continue
                if (status is AllocStatus.LATER or (num_tokens > budget and not self.chunked)
                        or num_seqs + len(seqs) > self.config.max_num_seqs):
                    break
                self.waiting.popleft()
                if self.chunked:  # blocks now, K/V chunk by chunk (the first one below)
                    bm.allocate(group, filled=0)
                else:
                    bm.allocate(group)
                for s in seqs:
                    s.status = SeqStatus.RUNNING
                group.status = "running"
                start = group.num_cached_tokens
                if group.preemptions:
                    group.recomputed_tokens += num_tokens - start
                stop = min(num_tokens, start + budget)
                if self.chunked:
                    bm.add_filled(group, start, stop)
                self._prefill(group, start, stop, out)
                budget -= stop - start
                num_seqs += len(seqs)
                bisect.insort(self.running, group, key=_key)
        return out

    def _prefill(self, group: SequenceGroup, start: int, stop: int, out: SchedulerOutputs) -> None:
        group.prefill_pos = start
        out.prefill_groups.append(group)
        out.prefill_ranges.append((start, stop))
        out.prefill_tokens += stop - start

    def _never_reason(self, group: SequenceGroup, num_tokens: int) -> str:
        if group.prompt_tokens + group.output_tokens > self.max_model_len:
            return (f"prompt + output tokens exceed the model's max_model_len ({self.max_model_len}); "
                    f"clip it (blocksim replay --clip-to-model, or traces convert --clip-max-len)")
        if num_tokens > self.prompt_limit:
            return (f"prompt tokens exceed the limit of {self.prompt_limit} (min of max_model_len and "
                    f"max_num_batched_tokens); raise --max-num-batched-tokens")
        if len(group.seqs) > self.config.max_num_seqs:
            return f"n={len(group.seqs)} sequences exceed max_num_seqs ({self.config.max_num_seqs})"
        return ""

    # --- outcome of a step ------------------------------------------------------------------------
    def complete_step(self, out: SchedulerOutputs, end_s: float) -> list[SequenceGroup]:
        """Decoding sequences and completed prompts gain one token; return groups finished at `end_s`."""
        finished = []
        for group, (_, stop) in zip(out.prefill_groups, out.prefill_ranges):
            if group.status != "running":
                continue
            if stop < group.seqs_with(SeqStatus.RUNNING)[0].num_tokens:
                group.prefill_pos = stop  # more chunks to go
                continue
            group.prefill_pos = None
            if group.first_token_s != group.first_token_s:  # NaN: first output token
                group.first_token_s = end_s
            self._advance(group, end_s, finished)
        for group in out.decode_groups:
            if group.status == "running":
                self._advance(group, end_s, finished)
        if finished:
            self.running = [g for g in self.running if g.status == "running"]
        return finished

    def _advance(self, group: SequenceGroup, end_s: float, finished: list) -> None:
        done = 0
        for s in group.seqs:
            if s.status is SeqStatus.RUNNING:
                s.num_tokens += 1
                if s.num_tokens - group.prompt_tokens >= group.output_tokens:
                    self._finish_seq(s)
            if s.status is SeqStatus.FINISHED:
                done += 1
        if done == len(group.seqs):
            self._finish_group(group, end_s, finished)

    def _finish_seq(self, seq) -> None:
        self.bm.free(seq)
        seq.status = SeqStatus.FINISHED

    def _finish_group(self, group: SequenceGroup, end_s: float, finished: list) -> None:
        group.status = "finished"
        group.finish_s = end_s
        finished.append(group)

    # --- spans of identical decode steps ----------------------------------------------------------
    def span_candidates(self, out: SchedulerOutputs):
        """After a plain decode step, the sequences of a possible span and its length bound.

        Valid when every decoding group has one running sequence and no group is mid-prompt: then,
        until a sequence finishes or free blocks run low, each further step is the same batch with
        every context one token longer; waiting and swapped groups stay blocked (free blocks only
        shrink, the batch is constant) and no copy-on-write can occur. Returns `(seqs, lens, k)`
        with `k` the number of steps (this one included) before the first finish, or None.
        """
        if len(out.decode_groups) != len(self.running):
            return None  # a group is mid-prompt (chunked prefill) and would resume
        seqs, lens = [], []
        k = 1 << 62
        for g in out.decode_groups:
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
        return seqs, np.asarray(lens, dtype=np.int64), k


def _key(group: SequenceGroup):
    return group.sort_key


class _SortedWaiting(Scheduler):
    """Waiting (and running, swapped) kept in `sort_key` order; preempted groups re-enter by key."""

    def add_request(self, group: SequenceGroup) -> None:
        group.sort_key = self.sort_key(group)
        group.status = "waiting"
        bisect.insort(self.waiting, group, key=_key)

    def _requeue(self, group: SequenceGroup) -> None:
        bisect.insort(self.waiting, group, key=_key)


class PriorityScheduler(_SortedWaiting):
    """Higher `priority` first, then arrival. A waiting group that cannot be admitted, for lack of
    blocks or of room under max_num_seqs or the step's token budget (decodes included), preempts
    running groups of strictly lower priority (lowest first) until it can (vLLM's priority policy)."""

    def sort_key(self, group: SequenceGroup) -> tuple:
        return (-group.priority, group.arrival_s, group.index)

    def _blocked(self, head: SequenceGroup) -> bool:
        seqs = sum(len(g.seqs_with(SeqStatus.RUNNING)) for g in self.running)
        waiting = head.seqs_with(SeqStatus.WAITING)
        tokens_over = (not self.chunked
                       and seqs + waiting[0].num_tokens > self.config.max_num_batched_tokens)
        return (self.bm.can_allocate(head) is AllocStatus.LATER or tokens_over
                or seqs + len(waiting) > self.config.max_num_seqs)

    def _before_schedule(self, out: SchedulerOutputs) -> None:
        if not self.waiting or not self.running or self.swapped:
            return
        head = self.waiting[0]
        if head.status != "waiting" or self._never_reason(head, head.seqs[0].num_tokens):
            return
        while self.running and self.running[-1].priority < head.priority and self._blocked(head):
            victim = self.running.pop()
            self._preempt(victim, out)

    def span_candidates(self, out: SchedulerOutputs):
        """No span while a waiting group outranks a running one: free blocks shrink during a span,
        which can turn its admission into a preemption at any step."""
        if self.waiting and self.running and self.waiting[0].priority > self.running[-1].priority:
            return None
        return super().span_candidates(out)


class SJFScheduler(_SortedWaiting):
    """Shortest job first by the oracle output length: a research bound, not a deployable policy."""

    def sort_key(self, group: SequenceGroup) -> tuple:
        return (group.output_tokens, group.arrival_s, group.index)


class OrcaScheduler(Scheduler):
    """Orca: iteration-level scheduling, FCFS, never preempts (its allocator reserves up front)."""

    preempts = False


class StaticScheduler(Scheduler):
    """Static batching (FasterTransformer-like): a batch is admitted only when the previous one is
    done, and runs until its longest request ends. A sequence that has finished keeps being
    computed as padding (priced in every step's decode tokens and context, its K/V not counted as
    token states) and keeps its memory; responses return with the batch (finish time = its end)."""

    preempts = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[SequenceGroup] = []
        self._padding: dict[int, list] = {}  # seq_id -> [sequence, padding tokens so far]

    def _may_admit(self) -> bool:
        return not self.running and not self.held

    def live_seqs(self):
        return super().live_seqs() + [s for g in self.held for s in g.seqs]

    def schedule(self) -> SchedulerOutputs:
        out = super().schedule()
        for seq, pad in self._padding.values():
            out.num_decode_seqs += 1
            out.decode_ctx_tokens += seq.num_tokens + pad
        return out

    def complete_step(self, out: SchedulerOutputs, end_s: float) -> list[SequenceGroup]:
        for entry in self._padding.values():
            entry[1] += 1
        return super().complete_step(out, end_s)

    def span_candidates(self, out: SchedulerOutputs):
        return None if self._padding else super().span_candidates(out)

    def _finish_seq(self, seq) -> None:
        seq.status = SeqStatus.FINISHED  # memory released with the batch; computed as padding until then
        self._padding[seq.seq_id] = [seq, 0]

    def _finish_group(self, group: SequenceGroup, end_s: float, finished: list) -> None:
        group.status = "held"
        self.held.append(group)
        if all(g.status != "running" for g in self.running):
            for g in self.held:
                for s in g.seqs:
                    self.bm.free(s)
                super()._finish_group(g, end_s, finished)
            self.held = []
            self._padding = {}

"""Scheduler variants: a different queue order (priority, SJF), no preemption (Orca), or a static
batch that runs until its longest request ends (FasterTransformer-like)."""

from __future__ import annotations

import bisect

from blocksim.interfaces import AllocStatus
from blocksim.scheduling.outputs import SchedulerOutputs
from blocksim.scheduling.scheduler import RUNNING, WAITING, Scheduler, _key
from blocksim.sequence import GroupStatus, SequenceGroup, SeqStatus


class _SortedWaiting(Scheduler):
    """Waiting (and running, swapped) kept in `sort_key` order; preempted groups re-enter by key."""

    def add_request(self, group: SequenceGroup) -> None:
        group.sort_key = self.sort_key(group)
        group.status = WAITING
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
        if head.status is not WAITING or self._never_reason(head, head.seqs[0].num_tokens):
            return
        while self.running and self.running[-1].priority < head.priority and self._blocked(head):
            victim = self.running.pop()
            self._preempt(victim, out)

    def allows_span(self) -> bool:
        """No span while a waiting group outranks a running one: free blocks shrink during a span,
        which can turn its admission into a preemption at any step."""
        return not (self.waiting and self.running and self.waiting[0].priority > self.running[-1].priority)


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

    def allows_span(self) -> bool:
        """No span while padding is computed: the padded contexts are not the span's batch."""
        return not self._padding

    def schedule(self) -> SchedulerOutputs:
        out = super().schedule()
        for seq, pad in self._padding.values():
            out.num_decode_seqs += 1
            out.decode_ctx_tokens += seq.num_tokens + pad
            out.padding_longest = max(out.padding_longest, seq.num_tokens + pad)
        return out

    def complete_step(self, out: SchedulerOutputs, end_s: float) -> list[SequenceGroup]:
        for entry in self._padding.values():
            entry[1] += 1
        finished = super().complete_step(out, end_s)
        self.running = [g for g in self.running if g.status is RUNNING]  # held groups leave the queue
        return finished

    def _finish_seq(self, seq) -> None:
        seq.status = SeqStatus.FINISHED  # memory released with the batch; computed as padding until then
        self._padding[seq.seq_id] = [seq, 0]

    def _finish_group(self, group: SequenceGroup, end_s: float, finished: list) -> None:
        group.status = GroupStatus.HELD
        self.held.append(group)
        if all(g.status is not RUNNING for g in self.running):
            for g in self.held:
                for s in g.seqs:
                    self.bm.free(s)
                super()._finish_group(g, end_s, finished)
            self.held = []
            self._padding = {}

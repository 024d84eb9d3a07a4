"""vLLM v0's continuous-batching scheduler: waiting, running and swapped queues.

Each `schedule()` call decides one step. `PolicyConfig.v0_release` selects the vLLM v0 release
whose rules it follows (a later release keeps the earlier ones' changes):

* ``0.1``: prefills and decodes mix in one step (vLLM 0.1's order, and that of vLLM's later
  chunked-prefill scheduler); swap-ins are not charged to the token budget; admission charges
  the whole prompt.
* ``0.2``: prompt-only steps (vLLM 0.2-0.6's default path, without chunked prefill): waiting
  groups are admitted first, against the token budget alone (running groups count against
  max_num_seqs); only a step that admits none decodes the running groups and swaps groups in.
* ``0.4``: a swap-in is charged to the step's token budget, one token per sequence, and waits
  when the budget is spent.
* ``0.6.4``: with prefix caching, admission charges only the prompt tokens the cache does not hold.

With chunked prefill, steps always mix (vLLM's chunked-prefill scheduler). The step is built as
vLLM 0.6 builds it, in three parts under one `SchedulingBudget` (max_num_batched_tokens,
max_num_seqs); with ``0.1`` in this order:

(a) `_schedule_running`: every running group gets its next slot, in queue order (FCFS: oldest
    first); when one cannot, a victim among the groups not yet served is preempted (vLLM: the
    newest), or the group itself if it is the last: RECOMPUTE for single-sequence groups and
    groups still in their prompt (blocks freed, group back to the *front* of waiting), SWAP for
    groups of several sequences. `preemption_mode` may force RECOMPUTE or SWAP (a decoding
    multi-sequence group is always swapped: it cannot be recomputed, as in vLLM). With chunked
    prefill, partially prefilled running groups then continue their prompts under the budget;
(b) `_schedule_swapped`, only if nothing was preempted: swapped groups that fit are swapped in,
    in queue order;
(c) `_schedule_prefills`, only if nothing is swapped: waiting groups are admitted in order while
    `can_allocate` is OK and the budget (decode tokens included) allows. NEVER rejects the group
    and records why; nothing is retried forever.

With chunked prefill (Sarathi-style, vLLM's `enable_chunked_prefill`), prompts are processed in
chunks under the per-step token budget after all decodes: partially prefilled running groups
first, then newly admitted ones; a group's blocks are allocated whole at admission.

The decision is a plain `SchedulerOutputs`; `complete_step()` applies the step's outcome (one new
token per decoding sequence and per completed prompt, finished requests freed). Neither knows
about time or SimPy. The memory manager is any `blocksim.interfaces.MemoryManager`. Victim
functions live in `blocksim.scheduling.victims`; the variants that change the queue order
(priority, SJF), forbid preemption (Orca) or hold a static batch in `blocksim.scheduling.variants`.
"""

from __future__ import annotations

import bisect
from collections import deque

from blocksim import plugins
from blocksim.config import PolicyConfig, SchedulerConfig
from blocksim.interfaces import AllocStatus, MemoryManager
from blocksim.scheduling import victims  # noqa: F401 - registers the built-in victims
from blocksim.scheduling.outputs import ScheduledPrefill, SchedulerOutputs, SchedulingBudget
from blocksim.sequence import GroupStatus, Sequence, SequenceGroup, SeqStatus

RUNNING, WAITING, SWAPPED = GroupStatus.RUNNING, GroupStatus.WAITING, GroupStatus.SWAPPED


class SchedulerError(RuntimeError):
    pass


def _key(group: SequenceGroup):
    return group.sort_key


class Scheduler:
    """FCFS, vLLM v0."""

    preempts = True

    def __init__(self, config: SchedulerConfig, block_manager: MemoryManager, max_model_len: int,
                 policy: PolicyConfig | None = None) -> None:
        self.config = config
        self.policy = policy or PolicyConfig()
        self.bm: MemoryManager = block_manager
        self.max_model_len = max_model_len
        self.chunked = self.policy.chunked_prefill
        self.prompt_limit = max_model_len if self.chunked else min(max_model_len, config.max_num_batched_tokens)
        self.victim = plugins.resolve("victim", self.policy.victim)
        release = tuple(int(x) for x in self.policy.v0_release.split("."))
        self.prompt_only_steps = release >= (0, 2) and not self.chunked
        self.charge_swap_in = release >= (0, 4)
        self.admit_uncached = release >= (0, 6, 4) and block_manager.hashes_prefixes
        self.charge_cached = (0, 2) <= release < (0, 6, 4) and not self.chunked
        self.marks_computed = block_manager.hashes_prefixes
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []

    # --- queues ------------------------------------------------------------------------------
    def sort_key(self, group: SequenceGroup) -> tuple:
        return (group.arrival_s, group.index)

    def add_request(self, group: SequenceGroup) -> None:
        group.sort_key = self.sort_key(group)
        group.status = WAITING
        self.waiting.append(group)

    def _requeue(self, group: SequenceGroup) -> None:
        """A recompute-preempted group goes back to the front of waiting (vLLM)."""
        self.waiting.appendleft(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def live_seqs(self):
        return [s for g in self.running + self.swapped for s in g.seqs
                if s.status in (SeqStatus.RUNNING, SeqStatus.SWAPPED)]

    def allows_span(self) -> bool:
        """Whether this policy lets a span of identical decode steps (`engine.spans`) follow a
        plain decode step; a policy whose next decision can change while the batch stays the
        same refuses."""
        return True

    def on_span_steps(self, steps: int) -> None:
        """`steps` further plain decode steps ran in a span (`engine.spans`) without `schedule()`;
        a policy with per-step state (SGLang's new-token ratio) advances it here."""

    def _reject(self, group: SequenceGroup, reason: str, out: SchedulerOutputs) -> None:
        for s in group.seqs:
            if s.status is not SeqStatus.FINISHED:
                self.bm.free(s)
                s.status = SeqStatus.FINISHED
        group.status = GroupStatus.REJECTED
        group.reject_reason = reason
        out.rejected.append(group)

    # --- preemption --------------------------------------------------------------------------
    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        if not self.preempts:
            raise SchedulerError(f"{type(self).__name__} never preempts, but request {group.request_id} "
                                 f"has no room to grow: its allocator must reserve the maximum up front")
        mode = self.config.preemption_mode
        in_prompt = group.prefill_pos is not None
        recompute = (in_prompt or not self.bm.supports_swap
                     or (group.num_unfinished() == 1 and mode in ("auto", "recompute")))
        group.preemptions += 1
        out.preempted.append(group)
        if recompute:
            for s in group.seqs_with(SeqStatus.RUNNING):
                self.bm.free(s)
                s.status = SeqStatus.WAITING
            group.prefill_pos = None
            group.status = WAITING
            self._requeue(group)
            return
        if not self.bm.can_swap_out(group):
            self._reject(group, "preempted by swap but CPU swap space is exhausted; raise --swap-space", out)
            return
        out.blocks_to_swap_out.update(self.bm.swap_out(group))
        group.swaps += 1
        group.status = SWAPPED
        bisect.insort(self.swapped, group, key=_key)

    def _make_room(self, group: SequenceGroup, queue: list, i: int, end: int,
                   out: SchedulerOutputs) -> tuple[int, bool]:
        """Preempt victims among queue[i:end] until the group can append; preempt `group` itself as
        a last resort. Returns the new end of the unserved part and whether the group stays."""
        while not self.bm.can_append_slots(group):
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

    def _prefill(self, group: SequenceGroup, start: int, stop: int, budget: SchedulingBudget,
                 out: SchedulerOutputs) -> None:
        group.prefill_pos = start
        out.prefills.append(ScheduledPrefill(group, start, stop))
        out.prefill_tokens += stop - start
        budget.add_num_batched_tokens(stop - start)

    # --- one step ----------------------------------------------------------------------------
    def _before_schedule(self, out: SchedulerOutputs) -> None:
        """Hook for policies that act before the running queue is served (priority preemption)."""

    def _may_admit(self) -> bool:
        return True

    def schedule(self) -> SchedulerOutputs:
        out = SchedulerOutputs()
        budget = SchedulingBudget(self.config.max_num_batched_tokens, self.config.max_num_seqs)
        if self.prompt_only_steps:
            self._schedule_prompt_only(budget, out)
        else:
            self._before_schedule(out)
            self._schedule_running(budget, out)
            if not out.preempted:
                self._schedule_swapped(budget, out)
            if not self.swapped and self._may_admit():
                self._schedule_prefills(budget, out)
        if self.marks_computed:
            self.bm.mark_blocks_as_computed()
        return out

    def _schedule_prompt_only(self, budget: SchedulingBudget, out: SchedulerOutputs) -> None:
        """vLLM 0.2-0.6's default step: prompts only when any is admitted, else decodes and swap-ins."""
        budget.add_num_seqs(sum(len(g.seqs_with(SeqStatus.RUNNING)) for g in self.running))
        if not self.swapped and self._may_admit():
            self._schedule_prefills(budget, out)
        if out.prefills:
            return
        budget = SchedulingBudget(self.config.max_num_batched_tokens, self.config.max_num_seqs)
        self._before_schedule(out)
        self._schedule_running(budget, out)
        if not out.preempted:
            self._schedule_swapped(budget, out)

    def _schedule_running(self, budget: SchedulingBudget, out: SchedulerOutputs) -> None:
        """(a) The running queue in order: decodes, preempting where a slot is missing, then the
        next chunks of partially prefilled prompts."""
        queue = self.running
        self.running = kept = []
        prefilling = []
        decode = out.decode_groups
        serve = self.bm.append_decode_slots
        i, end = 0, len(queue)
        while i < end:
            j, ctx = serve(queue, i, end)  # the common case: one call serves the whole queue
            if j != i:
                served = queue[i:j]
                kept += served
                decode += served
                out.num_decode_seqs += j - i
                out.decode_ctx_tokens += ctx
                i = j
                if i == end:
                    break
            group = queue[i]
            i += 1
            if group.prefill_pos is not None:
                prefilling.append(group)
                kept.append(group)
                continue
            end, ok = self._make_room(group, queue, i, end, out)
            if ok:
                self._append(group, out)
                kept.append(group)
        budget.add_num_batched_tokens(out.num_decode_seqs)
        budget.add_num_seqs(out.num_decode_seqs)
        if not prefilling:
            return
        budget.add_num_seqs(sum(len(g.seqs_with(SeqStatus.RUNNING)) for g in prefilling))
        for group in prefilling:  # chunked prefill: continue partial prompts first
            remaining = budget.remaining_token_budget()
            if remaining <= 0:
                break
            start = group.prefill_pos
            stop = min(group.seqs[0].num_tokens, start + remaining)
            self._prefill(group, start, stop, budget, out)
            self.bm.add_filled(group, start, stop)

    def _schedule_swapped(self, budget: SchedulingBudget, out: SchedulerOutputs) -> None:
        """(b) Swap groups back in, in queue order, while they fit (max_num_seqs; their decode
        tokens count against the token budget, and from vLLM 0.4 on a spent budget stops them)."""
        bm, swapped = self.bm, self.swapped
        while swapped:
            group = swapped[0]
            status = bm.can_swap_in(group)
            if status is AllocStatus.NEVER:
                swapped.pop(0)
                self._reject(group, "swapped group can never fit back in GPU memory", out)
                continue
            n = len(group.seqs_with(SeqStatus.SWAPPED))
            if status is AllocStatus.LATER or not (
                    budget.can_schedule(num_new_tokens=n, num_new_seqs=n) if self.charge_swap_in
                    else budget.can_schedule_seqs(n)):
                break
            swapped.pop(0)
            out.blocks_to_swap_in.update(bm.swap_in(group))
            group.status = RUNNING
            self._append(group, out)
            budget.add_num_batched_tokens(n)
            budget.add_num_seqs(n)
            bisect.insort(self.running, group, key=_key)

    def _schedule_prefills(self, budget: SchedulingBudget, out: SchedulerOutputs) -> None:
        """(c) Admit waiting groups in order while memory and the budget allow."""
        bm, waiting, chunked = self.bm, self.waiting, self.chunked
        while waiting and budget.remaining_token_budget() > 0:
            group = waiting[0]
            if group.preemptions and group in out.preempted:
                break
            seqs = group.seqs_with(SeqStatus.WAITING)
            num_tokens = seqs[0].num_tokens
            reason = self._never_reason(group, num_tokens)
            if reason:
                waiting.popleft()
                self._reject(group, reason, out)
                continue
            status = bm.can_allocate(group)
            if status is AllocStatus.NEVER:
                waiting.popleft()
                self._reject(group, "prompt needs more blocks than the GPU cache holds "
                                    f"({bm.num_total_gpu_blocks} blocks minus a watermark of "
                                    f"{bm.watermark_blocks}); use a larger GPU or a smaller model", out)
                continue
            if chunked:
                charged = 0
            elif self.admit_uncached:
                charged = num_tokens - bm.num_cached_tokens(group)
            else:
                charged = num_tokens
            if status is AllocStatus.LATER or not budget.can_schedule(num_new_tokens=charged,
                                                                      num_new_seqs=len(seqs)):
                break
            waiting.popleft()
            if chunked:  # blocks now, K/V chunk by chunk (the first one below)
                bm.allocate(group, filled=0)
            else:
                bm.allocate(group)
            for s in seqs:
                s.status = SeqStatus.RUNNING
            group.status = RUNNING
            start = group.num_cached_tokens
            if group.preemptions:
                group.recomputed_tokens += num_tokens - start
            stop = min(num_tokens, start + budget.remaining_token_budget())
            if chunked:
                bm.add_filled(group, start, stop)
            self._prefill(group, start, stop, budget, out)
            if self.charge_cached:  # vLLM 0.2-0.6.3 skip a cached prefix in the model runner, not the budget
                budget.add_num_batched_tokens(start)
            budget.add_num_seqs(len(seqs))
            bisect.insort(self.running, group, key=_key)

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
    @staticmethod
    def _prompt_done(group: SequenceGroup, stop: int, end_s: float) -> bool:
        """After a prefill chunk up to token `stop`: False while chunks remain (`prefill_pos` moves
        on); else the prompt is complete (its first output token stamped at `end_s` if new)."""
        if stop < group.seqs_with(SeqStatus.RUNNING)[0].num_tokens:
            group.prefill_pos = stop  # more chunks to go
            return False
        group.prefill_pos = None
        if group.first_token_s != group.first_token_s:  # NaN: first output token
            group.first_token_s = end_s
        return True

    def complete_step(self, out: SchedulerOutputs, end_s: float) -> list[SequenceGroup]:
        """Decoding sequences and completed prompts gain one token; return groups finished at `end_s`."""
        finished = []
        for group, _, stop in out.prefills:
            if group.status is RUNNING and self._prompt_done(group, stop, end_s):
                self._advance(group, end_s, finished)
        self._complete_decodes(out.decode_groups, end_s, finished)
        if finished:
            self.running = [g for g in self.running if g.status is RUNNING]
        return finished

    def complete_span(self, out: SchedulerOutputs, seqs: list[Sequence], steps: int, end_s: float,
                      finishes: bool) -> list[SequenceGroup]:
        """The outcome of a span (`engine.spans`) of `steps` decode steps of `out`, `seqs` its
        decoding sequences: each gains `steps` tokens; groups finished at `end_s`, the span's end.
        Without `finishes` no sequence reaches its output length, and nothing else changes."""
        if not finishes:
            for s in seqs:
                s.num_tokens += steps
            return []
        steps -= 1
        for s in seqs:
            s.num_tokens += steps
        return self.complete_step(out, end_s)

    def _complete_decodes(self, groups: list[SequenceGroup], end_s: float, finished: list) -> None:
        """Each running group of a decode step gains a token per running sequence (`_advance`)."""
        seq_running = SeqStatus.RUNNING
        for group in groups:
            if group.status is RUNNING:
                seqs = group.seqs
                if len(seqs) == 1 and seqs[0].status is seq_running and (
                        seqs[0].num_tokens + 1 - group.prompt_tokens < group.output_tokens):
                    seqs[0].num_tokens += 1  # `_advance` of one sequence that does not finish
                else:
                    self._advance(group, end_s, finished)

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
        group.status = GroupStatus.FINISHED
        group.finish_s = end_s
        finished.append(group)

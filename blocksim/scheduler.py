"""vLLM v0's continuous-batching scheduler: waiting, running and swapped queues.

Each `schedule()` call decides one step, in vLLM v0's order:

(a) every running group gets its next slot, oldest first (FCFS); when one cannot, the newest
    running group is preempted (or the group itself, if it is the last): RECOMPUTE for
    single-sequence groups (blocks freed, group to the *front* of waiting), SWAP for groups of
    several sequences. `preemption_mode` may force RECOMPUTE or SWAP (a multi-sequence group is
    always swapped: it cannot be recomputed, as in vLLM);
(b) if nothing was preempted, swapped groups that fit are swapped in, oldest first;
(c) only if nothing is swapped, waiting groups are admitted in order while `can_allocate` is OK
    and the max_num_seqs / max_num_batched_tokens budgets (decode tokens included) allow.
    NEVER rejects the group and records why; nothing is retried forever.

The decision is a plain `SchedulerOutputs`; `complete_step()` applies the step's outcome (one new
token per scheduled sequence, finished requests freed). Neither knows about time or SimPy.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from blocksim.block_manager import BlockSpaceManager
from blocksim.blocks import AllocStatus
from blocksim.config import SchedulerConfig
from blocksim.sequence import SequenceGroup, SeqStatus


@dataclass
class SchedulerOutputs:
    prefill_groups: list[SequenceGroup] = field(default_factory=list)
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


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockSpaceManager, max_model_len: int) -> None:
        self.config = config
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.prompt_limit = min(max_model_len, config.max_num_batched_tokens)
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []

    # --- queues ------------------------------------------------------------------------------
    def add_request(self, group: SequenceGroup) -> None:
        group.status = "waiting"
        self.waiting.append(group)

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
        mode = self.config.preemption_mode
        single = group.num_unfinished() == 1
        recompute = single and mode in ("auto", "recompute")
        group.preemptions += 1
        out.preempted.append(group)
        if recompute:
            for s in group.seqs_with(SeqStatus.RUNNING):
                self.bm.free(s)
                s.status = SeqStatus.WAITING
            group.status = "waiting"
            self.waiting.appendleft(group)
            return
        if not self.bm.can_swap_out(group):
            self._reject(group, f"preempted by swap but CPU swap space is exhausted "
                                f"({self.bm.cpu.num_free} CPU blocks free); raise --swap-space", out)
            return
        out.blocks_to_swap_out.update(self.bm.swap_out(group))
        group.swaps += 1
        group.status = "swapped"
        bisect.insort(self.swapped, group, key=_key)

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
    def schedule(self) -> SchedulerOutputs:
        out = SchedulerOutputs()
        bm = self.bm

        # (a) running groups, oldest first; preempt the newest when a slot is missing
        queue = self.running
        self.running = kept = []
        gpu, bs = bm.gpu, bm.block_size
        refs, decode = gpu.ref_counts, out.decode_groups
        i, end = 0, len(queue)
        while i < end:
            group = queue[i]
            i += 1
            seqs = group.seqs
            if len(seqs) == 1 and seqs[0].block_table and refs[seqs[0].block_table[-1]] == 1:
                # Fast path, same semantics: one sequence whose last block is its own (no CoW).
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
            while not bm.can_append_slots(group):
                if i < end:
                    end -= 1
                    self._preempt(queue[end], out)
                else:
                    self._preempt(group, out)
                    break
            else:
                self._append(group, out)
                kept.append(group)

        # (b) swap in, oldest first, only if nothing was preempted
        num_seqs = out.num_decode_seqs
        if not out.preempted:
            while self.swapped:
                group = self.swapped[0]
                status = bm.can_swap_in(group)
                if status is AllocStatus.NEVER:
                    self.swapped.pop(0)
                    self._reject(group, "swapped group can never fit back in GPU memory", out)
                    continue
                if status is AllocStatus.LATER:
                    break
                n = len(group.seqs_with(SeqStatus.SWAPPED))
                if num_seqs + n > self.config.max_num_seqs:
                    break
                self.swapped.pop(0)
                out.blocks_to_swap_in.update(bm.swap_in(group))
                group.status = "running"
                self._append(group, out)
                num_seqs += n
                bisect.insort(self.running, group, key=_key)

        # (c) admit waiting groups, only if nothing is swapped
        if not self.swapped:
            budget = self.config.max_num_batched_tokens - out.num_decode_seqs
            while self.waiting:
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
                    self._reject(group, f"prompt needs more blocks than the GPU cache holds "
                                        f"({bm.num_total_gpu_blocks} blocks minus a watermark of "
                                        f"{bm.watermark_blocks}); use a larger GPU or a smaller model", out)
                    continue
                if status is AllocStatus.LATER or num_tokens > budget or num_seqs + len(seqs) > self.config.max_num_seqs:
                    break
                self.waiting.popleft()
                bm.allocate(group)
                for s in seqs:
                    s.status = SeqStatus.RUNNING
                if group.preemptions:
                    group.recomputed_tokens += num_tokens
                group.status = "running"
                budget -= num_tokens
                num_seqs += len(seqs)
                out.prefill_groups.append(group)
                out.prefill_tokens += num_tokens
                bisect.insort(self.running, group, key=_key)
        return out

    def _never_reason(self, group: SequenceGroup, num_tokens: int) -> str:
        if group.prompt_tokens + group.output_tokens > self.max_model_len:
            return (f"prompt + output tokens exceed the model's max_model_len ({self.max_model_len}); "
                    f"clip the trace to the model's length (blocksim traces convert --clip-max-len)")
        if num_tokens > self.prompt_limit:
            return (f"prompt tokens exceed the limit of {self.prompt_limit} (min of max_model_len and "
                    f"max_num_batched_tokens); raise --max-num-batched-tokens")
        if len(group.seqs) > self.config.max_num_seqs:
            return f"n={len(group.seqs)} sequences exceed max_num_seqs ({self.config.max_num_seqs})"
        return ""

    # --- outcome of a step ------------------------------------------------------------------------
    def complete_step(self, out: SchedulerOutputs, end_s: float) -> list[SequenceGroup]:
        """Each scheduled sequence gains one token; return groups that finished at `end_s`."""
        finished = []
        for group in out.prefill_groups:
            if group.first_token_s != group.first_token_s:  # NaN: first output token
                group.first_token_s = end_s
        for groups in (out.prefill_groups, out.decode_groups):
            for group in groups:
                if group.status != "running":
                    continue
                done = 0
                for s in group.seqs:
                    if s.status is SeqStatus.RUNNING:
                        s.num_tokens += 1
                        if s.num_tokens - group.prompt_tokens >= group.output_tokens:
                            self.bm.free(s)
                            s.status = SeqStatus.FINISHED
                    if s.status is SeqStatus.FINISHED:
                        done += 1
                if done == len(group.seqs):
                    group.status = "finished"
                    group.finish_s = end_s
                    finished.append(group)
        if finished:
            self.running = [g for g in self.running if g.status == "running"]
        return finished

    # --- spans of identical decode steps ----------------------------------------------------------
    def span_candidates(self, out: SchedulerOutputs):
        """After a plain decode step, the sequences of a possible span and its length bound.

        Valid when every decoding group has one running sequence: then, until a sequence finishes
        or free blocks run low, each further step is the same batch with every context one token
        longer; waiting and swapped groups stay blocked (free blocks only shrink, the batch is
        constant) and no copy-on-write can occur. Returns `(seqs, lens, k)` with `k` the number of
        steps (this one included) before the first finish, or None.
        """
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

    def span_blocks(self, lens: np.ndarray, k: int):
        """Blocks each step of a `k`-step span allocates; cut `k` where free blocks would run low.

        Returns `(k, crossing)` with `crossing[j-1, i]` true when sequence i takes a new block at
        step j (step j writes the KV of position `lens[i] - 1 + j`).
        """
        bs = self.bm.block_size
        steps = np.arange(1, k, dtype=np.int64)
        crossing = ((lens[None, :] - 1 + steps[:, None]) % bs) == 0
        cum = np.cumsum(crossing.sum(axis=1))
        ok = cum <= self.bm.gpu.num_free - 1  # keeps vLLM's one-free-block-per-sequence check true
        if not ok[-1]:
            k = int(np.argmin(ok)) + 1
        return k, crossing[: k - 1]

    def apply_span(self, seqs, crossing: np.ndarray) -> None:
        """Apply steps 1..k-1 of a span: allocations in step order, then running order."""
        bm = self.bm
        steps_more = crossing.shape[0]
        if steps_more == 0:
            return
        for _, i in zip(*np.nonzero(crossing)):
            seqs[i].block_table.append(bm.gpu.allocate())
        for s in seqs:
            s.num_tokens += steps_more
        bm.gpu_filled_slots += steps_more * len(seqs)


def _key(group: SequenceGroup):
    return group.sort_key

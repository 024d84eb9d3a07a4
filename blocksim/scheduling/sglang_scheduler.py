"""SGLang's scheduler (`managers/scheduler.py` and `schedule_policy.py`, SGLang 0.4-0.5), one
event-loop iteration per `schedule()`.

Each iteration first tries a prefill batch (`get_new_batch_prefill`) and runs it alone if it
admits anything; otherwise the running requests decode one token (`update_running_batch`).
Prefill and decode never share a step (SGLang without `--enable-mixed-chunk`).

Prefill. Skipped while the batch is marked full (an admission failed for memory or
`max_running_requests` was reached; cleared when a request finishes or is retracted) unless a
chunked request is in progress. The waiting queue is ordered by the schedule policy
(`schedule_policy.SchedulePolicy`); a `PrefillAdder` then admits, in order:

* the chunked request's next chunk first;
* each waiting request whose extend tokens (prompt, plus outputs so far after a retraction, minus
  the radix-tree match) plus its estimated outputs (`min(max_new_tokens, 4096)`) fit in the free
  and evictable slots left after the running requests' estimated remaining outputs, each
  `min(remaining, 4096) x new_token_ratio`, and after what this batch already admitted
  (strict `<`, as SGLang);
* within `max_prefill_tokens` input tokens per batch (the first request may exceed it) and,
  with chunked prefill, `chunked_prefill_size` tokens; a request longer than what is left of
  the chunk budget is truncated to it (whole pages) and becomes the chunked request.

Decode. When the free plus evictable slots cannot hold one more token per request (one page
per request at a page boundary), requests are retracted, fewest outputs first (then longest
prompt), until 20 free slots per remaining request exist (always at least one retracted; never
the last): their own slots are freed, their prefix stays in the tree unlocked, and they go to the
back of the waiting queue to be prefilled again (prompt and outputs). `new_token_ratio` is then
re-estimated from the remaining requests, `min(1, (decoded + 20 x n) / sum(max_new_tokens))`;
without retraction it decays by `(init - min) / decay_steps` per decode step down to its minimum.

`max_new_tokens` is the trace's output length (requests run to it, as with `ignore_eos`).
Differences from SGLang are listed in `docs/sglang.md`.
"""

from __future__ import annotations

import enum

from blocksim.config import PolicyConfig, SchedulerConfig
from blocksim.memory.radix_manager import RadixCacheManager
from blocksim.scheduling.outputs import ScheduledPrefill, SchedulerOutputs
from blocksim.scheduling.schedule_policy import SchedulePolicy
from blocksim.scheduling.scheduler import Scheduler
from blocksim.sequence import GroupStatus, SequenceGroup, SeqStatus

CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
RUNNING, WAITING = GroupStatus.RUNNING, GroupStatus.WAITING


class AddReqResult(enum.Enum):
    CONTINUE = enum.auto()
    NO_TOKEN = enum.auto()
    OTHER = enum.auto()


def default_max_running_requests(capacity_tokens: int, context_len: int) -> int:
    """SGLang's default: half the pool's tokens, capped by the request pool
    (`max(2048, min(4096, tokens / context_len * 512))` slots)."""
    req_pool = min(max(int(capacity_tokens / context_len * 512), 2048), 4096)
    return max(1, min(capacity_tokens // 2, req_pool))


class PrefillAdder:
    """SGLang's `PrefillAdder`: the memory and token budgets of one prefill batch."""

    def __init__(self, bm: RadixCacheManager, running: list[SequenceGroup], new_token_ratio: float,
                 max_prefill_tokens: int, chunk_tokens: int | None) -> None:
        self.bm = bm
        self.ps = bm.block_size
        self.rem_total_offset = 0.0
        for g in running:
            out_len = g.seqs[0].num_tokens - g.prompt_tokens
            self.rem_total_offset += min(g.output_tokens - out_len, CLIP_MAX_NEW_TOKENS) * new_token_ratio
        self.cur_offset = 0
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunk_tokens
        self.admitted: list[tuple[SequenceGroup, int, int]] = []  # (group, start, stop)
        self.new_chunked: SequenceGroup | None = None

    @property
    def rem_total(self) -> float:
        return self.bm.available_tokens + self.bm.evictable_tokens - self.rem_total_offset

    def _ceil_page(self, n: int) -> int:
        return -(-n // self.ps) * self.ps

    def budget_state(self) -> AddReqResult:
        if self.rem_total <= 0 or self.bm.available_tokens + self.bm.evictable_tokens - self.cur_offset <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update(self, extend: int, max_new: int) -> None:
        extend = self._ceil_page(extend)
        self.rem_total_offset += extend + max_new
        self.cur_offset += extend
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend

    def add_chunked(self, group: SequenceGroup) -> bool:
        """The chunked request's next chunk; returns whether it is still unfinished after it."""
        start, num = group.prefill_pos, group.seqs[0].num_tokens
        rem = min(self.rem_chunk, int(self.rem_total))
        extend = num - start
        truncated = extend > rem
        if truncated:
            extend = rem // self.ps * self.ps
        if extend <= 0:
            return True
        self.admitted.append((group, start, start + extend))
        self._update(extend, 0 if truncated else min(group.output_tokens, CLIP_MAX_NEW_TOKENS))
        return truncated

    def add_one(self, group: SequenceGroup, matched: int) -> AddReqResult:
        num = group.seqs[0].num_tokens
        loaded = 0
        if self.bm.tiers is not None:  # HiCache: chunks the tiers load count as matched, but take slots
            loaded = self.bm.tier_extend(group, matched)
            matched += loaded
        extend = num - matched
        max_new = min(group.output_tokens, CLIP_MAX_NEW_TOKENS)
        total = extend + max_new + loaded
        input_tokens = self._ceil_page(extend)
        if total >= self.rem_total:
            return AddReqResult.NO_TOKEN
        if input_tokens >= self.rem_input and self.admitted:
            return AddReqResult.OTHER
        self.bm.allocate(group, filled=0)  # locks the matched prefix: it is no longer evictable
        if total >= self.rem_total:
            self.bm.unlock(group)
            return AddReqResult.NO_TOKEN
        if loaded:  # the loaded tokens' slots, outside the input budget
            self.rem_total_offset += loaded
            self.cur_offset += loaded
        if self.rem_chunk is None or input_tokens <= self.rem_chunk:
            self.admitted.append((group, matched, num))
            self._update(input_tokens, max_new)
        else:
            trunc = self.rem_chunk // self.ps * self.ps
            if trunc <= 0:
                self.bm.unlock(group)
                return AddReqResult.OTHER
            self.admitted.append((group, matched, matched + trunc))
            self.new_chunked = group
            self._update(trunc, 0)
        return self.budget_state()


class SGLangScheduler(Scheduler):
    """SGLang's scheduler over a `RadixCacheManager`; retracts instead of preempting."""

    preempts = True

    def __init__(self, config: SchedulerConfig, block_manager: RadixCacheManager, max_model_len: int,
                 policy: PolicyConfig | None = None) -> None:
        super().__init__(config, block_manager, max_model_len, policy)
        p = self.policy
        bm = block_manager
        self.schedule_policy = SchedulePolicy(p.schedule_policy)
        self.chunk_tokens = p.chunked_prefill_size if p.chunked_prefill_size > 0 else None
        self.chunked = False  # no prompt slots are allocated ahead of their chunk: nothing pending
        self.max_prefill_tokens = p.max_prefill_tokens
        self.capacity_tokens = bm.num_total_gpu_blocks * bm.block_size
        self.max_running = p.max_running_requests or default_max_running_requests(self.capacity_tokens,
                                                                                  max_model_len)
        self.init_new_token_ratio = min(1.0, p.init_new_token_ratio)
        self.min_new_token_ratio = self.init_new_token_ratio * p.min_new_token_ratio_factor
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) / p.new_token_ratio_decay_steps
        self.new_token_ratio = self.init_new_token_ratio
        self.batch_is_full = False
        self.chunked_group: SequenceGroup | None = None
        self.waiting: list[SequenceGroup] = []  # type: ignore[assignment]

    # --- queues --------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.chunked_group)

    def live_seqs(self):
        groups = self.running + ([self.chunked_group] if self.chunked_group else [])
        return [s for g in groups for s in g.seqs if s.status is SeqStatus.RUNNING]

    def allows_span(self) -> bool:
        """Decode steps repeat identically while no prefill can be tried: nothing waits or the
        batch is marked full, and no chunked prompt is in progress."""
        return self.chunked_group is None and (not self.waiting or self.batch_is_full)

    def on_span_steps(self, steps: int) -> None:
        """`steps` further decode steps ran in a span: the ratio decays once per step."""
        low, decay = self.min_new_token_ratio, self.new_token_ratio_decay
        r = self.new_token_ratio
        for _ in range(steps):
            if r <= low:
                r = low
                break
            r = max(r - decay, low)
        self.new_token_ratio = r

    # --- one iteration -------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutputs:
        out = SchedulerOutputs()
        if not self.running and self.chunked_group is None:
            self.batch_is_full = False
        if not self._schedule_prefill(out):
            self._schedule_decode(out)
        return out

    def _never_reason(self, group: SequenceGroup, num_tokens: int = 0) -> str:
        if len(group.seqs) != 1:
            return (f"n={len(group.seqs)}: the sglang preset runs one sequence per request "
                    f"(SGLang expands parallel samples into separate requests); use n=1")
        if group.prompt_tokens + group.output_tokens > self.max_model_len:
            return (f"prompt + output tokens exceed the model's max_model_len ({self.max_model_len}); "
                    f"clip it (blocksim replay --clip-to-model, or traces convert --clip-max-len)")
        need = group.seqs[0].num_tokens + min(group.output_tokens, CLIP_MAX_NEW_TOKENS)
        if need >= self.capacity_tokens:
            return (f"prompt + estimated output tokens ({need}) do not fit in the KV pool of "
                    f"{self.capacity_tokens} tokens; use a larger GPU or a smaller model")
        return ""

    def _schedule_prefill(self, out: SchedulerOutputs) -> bool:
        """SGLang's `get_new_batch_prefill`; True when a prefill batch was formed."""
        chunked = self.chunked_group
        if (self.batch_is_full or not self.waiting) and chunked is None:
            return False
        if len(self.running) >= self.max_running:
            self.batch_is_full = True
            return False
        bm = self.bm
        matched = self.schedule_policy.calc_priority(self.waiting, bm) if self.waiting else None
        adder = PrefillAdder(bm, self.running, self.new_token_ratio, self.max_prefill_tokens, self.chunk_tokens)
        if chunked is not None:
            adder.add_chunked(chunked)
        first_new = len(adder.admitted)
        rejected = []
        for group in self.waiting:
            if len(self.running) + len(adder.admitted) >= self.max_running:  # the chunked request counts
                self.batch_is_full = True
                break
            reason = self._never_reason(group)
            if reason:
                rejected.append((group, reason))
                continue
            m = matched[group.seqs[0].seq_id] if matched is not None else bm.match(group)
            res = adder.add_one(group, m)
            if res is not AddReqResult.CONTINUE:
                if res is AddReqResult.NO_TOKEN:
                    self.batch_is_full = True
                break
        gone = {id(g) for g, _, _ in adder.admitted[first_new:]} | {id(g) for g, _ in rejected}
        if gone:
            self.waiting = [g for g in self.waiting if id(g) not in gone]
        for group, reason in rejected:
            self._reject(group, reason, out)
        if not adder.admitted:
            return False
        ps = bm.block_size
        pages = sum(-(-stop // ps) - len(g.seqs[0].block_table) for g, _, stop in adder.admitted)
        bm.make_room(pages)  # one eviction for the batch, as SGLang's alloc_token_slots
        for group, start, stop in adder.admitted:
            bm.add_filled(group, start, stop)
            if bm.tiers is not None:
                start = bm.tier_commit(group, start)
            out.prefills.append(ScheduledPrefill(group, start, stop))
            out.prefill_tokens += stop - start
            if group is chunked:
                if stop == group.seqs[0].num_tokens:  # its last chunk: it joins the running batch
                    self.chunked_group = None
                    self.running.append(group)
                continue
            seq = group.seqs[0]
            seq.status = SeqStatus.RUNNING
            group.status = RUNNING
            group.prefill_pos = start
            if group.preemptions:
                group.recomputed_tokens += seq.num_tokens - start
            if group is adder.new_chunked:
                self.chunked_group = group
            else:
                self.running.append(group)
        return True

    def _schedule_decode(self, out: SchedulerOutputs) -> None:
        """SGLang's `update_running_batch`: retract when memory is short, decay the ratio
        otherwise, then one slot per running request."""
        running = self.running
        if not running:
            return
        bm = self.bm
        if not bm.check_decode(bm.pages_for_next_decode(running)):
            self._retract(out)
            running = self.running
            if not bm.check_decode(bm.pages_for_next_decode(running)):
                group = running.pop()
                self._reject(group, "its next token finds no free KV slot even alone; use a larger GPU "
                                    "or a smaller model", out)
                return
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        out.decode_ctx_tokens += bm.append_decode(running)
        out.decode_groups.extend(running)
        out.num_decode_seqs += len(running)

    def _retract(self, out: SchedulerOutputs) -> None:
        bm, running = self.bm, self.running
        order = sorted(range(len(running)), reverse=True,
                       key=lambda i: (running[i].seqs[0].num_tokens - running[i].prompt_tokens,
                                      -running[i].prompt_tokens))
        gone = set()
        first = True
        while first or bm.available_tokens < len(order) * RETRACT_DECODE_STEPS:
            if len(order) == 1:
                break
            first = False
            group = running[order.pop()]
            seq = group.seqs[0]
            bm.retract(seq)
            bm.evict(max(0, len(order) * RETRACT_DECODE_STEPS - bm.available_tokens))
            seq.status = SeqStatus.WAITING
            group.status = WAITING
            group.prefill_pos = None
            group.preemptions += 1
            out.preempted.append(group)
            self.waiting.append(group)
            gone.add(id(group))
        self.running = [g for g in running if id(g) not in gone]
        decoded = sum(g.seqs[0].num_tokens - g.prompt_tokens for g in self.running)
        max_new = sum(g.output_tokens for g in self.running)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / max_new)
        self.batch_is_full = False

    # --- outcome of a step ---------------------------------------------------------------------
    def complete_step(self, out: SchedulerOutputs, end_s: float) -> list[SequenceGroup]:
        """Prefilled requests insert what they wrote into the tree (`cache_unfinished_req`) and
        completed prompts gain their first token; decoding requests gain one token."""
        finished: list[SequenceGroup] = []
        bm = self.bm
        for group, _, stop in out.prefills:
            if group.status is not RUNNING:
                continue
            if stop < group.seqs[0].num_tokens:
                group.prefill_pos = stop
                bm.cache_unfinished(group)
                continue
            group.prefill_pos = None
            if group.first_token_s != group.first_token_s:
                group.first_token_s = end_s
            self._advance(group, end_s, finished)
            if group.status is RUNNING:
                bm.cache_unfinished(group)
        self._complete_decodes(out.decode_groups, end_s, finished)
        if finished:
            self.running = [g for g in self.running if g.status is RUNNING]
            self.batch_is_full = False
        return finished

"""What one scheduling step decides (`SchedulerOutputs`) and the budget it is decided under.

Names follow vLLM 0.6's `core/scheduler.py`: `SchedulingBudget`, `SchedulerOutputs`, and
`ScheduledPrefill` for its `ScheduledSequenceGroup` of a prompt (or prompt chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from blocksim.sequence import SequenceGroup


class SchedulingBudget:
    """Tokens and sequences of one step, against `max_num_batched_tokens` and `max_num_seqs`.

    vLLM 0.6's budget, counting only (vLLM also remembers which request added what, to make
    adding idempotent; here every caller adds once). A decoding sequence costs one token; a
    prompt chunk its length. The token count may exceed the budget (decodes are never refused
    for tokens), so `remaining_token_budget` may be negative.
    """

    __slots__ = ("token_budget", "max_num_seqs", "num_batched_tokens", "num_curr_seqs")

    def __init__(self, token_budget: int, max_num_seqs: int) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.num_batched_tokens = 0
        self.num_curr_seqs = 0

    def can_schedule(self, *, num_new_tokens: int, num_new_seqs: int) -> bool:
        """Whether `num_new_tokens` more tokens and `num_new_seqs` more sequences fit."""
        return (self.num_batched_tokens + num_new_tokens <= self.token_budget
                and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs)

    def can_schedule_seqs(self, num_new_seqs: int) -> bool:
        """Whether `num_new_seqs` more sequences fit, tokens aside (swap-in)."""
        return self.num_curr_seqs + num_new_seqs <= self.max_num_seqs

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_num_batched_tokens(self, num_tokens: int) -> None:
        self.num_batched_tokens += num_tokens

    def subtract_num_batched_tokens(self, num_tokens: int) -> None:
        self.num_batched_tokens -= num_tokens

    def add_num_seqs(self, num_seqs: int) -> None:
        self.num_curr_seqs += num_seqs

    def subtract_num_seqs(self, num_seqs: int) -> None:
        self.num_curr_seqs -= num_seqs


class ScheduledPrefill(NamedTuple):
    """A prompt (or one chunk of it) in this step: the K/V of positions [start, stop) is computed."""

    group: SequenceGroup
    start: int
    stop: int


@dataclass(init=False, slots=True)
class SchedulerOutputs:
    """One step: the prefills and decodes to run and the block moves the worker does first."""

    prefills: list[ScheduledPrefill]
    decode_groups: list[SequenceGroup]
    prefill_tokens: int
    num_decode_seqs: int
    decode_ctx_tokens: int
    blocks_to_swap_in: dict[int, int]
    blocks_to_swap_out: dict[int, int]
    blocks_to_copy: list[tuple[int, int]]
    preempted: list[SequenceGroup]
    rejected: list[SequenceGroup]
    padding_longest: int  # the longest context among decode rows outside `decode_groups` (static batching's padding)

    def __init__(self, prefills=None, decode_groups=None, prefill_tokens: int = 0, num_decode_seqs: int = 0,
                 decode_ctx_tokens: int = 0, blocks_to_swap_in=None, blocks_to_swap_out=None,
                 blocks_to_copy=None, preempted=None, rejected=None) -> None:
        # written out (not field defaults): one is built per scheduling decision
        self.prefills = [] if prefills is None else prefills
        self.decode_groups = [] if decode_groups is None else decode_groups
        self.prefill_tokens = prefill_tokens
        self.num_decode_seqs = num_decode_seqs
        self.decode_ctx_tokens = decode_ctx_tokens
        self.blocks_to_swap_in = {} if blocks_to_swap_in is None else blocks_to_swap_in
        self.blocks_to_swap_out = {} if blocks_to_swap_out is None else blocks_to_swap_out
        self.blocks_to_copy = [] if blocks_to_copy is None else blocks_to_copy
        self.preempted = [] if preempted is None else preempted
        self.rejected = [] if rejected is None else rejected
        self.padding_longest = 0

    @property
    def has_work(self) -> bool:
        return bool(self.prefills or self.decode_groups)

    @property
    def is_plain_decode(self) -> bool:
        """Decode only, with no block moves, preemptions or rejections: a span may follow."""
        return (not self.prefills and bool(self.decode_groups) and not self.blocks_to_swap_in
                and not self.blocks_to_swap_out and not self.blocks_to_copy and not self.preempted
                and not self.rejected)

"""Sequences and sequence groups, as counts (no token ids).

A request becomes one `SequenceGroup` of `n` sequences sharing the prompt (parallel sampling).
A sequence's `num_tokens` is prompt + tokens generated so far; the KV of all but the last
generated token is in the cache (vLLM v0 writes a token's KV in the step after it is sampled).
"""

from __future__ import annotations

import enum


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


class GroupStatus(enum.StrEnum):
    """Where a request stands; requests.parquet's `status` column holds these strings."""

    PENDING = "pending"      # not handed to the scheduler yet
    WAITING = "waiting"      # in the waiting queue (new, or preempted by recompute)
    RUNNING = "running"      # in the running queue (decoding, or mid-prompt under chunked prefill)
    SWAPPED = "swapped"      # preempted by swap: its blocks are in CPU memory
    FINISHED = "finished"
    REJECTED = "rejected"    # can never run; `reject_reason` says why
    HELD = "held"            # static batching: done, held until its batch ends


_NAN = float("nan")

#: `SequenceGroup.onload_state`: 0 (no tier load), its chunks loading, loaded and waiting to be scheduled.
ONLOADING, ONLOADED = 1, 2


class Sequence:
    __slots__ = ("seq_id", "group", "num_tokens", "status", "block_table")

    def __init__(self, seq_id: int, group: "SequenceGroup", num_tokens: int) -> None:
        self.seq_id = seq_id
        self.group = group
        self.num_tokens = num_tokens
        self.status = SeqStatus.WAITING
        self.block_table: list[int] = []

    @property
    def kv_len(self) -> int:
        """Tokens whose K/V is in the cache between steps (a prompt mid-chunk: the chunks done)."""
        g = self.group
        return self.num_tokens - 1 if g.prefill_pos is None else max(g.prefill_pos, g.hit_tokens)

    def __repr__(self) -> str:
        return f"Sequence({self.seq_id}, tokens={self.num_tokens}, {self.status.value}, blocks={self.block_table})"


class SequenceGroup:
    """One request: `n` sequences with the same prompt, each producing `output_tokens` tokens."""

    __slots__ = ("request_id", "index", "arrival_s", "prompt_tokens", "output_tokens", "priority", "seqs",
                 "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "swaps",
                 "recomputed_tokens", "status", "reject_reason", "sort_key", "prefix_hashes", "prefill_pos",
                 "num_cached_tokens", "block_keys", "prefix_hit_tokens", "hit_tokens", "onload_state",
                 "onload_issue_s", "onload_ready_s", "onload_wait_s", "tier_tokens", "onload_skipped_tokens",
                 "onload_ttft_s")

    def __init__(self, request_id: int, index: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 n: int = 1, priority: int = 0, first_seq_id: int = 0, prefix_hashes=None) -> None:
        self.request_id = request_id
        self.index = index
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.priority = priority
        self.seqs = ([Sequence(first_seq_id, self, prompt_tokens)] if n == 1
                     else [Sequence(first_seq_id + i, self, prompt_tokens) for i in range(n)])
        self.first_scheduled_s = self.first_token_s = self.finish_s = _NAN
        self.preemptions = 0
        self.swaps = 0
        self.recomputed_tokens = 0
        self.status = GroupStatus.PENDING
        self.reject_reason = ""
        self.sort_key = (arrival_s, index)
        self.prefix_hashes = prefix_hashes
        self.prefill_pos: int | None = None  # prompt tokens prefilled so far while a prompt is in progress
        self.num_cached_tokens = 0           # prompt tokens not prefilled at admission (prefix cache hits)
        self.hit_tokens = 0                  # tokens in prefix-cache hit blocks (>= num_cached_tokens)
        self.block_keys = None               # content keys of full prompt blocks (prefix caching)
        self.prefix_hit_tokens = 0
        # KV tiers (blocksim.memory.tiers): ONLOADING while chunks load, ONLOADED until scheduled after
        self.onload_state = 0
        self.onload_issue_s = self.onload_ready_s = _NAN
        self.onload_wait_s = 0.0             # seconds spent waiting for loads, all admissions
        self.onload_ttft_s = 0.0             # of which before the first token
        self.tier_tokens = None              # [gpu, host, disk] prompt tokens hit, all admissions
        self.onload_skipped_tokens = 0       # found in a tier, recomputed by the onload mode

    def seqs_with(self, status: SeqStatus) -> list[Sequence]:
        seqs = self.seqs
        if len(seqs) == 1:  # most requests
            return [seqs[0]] if seqs[0].status is status else []
        return [s for s in seqs if s.status is status]

    def num_unfinished(self) -> int:
        return sum(1 for s in self.seqs if s.status is not SeqStatus.FINISHED)

    def __repr__(self) -> str:
        return f"SequenceGroup(req={self.request_id}, prompt={self.prompt_tokens}, out={self.output_tokens}, n={len(self.seqs)})"

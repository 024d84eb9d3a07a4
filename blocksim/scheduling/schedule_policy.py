"""SGLang's waiting-queue orders (`schedule_policy.py`'s `SchedulePolicy.calc_priority`).

* ``fcfs``: the queue as it is (arrivals appended, retracted requests appended behind them);
* ``lof``: longest output first (the trace's output length stands for `max_new_tokens`);
* ``random``: shuffled by a generator seeded once per run;
* ``lpm``: longest prefix match against the radix tree first; a request whose own match is short
  (<= 32 tokens) but that shares >= 32 tokens with a request ahead of it in the queue is held back
  (SGLang's in-batch prefix caching: admit one, let the others hit its prefix later). With more
  than 128 waiting requests the matching is skipped and the order is fcfs, as in SGLang;
* ``dfs-weight``: requests grouped by their match node, visiting the tree depth first and the
  heavier subtree (more waiting requests below it) first.

Cache-aware orders match every waiting request (`RadixCacheManager.match`), which the admission
pass then reuses.
"""

from __future__ import annotations

import random

from blocksim.config import SCHEDULE_POLICIES
from blocksim.memory.radix_manager import RadixCacheManager
from blocksim.memory.radix_tree import RadixTree
from blocksim.sequence import SequenceGroup

CACHE_AWARE = ("lpm", "dfs-weight")
LPM_FCFS_QUEUE_LEN = 128
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32


class SchedulePolicy:
    def __init__(self, policy: str, seed: int = 0) -> None:
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(f"unknown schedule policy {policy!r}; known: {', '.join(SCHEDULE_POLICIES)}")
        self.policy = policy
        self.rng = random.Random(seed)

    def active(self, waiting: list) -> str:
        if self.policy == "lpm" and len(waiting) > LPM_FCFS_QUEUE_LEN:
            return "fcfs"
        return self.policy

    def calc_priority(self, waiting: list[SequenceGroup], bm: RadixCacheManager) -> dict[int, int] | None:
        """Reorder `waiting` in place; for cache-aware orders, return each group's matched tokens
        by seq_id (the admission pass reuses them), else None."""
        policy = self.active(waiting)
        if policy == "fcfs":
            return None
        if policy == "lof":
            waiting.sort(key=lambda g: -g.output_tokens)
            return None
        if policy == "random":
            self.rng.shuffle(waiting)
            return None
        matched = {g.seqs[0].seq_id: bm.match(g) for g in waiting}
        if policy == "lpm":
            held = self._in_batch_held(waiting, bm, matched)
            waiting.sort(key=lambda g: float("inf") if g.seqs[0].seq_id in held else -matched[g.seqs[0].seq_id])
        else:
            self._dfs_weight(waiting, bm)
        return matched

    @staticmethod
    def _in_batch_held(waiting: list[SequenceGroup], bm: RadixCacheManager, matched: dict[int, int]) -> set[int]:
        """Requests with a short tree match sharing a long prefix with one ahead in the queue."""
        held: set[int] = set()
        scratch = RadixTree(1, bm.hash_block_tokens, pages=False)
        for g in waiting:
            sid = g.seqs[0].seq_id
            if matched[sid] > IN_BATCH_CHECK_TOKENS:
                continue
            content = bm.content(g)
            n = g.seqs[0].num_tokens
            if scratch.match(content, n)[0] >= IN_BATCH_DEPRIORITIZE_TOKENS:
                held.add(sid)
            else:
                scratch.insert(content, n, None)
        return held

    @staticmethod
    def _dfs_weight(waiting: list[SequenceGroup], bm: RadixCacheManager) -> None:
        root = bm.tree.root
        at: dict[int, list] = {}
        weight: dict[int, int] = {}
        nodes = {}
        for g in waiting:
            node = bm.matched_node(g)
            at.setdefault(node.id, []).append(g)
            n = node
            while n is not None:
                weight[n.id] = weight.get(n.id, 0) + 1
                nodes[n.id] = n
                n = n.parent
        order: list = []

        def visit(node) -> None:
            kids = [c for c in node.children.values() if c.id in weight]
            kids.sort(key=lambda c: -weight[c.id])
            for c in kids:
                visit(c)
            order.extend(at.get(node.id, ()))

        visit(root)
        waiting[:] = order

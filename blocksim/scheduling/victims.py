"""Preemption victims: `(candidates in queue order) -> index of the group to preempt`.

A scheduler serves its running queue in order; when a group cannot get its next slot, the victim
function picks, among the groups not yet served this step, the one to preempt. Registered as
`--victim newest | largest | fewest-blocks`; a plug-in is any function of the same signature.
"""

from __future__ import annotations

from blocksim import plugins
from blocksim.sequence import SequenceGroup


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


# Registered here, beside their definitions, so a scheduler resolves them without the presets loaded.
for _name, _fn in (("newest", newest), ("largest", largest), ("fewest-blocks", fewest_blocks)):
    plugins.register("victim", _name, _fn)

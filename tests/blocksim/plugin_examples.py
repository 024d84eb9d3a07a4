"""A user's own policies, plugged in by 'tests.blocksim.plugin_examples:Name' strings."""

from blocksim.memory.paged import BlockSpaceManager
from blocksim.scheduling.scheduler import Scheduler
from blocksim.sequence import GroupStatus


class LongestPromptFirst(Scheduler):
    """Admits the waiting group with the longest prompt first."""

    def add_request(self, group):
        group.sort_key = (-group.prompt_tokens, group.index)
        group.status = GroupStatus.WAITING
        self.waiting.append(group)
        self.waiting = type(self.waiting)(sorted(self.waiting, key=lambda g: g.sort_key))


def oldest_victim(candidates):
    return 0


class GeneralPathOnly(BlockSpaceManager):
    """vLLM's paged manager without the scheduler's fast path: `append_decode_slots` serves no
    group, so every running group takes the general path (`can_append_slots`, `append_slots`)."""

    def append_decode_slots(self, groups, start, end):
        return start, 0


def general_path_only(config):
    """Allocator factory: `GeneralPathOnly` sized as the config's paged manager."""
    return GeneralPathOnly(config.cache.block_size, config.num_gpu_blocks, config.num_cpu_blocks,
                           config.watermark_blocks, config.policy_config.free_order)

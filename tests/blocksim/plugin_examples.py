"""A user's own policies, plugged in by 'tests.blocksim.plugin_examples:Name' strings."""

from blocksim.scheduling.scheduler import Scheduler


class LongestPromptFirst(Scheduler):
    """Admits the waiting group with the longest prompt first."""

    def add_request(self, group):
        group.sort_key = (-group.prompt_tokens, group.index)
        group.status = "waiting"
        self.waiting.append(group)
        self.waiting = type(self.waiting)(sorted(self.waiting, key=lambda g: g.sort_key))


def oldest_victim(candidates):
    return 0


def newest_again(candidates):
    """vLLM's victim under another name: the scheduler's inlined fast path is then off."""
    return len(candidates) - 1

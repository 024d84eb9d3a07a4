"""Plugins that break, for the bad-input corpus (tests/test_bad_input.py)."""

from blocksim.scheduling.scheduler import Scheduler


def raising_victim(candidates):
    raise ValueError("no victim today")


def out_of_range_victim(candidates):
    return len(candidates)


def no_argument_victim():
    return 0


class RaisingScheduler(Scheduler):
    """Fails on its first step."""

    def schedule(self, *args, **kwargs):
        raise RuntimeError("the scheduler plugin has a bug")


class TwoArgumentAllocator:
    def __init__(self, config, extra):
        self.config = config


NOT_CALLABLE = 42

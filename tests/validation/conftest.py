"""Fixtures shared by the validation tests."""
from __future__ import annotations

import time

import pytest


class HostClockEvent:
    """torch.cuda.Event on the host clock: the timers' logic without a GPU."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


@pytest.fixture
def host_clock_cuda(monkeypatch):
    """torch.cuda's sleep and events for `validation.model.SegmentTimer` on a machine without a GPU:
    the sleep queues nothing, the events read the host clock."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "Event", HostClockEvent)

"""The sleeps the step executor queues on the GPU ahead of the work it times (torch-free, so that
planning tools such as `benchmarks/fidelity_runs.py estimate` read them without a GPU stack).

A sleep before a timed segment lets the host queue the segment's launches before the GPU reaches
them, so the segment's CUDA events hold GPU work only (`validation.step_executor`)."""

LEAD_S = 1.2e-3         # sleep queued before each eager segment (one layer): covers its launches
GRAPH_LEAD_S = 50e-6    # before a graph replay (one launch)
RETIME_LEAD_S = 4 * LEAD_S  # per segment (or before a graph replay), when a forward is timed again


class Lead:
    """The sleep to queue before one kind of timed segment (a graph replay, an eager layer), kept
    ahead of this host.

    At least `base_s`; once segments of the kind have run, `margin` times the 90th percentile of the
    host's time for the last `window` of them (from queuing the sleep to recording the segment's
    end event), at most `cap_s`. A host slower than the one `base_s` was set on (its launches
    outlasting the sleep at nearly every step) would otherwise make most segments late and their
    forwards timed again with `RETIME_LEAD_S`, at twice the device time; a longer sleep costs only
    its length, outside the timed span. A segment still late is detected and its forward timed
    again with four times the lead, at least `RETIME_LEAD_S` (`validation.step_executor`)."""

    def __init__(self, base_s: float, cap_s: float = RETIME_LEAD_S, *, window: int = 64, margin: float = 1.25):
        if not 0 <= base_s <= cap_s:
            raise ValueError(f"Lead: base_s {base_s} must lie in [0, cap_s {cap_s}]")
        if window < 1:
            raise ValueError(f"Lead: window {window} must be at least 1")
        self.base_s, self.cap_s, self.window, self.margin = base_s, cap_s, window, margin
        self._recent: list[float] = []

    @property
    def s(self) -> float:
        """The sleep, seconds, for the next segment of the kind."""
        if not self._recent:
            return self.base_s
        ordered = sorted(self._recent)
        q90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        return min(self.cap_s, max(self.base_s, self.margin * q90))

    def observe(self, host_s) -> None:
        """Record the host's time of finished segments of the kind (seconds, an iterable)."""
        self._recent.extend(host_s)
        del self._recent[:-self.window]


def leads() -> tuple[Lead, Lead]:
    """The (graph replay, eager segment) leads of one timing process, the executor's or the
    profiler's: from `GRAPH_LEAD_S` over the last 64 replays, from `LEAD_S` over the last 256 eager
    segments (a step's layers and more)."""
    return Lead(GRAPH_LEAD_S), Lead(LEAD_S, window=256)

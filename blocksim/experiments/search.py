"""Capacity search: per configuration, the highest rate scale whose goodput meets the SLO.

A run *meets* the SLO when at least ``threshold`` (default 0.9) of all its requests finish within
every bound (``analysis.metrics.slo_met``; rejected requests count as missing it), i.e. its
``slo_attainment`` is >= ``threshold``. The search starts at the configuration's rate scale,
brackets by doubling (or halving) until one run meets and one does not, then bisects the bracket
geometrically ``steps`` times. It assumes attainment falls as the rate rises. Every probe is an
ordinary sweep point, so a rerun reuses the probes already run and reaches the same answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blocksim.experiments.backends import Job
from blocksim.experiments.spec import Point

BRACKET_LIMIT = 1024.0  # search rate scales within start / 1024 .. start * 1024


def _round(rate: float) -> float:
    return float(f"{rate:.6g}")


@dataclass
class Search:
    config: Point
    start: float
    steps: int
    index: int = 0
    lo: float | None = None  # highest rate scale that met the SLO
    hi: float | None = None  # lowest rate scale that did not
    lo_row: dict | None = None
    runs: int = 0
    bisections: int = 0
    status: str = "running"
    error: str = ""
    probes: list = field(default_factory=list)

    def next_rate(self) -> float | None:
        """The next rate scale to try, or None when the search is over (``status`` says why)."""
        if self.lo is None and self.hi is None:
            return self.start
        if self.hi is None:
            nxt = self.lo * 2
            if nxt > self.start * BRACKET_LIMIT:
                self.status = "meets-at-limit"
                return None
            return _round(nxt)
        if self.lo is None:
            nxt = self.hi / 2
            if nxt < self.start / BRACKET_LIMIT:
                self.status = "fails-at-limit"
                return None
            return _round(nxt)
        mid = _round(math.sqrt(self.lo * self.hi))
        if self.bisections >= self.steps or not self.lo < mid < self.hi:
            self.status = "found"
            return None
        self.bisections += 1
        return mid

    def record(self, rate: float, row: dict, threshold: float) -> None:
        self.runs += 1
        self.probes.append(rate)
        if row["status"] != "ok":
            self.status, self.error = "failed", row.get("error", "")
            return
        attainment = row.get("slo_attainment", math.nan)
        if attainment >= threshold:
            if self.lo is None or rate > self.lo:
                self.lo, self.lo_row = rate, row
        elif self.hi is None or rate < self.hi:
            self.hi = rate

    def result(self) -> dict:
        row = self.lo_row or {}
        return {
            "search_status": self.status,
            "max_rate_scale": self.lo if self.lo is not None else math.nan,
            "max_offered_rate_req_s": row.get("offered_rate_req_s", math.nan),
            "first_failing_rate_scale": self.hi if self.hi is not None else math.nan,
            "slo_attainment": row.get("slo_attainment", math.nan),
            "goodput_requests_per_s": row.get("goodput_requests_per_s", math.nan),
            "requests_per_s": row.get("requests_per_s", math.nan),
            "max_rate_run_dir": row.get("run_dir", ""),
            "probes": self.runs,
            "error": self.error,
        }


class MaxRateSource:
    """Job source for `backends.drive`: one search per configuration, one probe at a time each."""

    def __init__(self, configs: list[Point], threshold: float = 0.9, steps: int = 6):
        if not 0 < threshold <= 1:
            raise ValueError(f"goodput threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self.searches = [Search(c, _round(c.rate_scale), steps, index=i) for i, c in enumerate(configs)]
        self.steps = steps

    def _job(self, search: Search) -> list[Job]:
        rate = search.next_rate()
        if rate is None:
            return []
        point = search.config.with_rate(rate)
        return [Job(point.name(), point, order=(search.index, len(search.probes)), tag=search)]

    def initial(self) -> list[Job]:
        return [job for s in self.searches for job in self._job(s)]

    def estimated_total(self) -> int:
        return len(self.searches) * (self.steps + 2)

    def on_result(self, job: Job, row: dict) -> list[Job]:
        search: Search = job.tag
        search.record(job.point.rate_scale, row, self.threshold)
        return [] if search.status == "failed" else self._job(search)

"""Paired comparisons of the fast kernel with SDPA: measurements taken in alternating order, and
the median of their time ratios with a distribution-free confidence interval."""

from __future__ import annotations

import math
import statistics

from .timing import graph_ms, sdpa


def alternate(measure_a, measure_b, repeats: int) -> tuple[list, list]:
    """``repeats`` pairs of measurements by the zero-argument functions ``measure_a`` and
    ``measure_b``, the pair's order alternating (a first on even repeats, b first on odd ones), so
    that whatever the first of two measurements gains or loses falls on both sides (evenly for an
    even number of repeats; a goes first once more for an odd one): the lists of their results,
    ``repeats`` each, in the order taken."""
    runs_a, runs_b = [], []
    for i in range(repeats):
        if i % 2 == 0:
            runs_a.append(measure_a())
            runs_b.append(measure_b())
        else:
            runs_b.append(measure_b())
            runs_a.append(measure_a())
    return runs_a, runs_b


def rotate(measures, repeats: int) -> list[list]:
    """``repeats`` rounds of one measurement by each zero-argument function of ``measures``, the
    round's order rotating by one each time (round ``i`` starts with measure ``i % len``), so that
    whatever a position in a round gains or loses falls on each alike: one list of results per
    measure, in the order taken. Two measures make ``alternate``'s order."""
    runs = [[] for _ in measures]
    for i in range(repeats):
        for j in range(len(measures)):
            k = (i + j) % len(measures)
            runs[k].append(measures[k]())
    return runs


def alternating_runs(c, backend, args):
    """The fast kernel on case ``c`` and SDPA (``backend``) on the same tokens, measured in turn
    ``args.repeats`` times (``alternate``, fast first on even repeats): lists of times (ms), so
    that medians compare the two under the same drift of the device's speed."""
    k, v = c.contiguous()
    q4 = [s[0].unsqueeze(2) for s in c.sets]
    fast_runs, sdpa_runs = alternate(
        lambda: c.fast_ms(args.warmup, args.iters),
        lambda: graph_ms([lambda q=q: sdpa(q, k, v, backend) for q in q4], args.warmup, args.iters),
        args.repeats)
    del k, v
    return fast_runs, sdpa_runs


def alternate_with_sdpa(c, backend, args) -> dict:
    """``alternating_runs`` on case ``c``: both lists of times, their medians ("fast", "sdpa") and
    the paired ``ratio_interval``."""
    fast_runs, sdpa_runs = alternating_runs(c, backend, args)
    return {"fast_runs": fast_runs, "sdpa_runs": sdpa_runs, "fast": statistics.median(fast_runs),
            "sdpa": statistics.median(sdpa_runs), "ratio_interval": ratio_interval(fast_runs, sdpa_runs)}


def ratio_interval(fast_runs, sdpa_runs, confidence: float = 0.95) -> dict:
    """The fast / SDPA time ratios of paired alternating measurements: their median and a
    distribution-free confidence interval for it (order statistics of the ratios: the narrowest
    pair ``(k-th smallest, k-th largest)`` whose coverage, ``1 - 2 P(Binomial(n, 1/2) < k)``, is
    at least ``confidence``; min and max with their lower coverage when there are too few pairs).
    An interval below 1 says the kernel is faster, above 1 slower, across 1 that the run cannot
    tell them apart."""
    if len(fast_runs) != len(sdpa_runs):
        raise ValueError(f"ratio_interval pairs the runs: {len(fast_runs)} fast and {len(sdpa_runs)} SDPA times")
    ratios = sorted(f / s for f, s in zip(fast_runs, sdpa_runs))
    n = len(ratios)
    if n == 0:
        raise ValueError("ratio_interval needs at least one pair of measurements")

    def coverage(k):  # of (k-th smallest, k-th largest), k >= 1
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return {"median": statistics.median(ratios), "low": ratios[k - 1], "high": ratios[n - k],
            "coverage": coverage(k), "pairs": n}


def interval_label(iv: dict) -> str:
    """``median [low, high] verdict``, with the interval's coverage appended when under 95%."""
    verdict = "faster" if iv["high"] < 1 else "slower" if iv["low"] > 1 else "same"
    label = f"{iv['median']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}] {verdict}"
    return label if iv["coverage"] >= 0.95 else f"{label} ({100 * iv['coverage']:.0f}% interval)"

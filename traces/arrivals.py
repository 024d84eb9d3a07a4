"""Arrival processes for synthetic workloads: arrival times in seconds, first at 0.0."""

from __future__ import annotations

import numpy as np


def poisson_arrivals(count: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """``count`` arrivals of a Poisson process: exponential gaps with mean ``1 / rate_per_s``."""
    return gamma_arrivals(count, rate_per_s, 1.0, rng)


def gamma_arrivals(count: int, rate_per_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``count`` arrivals with Gamma-distributed gaps of mean ``1 / rate_per_s`` and coefficient of variation ``cv``.

    ``cv`` 1 is Poisson; above 1 is bursty (clustered arrivals), below 1 more regular.
    """
    if not rate_per_s > 0:
        raise ValueError(f"arrival rate_per_s must be > 0, got {rate_per_s}")
    if not cv > 0:
        raise ValueError(f"arrival cv must be > 0, got {cv}")
    if count <= 0:
        return np.zeros(0)
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=count - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])

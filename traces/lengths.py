"""Token-length distributions for synthetic workloads.

Each distribution has ``sample(count, rng) -> int64 array`` of lengths >= ``minimum`` (1).
:func:`parse_length` reads the command-line form, e.g. ``fixed:512``, ``uniform:128:2048``,
``lognormal:MEAN:CV`` or ``empirical:FILE[:prompt|output]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class LengthDist(Protocol):
    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray: ...


@dataclass(frozen=True)
class Fixed:
    tokens: int

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(count, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform in ``[low_tokens, high_tokens]`` (both included)."""

    low_tokens: int
    high_tokens: int

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low_tokens, self.high_tokens + 1, size=count, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal with the given mean and coefficient of variation, rounded, clipped to ``[1, max_tokens]``."""

    mean_tokens: float
    cv: float
    max_tokens: int | None = None

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        sigma2 = np.log1p(self.cv**2)
        mu = np.log(self.mean_tokens) - sigma2 / 2
        values = np.rint(rng.lognormal(mu, np.sqrt(sigma2), size=count)).astype(np.int64)
        return np.clip(values, 1, self.max_tokens or np.iinfo(np.int64).max)


@dataclass(frozen=True, eq=False)
class Empirical:
    """Resample (with replacement) from observed lengths, e.g. a trace's ``prompt_tokens``."""

    values: np.ndarray

    @classmethod
    def from_trace(cls, trace, column: str) -> Empirical:
        return cls(trace.df[column].to_numpy(dtype=np.int64, copy=True))

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        if len(self.values) == 0:
            raise ValueError("an empirical length distribution needs at least one value")
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=count, replace=True)


def parse_length(text: str, default_column: str = "prompt_tokens") -> LengthDist:
    """Parse ``fixed:N``, ``uniform:LOW:HIGH``, ``lognormal:MEAN:CV[:MAX]`` or ``empirical:FILE[:prompt|output]``."""
    kind, _, rest = text.partition(":")
    args = rest.split(":") if rest else []
    try:
        if kind == "fixed" and len(args) == 1:
            return Fixed(int(args[0]))
        if kind == "uniform" and len(args) == 2:
            return Uniform(int(args[0]), int(args[1]))
        if kind == "lognormal" and len(args) in (2, 3):
            return LogNormal(float(args[0]), float(args[1]), int(args[2]) if len(args) == 3 else None)
        if kind == "empirical" and args:
            from .read import read_trace
            column = default_column
            if args[-1] in ("prompt", "output") and len(args) > 1:
                column = f"{args.pop()}_tokens"
            return Empirical.from_trace(read_trace(":".join(args)), column)
    except ValueError as e:
        raise ValueError(f"bad length distribution {text!r}: {e}") from None
    raise ValueError(f"bad length distribution {text!r}; use fixed:N, uniform:LOW:HIGH, "
                     "lognormal:MEAN:CV[:MAX] or empirical:FILE[:prompt|output]")

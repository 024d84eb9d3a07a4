"""Interpolation of a measured table of seconds on a grid, and extrapolation beyond it.

Rule: multilinear interpolation of ``log(seconds)`` in each axis' coordinate, where an axis'
coordinate is ``log(x)`` when its grid starts above zero (token, batch, context and block counts
span decades) and ``x`` itself when its grid starts at zero (cached tokens). So between two grid
points of a log axis a time follows the power law through them: exact for times proportional to
a power of the size (quadratic prefill attention, linear KV reads), within about 1% on a grid of
doublings for a floor plus a slope. On grid points the table's values come back (up to one
rounding of ``exp(log(t))``).

Outside the grid an axis is extrapolated from its two nearest grid points with the same rule (a
power law on log axes). Sizes on a log axis are positive (the profiled model prices a component of
size zero at zero seconds without interpolating; `Table` evaluates a zero at the first grid point). Every
evaluation also says which points fell outside the grid on each axis, so that callers count them.
An axis with a single grid point is constant along it; any other value on it is outside.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import product

import numpy as np

from blocksim.cost.profile_file import Grid


class Table:
    """A `Grid` prepared for evaluation: coordinates and log-seconds computed once."""

    def __init__(self, grid: Grid) -> None:
        self.name, self.axes = grid.name, grid.axes
        self.grids = grid.grids
        self.log_axis = tuple(bool(g[0] > 0) for g in grid.grids)
        self.coords = tuple(np.log(g) if lg else g for g, lg in zip(grid.grids, self.log_axis))
        self.log_seconds = np.log(grid.seconds)
        self._coord_list = [c.tolist() for c in self.coords]

    def _coord(self, i: int, x: np.ndarray) -> np.ndarray:
        if not self.log_axis[i]:
            return x
        safe = np.maximum(x, self.grids[i][0] * 1e-300)
        return np.where(x > 0, np.log(safe), self.coords[i][0])

    def outside(self, i: int, x: np.ndarray) -> np.ndarray:
        """Points of axis i beyond its grid."""
        g = self.grids[i]
        return (x < g[0]) | (x > g[-1])

    def log_eval(self, *xs) -> np.ndarray:
        """log(seconds) at the points ``xs`` (one array or number per axis, broadcast together; at
        least one-dimensional)."""
        xs = np.broadcast_arrays(*[np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in xs])
        js, ws = [], []
        for i, x in enumerate(xs):
            c, n = self.coords[i], len(self.coords[i])
            if n == 1:
                js.append(np.zeros(x.shape, dtype=np.intp))
                ws.append(None)
                continue
            xc = self._coord(i, x)
            j = np.clip(np.searchsorted(c, xc, side="right") - 1, 0, n - 2)
            js.append(j)
            ws.append((xc - c[j]) / (c[j + 1] - c[j]))
        out = np.zeros(xs[0].shape if xs else (), dtype=np.float64)
        for corner in product((0, 1), repeat=len(xs)):
            if any(o and w is None for o, w in zip(corner, ws)):
                continue
            weight = None
            for o, w in zip(corner, ws):
                if w is None:
                    continue
                f = w if o else 1.0 - w
                weight = f if weight is None else weight * f
            v = self.log_seconds[tuple(j + o for j, o in zip(js, corner))]
            out = out + (v if weight is None else weight * v)
        return out

    def eval(self, *xs) -> np.ndarray:
        return np.exp(self.log_eval(*xs))

    def point(self, *xs: float) -> float:
        """Seconds at one point (one number per axis), by the rule of `log_eval` in plain Python:
        the fast path for one prompt priced alone."""
        idx, wts = [], []
        for i, x in enumerate(xs):
            c = self._coord_list[i]
            n = len(c)
            if n == 1:
                idx.append(0)
                wts.append(None)
                continue
            xc = (math.log(x) if x > 0 else c[0]) if self.log_axis[i] else x
            j = min(max(bisect_right(c, xc) - 1, 0), n - 2)
            idx.append(j)
            wts.append((xc - c[j]) / (c[j + 1] - c[j]))
        total = 0.0
        ls = self.log_seconds
        for corner in product((0, 1), repeat=len(xs)):
            weight = 1.0
            for o, w in zip(corner, wts):
                if w is None:
                    if o:
                        weight = 0.0
                        break
                    continue
                weight *= w if o else 1.0 - w
            if weight:
                total += weight * float(ls[tuple(j + o for j, o in zip(idx, corner))])
        return math.exp(total)

    def line(self, free: str, **fixed: float) -> "Line":
        """The 1-D table along axis `free` with every other axis fixed at the given value."""
        i = self.axes.index(free)
        g = self.grids[i]
        points = [g if a == free else np.full(len(g), float(fixed[a])) for a in self.axes]
        outside = {a: bool(self.outside(k, np.asarray([float(fixed[a])]))[0])
                   for k, a in enumerate(self.axes) if a != free}
        return Line(self.name, free, g, self.log_eval(*points), outside)


class Line:
    """A 1-D table (a grid and log-seconds along it), the hot path of the profiled model.

    `fixed_outside` says, for each axis fixed when the line was cut from a larger table, whether
    its value lay beyond that table's grid.
    """

    def __init__(self, name: str, axis: str, grid: np.ndarray, log_seconds: np.ndarray,
                 fixed_outside: dict[str, bool] | None = None) -> None:
        self.name, self.axis = name, axis
        self.grid = grid
        self.lo, self.hi = float(grid[0]), float(grid[-1])
        self.log_axis = bool(grid[0] > 0)
        self.coord = np.log(grid) if self.log_axis else grid
        self.log_seconds = log_seconds
        self.fixed_outside = fixed_outside or {}
        self._inner = self.coord[1:-1]  # searchsorted on the inner points gives the segment, 0 .. n - 2
        if len(grid) > 1:  # per segment j: log-seconds = intercept[j] + slope[j] * coordinate
            self._slope = np.diff(log_seconds) / np.diff(self.coord)
            self._intercept = log_seconds[:-1] - self._slope * self.coord[:-1]

    @classmethod
    def of(cls, grid: Grid) -> "Line":
        return cls(grid.name, grid.axes[0], grid.grids[0], np.log(grid.seconds))

    def eval(self, x: np.ndarray) -> np.ndarray:
        """Seconds at the points `x` (a 1-D float64 array; > 0 on a log axis)."""
        if len(self.grid) == 1:
            return np.full(x.shape, float(np.exp(self.log_seconds[0])))
        xc = np.log(x) if self.log_axis else x
        j = np.searchsorted(self._inner, xc, side="right")
        return np.exp(self._intercept[j] + self._slope[j] * xc)

    def outside(self, x: np.ndarray) -> np.ndarray:
        return (x < self.lo) | (x > self.hi)

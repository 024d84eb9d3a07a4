"""Interpolation of a measured table of seconds on a grid, and extrapolation beyond it.

Rule: piecewise-linear in seconds along each axis (multilinear across axes), except along a
*power* axis, where the time follows the power law through its two neighbouring grid points
(linear in ``log(seconds)`` against ``log(x)``). Step components are mostly a fixed cost plus a
slope (a launch floor plus bytes or FLOPs): linear interpolation is exact for those, while a power
law between far-apart grid points overshoots by several per cent where the floor and the slope are
of one size. The one power axis is prefill attention's ``new_tokens``, whose cost grows with the
square of the new tokens. Leave-one-out on the three shipped H200 profiles
(`benchmarks/interpolation_check.py`: each inner grid point dropped and interpolated from its
neighbours) gives median errors along decode_step.context of 0.2% with straight lines against
4.5-6.3% with power laws, attn_decode.context 1.4-1.7% against 7.1-8.2%,
attn_prefill.cached_tokens 0.9-1.2% against 14.5-14.6%, linear.tokens 0.9-1.6% against 1.2-1.8%;
along attn_prefill.new_tokens the two are within 1.4 points (29.2-32.2% power law, 29.4-33.0%
straight), and the power law keeps the quadratic growth beyond the grid (a straight line in the
attention's work comes closer there, 9.2-10.2%, and is not the rule yet: docs/cost_models.md).

On grid points the table's values come back exactly (tables without a power axis) or up to one
rounding of ``exp(log(t))``. Outside the grid an axis is extrapolated from its two nearest grid
points by the same rule (a straight line, or a power law along a power axis); an extrapolated time
is kept at least `FLOOR_S`. Every evaluation can say which points fell outside the grid on each
axis (`outside`), so that callers count them. An axis with a single grid point is constant along it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import product

import numpy as np

from blocksim.cost.profile_file import Grid

#: (table, axis) pairs interpolated as power laws.
POWER_AXES = frozenset({("attn_prefill", "new_tokens")})
#: Seconds: the least time an extrapolated point is given (a line extrapolated down may cross zero).
FLOOR_S = 1e-9


class Table:
    """A `Grid` prepared for evaluation."""

    def __init__(self, grid: Grid) -> None:
        self.name, self.axes = grid.name, grid.axes
        self.grids = grid.grids
        self.power = tuple((grid.name, a) in POWER_AXES and bool(g[0] > 0) for a, g in zip(grid.axes, grid.grids))
        self.coords = tuple(np.log(g) if p else g for g, p in zip(grid.grids, self.power))
        self.seconds = grid.seconds
        self._coord_list = [c.tolist() for c in self.coords]
        self._seconds_list = np.asarray(grid.seconds, dtype=np.float64).tolist()
        lin = [i for i in range(len(self.axes)) if not self.power[i]]
        pw = [i for i in range(len(self.axes)) if self.power[i]]
        self._lin, self._pw = lin, pw
        # `point`'s corners: per power-axis offsets, the linear-axis offsets, each as offsets per axis
        self._corners = [(pc, [(lc, [(dict(zip(pw, pc)) | dict(zip(lin, lc)))[i] for i in range(len(self.axes))])
                               for lc in product((0, 1), repeat=len(lin))])
                         for pc in product((0, 1), repeat=len(pw))]

    def outside(self, i: int, x: np.ndarray) -> np.ndarray:
        """Points of axis i beyond its grid."""
        g = self.grids[i]
        return (x < g[0]) | (x > g[-1])

    def _locate(self, i: int, x: np.ndarray):
        """(segment index, weight of its upper point) per point; weight None on a one-point axis."""
        c = self.coords[i]
        if len(c) == 1:
            return np.zeros(x.shape, dtype=np.intp), None
        if self.power[i]:
            x = np.where(x > 0, np.log(np.maximum(x, 1e-300)), c[0])
        j = np.clip(np.searchsorted(c, x, side="right") - 1, 0, len(c) - 2)
        return j, (x - c[j]) / (c[j + 1] - c[j])

    def eval(self, *xs) -> np.ndarray:
        """Seconds at the points ``xs`` (one array or number per axis, broadcast together; at least
        one-dimensional)."""
        xs = np.broadcast_arrays(*[np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in xs])
        loc = [self._locate(i, x) for i, x in enumerate(xs)]
        lin = [i for i in range(len(xs)) if not self.power[i]]
        pw = [i for i in range(len(xs)) if self.power[i]]
        shape = xs[0].shape
        log_total = np.zeros(shape)
        for pc in product((0, 1), repeat=len(pw)):
            if any(o and loc[i][1] is None for o, i in zip(pc, pw)):
                continue
            value = np.zeros(shape)
            for lc in product((0, 1), repeat=len(lin)):
                if any(o and loc[i][1] is None for o, i in zip(lc, lin)):
                    continue
                weight = np.ones(shape)
                for o, i in zip(lc, lin):
                    w = loc[i][1]
                    if w is not None:
                        weight = weight * (w if o else 1.0 - w)
                offsets = dict(zip(pw, pc)) | dict(zip(lin, lc))
                value = value + weight * self.seconds[tuple(loc[i][0] + offsets[i] for i in range(len(xs)))]
            value = np.maximum(value, FLOOR_S)
            if not pw:
                return value
            pweight = np.ones(shape)
            for o, i in zip(pc, pw):
                w = loc[i][1]
                if w is not None:
                    pweight = pweight * (w if o else 1.0 - w)
            log_total = log_total + pweight * np.log(value)
        return np.exp(log_total)

    def point(self, *xs: float) -> float:
        """Seconds at one point (one number per axis), by the rule of `eval` in plain Python: the
        fast path for one prompt priced alone."""
        idx, wts = [], []
        for i, x in enumerate(xs):
            c = self._coord_list[i]
            if len(c) == 1:
                idx.append(0)
                wts.append(None)
                continue
            xc = (math.log(x) if x > 0 else c[0]) if self.power[i] else x
            j = min(max(bisect_right(c, xc) - 1, 0), len(c) - 2)
            idx.append(j)
            wts.append((xc - c[j]) / (c[j + 1] - c[j]))
        lin, pw = self._lin, self._pw
        log_total = 0.0
        for pc, corners in self._corners:
            if any(o and wts[i] is None for o, i in zip(pc, pw)):
                continue
            value = 0.0
            for lc, offsets in corners:
                if any(o and wts[i] is None for o, i in zip(lc, lin)):
                    continue
                weight = 1.0
                for o, i in zip(lc, lin):
                    if wts[i] is not None:
                        weight *= wts[i] if o else 1.0 - wts[i]
                v = self._seconds_list
                for j, o in zip(idx, offsets):
                    v = v[j + o]
                value += weight * v
            value = max(value, FLOOR_S)
            if not pw:
                return value
            pweight = 1.0
            for o, i in zip(pc, pw):
                if wts[i] is not None:
                    pweight *= wts[i] if o else 1.0 - wts[i]
            log_total += pweight * math.log(value)
        return math.exp(log_total)

    def line(self, free: str, **fixed: float) -> "Line":
        """The 1-D table along axis `free` with every other axis fixed at the given value."""
        i = self.axes.index(free)
        g = self.grids[i]
        points = [g if a == free else np.full(len(g), float(fixed[a])) for a in self.axes]
        outside = {a: bool(self.outside(k, np.asarray([float(fixed[a])]))[0])
                   for k, a in enumerate(self.axes) if a != free}
        return Line(self.name, free, g, self.eval(*points), outside, power=self.power[i])


class Line:
    """A 1-D table (a grid and seconds along it), the hot path of the profiled model.

    Per grid segment j, seconds = ``intercept[j] + slope[j] * x`` (at least `FLOOR_S`), or along a
    power axis ``exp(intercept[j] + slope[j] * log(x))``. `fixed_outside` says, for each axis fixed
    when the line was cut from a larger table, whether its value lay beyond that table's grid.
    """

    def __init__(self, name: str, axis: str, grid: np.ndarray, seconds: np.ndarray,
                 fixed_outside: dict[str, bool] | None = None, power: bool = False) -> None:
        self.name, self.axis = name, axis
        self.grid = grid
        self.lo, self.hi = float(grid[0]), float(grid[-1])
        self.power = bool(power and grid[0] > 0)
        self.seconds = np.asarray(seconds, dtype=np.float64)
        self.fixed_outside = fixed_outside or {}
        coord = np.log(grid) if self.power else grid
        y = np.log(self.seconds) if self.power else self.seconds
        self._inner = coord[1:-1]  # searchsorted on the inner points gives the segment, 0 .. n - 2
        if len(grid) > 1:
            self._slope = np.diff(y) / np.diff(coord)
            self._intercept = y[:-1] - self._slope * coord[:-1]

    @classmethod
    def of(cls, grid: Grid) -> "Line":
        return cls(grid.name, grid.axes[0], grid.grids[0], grid.seconds,
                   power=(grid.name, grid.axes[0]) in POWER_AXES)

    def eval(self, x: np.ndarray) -> np.ndarray:
        """Seconds at the points `x` (a 1-D float64 array; > 0 along a power axis)."""
        if len(self.grid) == 1:
            return np.full(x.shape, float(self.seconds[0]))
        if self.power:
            xc = np.log(x)
            j = np.searchsorted(self._inner, xc, side="right")
            return np.exp(self._intercept[j] + self._slope[j] * xc)
        j = np.searchsorted(self._inner, x, side="right")
        return np.maximum(self._intercept[j] + self._slope[j] * x, FLOOR_S)

    def outside(self, x: np.ndarray) -> np.ndarray:
        return (x < self.lo) | (x > self.hi)


class Plane:
    """A 2-D table with two straight-line axes, the hot path of a graph step priced by its longest
    row: per grid cell (i, j), seconds = ``a + b x + c y + d x y`` (bilinear; at least `FLOOR_S`),
    which is `Table.eval`'s rule on such a table, inside the grid and beyond it."""

    def __init__(self, name: str, gx: np.ndarray, gy: np.ndarray, seconds: np.ndarray) -> None:
        self.name = name
        s = np.asarray(seconds, dtype=np.float64)
        gx, gy = np.asarray(gx, np.float64), np.asarray(gy, np.float64)
        if len(gx) == 1:  # constant along a one-point axis
            gx, s = np.array([gx[0], gx[0] + 1.0]), np.concatenate([s, s], axis=0)
        if len(gy) == 1:
            gy, s = np.array([gy[0], gy[0] + 1.0]), np.concatenate([s, s], axis=1)
        x0, x1, y0, y1 = gx[:-1, None], gx[1:, None], gy[None, :-1], gy[None, 1:]
        s00, s10, s01, s11 = s[:-1, :-1], s[1:, :-1], s[:-1, 1:], s[1:, 1:]
        area = (x1 - x0) * (y1 - y0)
        # s(x, y) = [s00 (x1-x)(y1-y) + s10 (x-x0)(y1-y) + s01 (x1-x)(y-y0) + s11 (x-x0)(y-y0)] / area
        self._d = (s00 - s10 - s01 + s11) / area
        self._b = (-s00 * y1 + s10 * y1 + s01 * y0 - s11 * y0) / area
        self._c = (-s00 * x1 + s10 * x0 + s01 * x1 - s11 * x0) / area
        self._a = (s00 * x1 * y1 - s10 * x0 * y1 - s01 * x1 * y0 + s11 * x0 * y0) / area
        self._inner_x, self._inner_y = np.asarray(gx[1:-1], np.float64), np.asarray(gy[1:-1], np.float64)
        self._ix, self._iy = self._inner_x.tolist(), self._inner_y.tolist()
        self._coef = [[(float(self._a[i, j]), float(self._b[i, j]), float(self._c[i, j]), float(self._d[i, j]))
                       for j in range(self._a.shape[1])] for i in range(self._a.shape[0])]

    def eval(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Seconds at the points (`x`, `y`) (1-D float64 arrays of one length)."""
        i = np.searchsorted(self._inner_x, x, side="right")
        j = np.searchsorted(self._inner_y, y, side="right")
        return np.maximum(self._a[i, j] + self._b[i, j] * x + self._c[i, j] * y + self._d[i, j] * x * y, FLOOR_S)

    def point(self, x: float, y: float) -> float:
        """`eval` at one point in plain Python: the same operations in the same order, so the same
        seconds bit for bit."""
        a, b, c, d = self._coef[bisect_right(self._ix, x)][bisect_right(self._iy, y)]
        return max(a + b * x + c * y + d * x * y, FLOOR_S)

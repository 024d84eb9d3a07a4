"""Profiled cost model: step times interpolated from a GPU profile ("blocksim-profile/1").

The profile (`blocksim.cost.profile_file`) holds, per component, seconds measured on a grid for the
whole model at the run's tensor-parallel degree. A step is priced from the tables as follows; the
engine's columns `t_<component>_s` hold:

* ``t_linear_s``: everything but attention, swaps and copies: ``linear(tokens) + cache_write(tokens)
  + sample(sequences)``, where tokens = prefill tokens + decoding sequences and sequences = those
  that sample a token: every decoding sequence and each prompt (or chunk) reaching its end. A decode-only step whose
  batch fits a captured CUDA graph runs the graph at the padded batch size (the smallest of
  ``cuda_graph_batch_sizes`` >= the batch): the linear part reads ``graph_seconds`` at that size
  (eager seconds when the profile has no graph timings). Decode-only means no prompt and no block
  move (swap or copy) in the step, as the executor replays graphs; larger decode batches, steps
  with a prompt and steps that move blocks run eager.
* ``t_attn_prefill_s``: a prompt (or chunk) of ``p`` new tokens after ``c`` cached ones alone is
  ``attn_prefill(1, p, c)``; a step of ``P > 1`` prompts adds up ``attn_prefill(B_i, p_i, c_i) / B_i``,
  each prompt at the batch ``B_i`` of its own shape lasting as long as all the prompts alone in turn
  (``sum_j attn_prefill(1, j) / attn_prefill(1, i)``, at most the grid's largest batch or ``P``):
  exact for a uniform batch, and a short chunk beside a long prompt costs what it adds to a full GPU.
  Where the profile measured the mma.sync prefill kernel and its blocks fit one wave at two per SM,
  the step lasts at least its longest prompt alone times its busiest SM over that prompt's own
  (`blocksim.cost.placement`: two long blocks on one SM run side by side, each slower); and a
  prompt alone between the grid's new-token points where its blocks go from one to two an SM is
  priced by the cells' seconds per key of their busiest SM times its own busiest SM.
* ``t_attn_decode_s``: ``attn_decode(batch, mean context)``; with the optional
  ``decode_step_longest`` table, an eager step adds the seconds that table gives a batch of that
  many rows whose longest row holds the step's longest context beyond the same tokens spread
  evenly (the fast decode kernel's rows run side by side, so an uneven batch lasts longer than its
  mean context says; held at the table's edges). For a graph-replayed decode-only step
  of a profile with the optional ``decode_step`` table (a whole decode step replayed as a graph),
  the step's GPU time is ``decode_step(padded batch, mean context)`` and this column holds it less
  ``t_linear_s`` (at least zero), so the two sum to the measured whole step. With the optional
  ``decode_step_shared`` table, a graph step whose rows read blocks an earlier row reads too (the
  prompt a request's samples share) saves ``(1 - paired / own) * min(1, f / f_table)`` of the step
  of equal rows at its padded batch and mean context, ``f`` the share of its context tokens in
  shared blocks: the bytes the shared blocks save, which a longer longest row does not change
  (an eager step is priced without it). With the optional ``decode_step_padded`` table, a graph
  step of ``b`` real rows in a graph of ``pad > b`` rows lasts that price times the table's ratio
  of a padded step to its spread twin at ``(pad, b / pad, mean context)``: the same tokens on the
  real rows, the padding rows holding
  one token each, against the same tokens spread over all the rows, as the ``decode_step_longest``
  table is measured. Between the table's largest fraction of real rows and a full batch the ratio
  goes to 1; beyond the grid's batches, fractions and contexts it is held at the edge (and the
  steps counted), never extrapolated.
* ``t_swap_s``: ``swap_in(blocks in) + swap_out(blocks out)``; ``t_copy_s``: ``copy(blocks)``.
  Block counts are converted to the profile's block size (a run with blocks twice as large moves
  twice as many of the profile's blocks).
* ``t_overhead_s``: the profile's fixed per-step cost when the step runs anything, ``graph_s`` for
  a graph-replayed decode step, else the eager step's: the median of the profile's
  ``eager_cases_s`` (whole eager steps less the sum of their components), negative where the
  components timed alone add up to more than the whole step (each timed alone pays a start the
  whole step pays once); ``eager_s`` for a profile without the cases.
* ``t_comm_s`` (tensor_parallel > 1 only): ``2 * layers`` all-reduces of ``tokens * hidden *
  dtype_bytes`` bytes each (attention output and MLP output, Megatron-style), each priced by the
  profile's ``allreduce`` table by message bytes when it has one, else by the roofline's ring
  formula (`blocksim.cost.roofline`) from the catalog's GPU link. The ``decode_step`` table of a
  tensor-parallel profile is a whole step with its all-reduces: ``t_attn_decode_s`` then holds it
  less ``t_linear_s`` and ``t_comm_s``.

Interpolation and extrapolation follow `blocksim.cost.interpolate` (piecewise-linear in seconds,
a power law along prefill attention's new tokens). Steps whose size lies outside a table's grid are
extrapolated and counted per component and axis; `report` (called once at the end of a run) warns
with the counts and returns them for summary.json.

Speed: one-axis lines are cut from the tables once per batch size and cached, scalar components
are memoized, and a span of decode steps is priced in one vectorized call; stepping one by one
calls the same vectorized code on one-element arrays, so both give identical times.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from blocksim.config import SimConfig
from blocksim.cost import placement
from blocksim.cost.interpolate import Line, Plane, Table
from blocksim.cost.profile_file import Grid, Profile, ProfileWarning
from blocksim.cost.roofline import ALLREDUCES_PER_LAYER, RooflineCostModel

if TYPE_CHECKING:
    import pandas as pd


#: Prompts of a step up to which its prefill attention is priced in plain Python (`Table.point`): two
#: prompts take 0.12 ms so against 0.26 ms over arrays, eight 0.3 ms against 0.27 ms.
FEW_PROMPTS = 6
#: Cached tokens from which one prompt between the prefill grid's one- and two-blocks-an-SM points is
#: priced per key of its busiest SM (`ProfiledCostModel._per_key_table`): the least cached count
#: `placement.share_of` reads the share at.
PER_KEY_CACHED = placement.MIN_CACHED


class ProfiledCostModel:
    """Prices steps from a measured `Profile`; refuses one measured for another model, GPU, dtype or TP."""

    name = "profiled"

    def __init__(self, config: SimConfig, profile: Profile) -> None:
        profile.check_matches(config)
        self.profile = profile
        self.block_ratio = config.cache.block_size / profile.block_size
        t = profile.tables
        self.linear_eager = Line.of(t["linear"])
        self.linear_graph = Line.of(profile.linear_graph) if profile.linear_graph is not None else None
        self.cache_write = Line.of(t["cache_write"])
        self.sample = Line.of(t["sample"])
        self.swap_in_line, self.swap_out_line, self.copy_line = (Line.of(t[k]) for k in ("swap_in", "swap_out", "copy"))
        self.prefill = Table(t["attn_prefill"])
        self._prefill_range = [(float(g[0]), float(g[-1])) for g in self.prefill.grids]
        self.placement = self._placement(config, profile)
        self._per_key = self._per_key_table() if self.placement is not None else None
        self.decode = Table(t["attn_decode"])
        self.decode_step = Table(t["decode_step"]) if "decode_step" in t else None
        self.decode_longest = Table(t["decode_step_longest"]) if "decode_step_longest" in t else None
        #: Whether a graph-replayed decode step is priced by its longest row too: callers then pass
        #: `longest` to `attn_decode` and count its steps with `count_longest`.
        self.prices_longest_row = self.decode_longest is not None
        #: Whether a graph-replayed decode step whose rows read blocks another row also reads (the
        #: shared prompt of a request's samples) is priced for it: callers then pass `shared`.
        self.prices_shared_rows = self.decode_longest is not None and "decode_step_shared" in t
        if self.prices_shared_rows:
            paired = t["decode_step_shared"]
            self._shared_ratio = Table(Grid("decode_step_shared_ratio", paired.axes, paired.grids,
                                            paired.seconds / t["decode_step_shared_own"].seconds))
            self._shared_fraction = Table(t["decode_step_shared_fraction"])
        self._longest_planes: dict = {}
        unread = [k for k in ("decode_step_shared", "decode_step_padded") if k in t and self.decode_longest is None]
        if unread:
            warnings.warn(f"cost profile {profile.path}: {', '.join(unread)} read only beside decode_step_longest, "
                          f"which the profile lacks: priced without it; profile the device again (blocksim profile)",
                          ProfileWarning, stacklevel=3)
        #: Whether a graph-replayed decode step with padding rows is priced for them (the
        #: ``decode_step_padded`` table, over its spread twin).
        self.prices_padding = self.decode_longest is not None and "decode_step_padded" in t
        if self.prices_padding:
            pt = t["decode_step_padded"]
            ratio = pt.seconds / t["decode_step_padded_spread"].seconds
            # the fraction of real rows closed at 1: a batch without padding rows is its own twin
            real = np.append(pt.grids[1], 1.0)
            ratio = np.concatenate([ratio, np.ones_like(ratio[:, :1])], axis=1)
            self._padding = Table(Grid("decode_step_padded_ratio", pt.axes, (pt.grids[0], real, pt.grids[2]), ratio))
            self._padding_planes: dict = {}
        self.graph_sizes = np.asarray(profile.cuda_graph_batch_sizes, dtype=np.int64)
        self.max_graph = int(self.graph_sizes[-1]) if len(self.graph_sizes) else 0
        self._pad = [None] + [int(self.graph_sizes[np.searchsorted(self.graph_sizes, b)])
                              for b in range(1, self.max_graph + 1)]
        m = config.model
        self.allreduces_per_step = ALLREDUCES_PER_LAYER * m.num_layers if config.tensor_parallel > 1 else 0
        self.allreduce_bytes_per_token = m.hidden_size * m.dtype_bytes
        self.allreduce_line = Line.of(t["allreduce"]) if "allreduce" in t else None
        self._ring = RooflineCostModel(config) if self.allreduces_per_step and self.allreduce_line is None else None
        self._memo: dict = {}
        self._lines: dict = {}
        self.step_outside: Counter = Counter()  # counted as single steps are priced (never in a span)

    @staticmethod
    def _placement(config: SimConfig, profile: Profile) -> tuple | None:
        """(query heads, KV heads, head size, SMs, share) of the prefill kernel's blocks on one GPU
        (`blocksim.cost.placement`), where the profile measured the mma.sync kernel, its SMs are
        known (the profile's ``num_sms``, else the catalog GPU's) and its batch cells give the share;
        None otherwise."""
        sms = int(profile.header.get("num_sms") or config.gpu.num_sms)
        g = profile.tables["attn_prefill"]
        if profile.header.get("prefill_attention") != "kernel" or not sms:
            return None
        m, tp = config.model, config.tensor_parallel
        if m.head_size > 128:  # other tiles, one block an SM at a time (`blocksim.cost.placement`)
            return None
        shape = (m.num_heads // tp, max(1, m.num_kv_heads // tp), m.head_size, sms)
        share = placement.share_of(g.grids[0], g.grids[1], g.grids[2], g.seconds, *shape)
        return None if share is None else (*shape, share)

    def _per_key_table(self) -> tuple[float, float, Table, float] | None:
        """(first, last, table, most cached) where one prompt's new tokens go from a
        grid point whose blocks sit one to an SM to the next, whose blocks sit two to an SM: the
        table holds each cell's seconds over its busiest SM (`placement.busiest`) at those two
        points and every cached count; it prices from `PER_KEY_CACHED` cached tokens (below, a
        prompt's blocks walk too few keys for their start to be negligible) to the grid's most,
        where it is held. None where the grid has no such pair."""
        heads, kv, head, sms, share = self.placement
        g = self.prefill.grids
        for a, b in zip(g[1][:-1], g[1][1:]):
            one, two = (placement.live_blocks([int(x)], heads, kv, head, sms) for x in (a, b))
            if one <= sms < two <= 2 * sms:
                j = int(np.searchsorted(g[1], a))
                rows = [[self.prefill.seconds[0, j + k, i]
                         / placement.busiest([int(x)], [int(c)], heads, kv, head, sms, share)
                         for i, c in enumerate(g[2])] for k, x in enumerate((a, b))]
                return (float(a), float(b), Table(Grid("attn_prefill_per_key", ("new_tokens", "cached_tokens"),
                                                       (np.asarray([a, b], np.float64), g[2]), np.asarray(rows))),
                        float(g[2][-1]))
        return None

    def _alone(self, p: float, c: float) -> float:
        """One prompt of `p` new tokens after `c` cached alone: the table at batch 1, or, between
        the grid's points where its blocks go from one to two an SM (`_per_key_table`), the
        seconds per busiest-SM key there times its own busiest SM."""
        if self._per_key is not None and self._per_key[0] < p < self._per_key[1] and c >= PER_KEY_CACHED:
            heads, kv, head, sms, share = self.placement
            held = min(c, self._per_key[3])  # seconds per key held at the grid's edge, never extrapolated
            return self._per_key[2].point(p, held) * placement.busiest([int(p)], [int(c)], heads, kv, head, sms,
                                                                      share)
        return self.prefill.point(1.0, p, c)

    # --- helpers ---------------------------------------------------------------------------------
    def padded(self, batch: int) -> int | None:
        """The captured CUDA-graph batch size a decode-only batch replays at, None when it runs eager."""
        if batch > self.max_graph or batch <= 0:
            return None
        return self._pad[batch]

    @staticmethod
    def _one(line: Line, x: float) -> float:
        return float(line.eval(np.array([x], dtype=np.float64))[0])

    def _decode_line(self, batch: int, decode_only: bool) -> tuple[Line, bool]:
        """(line along the context, whole_step) for a decode batch: the decode_step table at the padded
        size for a graph-replayed step when the profile has it, else attention at the batch."""
        key = (batch, decode_only)
        hit = self._lines.get(key)
        if hit is None:
            pad = self.padded(batch) if decode_only else None
            if pad is not None and self.decode_step is not None:
                hit = (self.decode_step.line("context", batch=pad), True)
            else:
                hit = (self.decode.line("context", batch=batch), False)
            self._lines[key] = hit
        return hit

    # --- components --------------------------------------------------------------------------------
    def linear(self, tokens: int, sequences: int = 0, decode_only: bool = False) -> float:
        """Everything but attention, swaps and copies for `tokens` tokens of which `sequences` sample.

        A step that is not decode-only is priced here once (never in a span), so its sampling
        outside the grid is counted here; decode-only steps are counted from the records."""
        key = ("linear", tokens, sequences, decode_only)
        hit = self._memo.get(key)
        if hit is None:
            if tokens <= 0:
                t = 0.0
            else:
                pad = self.padded(tokens) if decode_only else None
                if pad is not None and self.linear_graph is not None:
                    t = self._one(self.linear_graph, pad)
                else:
                    t = self._one(self.linear_eager, tokens)
                t += self._one(self.cache_write, tokens)
                if sequences > 0:
                    t += self._one(self.sample, sequences)
            hit = (t, sequences > 0 and bool(self.sample.outside(np.array([float(sequences)]))[0]))
            self._memo[key] = hit
        if hit[1] and not decode_only:
            self.step_outside["sample.sequences"] += 1
        return hit[0]

    def attn_prefill(self, new_tokens, cached_tokens=None) -> float:
        """Prefill attention of the step's prompts (chunks): `new_tokens[i]` after `cached_tokens[i]`."""
        n = len(new_tokens)
        if n == 0:
            return 0.0
        tab = self.prefill
        if n == 1:  # most prompt steps: plain Python
            pv = float(new_tokens[0])
            cv = 0.0 if cached_tokens is None else float(cached_tokens[0])
            key = ("prefill", pv, cv)
            hit = self._memo.get(key)
            if hit is None:
                hit = (self._alone(pv, cv), tuple(a for a, (lo, hi), v in zip(tab.axes, self._prefill_range,
                                                                                   (1.0, pv, cv)) if not lo <= v <= hi))
                self._memo[key] = hit
        elif n <= FEW_PROMPTS:  # a few prompts: plain Python too (`Table.point`), as numpy's start outweighs the work
            p = [float(x) for x in new_tokens]
            c = [0.0] * n if cached_tokens is None else [float(x) for x in cached_tokens]
            # each prompt at the batch of its own shape that would last as long as the whole batch
            # alone: n for n equal prompts (the table's own batch), more for a prompt far shorter
            # than the rest, whose thread blocks run alongside theirs (capped at the grid or n)
            alone = [max(self._alone(x, y), 1e-12) for x, y in zip(p, c)]
            total, cap = sum(alone), max(float(n), float(tab.grids[0][-1]))
            base = 0.0
            for a, x, y in zip(alone, p, c):
                b = min(total / a, cap)
                base += tab.point(b, x, y) / b
            base = max(base, max(alone))  # no launch ends before its longest prompt alone would
            if self.placement is not None:
                base = max(base, self._placed(p, c, alone))
            (b_lo, b_hi), (p_lo, p_hi), (c_lo, c_hi) = self._prefill_range
            hit = (base, tuple(a for a, out in zip(tab.axes, (not b_lo <= 1.0 <= b_hi or not b_lo <= n <= b_hi,
                                                              min(p) < p_lo or max(p) > p_hi,
                                                              min(c) < c_lo or max(c) > c_hi)) if out))
        else:  # many prompts: the same rule over arrays
            p = np.asarray(new_tokens, dtype=np.float64)
            c = np.zeros_like(p) if cached_tokens is None else np.asarray(cached_tokens, dtype=np.float64)
            alone = np.maximum(tab.eval(1.0, p, c), 1e-12)
            if self._per_key is not None:
                lo, hi = self._per_key[:2]
                for k in np.nonzero((p > lo) & (p < hi) & (c >= PER_KEY_CACHED))[0]:
                    alone[k] = max(self._alone(float(p[k]), float(c[k])), 1e-12)
            batch = np.minimum(alone.sum() / alone, max(float(n), float(tab.grids[0][-1])))
            base = float(np.sum(tab.eval(batch, p, c) / batch))
            base = max(base, float(alone.max()))
            if self.placement is not None:
                base = max(base, self._placed(p.tolist(), c.tolist(), alone.tolist()))
            hit = (base, tuple(a for a, vals in zip(tab.axes, (np.asarray([1.0, n]), p, c))
                               if tab.outside(tab.axes.index(a), vals).any()))
        for axis in hit[1]:
            self.step_outside[f"attn_prefill.{axis}"] += 1
        return hit[0]

    def _placed(self, p: list[float], c: list[float], alone: list[float]) -> float:
        """The prompts' prefill attention as placed on the SMs (`blocksim.cost.placement`): the
        longest prompt alone, times the busiest SM's keys over its own busiest SM's; 0 where the
        blocks are more than two to an SM (the table's batch cells price their waves)."""
        heads, kv, head, sms, share = self.placement
        live = [k for k, x in enumerate(p) if x > 0]
        if not live or placement.live_blocks([p[k] for k in live], heads, kv, head, sms) > 2 * sms:
            return 0.0
        i = max(live, key=lambda k: alone[k])
        one = placement.busiest(p[i:i + 1], c[i:i + 1], heads, kv, head, sms, share)
        return alone[i] * placement.busiest(p, c, heads, kv, head, sms, share) / one

    def _longest_plane(self, pad: int) -> Plane:
        """`decode_step_longest` at the padded batch `pad`: a plane over (context, longest)."""
        hit = self._longest_planes.get(pad)
        if hit is None:
            tab = self.decode_longest
            c, x = tab.grids[1], tab.grids[2]
            cc, xx = np.meshgrid(c, x, indexing="ij")
            hit = self._longest_planes[pad] = Plane(tab.name, c, x, tab.eval(float(pad), cc, xx))
        return hit

    def _padding_plane(self, pad: int) -> Plane:
        """The ``decode_step_padded`` ratio at the padded batch `pad` (held at the grid's nearest
        batch beyond it): a plane over (fraction of real rows, context)."""
        hit = self._padding_planes.get(pad)
        if hit is None:
            tab = self._padding
            b = min(max(float(pad), tab.grids[0][0]), tab.grids[0][-1])
            f, c = tab.grids[1], tab.grids[2]
            ff, cc = np.meshgrid(f, c, indexing="ij")
            hit = self._padding_planes[pad] = Plane(tab.name, f, c, tab.eval(b, ff, cc))
        return hit

    def _padding_factor(self, batch: int, pad: int, mean):
        """A graph step's time over its spread twin's, for `batch` real rows of a graph of `pad`
        rows at mean contexts `mean` (over the padded rows; a float, or an array): 1 without padding
        rows, else the ``decode_step_padded`` ratio, held at the grid's edges (never extrapolated)."""
        tab = self._padding
        real = min(max(batch / pad, float(tab.grids[1][0])), 1.0)
        lo, hi = float(tab.grids[2][0]), float(tab.grids[2][-1])
        plane = self._padding_plane(pad)
        if isinstance(mean, np.ndarray):
            return plane.eval(np.full(mean.shape, real), np.clip(mean, lo, hi))
        return plane.point(real, min(max(mean, lo), hi))

    def attn_decode(self, ctx_tokens, batch: int = 0, decode_only: bool = False, longest=None, shared=0):
        """Decode attention of `batch` sequences holding `ctx_tokens` context tokens in all (an int,
        or an int array for a span of steps: then an array of seconds). `longest`: the longest
        sequence's context (an int, or an array like `ctx_tokens`), read by a profile with the
        ``decode_step_longest`` table: a graph-replayed step is priced from it, an eager one adds
        the table's seconds for an uneven batch to its attention (`_uneven_extra`). `shared`: of
        those tokens, the ones a row reads from blocks an earlier row of the step also reads (an
        int, constant over a span), read by a profile with the ``decode_step_shared`` table for a
        graph-replayed step."""
        if batch <= 0:
            return np.zeros(len(ctx_tokens)) if isinstance(ctx_tokens, np.ndarray) else 0.0
        scalar = not isinstance(ctx_tokens, np.ndarray)
        pad = self.padded(batch) if decode_only and longest is not None and self.decode_longest is not None else None
        if pad is not None and scalar and not shared:  # plain Python, the same operations as the array path below
            mean = ctx_tokens / pad
            t = self._longest_plane(pad).point(mean, max(longest / mean, 1.0))
            if batch < pad and self.prices_padding:
                t = t * self._padding_factor(batch, pad, mean)
            return max(t - self._step_rest(batch), 0.0)
        ctx = np.array([ctx_tokens], dtype=np.int64) if scalar else ctx_tokens.astype(np.int64, copy=False)
        if pad is not None:
            mean = ctx / pad  # the padding rows count as rows of no context
            t = self._longest_plane(pad).eval(mean, np.maximum(np.asarray(longest, np.float64) / mean, 1.0))
            if shared and self.prices_shared_rows:  # the bytes the shared blocks save, as at equal rows
                equal = self._longest_plane(pad).eval(mean, np.ones_like(mean))
                t = t - (1.0 - self._shared_factor(pad, mean, shared / np.maximum(ctx, 1))) * equal
            if batch < pad and self.prices_padding:
                t = t * self._padding_factor(batch, pad, mean)
            whole = True
        else:
            line, whole = self._decode_line(batch, decode_only)
            t = line.eval(ctx / batch)
            if longest is not None and not whole and self.decode_longest is not None:  # an eager step's rows
                t = t + (self._uneven_extra(batch, ctx_tokens / batch, float(longest)) if scalar else
                         self._uneven_extra(batch, ctx / batch, np.asarray(longest, np.float64)))
        if whole:
            t = np.maximum(t - self._step_rest(batch), 0.0)
        return float(t[0]) if scalar else t

    def _uneven_extra(self, batch: int, mean: np.ndarray, longest: np.ndarray) -> np.ndarray:
        """Seconds an eager decode batch of `batch` rows, `mean` context tokens a row and its longest
        row holding `longest`, takes beyond the same tokens spread evenly: ``decode_step_longest``'s
        difference between the two at that many rows (the attention's share of the step: the linear
        part does not depend on how the context is spread). Batch and mean context are held at the
        table's edges and the longest row over the mean at its largest ratio (`count_longest` counts
        the steps beyond it), never extrapolated. One step (floats) in plain Python, the same
        operations as for a span's arrays."""
        tab = self.decode_longest
        g_b, g_c, top = tab.grids[0], tab.grids[1], tab.grids[2][-1]
        plane = self._longest_plane(int(min(max(batch, g_b[0]), g_b[-1])))
        if not isinstance(mean, np.ndarray):
            m = min(max(mean, g_c[0]), g_c[-1])
            x = min(max(longest / max(mean, 1e-9), 1.0), top)
            return max(plane.point(m, x) - plane.point(m, 1.0), 0.0)
        m = np.clip(mean, g_c[0], g_c[-1])
        x = np.clip(longest / np.maximum(mean, 1e-9), 1.0, top)
        return np.maximum(plane.eval(m, x) - plane.eval(m, np.ones_like(m)), 0.0)

    def _shared_factor(self, pad: int, mean: np.ndarray, fraction: np.ndarray) -> np.ndarray:
        """A graph step's time over its time with no row sharing blocks, where `fraction` of its
        context tokens are read from blocks an earlier row also reads: linear in the fraction, from 1
        at none to the ``decode_step_shared`` table's paired-over-own ratio at its pairs' fraction
        (and no further)."""
        ratio = self._shared_ratio.eval(float(pad), mean)
        frac = self._shared_fraction.eval(float(pad), mean)
        return 1.0 - (1.0 - ratio) * np.minimum(fraction / frac, 1.0)

    def _step_rest(self, batch: int) -> float:
        """What a whole graph step of `batch` sequences holds besides its decode attention: the
        linear part and, at tensor_parallel > 1, the all-reduces."""
        rest = self.linear(batch, batch, True)
        if self.allreduces_per_step:
            rest += self.comm(batch)
        return rest

    def count_longest(self, ctx_tokens, batch: int, longest, graph: bool = True) -> None:
        """Count the steps (`ctx_tokens`, `longest` per step, int arrays or ints, of a `batch` of
        decoding sequences) whose longest row over the mean lies beyond ``decode_step_longest``'s
        grid: the step records hold neither, so the engine counts them as it records the steps. The
        mean is over the padded rows of a graph-replayed step (`graph`, where a graph holds the
        batch), else over the batch (an eager step's uneven rows, `attn_decode`)."""
        if self.decode_longest is None or batch <= 0:
            return
        rows = (self.padded(batch) if graph else None) or batch
        ratio = np.asarray(longest, np.float64) * rows / np.maximum(np.asarray(ctx_tokens, np.float64), 1.0)
        n = int(np.count_nonzero(ratio > self.decode_longest.grids[2][-1]))
        if n:
            self.step_outside["decode_step_longest.longest"] += n

    def swap(self, blocks_in: int, blocks_out: int = 0) -> float:
        key = ("swap", blocks_in, blocks_out)
        t = self._memo.get(key)
        if t is None:
            t = 0.0
            if blocks_in > 0:
                t += self._one(self.swap_in_line, blocks_in * self.block_ratio)
            if blocks_out > 0:
                t += self._one(self.swap_out_line, blocks_out * self.block_ratio)
            self._memo[key] = t
        return t

    def copy(self, blocks: int) -> float:
        key = ("copy", blocks)
        t = self._memo.get(key)
        if t is None:
            t = self._one(self.copy_line, blocks * self.block_ratio) if blocks > 0 else 0.0
            self._memo[key] = t
        return t

    def comm(self, tokens: int) -> float:
        """The step's tensor-parallel all-reduces for `tokens` tokens (0 at tensor_parallel 1)."""
        if tokens <= 0 or not self.allreduces_per_step:
            return 0.0
        key = ("comm", tokens)
        t = self._memo.get(key)
        if t is None:
            nbytes = tokens * self.allreduce_bytes_per_token
            if self.allreduce_line is not None:
                one = self._one(self.allreduce_line, nbytes)
            else:
                one = self._ring.allreduce(nbytes)
            t = self._memo[key] = self.allreduces_per_step * one
        return t

    def overhead(self, active: bool, decode_batch: int = 0) -> float:
        """The fixed per-step cost; `decode_batch` is the batch of a decode-only step (0 with a prompt)."""
        if not active:
            return 0.0
        return self.profile.overhead_graph_s if self.padded(decode_batch) is not None else self.profile.overhead_eager_s

    # --- end of run --------------------------------------------------------------------------------
    def extrapolated(self, steps: pd.DataFrame | dict[str, np.ndarray]) -> Counter:
        """Steps priced outside a table's grid, per ``component.axis``, from a run's step records
        (a frame, or its `report_columns` as arrays; prefill attention, and the sampling of steps
        that are not decode-only, counted as their steps were priced)."""
        out = Counter(self.step_outside)
        P = np.asarray(steps["num_prefill_seqs"], np.int64)
        if not len(P):
            return out
        D = np.asarray(steps["num_decode_seqs"], np.int64)
        T = np.asarray(steps["prefill_tokens"], np.int64) + D
        C = np.asarray(steps["decode_ctx_tokens"], np.int64)
        moves = (np.asarray(steps["blocks_swapped_in"], np.int64) + np.asarray(steps["blocks_swapped_out"], np.int64)
                 + np.asarray(steps["blocks_copied"], np.int64))
        decode_only = (P == 0) & (D > 0) & (moves == 0)
        graph = decode_only & (D <= self.max_graph)
        if len(self.graph_sizes):
            pad = np.where(graph, self.graph_sizes[np.minimum(np.searchsorted(self.graph_sizes, D),
                                                              len(self.graph_sizes) - 1)], 0)
        else:
            pad = np.zeros_like(D)

        def add(key: str, mask: np.ndarray) -> None:
            n = int(mask.sum())
            if n:
                out[key] += n

        g_lin = graph if self.linear_graph is not None else np.zeros_like(graph)
        add("linear.tokens", (T > 0) & ~g_lin & self.linear_eager.outside(T))
        if self.linear_graph is not None:
            add("linear.graph_tokens", g_lin & self.linear_graph.outside(pad))
        add("cache_write.tokens", (T > 0) & self.cache_write.outside(T))
        add("sample.sequences", decode_only & self.sample.outside(D))
        mean_ctx = np.where(D > 0, C / np.maximum(D, 1), 0.0)
        whole = graph if self.decode_step is not None or self.decode_longest is not None else np.zeros_like(graph)
        dec = (D > 0) & ~whole
        add("attn_decode.batch", dec & self.decode.outside(0, D))
        add("attn_decode.context", dec & self.decode.outside(1, mean_ctx))
        if self.decode_longest is not None:  # its context: the mean over the padded rows
            add("decode_step_longest.batch", whole & self.decode_longest.outside(0, pad))
            add("decode_step_longest.context", whole & self.decode_longest.outside(1, C / np.maximum(pad, 1)))
            if self.prices_padding:  # padded graph steps whose ratio is held at the grid's edge
                padded = whole & (D < pad)
                add("decode_step_padded.batch", padded & self._padding.outside(0, pad))
                add("decode_step_padded.real", padded & (D / np.maximum(pad, 1) < self._padding.grids[1][0]))
                add("decode_step_padded.context", padded & self._padding.outside(2, C / np.maximum(pad, 1)))
        elif self.decode_step is not None:
            add("decode_step.batch", whole & self.decode_step.outside(0, pad))
            add("decode_step.context", whole & self.decode_step.outside(1, mean_ctx))
        for col, line in (("blocks_swapped_in", self.swap_in_line), ("blocks_swapped_out", self.swap_out_line),
                          ("blocks_copied", self.copy_line)):
            b = np.asarray(steps[col], np.int64)
            add(f"{line.name}.blocks", (b > 0) & line.outside(b * self.block_ratio))
        if self.allreduces_per_step and self.allreduce_line is not None:
            add("allreduce.bytes", (T > 0) & self.allreduce_line.outside(T * self.allreduce_bytes_per_token))
        return out

    def describe(self) -> dict:
        h = self.profile.header
        rec = {"name": self.name, "profile": self.profile.path, "device": h.get("device"),
               "created_utc": h.get("created_utc"), "block_size_ratio": self.block_ratio,
               "tables_measured": dict(sorted(self.profile.tables_measured.items()))}
        # the optional tables that price a graph-replayed decode step
        graph = ["decode_step_longest"] if self.decode_longest is not None else (
            ["decode_step"] if self.decode_step is not None else [])
        graph += ["decode_step_shared"] * self.prices_shared_rows + ["decode_step_padded"] * self.prices_padding
        rec["graph_step_tables"] = graph
        cal = h.get("calibrated")
        if isinstance(cal, dict):  # `blocksim profile --calibrate`: the base's tables scaled to a device
            rec["calibrated"] = {"device": cal.get("device"), "utc": cal.get("utc"),
                                 "scales": {k: v.get("scale") for k, v in (cal.get("tables") or {}).items()
                                            if isinstance(v, dict)}}
        if self.allreduces_per_step:
            rec["allreduce"] = "profile" if self.allreduce_line is not None else "roofline ring formula"
        return rec

    #: The step columns `report` reads (`extrapolated`).
    report_columns = ("num_prefill_seqs", "prefill_tokens", "num_decode_seqs", "decode_ctx_tokens",
                      "blocks_swapped_in", "blocks_swapped_out", "blocks_copied")

    def report(self, steps: pd.DataFrame | dict[str, np.ndarray]) -> dict:
        """summary.json's record of the cost model; warns once when steps left the profiled grid."""
        counts = self.extrapolated(steps)
        rec = self.describe()
        rec["extrapolated_steps"] = dict(sorted(counts.items()))
        if counts:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
            warnings.warn(f"cost profile {self.profile.path}: steps extrapolated beyond its grid (of "
                          f"{len(steps['num_prefill_seqs'])} "
                          f"steps), per component.axis: {parts}", ProfileWarning, stacklevel=2)
        return rec

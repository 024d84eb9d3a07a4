"""One step's duration by component, priced by a cost model: the one rule that the engine
(`blocksim.engine.Engine`), the re-pricing of an executed run's plan (`analysis.fidelity.reprice_plan`)
and the benchmarks that price synthetic steps share, so that a step is priced alike wherever it is
priced."""

from __future__ import annotations

from typing import Callable

import numpy as np


def decode_attention(cost, ctx, n: int, decode_only: bool, longest=None, shared: int = 0):
    """`cost.attn_decode` of `n` decoding rows holding `ctx` context tokens (ints, or arrays over a
    span's steps): with the longest row where the model prices it (`longest` not None), and the
    shared tokens where it prices those too (`shared`, passed only when there are some)."""
    if not n or longest is None:
        return cost.attn_decode(ctx, n, decode_only)
    if shared:
        return cost.attn_decode(ctx, n, decode_only, longest, shared)
    return cost.attn_decode(ctx, n, decode_only, longest)


def step_times(cost, new: np.ndarray | None, cached: np.ndarray | None, n: int, ctx: int, *, decode_only: bool,
               sampled: int, active: bool, longest: int | None = None, shared: int = 0, swapped_in: int = 0,
               swapped_out: int = 0, copied: int = 0,
               comm: Callable[[int], float] | None = None) -> dict[str, float]:
    """The `t_*_s` components of a step, in the order the engine records and adds them.

    `new`, `cached`: each prompt's (or chunk's) new tokens and the tokens cached before them (int
    arrays; None without a prompt); `n` decoding sequences holding `ctx` context tokens; `sampled`:
    the sequences that sample a token; `decode_only`: no prompt and no block move (a graph-replayed
    step); `active`: the step runs anything. `longest` (the longest decoding row's context) and
    `shared` (context tokens rows read from blocks another row reads too): given only to a model
    that prices them (`prices_longest_row`, `prices_shared_rows`). `comm(tokens)`: the
    tensor-parallel all-reduces (None on one GPU). `swapped_in`, `swapped_out`, `copied`: the blocks
    the step moves."""
    prompts = new is not None and len(new) > 0
    tokens = (int(new.sum()) if prompts else 0) + n
    attn_prefill = cost.attn_prefill(new, cached) if prompts else 0.0
    attn = decode_attention(cost, ctx, n, decode_only, longest, shared)
    return {
        "t_linear_s": cost.linear(tokens, sampled, decode_only),
        "t_attn_prefill_s": attn_prefill,
        "t_attn_decode_s": float(attn),
        "t_swap_s": cost.swap(swapped_in, swapped_out),
        "t_copy_s": cost.copy(copied),
        "t_comm_s": comm(tokens) if comm is not None else 0.0,
        "t_overhead_s": cost.overhead(active, n if decode_only else 0),
    }

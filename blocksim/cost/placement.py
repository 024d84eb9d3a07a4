"""Where the paged prefill kernel's thread blocks land on the SMs, for the prefill attention of a
step of several prompts (or chunks).

The executor's prefill kernel (`kernels.paged_prefill_attention`, its mma.sync configurations)
launches a grid of (row blocks of the longest sequence, KV heads, sequences): a KV head's query
heads are packed into rows (a sequence of ``p`` new tokens has ``p * num_heads / num_kv_heads``
rows), a thread block takes 128 of them (configuration 0) or 64 (configuration 1, `prefill_config`),
the row blocks with the most keys come first, and a block past its own sequence's rows exits at
once. Block ``i`` of the grid's linear order (row blocks fastest, then heads, then sequences) is
placed on SM ``i mod num_sms``. A block's work is the keys it walks: its sequence's cached tokens
and the new tokens up to its last row (causal).

Two blocks that share an SM run side by side (two fit at once) and each runs slower: two equal
blocks on one SM take ``2 * share`` times one block's time, where ``share`` is about 0.6-0.65 on an
H100 (``share_of`` reads it from a profile's batch cells: two or more equal prompts whose blocks
pair up on the SMs against one alone). An SM's time is that of its longest block or ``share``
times its keys, whichever is longer (`busiest`): on an H100 with llama-3-8b, the 12 two-chunk steps
of `benchmarks/wide_steps.py --cases placement` (beside 2 single chunks), chosen by this placement
before they were timed, took 1.22-1.33 times the longer chunk alone wherever two of the longest
blocks share an SM and 0.98-1.00 times where none do (benchmarks/results/fidelity-h100-placement/).
The fold by ``i mod num_sms`` numbers the blocks that exit at once too, so an SM can hold three
live blocks where the live blocks number at most twice the SMs (11 of those 12 steps): the model
was checked there, not beyond. Head sizes above 128 run other tiles (64-row blocks, one a
SM at a time) and the warpgroup kernels (``--executor-prefill wgmma``) are persistent: neither is
modelled.
"""

from __future__ import annotations

import numpy as np

#: Packed query rows of a thread block in configuration 0 (configuration 1: half).
LARGE_ROWS = 128
#: Configuration 1 where this share of configuration 0's rows would be padding.
PADDING_SHARE = 0.25
#: `share_of` reads cells of at least this many cached tokens: below, a block's keys are too few
#: for its start to be negligible.
MIN_CACHED = 512


def prefill_config(num_seqs: int, max_new: int, num_heads: int, num_kv_heads: int, head_size: int,
                   num_sms: int) -> int:
    """The mma.sync configuration the kernel runs (`kernels.choose_prefill_config` without the
    warpgroup kernels): 0 (128-row blocks) or 1 (64-row blocks)."""
    rows = max(1, max_new * (num_heads // num_kv_heads))
    if head_size > 128:
        return 0
    large = -(-rows // LARGE_ROWS)
    if large * num_kv_heads * num_seqs <= 2 * num_sms:
        return 1
    return 1 if large * LARGE_ROWS - rows >= PADDING_SHARE * rows else 0


def block_rows(num_seqs: int, max_new: int, num_heads: int, num_kv_heads: int, head_size: int,
               num_sms: int) -> int:
    """Packed query rows of one thread block in the configuration `prefill_config` picks."""
    return LARGE_ROWS if prefill_config(num_seqs, max_new, num_heads, num_kv_heads, head_size, num_sms) == 0 \
        else LARGE_ROWS // 2


def sm_keys(new, cached, num_heads: int, num_kv_heads: int, head_size: int, num_sms: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per SM: the keys of its longest block, the keys of all its blocks and its block count, for
    the prefill attention of prompts of `new[i]` tokens after `cached[i]` (the step's order)."""
    new = np.asarray(new).astype(np.int64)
    cached = np.asarray(cached).astype(np.int64)
    group = num_heads // num_kv_heads
    rows = new * group
    bm = block_rows(len(new), int(new.max()), num_heads, num_kv_heads, head_size, num_sms)
    bx = -(-int(rows.max()) // bm)
    if bx <= 0:  # no new token: no block does any work
        return np.zeros(num_sms, np.int64), np.zeros(num_sms, np.int64), np.zeros(num_sms, np.int64)
    first = (bx - 1 - np.arange(bx)) * bm  # each row block's first row: the most keys first
    # the keys of each (sequence, row block); 0 for a block past its sequence's rows (every live
    # block walks at least one key)
    keys = np.where(first < rows[:, None], cached[:, None] + np.minimum(new[:, None], (first + bm - 1) // group + 1), 0)
    # the grid's linear order (row blocks fastest, then KV heads, then sequences), folded onto the SMs
    flat = np.repeat(keys, num_kv_heads, axis=0).ravel()
    flat = np.concatenate([flat, np.zeros(-len(flat) % num_sms, np.int64)]).reshape(-1, num_sms)
    return flat.max(axis=0), flat.sum(axis=0), np.count_nonzero(flat, axis=0)


def busiest(new, cached, num_heads: int, num_kv_heads: int, head_size: int, num_sms: int,
            share: float) -> float:
    """The keys' worth of time of the busiest SM: per SM, its longest block or `share` times all
    its keys, whichever is more."""
    if len(new) == 1:  # one prompt whose blocks sit one to an SM: its first block's keys, all of them
        if int(new[0]) <= 0:
            return 0.0
        group = num_heads // num_kv_heads
        bm = block_rows(1, int(new[0]), num_heads, num_kv_heads, head_size, num_sms)
        if -(-int(new[0]) * group // bm) * num_kv_heads <= num_sms:
            return float(int(cached[0]) + int(new[0]))
    longest, total, _ = sm_keys(new, cached, num_heads, num_kv_heads, head_size, num_sms)
    return float(np.max(np.maximum(longest, share * total)))


def live_blocks(new, num_heads: int, num_kv_heads: int, head_size: int, num_sms: int) -> int:
    """The thread blocks of the launch that do any work (those past their sequence's rows exit)."""
    group = num_heads // num_kv_heads
    bm = block_rows(len(new), int(max(new)), num_heads, num_kv_heads, head_size, num_sms)
    return num_kv_heads * sum(-(-int(p) * group // bm) for p in new)


def share_of(batches, new_tokens, cached_tokens, seconds, num_heads: int, num_kv_heads: int, head_size: int,
             num_sms: int) -> float | None:
    """``share`` read from a prefill-attention table (`seconds[b, p, c]` over `batches` starting at
    1, `new_tokens`, `cached_tokens`): the median, over the cells of ``b > 1`` equal prompts whose
    blocks sit at most two to an SM while one prompt's sit one to an SM, of the cell's time over
    one prompt's, times one prompt's longest block over the busiest SM's keys. None where no cell
    qualifies."""
    seconds = np.asarray(seconds, np.float64)
    if len(batches) < 2 or int(batches[0]) != 1:
        return None
    found = []
    for j, p in enumerate(int(x) for x in new_tokens):
        for k, c in enumerate(int(x) for x in cached_tokens):
            if c < MIN_CACHED:  # the blocks' keys must outweigh their start
                continue
            l1, _, n1 = sm_keys([p], [c], num_heads, num_kv_heads, head_size, num_sms)
            if n1.max() > 1:
                continue
            for i, b in enumerate(int(x) for x in batches):
                if b == 1:
                    continue
                _, tb, nb = sm_keys([p] * b, [c] * b, num_heads, num_kv_heads, head_size, num_sms)
                if nb.max() == 2:
                    found.append(seconds[i, j, k] / seconds[0, j, k] * l1.max() / tb.max())
    return float(np.median(found)) if found else None

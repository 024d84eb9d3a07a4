"""Synthetic workloads, seeded and reproducible.

- :func:`synth_trace`: independent requests, Poisson or Gamma (bursty) arrivals.
- :func:`shared_prefix_trace`: k-shot prompts that share a system prompt and examples.
- :func:`multi_turn_trace`: conversations whose turns extend the previous context.

All take length distributions from :mod:`traces.lengths`, parallel sampling ``n`` or a
beam search ``beam_width`` (which sets ``n = beam_width`` and adds a ``beam_width`` column).
"""

from __future__ import annotations

import numpy as np

from .arrivals import gamma_arrivals
from .lazy_pandas import pd
from .lengths import LengthDist
from .prefix import lineage_hashes
from .trace import Trace


def synth_trace(count: int, *, rate_per_s: float, prompt: LengthDist, output: LengthDist, cv: float = 1.0,
                n: int = 1, beam_width: int = 1, hash_block_tokens: int | None = None, seed: int = 0,
                name: str = "synth") -> Trace:
    """``count`` independent requests; with ``hash_block_tokens``, unique (never shared) prefix hashes."""
    rng = np.random.default_rng(seed)
    arrival = gamma_arrivals(count, rate_per_s, cv, rng)
    prompt_tokens = prompt.sample(count, rng)
    frame = _frame(arrival, prompt_tokens, output.sample(count, rng), n, beam_width)
    if hash_block_tokens:
        frame["prefix_hashes"] = lineage_hashes(prompt_tokens, np.zeros(count), np.arange(count), hash_block_tokens)
    return Trace(frame, hash_block_tokens, name)


def shared_prefix_trace(count: int, *, rate_per_s: float, prefix_tokens: int, suffix: LengthDist,
                        output: LengthDist, n_prefixes: int = 1, cv: float = 1.0, n: int = 1, beam_width: int = 1,
                        hash_block_tokens: int = 16, seed: int = 0, name: str = "shared-prefix") -> Trace:
    """Prompts = one of ``n_prefixes`` shared prefixes of ``prefix_tokens`` + a private suffix.

    For a k-shot prompt, ``prefix_tokens`` = system prompt + k examples. Each request picks
    its prefix uniformly at random; full blocks of the prefix share hashes within a prefix.
    """
    if n_prefixes < 1 or prefix_tokens < 0:
        raise ValueError("shared_prefix_trace needs n_prefixes >= 1 and prefix_tokens >= 0")
    rng = np.random.default_rng(seed)
    arrival = gamma_arrivals(count, rate_per_s, cv, rng)
    group = rng.integers(0, n_prefixes, size=count)
    prompt_tokens = prefix_tokens + suffix.sample(count, rng)
    frame = _frame(arrival, prompt_tokens, output.sample(count, rng), n, beam_width)
    frame["prefix_hashes"] = lineage_hashes(prompt_tokens, np.full(count, prefix_tokens), group, hash_block_tokens)
    return Trace(frame, hash_block_tokens, name)


def multi_turn_trace(conversations: int, *, turns: int, rate_per_s: float, user: LengthDist, output: LengthDist,
                     think_s: float = 10.0, cv: float = 1.0, n: int = 1, beam_width: int = 1,
                     hash_block_tokens: int = 16, seed: int = 0, name: str = "multi-turn") -> Trace:
    """``conversations`` of ``turns`` requests each; conversations start at ``rate_per_s``.

    Turn t's prompt is the whole conversation so far (earlier user messages and outputs)
    plus a new user message, so its full blocks share hashes with the next turns. Turn t+1
    arrives an exponential ``think_s`` (mean) after turn t arrives. Request ids number the
    turns conversation by conversation (``request_id // turns`` is the conversation).
    """
    if turns < 1 or think_s < 0:
        raise ValueError("multi_turn_trace needs turns >= 1 and think_s >= 0")
    rng = np.random.default_rng(seed)
    start = gamma_arrivals(conversations, rate_per_s, cv, rng)
    gaps = rng.exponential(think_s, size=(conversations, turns)) if think_s > 0 else np.zeros((conversations, turns))
    gaps[:, 0] = 0.0
    arrival = (start[:, None] + np.cumsum(gaps, axis=1)).ravel()
    user_tokens = user.sample(conversations * turns, rng).reshape(conversations, turns)
    out_tokens = output.sample(conversations * turns, rng).reshape(conversations, turns)
    prompt_tokens = (np.cumsum(user_tokens + out_tokens, axis=1) - out_tokens).ravel()
    conversation = np.repeat(np.arange(conversations), turns)
    frame = _frame(arrival, prompt_tokens, out_tokens.ravel(), n, beam_width)
    frame["prefix_hashes"] = lineage_hashes(prompt_tokens, prompt_tokens, conversation, hash_block_tokens)
    order = np.argsort(arrival, kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    frame["arrival_s"] -= frame["arrival_s"].iloc[0] if len(frame) else 0.0
    return Trace(frame, hash_block_tokens, name)


def _frame(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray, n: int,
           beam_width: int) -> pd.DataFrame:
    if n < 1 or beam_width < 1:
        raise ValueError("n and beam_width must be >= 1")
    if beam_width > 1 and n > 1 and n != beam_width:
        raise ValueError("beam search returns beam_width sequences: give n = 1 or n = beam_width")
    count = len(arrival_s)
    frame = pd.DataFrame({
        "request_id": np.arange(count, dtype=np.int64),
        "arrival_s": np.asarray(arrival_s, dtype=np.float64),
        "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
        "output_tokens": np.asarray(output_tokens, dtype=np.int64),
        "n": np.full(count, max(n, beam_width), dtype=np.int64),
        "priority": np.zeros(count, dtype=np.int64),
    })
    if beam_width > 1:
        frame["beam_width"] = np.full(count, beam_width, dtype=np.int64)
    return frame

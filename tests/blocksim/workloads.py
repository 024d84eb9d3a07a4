"""Synthetic traces for engine tests: requests in prefix families sharing hash blocks."""

from __future__ import annotations

import numpy as np
import pandas as pd

import traces


def family_trace(arrivals, prompts, outputs, families, *, hash_tokens: int, family_stride: int) -> traces.Trace:
    """Requests arriving `arrivals` seconds apart (the first at 0) whose prompts share hash blocks
    within a family: block j of family f has hash ``f * family_stride + j``."""
    hashes = [[f * family_stride + j for j in range(-(-p // hash_tokens))] for p, f in zip(prompts, families)]
    arrival_s = np.cumsum(arrivals)
    df = pd.DataFrame({"arrival_s": arrival_s - arrival_s[0], "prompt_tokens": prompts, "output_tokens": outputs,
                       "prefix_hashes": hashes})
    return traces.Trace(df, hash_block_tokens=hash_tokens)

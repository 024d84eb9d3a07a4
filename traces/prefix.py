"""Prefix block hashes for synthetic workloads (vectorized).

Each request belongs to a *lineage* (a shared system prompt, or a conversation) whose
token stream is append-only. The first ``shared_tokens`` tokens of a prompt are lineage
content: every full ``block_tokens`` block of it gets the lineage's id for that block
position, so requests of one lineage share those ids. All other blocks (after the shared
part, or a partial last block) get ids used nowhere else.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .lazy_pandas import pd
from .trace import hash_dtype


def lineage_hashes(prompt_tokens: np.ndarray, shared_tokens: np.ndarray, lineage: np.ndarray,
                   block_tokens: int) -> pd.Series:
    """``list<int64>`` hashes, ``ceil(prompt_tokens / block_tokens)`` per request."""
    if block_tokens < 1:
        raise ValueError(f"hash block_tokens must be >= 1, got {block_tokens}")
    prompt_tokens = np.asarray(prompt_tokens, dtype=np.int64)
    blocks = -(-prompt_tokens // block_tokens)
    shared_blocks = np.minimum(np.asarray(shared_tokens, dtype=np.int64), prompt_tokens) // block_tokens
    lineage = np.asarray(lineage, dtype=np.int64)
    _, lineage = np.unique(lineage, return_inverse=True)
    per_lineage = np.zeros(int(lineage.max(initial=-1)) + 1, dtype=np.int64)
    np.maximum.at(per_lineage, lineage, shared_blocks)
    base = np.concatenate([[0], np.cumsum(per_lineage)[:-1]])
    total = int(blocks.sum())
    owner = np.repeat(np.arange(len(blocks)), blocks)
    position = np.arange(total) - np.repeat(np.cumsum(blocks) - blocks, blocks)
    shared = position < shared_blocks[owner]
    ids = np.where(shared, base[lineage[owner]] + position, 0)
    ids[~shared] = per_lineage.sum() + np.arange(int((~shared).sum()))
    offsets = np.concatenate([[0], np.cumsum(blocks)])
    return pd.Series(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(ids, pa.int64())),
                     dtype=hash_dtype())

"""Deterministic K/V and query values for validating a plan: what every cache slot must hold.

Each token position of a sequence has a *content key*, a 64-bit id of what its K/V would be in a
real model (equal keys, equal K/V):

* a prompt position inside a full prompt block that has a block key (prefix caching):
  ``(block_key, offset in block)``, so that requests sharing a prefix share content;
* any other prompt position: ``(request_id, position)``, shared by the group's ``n`` sequences;
* a generated position (``position >= prompt_tokens``): ``(seq_id, position)``, the sequence's own.

The values of a token for (layer, K or V or query, head, dimension) are pseudo-random in
``[-1, 1)`` (multiples of 2**-15), computed on the tensors' device from the key's 32-bit seed
with integer hashing in int64 (no overflow: every product stays below 2**63). The same seed
gives the same values on every call, so the expected K/V of any position can be regenerated
at any step without storing it.

Plain numpy for the keys; torch is imported by the callers and passed in.
"""

from __future__ import annotations

import numpy as np

KIND_BLOCK, KIND_PROMPT, KIND_GEN, KIND_QUERY = 1, 2, 3, 4
WHICH_K, WHICH_V, WHICH_Q = 0, 1, 2
M32 = 0xFFFFFFFF
_C = 0x45D9F3B  # < 2**27: h * _C < 2**59 for h < 2**32
_MAX_HEADS, _MAX_DIM = 1024, 1024


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _key(kind: int, ident, pos) -> np.ndarray:
    """64-bit key of (kind, identity, position); identity and position are int arrays or scalars."""
    ident = np.asarray(ident, dtype=np.int64).astype(np.uint64)
    pos = np.asarray(pos, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        return _mix64(_mix64(ident * np.uint64(0x9E3779B97F4A7C15) + np.uint64(kind)) ^ pos)


def seeds_of(keys: np.ndarray) -> np.ndarray:
    """32-bit seeds (as int64) of 64-bit keys: the high half, which splitmix64 mixes best."""
    return (keys >> np.uint64(32)).astype(np.int64)


def content_seeds(request_id: int, seq_id: int, prompt_tokens: int, block_keys, positions: np.ndarray,
                  block_size: int) -> np.ndarray:
    """Seeds of the K/V content of ``positions`` of one sequence (see the module docstring)."""
    pos = np.asarray(positions, dtype=np.int64)
    keys = _key(KIND_GEN, seq_id, pos)
    prompt = pos < prompt_tokens
    if prompt.any():
        keys[prompt] = _key(KIND_PROMPT, request_id, pos[prompt])
        bk = np.asarray(block_keys if block_keys is not None else [], dtype=np.int64)
        full_blocks = min(len(bk), prompt_tokens // block_size)
        if full_blocks:
            keyed = prompt & (pos // block_size < full_blocks)
            if keyed.any():
                p = pos[keyed]
                keys[keyed] = _key(KIND_BLOCK, bk[p // block_size], p % block_size)
    return seeds_of(keys)


def query_seeds(seq_id: int, positions) -> np.ndarray:
    """Seeds of the query of a sequence at ``positions`` (the token being decoded)."""
    return seeds_of(_key(KIND_QUERY, seq_id, positions))


def fmix32(h):
    """A bijection of 32-bit values held in int64 tensors or ints (a murmur3-style finalizer)."""
    h = h ^ (h >> 16)
    h = (h * _C) & M32
    h = h ^ (h >> 16)
    h = (h * _C) & M32
    return h ^ (h >> 16)


class ValueGenerator:
    """Values ``[tokens, layers, heads, head_size]`` for seeds, one call for all layers of a step.

    ``layers`` are the model's layer indices being executed and ``heads`` the number of heads
    (the first heads of the model); lanes (layer, which, head, dim) are hashed once and cached.
    """

    def __init__(self, torch, device, layers: list[int], head_size: int, dtype) -> None:
        self.torch = torch
        self.device = device
        self.layers = list(layers)
        self.head_size = head_size
        self.dtype = dtype
        self._lanes: dict[tuple[int, int, tuple[int, ...]], object] = {}

    def _lane(self, which: int, heads: int, layers: tuple[int, ...]):
        key = (which, heads, layers)
        lane = self._lanes.get(key)
        if lane is None:
            t = self.torch
            l_ = t.tensor(layers, dtype=t.int64, device=self.device).view(-1, 1, 1)
            h = t.arange(heads, dtype=t.int64, device=self.device).view(1, -1, 1)
            d = t.arange(self.head_size, dtype=t.int64, device=self.device).view(1, 1, -1)
            ids = ((l_ * 3 + which) * _MAX_HEADS + h) * _MAX_DIM + d
            lane = self._lanes[key] = fmix32((ids * 0x27D4EB2F) & M32 ^ 0x165667B1)
        return lane

    def values(self, seeds, which: int, heads: int, layers: list[int] | None = None):
        """``[len(seeds), len(layers), heads, head_size]`` in ``dtype``; seeds is an int64 tensor on
        the device (or a numpy array)."""
        t = self.torch
        if not isinstance(seeds, t.Tensor):
            seeds = t.as_tensor(np.asarray(seeds, dtype=np.int64), device=self.device)
        lane = self._lane(which, heads, tuple(self.layers if layers is None else layers))
        h = fmix32(seeds.view(-1, 1, 1, 1) ^ lane.unsqueeze(0))
        v = ((h & 0xFFFF).to(t.float32) - 32768.0) * (1.0 / 32768.0)
        return v.to(self.dtype)

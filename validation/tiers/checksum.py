"""A chunk's checksum, computed on the tensor's device from its bytes.

The bytes are read as 32-bit words ``w[i]``; each word is mixed with its index and summed:
``sum_i fmix32(w[i] ^ lane[i])`` in int64, with ``lane[i] = fmix32(i * 0x9E3779B1)`` (murmur3's
finalizer, a bijection of 32-bit values). Changing any one word changes exactly one term, so a
single corrupted word (or byte) always changes the sum; two chunks whose blocks come back in
another order differ because the lane depends on the position. Each term is below 2**32, so the
sum of up to 2**31 words never overflows int64.
"""

from __future__ import annotations

from validation.kv import M32, fmix32


class Checksum:
    """Checksums of byte rows of one length (a chunk), lanes cached per device."""

    def __init__(self, torch, row_bytes: int) -> None:
        if row_bytes % 4:
            raise ValueError(f"a checksummed row must be a whole number of 32-bit words, got {row_bytes} bytes")
        self.torch, self.words = torch, row_bytes // 4
        self._lanes: dict = {}

    def _lane(self, device):
        lane = self._lanes.get(device)
        if lane is None:
            t = self.torch
            i = t.arange(self.words, dtype=t.int64, device=device)
            lane = self._lanes[device] = fmix32((i * 0x9E3779B1) & M32)
        return lane

    def of(self, row):
        """int64 scalar tensor (on ``row``'s device): the checksum of a uint8 tensor's bytes in their
        logical (row-major) order, whatever its strides."""
        t = self.torch
        w = row.reshape(-1).view(t.int32).to(t.int64) & M32
        return fmix32(w ^ self._lane(row.device)).sum()

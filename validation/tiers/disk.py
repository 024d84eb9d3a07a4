"""The disk tier: fixed-size chunk slots in one file, written and read with direct I/O where the
file system allows it.

``O_DIRECT`` moves the bytes between the buffer and the device without the page cache; it needs
the buffer, the file offset and the length aligned to the device's logical block (4096 bytes is
safe on every common device), so slots are ``chunk_bytes`` rounded up to 4096 and every buffer
passed in starts on a 4096-byte boundary (`aligned_empty`). Opening with ``O_DIRECT`` fails on
file systems without it (tmpfs, some overlay mounts); a first aligned write and read then tell
whether it works. Where it does not, the tier falls back to buffered I/O: each write batch ends
with ``fdatasync`` and ``posix_fadvise(DONTNEED)`` on the written range, and each read is
preceded by ``DONTNEED`` on its range, so reads come from the device and not from the page cache
as far as the kernel allows. `mode` says which ("direct" or "buffered") and `reason` why.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from validation.tiers.ops import TierOpError

ALIGN = 4096


def round_up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


def aligned_empty(torch, rows: int, row_bytes: int, *, pin: bool):
    """uint8 ``[rows, row_bytes]`` whose first byte sits on a 4096-byte boundary (page-locked when
    ``pin``; plain memory otherwise). ``row_bytes`` must be a multiple of 4096 for every row to be
    aligned too."""
    raw = torch.empty(rows * row_bytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    off = (-raw.data_ptr()) % ALIGN
    return raw[off:off + rows * row_bytes].view(rows, row_bytes)


class DiskTier:
    """``slots`` chunk slots of ``slot_bytes`` (a multiple of 4096) in the file ``path``."""

    def __init__(self, path: str | Path, slots: int, slot_bytes: int, *, direct: bool = True, io_threads: int = 4,
                 probe_buffer=None) -> None:
        if slot_bytes % ALIGN:
            raise ValueError(f"disk slots must be multiples of {ALIGN} bytes, got {slot_bytes}")
        self.path, self.slots, self.slot_bytes = Path(path), slots, slot_bytes
        if not self.path.parent.is_dir():
            raise TierOpError(f"disk tier {self.path}: directory {self.path.parent} does not exist; "
                              f"create it or pass another --tier-disk path")
        if not os.access(self.path.parent, os.W_OK):
            raise TierOpError(f"disk tier {self.path}: directory {self.path.parent} is not writable; "
                              f"pass a writable --tier-disk path")
        self.mode, self.reason, self.fd = "buffered", "direct I/O not asked for", None
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
                self.mode, self.reason = "direct", "O_DIRECT"
            except OSError as e:
                self.reason = f"O_DIRECT refused by the file system ({e.strerror})"
        elif direct:
            self.reason = "this platform has no O_DIRECT"
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(self.fd, slots * slot_bytes)
        if self.mode == "direct" and probe_buffer is not None:
            self._probe(probe_buffer)
        self.pool = ThreadPoolExecutor(max(1, io_threads), thread_name_prefix="tier-disk")

    def _probe(self, buf) -> None:
        """One aligned write and read of slot 0; on EINVAL fall back to buffered I/O."""
        view = memoryview(buf[:ALIGN].numpy())
        try:
            os.pwrite(self.fd, view, 0)
            os.preadv(self.fd, [view], 0)
        except OSError as e:
            os.close(self.fd)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            self.mode, self.reason = "buffered", f"O_DIRECT opened but aligned I/O failed ({e.strerror})"

    def _write_one(self, slot: int, row) -> int:
        view = memoryview(row.numpy())
        off, done = slot * self.slot_bytes, 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], off + done)
        return done

    def _read_one(self, slot: int, row) -> int:
        view = memoryview(row.numpy())
        off, done = slot * self.slot_bytes, 0
        if self.mode == "buffered":
            os.posix_fadvise(self.fd, off, len(view), os.POSIX_FADV_DONTNEED)
        while done < len(view):
            n = os.preadv(self.fd, [view[done:]], off + done)
            if n == 0:
                raise OSError(f"disk tier {self.path}: short read of slot {slot}")
            done += n
        return done

    def write(self, slots, rows) -> int:
        """Write ``rows[i]`` (uint8 CPU tensors of ``slot_bytes``, 4096-aligned) to ``slots[i]``;
        returns the bytes written, durable on return."""
        n = sum(self.pool.map(self._write_one, slots, rows))
        if self.mode == "buffered":
            os.fdatasync(self.fd)
            for s in slots:
                os.posix_fadvise(self.fd, s * self.slot_bytes, self.slot_bytes, os.POSIX_FADV_DONTNEED)
        return n

    def read(self, slots, rows) -> int:
        """Read ``slots[i]`` into ``rows[i]``; returns the bytes read."""
        return sum(self.pool.map(self._read_one, slots, rows))

    def close(self) -> None:
        if self.fd is not None:
            self.pool.shutdown()
            os.close(self.fd)
            self.fd = None

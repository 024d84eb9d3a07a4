"""The ``tier_ops`` table of a plan: one row per chunk move between the GPU, host and disk tiers.

Columns: ``step`` (int), ``op`` (``store`` | ``load``), ``src`` and ``dst`` (``gpu`` | ``host`` |
``disk``), ``key`` (int, the chunk's content key), ``gpu_blocks`` (the chunk's GPU block ids in
order; empty for host->disk) and, optionally, ``evict`` (bool: the row drops ``key`` from ``src``
without copying). The moves a row may name:

=========  ==========================================
store      gpu->host, gpu->disk, host->disk
load       host->gpu, disk->gpu
evict      a drop of ``key`` from ``src`` (any tier; ``dst`` and ``gpu_blocks`` are not read)
=========  ==========================================

`check_tier_ops` checks a table whole before anything runs: the columns and their values, steps in
order, each chunk's GPU blocks (``chunk_blocks`` of them, inside the GPU cache, none loaded into
twice in one step), and, replaying the
tiers' contents on the host, that every load or host->disk store finds its key in ``src``, no
store writes a key its ``dst`` already holds, no drop removes a key that is not there, and no tier
ever holds more chunks than its capacity. The first bad row is refused in one line naming the row,
its step and the fix (`TierOpError`, a `blocksim.config.ConfigError`: exit code 2 at the CLI).

No torch here: the table is read with numpy / pandas.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from blocksim.config import ConfigError

TIERS = ("gpu", "host", "disk")
MOVES = {("store", "gpu", "host"), ("store", "gpu", "disk"), ("store", "host", "disk"),
         ("load", "host", "gpu"), ("load", "disk", "gpu")}
REQUIRED = ("step", "op", "src", "dst", "key", "gpu_blocks")


class TierOpError(ConfigError):
    """A tier_ops table, or one of its rows, that the tier executor cannot apply."""


@dataclass(frozen=True)
class TierOps:
    """A checked tier_ops table as columns (row order kept)."""

    step: np.ndarray          # int64 [n]
    op: np.ndarray            # object [n]: "store" | "load"
    src: np.ndarray           # object [n]
    dst: np.ndarray           # object [n]
    key: np.ndarray           # int64 [n]
    gpu_blocks: list          # n int64 arrays
    evict: np.ndarray         # bool [n]
    source: str = "tier_ops"  # how errors name the table

    def __len__(self) -> int:
        return len(self.step)


def _where(source: str, i: int, step) -> str:
    return f"{source} row {i} (step {int(step)})"


def read_tier_ops(table, source: str | None = None) -> TierOps:
    """Columns of a tier_ops table (a pandas DataFrame, a dict of columns, a Parquet file, or a plan
    directory holding ``tier_ops.parquet``), with their types and values checked row by row."""
    if isinstance(table, (str, Path)):
        p = Path(table)
        if p.is_dir():
            p = p / "tier_ops.parquet"
        if not p.is_file():
            raise TierOpError(f"{p}: no tier_ops table here; record the plan with tier transfers (--plan-dir)")
        import pandas as pd
        try:
            table = pd.read_parquet(p)
        except Exception as e:  # pyarrow raises several kinds for a damaged file
            raise TierOpError(f"{p}: not a readable Parquet table ({type(e).__name__}: {e})") from None
        source = source or str(p)
    source = source or "tier_ops"
    cols = {c: table[c] for c in (table.columns if hasattr(table, "columns") else table.keys())}
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise TierOpError(f"{source}: missing column(s) {', '.join(missing)}; a tier_ops table has "
                          f"{', '.join(REQUIRED)} and optionally evict")
    n = len(cols["step"])
    for c in REQUIRED + (("evict",) if "evict" in cols else ()):
        if len(cols[c]) != n:
            raise TierOpError(f"{source}: column {c} has {len(cols[c])} rows, column step has {n}")
    ints = {}
    for c in ("step", "key"):
        v = np.asarray(cols[c])
        if n and not (np.issubdtype(v.dtype, np.integer)):
            raise TierOpError(f"{source}: column {c} must be int64, got {v.dtype}")
        ints[c] = v.astype(np.int64)
    strs = {}
    for c, allowed in (("op", ("store", "load")), ("src", TIERS), ("dst", TIERS)):
        v = np.asarray(cols[c], dtype=object)
        for i, x in enumerate(v):
            if x not in allowed:
                raise TierOpError(f"{_where(source, i, ints['step'][i])}: {c} is {x!r}; expected one of "
                                  f"{', '.join(allowed)}")
        strs[c] = v
    evict = np.zeros(n, dtype=bool)
    if "evict" in cols:
        ev = np.asarray(cols["evict"])
        if n and ev.dtype != bool:
            raise TierOpError(f"{source}: column evict must be bool, got {ev.dtype}")
        evict = ev.astype(bool)
    blocks = []
    for i, b in enumerate(cols["gpu_blocks"]):
        arr = np.asarray([] if b is None else b)
        if arr.ndim != 1 or (len(arr) and not np.issubdtype(arr.dtype, np.integer)):
            raise TierOpError(f"{_where(source, i, ints['step'][i])}: gpu_blocks must be a list of block ids, "
                              f"got {b!r}")
        blocks.append(arr.astype(np.int64))
    if n and (np.diff(ints["step"]) < 0).any():
        i = int(np.argmax(np.diff(ints["step"]) < 0)) + 1
        raise TierOpError(f"{_where(source, i, ints['step'][i])}: steps go backwards (after step "
                          f"{int(ints['step'][i - 1])}); rows must be in step order")
    return TierOps(ints["step"], strs["op"], strs["src"], strs["dst"], ints["key"], blocks, evict, source)


def check_tier_ops(ops: TierOps, *, chunk_blocks: int, num_gpu_blocks: int, host_chunks: int,
                   disk_chunks: int, host_keys=(), disk_keys=()) -> None:
    """Refuse (TierOpError, one line) the first row the executor could not apply, replaying the
    tiers' contents from ``host_keys`` / ``disk_keys`` (what they hold before the table's first row)."""
    held = {"host": set(host_keys), "disk": set(disk_keys)}
    cap = {"host": host_chunks, "disk": disk_chunks}
    loaded: dict[int, int] = {}  # GPU block -> the row loading into it, within the current step
    for i in range(len(ops)):
        op, src, dst, key = ops.op[i], ops.src[i], ops.dst[i], int(ops.key[i])
        where = _where(ops.source, i, ops.step[i])
        if i and ops.step[i] != ops.step[i - 1]:
            loaded = {}
        if ops.evict[i]:
            if src != "gpu" and key not in held[src]:
                raise TierOpError(f"{where}: drop of key {key} from {src}, which holds no copy of it; "
                                  f"drop only keys stored there")
            if src != "gpu":
                held[src].discard(key)
            continue
        if (op, src, dst) not in MOVES:
            allowed = ", ".join(f"{o} {s}->{d}" for o, s, d in sorted(MOVES))
            raise TierOpError(f"{where}: {op} {src}->{dst} is not a tier move; the moves are {allowed}")
        blocks = ops.gpu_blocks[i]
        if "gpu" in (src, dst):
            if len(blocks) != chunk_blocks:
                raise TierOpError(f"{where}: {op} {src}->{dst} of key {key} names {len(blocks)} GPU blocks; a chunk "
                                  f"is {chunk_blocks} blocks (chunk_tokens / block_size)")
            bad = (blocks < 0) | (blocks >= num_gpu_blocks)
            if bad.any():
                raise TierOpError(f"{where}: GPU block {int(blocks[bad][0])} is outside the cache's {num_gpu_blocks} "
                                  f"blocks")
            if len(np.unique(blocks)) != len(blocks):
                raise TierOpError(f"{where}: the chunk's GPU blocks repeat a block ({blocks.tolist()})")
            if dst == "gpu":
                for b in blocks.tolist():
                    if b in loaded:
                        raise TierOpError(f"{where}: GPU block {b} is loaded into twice in one step (also by row "
                                          f"{loaded[b]}); each block takes one chunk per step")
                    loaded[b] = i
        elif len(blocks):
            raise TierOpError(f"{where}: {op} {src}->{dst} names GPU blocks; a host->disk move takes none "
                              f"(gpu_blocks must be empty)")
        if src != "gpu" and key not in held[src]:
            raise TierOpError(f"{where}: {op} {src}->{dst} of key {key}, which {src} does not hold; "
                              f"store it to {src} first")
        if dst != "gpu":
            if key in held[dst]:
                raise TierOpError(f"{where}: {op} {src}->{dst} of key {key}, which {dst} already holds; a tier holds "
                                  f"one copy per key (drop it first)")
            if len(held[dst]) >= cap[dst]:
                raise TierOpError(f"{where}: {op} {src}->{dst} of key {key} into a full {dst} tier "
                                  f"({cap[dst]} chunks); the plan must drop a chunk first, or give the "
                                  f"executor a larger {dst} tier")
            held[dst].add(key)

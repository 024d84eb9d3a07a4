"""Execution plans: what each engine step asked of the KV cache, written as Parquet chunks.

A plan lets `validation.validate` replay a simulated run on real cache tensors. It lives in
`RUN_DIR/plan/`:

* `meta.json`: `plan_version`, block size, GPU / CPU block counts, the model's KV dimensions,
  `hash_block_tokens`.
* `steps-NNNNN.parquet`: one row per step: `step`, the predicted times `t_*_s`, and the block moves
  in the order a vLLM v0 worker performs them before the forward pass: `swap_in_src/dst` (CPU ->
  GPU), `swap_out_src/dst` (GPU -> CPU), `copy_src/dst` (copy-on-write, GPU -> GPU).
* `seqs-NNNNN.parquet`: one row per scheduled sequence and step: `step`, `request_id`, `seq_id`,
  `prompt_tokens`, `is_prefill`, `context_len` (tokens attended to, the new ones included),
  `new_start`, `new_end` (positions whose K/V this step writes), `block_table` (GPU block ids).
* `tier_ops.parquet` (with KV tiers): one row per chunk move, in issue order: `step`, `op` (store:
  down a tier; load: up into GPU blocks), `src`, `dst` (gpu, host, disk), `key` (the chunk's content
  key; a tier holds one copy per key), `gpu_blocks` (the chunk's GPU blocks, source of a store from the
  GPU, destination of a load; empty between host and disk), `evict` (the row drops `key` from `src`).
  A store from the GPU reads K/V that exists at the end of step `step`; a load must land before the
  attention of step `step` (its blocks are fresh and read by a later step). `meta.json` gains
  `tier_chunk_tokens` and `tier_chunk_bytes`.
* `requests.parquet`: per request, `request_id`, `prompt_tokens` and `block_keys` (the content
  identity of each full prompt block when prefix hashes exist, else empty): tokens with equal keys
  have equal K/V, which is what makes shared blocks checkable.

Recording steps one by one is slower than the span-jumping replay; record plans for slices.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from blocksim.sequence import SeqStatus

PLAN_VERSION = 1
TIME_COLUMNS = ("t_linear_s", "t_attn_prefill_s", "t_attn_decode_s", "t_swap_s", "t_copy_s", "t_overhead_s")


class PlanRecorder:
    def __init__(self, out_dir: str | Path, config, chunk_steps: int = 4096) -> None:
        self.dir = Path(out_dir) / "plan"
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("*.parquet"):
            old.unlink()
        m = config.model
        self.meta = {"plan_version": PLAN_VERSION, "block_size": config.cache.block_size,
                     "num_gpu_blocks": config.num_gpu_blocks, "num_cpu_blocks": config.num_cpu_blocks,
                     "num_layers": m.num_layers, "num_heads": m.num_heads // config.tensor_parallel,
                     "num_kv_heads": config.kv_heads_per_gpu, "head_size": m.head_size,
                     "model": m.name, "policy": config.policy}
        self.chunk_steps = chunk_steps
        self._steps: list[dict] = []
        self._seqs: dict[str, list] = {k: [] for k in ("step", "request_id", "seq_id", "prompt_tokens", "is_prefill",
                                                        "context_len", "new_start", "new_end", "block_table")}
        self._requests: dict[int, tuple[int, list[int]]] = {}
        self._chunk = 0
        self._tier_ops: list = []
        if config.tiers is not None:
            self.meta["tier_chunk_tokens"] = config.tier_chunk_tokens
            self.meta["tier_chunk_bytes"] = config.tier_chunk_tokens * config.kv_bytes_per_token

    def on_step(self, step: int, out, times: dict[str, float]) -> None:
        row = {"step": step, **{c: times[c] for c in TIME_COLUMNS}}
        for name, pairs in (("swap_in", out.blocks_to_swap_in.items()), ("swap_out", out.blocks_to_swap_out.items()),
                            ("copy", out.blocks_to_copy)):
            pairs = list(pairs)
            row[f"{name}_src"] = [int(a) for a, _ in pairs]
            row[f"{name}_dst"] = [int(b) for _, b in pairs]
        self._steps.append(row)
        for g, start, stop in out.prefills:
            self._add_group(step, g, (start, stop))
        for g in out.decode_groups:
            self._add_group(step, g, None)
        if len(self._steps) >= self.chunk_steps:
            self._flush()

    def on_tier_ops(self, ops) -> None:
        """Chunk moves of the KV tiers (`blocksim.memory.tiers.TierOp`), in issue order."""
        self._tier_ops.extend(ops)

    def _add_group(self, step: int, g, prefill: tuple[int, int] | None) -> None:
        """One row per running sequence of a scheduled group: a prompt (chunk) writes positions
        `prefill` = [start, stop), a decode the K/V of its newest token."""
        if g.request_id not in self._requests:
            self._requests[g.request_id] = (g.prompt_tokens, list(g.block_keys or []))
        s = self._seqs
        for seq in g.seqs:
            if seq.status is not SeqStatus.RUNNING:
                continue
            start, n = prefill if prefill is not None else (seq.num_tokens - 1, seq.num_tokens)
            s["step"].append(step)
            s["request_id"].append(g.request_id)
            s["seq_id"].append(seq.seq_id)
            s["prompt_tokens"].append(g.prompt_tokens)
            s["is_prefill"].append(prefill is not None)
            s["context_len"].append(n)
            s["new_start"].append(start)
            s["new_end"].append(n)
            s["block_table"].append(list(seq.block_table))

    def _flush(self) -> None:
        if not self._steps:
            return
        name = f"{self._chunk:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(self._steps), self.dir / f"steps-{name}")
        seqs = {k: v for k, v in self._seqs.items() if k != "block_table"}
        table = pa.table({**{k: np.asarray(v) for k, v in seqs.items()},
                          "block_table": pa.array(self._seqs["block_table"], type=pa.list_(pa.int32()))})
        pq.write_table(table, self.dir / f"seqs-{name}")
        self._steps = []
        for v in self._seqs.values():
            v.clear()
        self._chunk += 1

    def close(self) -> None:
        self._flush()
        ids = sorted(self._requests)
        pq.write_table(pa.table({
            "request_id": pa.array(ids, type=pa.int64()),
            "prompt_tokens": pa.array([self._requests[i][0] for i in ids], type=pa.int64()),
            "block_keys": pa.array([self._requests[i][1] for i in ids], type=pa.list_(pa.int64())),
        }), self.dir / "requests.parquet")
        if "tier_chunk_tokens" in self.meta:
            ops = self._tier_ops
            pq.write_table(pa.table({
                "step": pa.array([o.step for o in ops], type=pa.int64()),
                "op": pa.array([o.op for o in ops], type=pa.string()),
                "src": pa.array([o.src for o in ops], type=pa.string()),
                "dst": pa.array([o.dst for o in ops], type=pa.string()),
                "key": pa.array([o.key for o in ops], type=pa.int64()),
                "gpu_blocks": pa.array([list(o.gpu_blocks) for o in ops], type=pa.list_(pa.int64())),
                "evict": pa.array([o.evict for o in ops], type=pa.bool_()),
            }), self.dir / "tier_ops.parquet")
        (self.dir / "meta.json").write_text(json.dumps({**self.meta, "chunks": self._chunk}, indent=2) + "\n")


class PlanError(ValueError):
    """A recorded plan that cannot be read: the message names the file and how to fix it."""


_RECORD_AGAIN = "record the plan again (blocksim replay ... --record-plan --overwrite)"


def _read_table(path: Path):
    import pandas as pd
    try:
        return pd.read_parquet(path)
    except (pa.ArrowException, OSError) as e:
        raise PlanError(f"{path}: not a readable Parquet file ({' '.join(str(e).split())}); {_RECORD_AGAIN}") from None


def read_plan(run_dir: str | Path):
    """(meta, steps DataFrame, seqs DataFrame, requests DataFrame) of a recorded plan; a `PlanError`
    (or `FileNotFoundError` when there is none) names the file at fault."""
    import pandas as pd
    d = Path(run_dir) / "plan"
    meta_path = d / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{run_dir}: no execution plan (plan/meta.json); "
                                f"record one with `blocksim replay ... --record-plan`")
    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, OSError) as e:
        raise PlanError(f"{meta_path}: not valid JSON ({' '.join(str(e).split())}); {_RECORD_AGAIN}") from None
    if not isinstance(meta, dict):
        raise PlanError(f"{meta_path}: expected a JSON object; {_RECORD_AGAIN}")
    if meta.get("plan_version") != PLAN_VERSION:
        raise PlanError(f"{meta_path}: plan version {meta.get('plan_version')!r}, this blocksim reads "
                        f"version {PLAN_VERSION}; record the plan again with this version")
    steps = [_read_table(p) for p in sorted(d.glob("steps-*.parquet"))]
    seqs = [_read_table(p) for p in sorted(d.glob("seqs-*.parquet"))]
    if len(steps) != meta.get("chunks"):
        raise PlanError(f"{d}: {len(steps)} step chunks, meta.json says {meta.get('chunks')}; the plan is "
                        f"incomplete; {_RECORD_AGAIN}")
    if not (d / "requests.parquet").exists():
        raise PlanError(f"{d}: requests.parquet is missing; the plan is incomplete; {_RECORD_AGAIN}")
    reqs = _read_table(d / "requests.parquet")
    return (meta, pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(),
            pd.concat(seqs, ignore_index=True) if seqs else pd.DataFrame(), reqs)

"""Executes the engine's steps on a GPU as they are scheduled: the GPU-in-the-loop replay.

`ModelStepExecutor` implements `blocksim.engine.executor.StepExecutor`. For each step the engine
schedules, it runs, in vLLM v0 worker order, the swaps in and out and the copy-on-write copies,
then the model's forward pass over the step's tokens (`validation.model.ModelRunner`): each
prefill (chunk) once per sequence group (a group's sequences share their prompt blocks), one
token per decoding sequence. Pure-decode steps replay the CUDA graph captured at the padded
batch size; steps with a prefill or a block move run eagerly. The step's duration is its GPU
work timed with CUDA events: a graph replay whole, an eager step segment by segment (block moves,
embedding, each layer, sampling; `validation.model.SegmentTimer`: a sleep queued before each
segment keeps the host's launch gaps out). The engine's clock advances by it instead of the cost
model's prediction; the host's own time per step is recorded beside it.

Token ids: a prompt position's id comes from its content key (`validation.kv.content_seeds`, so
positions that a prefix cache shares have equal ids and equal K/V), a decode step's input is the
token the sequence sampled in its previous step, a recomputed generated position's the one it
sampled then.

Checks, every step, on the host before anything is launched: every slot written lies inside the
GPU cache, no two tokens of one step write one slot with different content (a block shared
without copy-on-write), block moves stay inside their caches and no destination repeats.
`blocksim validate` checks a recorded plan's cache contents and attention outputs exactly.

Measured per step (`executor_steps.parquet` in the run directory): `measured_s` (the events'
time), its parts `m_swap_s`, `m_copy_s` and `m_forward_s`, `host_s` (the host's time for the
step: inputs built and uploaded, launches, waiting for the GPU), `graph` and `padded_batch`;
`lead_s`, the sleep before the kept timing's graph replay or before each of its eager segments
(`validation.sleeps.Lead`: raised to keep ahead of a slow host; 0 where the step ran no forward);
`late_segments`, the step's timed segments whose launches outlasted their sleep (the GPU may have
waited for the host inside them: `SegmentTimer`), and `late_s`, their overruns' sum, a bound on
those waits; `retimed`: a forward (eager, or a graph's replay) whose overruns exceed
`RETIME_FRACTION` (0.5%) of its time runs again at once with four times the sleep, at least
`RETIME_LEAD_S` (the same writes and samples), and that time counts (`late_after_retime`, its own late segments);
at one GPU only (at TP > 1 every rank would have to run it again).

Tensor parallelism (``tensor_parallel`` N > 1): the model is split over N GPUs, one process each
(`validation.sharded`); this process is rank 0, runs the engine and times its own GPU, and the
other ranks repeat its calls. Each step's all-reduces are recorded beside its time
(`allreduces`, `allreduce_bytes`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import kernels
from blocksim.sequence import SeqStatus
from validation.kv import content_seeds
from validation.model import (GRAPH_BATCH_SIZES, ModelDims, PrefillSeq, SegmentTimer, StepBatch,
                              padded_batch_size)
from validation.sleeps import LEAD_S, RETIME_LEAD_S, leads

WORKSPACE_BYTES = 6 << 30  # activations, CUDA graphs and the allocator's slack
RETIME_FRACTION = 0.005     # ... because its late segments' overruns exceed this fraction of its time


class ExecutorError(RuntimeError):
    """A step the executor cannot run as scheduled (a plan inconsistency), or a run that does not fit."""


def memory_check(dims: ModelDims, num_blocks: int, block_size: int, dtype_bytes: int, free_bytes: int, *,
                 device: str = "cuda", ranks: int = 1) -> None:
    """Refuse a run whose weights + KV cache + workspace exceed the device's free memory: a GPU's
    (per GPU: `dims` are one rank's), or the host's for `--executor cpu`, which holds every rank's."""
    weights = dims.weight_bytes(dtype_bytes)
    cache = (num_blocks + 1) * dims.kv_block_bytes(block_size, dtype_bytes)
    workspace = WORKSPACE_BYTES if device == "cuda" else WORKSPACE_BYTES // 6
    need = ranks * (weights + cache + workspace)
    if need > free_bytes:
        gib = 1 << 30
        where = "the GPU has" if device == "cuda" else "this machine has"
        parts = (f"weights {weights / gib:.1f} GiB + KV cache {num_blocks} blocks = {cache / gib:.1f} GiB + "
                 f"workspace {workspace / gib:.0f} GiB")
        parts = f"{ranks} ranks x ({parts})" if ranks > 1 else f"({parts})"
        raise ExecutorError(
            f"--executor {device}: {dims.name} needs {need / gib:.1f} GiB {parts} but {where} {free_bytes / gib:.1f} "
            f"GiB free; lower --num-gpu-blocks or --gpu-memory-utilization, or choose a smaller --model")


def _host_free_bytes() -> int:
    """Memory the host can still give (MemAvailable; all of it where /proc/meminfo is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class ModelStepExecutor:
    """Runs each scheduled step on the GPU and returns its measured time (seconds)."""

    def __init__(self, config, *, dtype: str = "float16", attention: str = "fast", prefill: str = "auto",
                 graphs: bool = True, device: str = "cuda", seed: int = 0) -> None:
        import torch
        self.torch = torch
        self.tp = tp = config.tensor_parallel
        self.dims = ModelDims.of(config.model)
        self.bs = config.cache.block_size
        self.num_gpu_blocks, self.num_cpu_blocks = config.num_gpu_blocks, config.num_cpu_blocks
        self.cuda = device.startswith("cuda")
        sizes = kernels.FAST_BLOCK_SIZES if attention == "fast" else kernels.SUPPORTED_BLOCK_SIZES
        if self.bs not in sizes:
            option = "--page-size" if config.policy_config.scheduler == "sglang" else "--block-size"
            raise ExecutorError(f"--executor {device}: blocks of {self.bs} tokens ({option}) have no {attention!r} "
                                f"attention kernel; give {option} one of {', '.join(map(str, sizes))}")
        from validation.sharded import ShardError, make_runner, per_rank_dims
        try:
            per_gpu = per_rank_dims(self.dims, tp)
        except ShardError as e:
            raise ExecutorError(f"--executor with tensor_parallel {tp}: {e}") from None
        if self.cuda:
            if not torch.cuda.is_available():
                raise ExecutorError("--executor cuda: no CUDA device is visible to this torch")
            if torch.cuda.device_count() < tp:
                raise ExecutorError(f"--executor cuda with tensor_parallel {tp}: this machine has "
                                    f"{torch.cuda.device_count()} GPUs")
            memory_check(per_gpu, self.num_gpu_blocks, self.bs, torch.finfo(getattr(torch, dtype)).bits // 8,
                         torch.cuda.mem_get_info()[0])
        else:
            memory_check(per_gpu, self.num_gpu_blocks, self.bs, torch.finfo(getattr(torch, dtype)).bits // 8,
                         _host_free_bytes(), device="cpu", ranks=tp)
        kw = dict(num_blocks=self.num_gpu_blocks, num_cpu_blocks=self.num_cpu_blocks, block_size=self.bs,
                  dtype=dtype, attention=attention, prefill=prefill, seed=seed)
        self.runner = make_runner(self.dims, tp, device, **kw)  # at tp > 1 one process per GPU, this one rank 0
        self.runner.warm_up(min(config.scheduler.max_num_batched_tokens, 16384))
        self.graph_sizes: list[int] = []
        if graphs and self.cuda:
            self.graph_sizes = sorted(self.runner.capture_decode_graphs(config.scheduler.max_num_seqs))
        self.max_graph_batch = max(self.graph_sizes, default=0)
        self.config = config
        self.describe = {"device": torch.cuda.get_device_name() if self.cuda else "cpu", "torch": torch.__version__,
                         "dtype": dtype, "attention": attention, "prefill": self.runner.prefill_impl,
                         "tensor_parallel": tp,
                         "cuda_graph_batch_sizes": self.graph_sizes, "model": self.dims.name,
                         "num_gpu_blocks": self.num_gpu_blocks, "num_cpu_blocks": self.num_cpu_blocks}
        self._last_token: dict[int, int] = {}     # seq_id -> the token it sampled last
        self._generated: dict[int, list[int]] = {}  # seq_id -> tokens sampled so far (for recomputation)
        self._prompt_ids: dict[int, np.ndarray] = {}
        self._shapes: set[tuple[int, int]] = set()  # (tokens, sampled) of the eager steps run so far
        self.rows: list[dict] = []
        # the sleeps before a graph replay and before each eager segment, raised to keep ahead of a slow host
        self.graph_lead, self.eager_lead = leads()

    def new_run(self, config) -> None:
        """Start another run on the same model, caches and CUDA graphs (several runs in one
        process): the last run's sequences, sampled tokens, primed shapes, records and tiers are
        forgotten. `config` must have the model, blocks, block size and batch limits of the first."""
        keep = ("model", "num_gpu_blocks", "num_cpu_blocks", "tensor_parallel")
        sched, first = config.scheduler, self.config.scheduler
        if (ModelDims.of(config.model) != self.dims or config.num_gpu_blocks != self.num_gpu_blocks
                or config.num_cpu_blocks != self.num_cpu_blocks or config.cache.block_size != self.bs
                or config.tensor_parallel != self.tp or sched.max_num_seqs != first.max_num_seqs
                or sched.max_num_batched_tokens != first.max_num_batched_tokens):
            raise ExecutorError(f"another run on this executor needs the same {', '.join(keep)}, block size, "
                                f"max_num_seqs and max_num_batched_tokens as its first; build a new executor")
        self.config = config
        self._last_token, self._generated, self._prompt_ids = {}, {}, {}
        self._shapes, self.rows = set(), []
        if getattr(self, "tier_ex", None) is not None:  # a run that ended before `save` leaves its disk file and
            self.tier_ex.close()                        # I/O threads open
        self.tier_ex = None
        for k in ("tier_disk_io", "tier_disk_io_reason", "tier_transfer_prices"):
            self.describe.pop(k, None)

    # --- token ids ------------------------------------------------------------------------------------
    def _ids(self, g, seq, positions: np.ndarray) -> np.ndarray:
        vocab = self.dims.vocab_size
        ids = np.empty(len(positions), np.int64)
        prompt = positions < g.prompt_tokens
        if prompt.any():
            p = self._prompt_ids.get(g.request_id)
            if p is None:
                keys = np.asarray(g.block_keys or [], dtype=np.int64)
                p = content_seeds(g.request_id, seq.seq_id, g.prompt_tokens, keys, np.arange(g.prompt_tokens),
                                  self.bs) % vocab
                self._prompt_ids[g.request_id] = p
            ids[prompt] = p[positions[prompt]]
        if (~prompt).any():
            gen = self._generated.get(seq.seq_id, [])
            k = positions[~prompt] - g.prompt_tokens
            ids[~prompt] = [gen[i] if i < len(gen) else (seq.seq_id * 7919 + i) % vocab for i in k.tolist()]
        return ids

    # --- the step's batch -----------------------------------------------------------------------------
    def batch(self, step: int, out) -> tuple[StepBatch, list[tuple[int, ...]]]:
        """The step's `StepBatch` and, per sampling position, the seq_ids that take its token."""
        bs = self.bs
        ids, pos, slots, prefills, takers = [], [], [], [], []
        for g, start, stop in out.prefills:
            running = [s for s in g.seqs if s.status is SeqStatus.RUNNING]
            if not running or stop <= start:
                continue
            seq = running[0]
            table = np.asarray(seq.block_table, dtype=np.int64)
            p = np.arange(start, stop, dtype=np.int64)
            self._check_table(step, g, seq, table, stop)
            ids.append(self._ids(g, seq, p))
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            done = stop >= seq.num_tokens
            prefills.append(PrefillSeq(int(start), int(stop), table, sample=done))
            if done:
                takers.append(tuple(s.seq_id for s in running))
        dec_tables, dec_ctx = [], []
        for g in out.decode_groups:
            for seq in g.seqs:
                if seq.status is not SeqStatus.RUNNING:
                    continue
                n = seq.num_tokens
                table = np.asarray(seq.block_table, dtype=np.int64)
                self._check_table(step, g, seq, table, n)
                p = n - 1
                last = self._last_token.get(seq.seq_id)
                ids.append(np.asarray([last], np.int64) if last is not None else self._ids(g, seq, np.asarray([p])))
                pos.append(np.asarray([p], np.int64))
                slots.append(np.asarray([table[p // bs] * bs + p % bs], np.int64))
                dec_tables.append(table[: -(-n // bs)])
                dec_ctx.append(n)
                takers.append((seq.seq_id,))
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
        b = StepBatch(cat(ids), cat(pos), cat(slots), prefills, dec_tables, np.asarray(dec_ctx, np.int64))
        self._check_slots(step, b)
        return b, takers

    def _check_table(self, step: int, g, seq, table: np.ndarray, upto: int) -> None:
        need = -(-upto // self.bs)
        if len(table) < need:
            raise ExecutorError(f"step {step}: request {g.request_id} sequence {seq.seq_id}: block table of "
                                f"{len(table)} blocks cannot hold position {upto - 1}")
        bad = (table[:need] < 0) | (table[:need] >= self.num_gpu_blocks)
        if bad.any():
            raise ExecutorError(f"step {step}: request {g.request_id} sequence {seq.seq_id}: physical block "
                                f"{int(table[:need][bad][0])} outside the GPU cache's {self.num_gpu_blocks} blocks")

    def _check_slots(self, step: int, b: StepBatch) -> None:
        """Two tokens of one step in one slot: allowed only for equal content (same id, same position)."""
        if len(b.slots) < 2:
            return
        order = np.argsort(b.slots, kind="stable")
        s = b.slots[order]
        same = s[1:] == s[:-1]
        if same.any():
            clash = same & ((b.token_ids[order][1:] != b.token_ids[order][:-1])
                            | (b.positions[order][1:] != b.positions[order][:-1]))
            if clash.any():
                j = int(np.argmax(clash))
                raise ExecutorError(f"step {step}: two tokens write different K/V to slot {int(s[j])} (block "
                                    f"{int(s[j]) // self.bs}): a block shared without copy-on-write")

    def _moves(self, step: int, what: str, pairs, n_src: int, n_dst: int) -> np.ndarray:
        m = np.asarray(list(pairs), dtype=np.int64).reshape(-1, 2)
        for col, n, side in ((0, n_src, "source"), (1, n_dst, "destination")):
            bad = (m[:, col] < 0) | (m[:, col] >= n)
            if bad.any():
                raise ExecutorError(f"step {step}: {what}: {side} block {int(m[bad][0, col])} outside the cache's "
                                    f"{n} blocks")
        if len(np.unique(m[:, 1])) != len(m):
            raise ExecutorError(f"step {step}: {what}: a destination block appears twice")
        return m

    # --- one step -------------------------------------------------------------------------------------
    def execute(self, step: int, out, predicted: dict[str, float]) -> float:
        r = self.runner
        t_host = time.perf_counter()
        if self.tp > 1:
            r.comm_log.reset()
        G, C = self.num_gpu_blocks, self.num_cpu_blocks
        swap_in = self._moves(step, "swap in", out.blocks_to_swap_in.items(), C, G)
        swap_out = self._moves(step, "swap out", out.blocks_to_swap_out.items(), G, C)
        copy = self._moves(step, "copy-on-write", out.blocks_to_copy, G, G)
        batch, takers = self.batch(step, out)
        moves = len(swap_in) + len(swap_out) + len(copy)
        padded = None
        if (self.graph_sizes and not batch.prefills and not moves and batch.num_decodes
                and batch.num_decodes <= self.max_graph_batch):
            padded = padded_batch_size(batch.num_decodes, self.graph_sizes)
        if padded is not None:
            r.load_decode(batch, padded)
            inp = None
        elif batch.num_tokens:
            inp = r.prepare(batch)
        primed = False
        if padded is None and batch.num_tokens and self.cuda:
            shape = (batch.num_tokens, len(inp["sample"]))
            primed = shape not in self._shapes  # a new shape's first host calls stay out of the timed segments
            self._shapes.add(shape)
        tokens = None
        late, late_s, retimed, late_again, lead_s = 0, 0.0, False, 0, 0.0
        if self.cuda:
            lead = self.graph_lead if padded is not None else self.eager_lead  # the forward's kind
            t_swap, t_copy, t_fwd = SegmentTimer(LEAD_S), SegmentTimer(LEAD_S), SegmentTimer(lead.s)
            r.swap(swap_in, True, t_swap)
            r.swap(swap_out, False, t_swap)
            r.copy(copy, t_copy)
            if primed:  # after the block moves: the first layer's writes land where the step's do
                r.prime(inp)
                if self.tp > 1:
                    r.comm_log.reset()  # the untimed first layer's all-reduces are not the step's

            def forward(timer: SegmentTimer):
                """The step's forward timed by `timer`, after its sleep: the graph replayed whole
                (its inputs loaded), or the eager forward segment by segment."""
                if padded is None:
                    return r.forward(inp, timer=timer)
                timer.begin()
                out = r.replay_decode(padded)[: batch.num_decodes]
                timer.end()
                return out
            if padded is not None or batch.num_tokens:
                tokens = forward(t_fwd)
                lead_s = t_fwd.lead_s
            fwd_s, swap_s, copy_s = t_fwd.seconds(), t_swap.seconds(), t_copy.seconds()
            lead.observe(t_fwd.host_s)
            late = t_fwd.late + t_swap.late + t_copy.late
            late_s = t_fwd.overrun_s + t_swap.overrun_s + t_copy.overrun_s
            if t_fwd.overrun_s > RETIME_FRACTION * fwd_s and self.tp == 1:
                # the host fell behind the sleep(s) by enough to move the time: the forward again,
                # with four times the sleep (at least RETIME_LEAD_S); it writes the same keys and
                # values and samples the same tokens
                t_again = SegmentTimer(max(RETIME_LEAD_S, 4 * t_fwd.lead_s))
                tokens = forward(t_again)
                fwd_s, retimed, late_again, lead_s = t_again.seconds(), True, t_again.late, t_again.lead_s
        else:
            t0 = time.perf_counter()
            r.swap(swap_in, True)
            r.swap(swap_out, False)
            t1 = time.perf_counter()
            r.copy(copy)
            t2 = time.perf_counter()
            if batch.num_tokens:
                tokens = r.forward(inp)
            swap_s, copy_s, fwd_s = t1 - t0, t2 - t1, time.perf_counter() - t2
        sampled = tokens.tolist() if tokens is not None else []
        for seq_ids, tok in zip(takers, sampled):
            for sid in seq_ids:
                self._last_token[sid] = tok
                self._generated.setdefault(sid, []).append(tok)
        measured = swap_s + copy_s + fwd_s
        self.rows.append({"step": step, "measured_s": measured, "m_swap_s": swap_s, "m_copy_s": copy_s,
                          "m_forward_s": fwd_s, "host_s": time.perf_counter() - t_host,
                          "graph": padded is not None, "padded_batch": int(padded or 0), "primed": primed,
                          "lead_s": lead_s,
                          "late_segments": late, "late_s": late_s, "retimed": retimed, "late_after_retime": late_again,
                          "num_tokens": batch.num_tokens, "num_decodes": batch.num_decodes,
                          "num_prefills": len(batch.prefills),
                          "predicted_s": float(sum(predicted.values()))})
        if self.tp > 1:  # the all-reduces the step issued (rank 0's count)
            self.rows[-1].update(allreduces=r.comm_log.count, allreduce_bytes=r.comm_log.bytes)
        return measured

    # --- KV tiers ---------------------------------------------------------------------------------------
    def attach_tiers(self, store) -> None:
        """Perform the moves of `store` (a `blocksim.memory.tiers.TierStore`) as it issues them: a
        `TierExecutor` over the model's caches, with as many host and disk chunks as the store's tiers
        hold (the disk tier in a file under `tiers.disk_path`, else under the system's temporary
        directory), attached to the store as its mover, so each transfer lasts what was measured."""
        from blocksim.config import ConfigError
        from validation.tiers.executor import TierExecutor
        if self.tp > 1:
            raise ConfigError(f"tiers with --executor at tensor_parallel {self.tp}: the tier executor moves one "
                              f"GPU's cache; run the tiers at tensor_parallel 1")
        cap = {lv.name: lv.capacity for lv in store.levels}
        path = None
        if cap.get("disk", 0):
            root = Path(store.config.disk_path or tempfile.gettempdir())
            path = root / f"blocksim-kv-{os.getpid()}.bin"
        self.tier_ex = TierExecutor(self.runner.k_caches, self.runner.v_caches, chunk_blocks=store.chunk_blocks,
                                    host_chunks=cap.get("host", 0), disk_chunks=cap.get("disk", 0), disk_path=path,
                                    lead=True)
        self.tier_store = store
        self.tier_priced: list[float] = []  # per batch: what the store's links would have charged
        store.attach_mover(self.tier_moves)
        self.describe.update(tier_disk_io=self.tier_ex.disk_mode, tier_disk_io_reason=self.tier_ex.disk_reason,
                             tier_transfer_prices=store.transfer_source)

    def tier_moves(self, ops) -> list[tuple[float, float]]:
        """Perform tier moves (`TierOp` rows, in issue order) now: loads land before the step's
        attention, stores gather their blocks before the step writes them; every restored chunk is
        checksummed against the stored one (`save` reports mismatches). Returns, per row, its
        measured (GPU copy, disk I/O) seconds: a batch's time split evenly over its chunks (the
        copy: CUDA events around the gather or scatter and the host copies, with a sleep queued
        first; the disk: the file I/O's wall time), (0, 0) for a drop."""
        from validation.tiers.replay import TierReplay
        table = {"step": [o.step for o in ops], "op": [o.op for o in ops], "src": [o.src for o in ops],
                 "dst": [o.dst for o in ops], "key": [o.key for o in ops],
                 "gpu_blocks": [list(o.gpu_blocks) for o in ops], "evict": [bool(o.evict) for o in ops]}
        ex = self.tier_ex
        done = ex.batches
        replay = TierReplay(ex, table, source=f"the tier moves of step {ops[0].step}")
        for step in replay.steps:
            replay.step(step)
        per_chunk = []
        st = self.tier_store
        price = {"gpu->host": (st.d2h, None), "gpu->disk": (st.d2h, st.disk_write),
                 "host->disk": (None, st.disk_write), "host->gpu": (st.h2d, None), "disk->gpu": (st.h2d, st.disk_read)}
        for r in ex.records(done):
            n = r["chunks"]
            copy_s = r.get("gather_s", 0.0) + r.get("copy_s", 0.0) + r.get("scatter_s", 0.0)
            per_chunk += [(copy_s / n, r["disk_s"] / n)] * n
            self.tier_priced.append(sum(n * link.seconds(st.chunk_bytes) for link in price[r["move"]] if link))
        parts = iter(per_chunk)
        return [(0.0, 0.0) if o.evict else next(parts) for o in ops]

    # --- results --------------------------------------------------------------------------------------
    def save(self, out_dir) -> None:
        import pandas as pd
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        df = pd.DataFrame(self.rows)
        df.to_parquet(out / "executor_steps.parquet", index=False)
        summary = {**self.describe, "steps": len(df),
                   "graph_steps": int(df["graph"].sum()) if len(df) else 0,
                   "measured_s": float(df["measured_s"].sum()) if len(df) else 0.0,
                   "host_s": float(df["host_s"].sum()) if len(df) else 0.0,
                   "late_steps": int((df["late_segments"] > 0).sum()) if len(df) else 0,
                   "retimed_steps": int(df["retimed"].sum()) if len(df) else 0,
                   # where the sleeps settled: a lead at its cap says the host never kept ahead
                   "graph_lead_s": self.graph_lead.s, "eager_lead_s": self.eager_lead.s}
        tiers = getattr(self, "tier_ex", None)
        if tiers is not None:  # every move done, every restored chunk checked
            tiers.synchronize()
            moves = pd.DataFrame(tiers.records())
            if len(moves) == len(self.tier_priced):
                moves["priced_s"] = self.tier_priced
            moves.to_parquet(out / "executor_tier_moves.parquet", index=False)
            summary.update(tier_moves=len(moves), tier_checked_loads=tiers.checked_loads,
                           tier_checksum_mismatches=tiers.mismatches(),
                           tier_moved_bytes=int(moves["bytes"].sum()) if len(moves) else 0,
                           tier_move_s=float(moves["seconds"].sum()) if len(moves) else 0.0)
            tiers.close()
            self.tier_ex = None
        (out / "executor.json").write_text(json.dumps(summary, indent=2) + "\n")


def make_executor(kind: str, **kw):
    """A factory `config -> StepExecutor` for `blocksim replay --executor KIND` ("cuda" or "cpu", the
    latter running the same code on the CPU: for tests with tiny models)."""
    def build(config):
        return ModelStepExecutor(config, device="cuda" if kind == "cuda" else "cpu", **kw)
    return build


__all__ = ["ExecutorError", "GRAPH_BATCH_SIZES", "ModelStepExecutor", "make_executor", "memory_check"]

"""The model forward pass split over tensor-parallel ranks: one process per GPU, `torch.distributed`
(NCCL on GPUs, gloo on the CPU), Megatron-style sharding as vLLM applies it to Llama models.

Per layer, rank r of N holds:

* QKV, column-parallel: query heads ``[r H/N, (r+1) H/N)``; KV heads ``[r K/N, (r+1) K/N)`` when
  ``K >= N``, else the one KV head its query heads read, replicated over ``N / K`` ranks (vLLM's
  rule for fewer KV heads than ranks);
* O, row-parallel: the columns of its query heads; the partial outputs are all-reduced;
* gate and up, column-parallel: rows ``[r I/N, (r+1) I/N)`` of each; down, row-parallel, its
  columns, all-reduced;
* the norms, the embedding and the LM head whole (replicated): every rank embeds every token and
  samples the same greedy token, so the only communication is the two all-reduces per layer that
  the cost model prices (`blocksim.cost.roofline`). vLLM shards the vocabulary instead, which adds
  an all-reduce after the embedding and a gather of the logits per step.

A rank's KV caches hold its KV heads only. Weights are random: each rank draws its shards with
its own seed and the replicated weights with the common one; ``from_full=True`` draws the whole
model with `validation.model.ModelRunner`'s seed on every rank and keeps its slices, so that the
sharded forward can be checked against the unsharded one (it needs the whole model's memory).

Processes: rank 0 (the caller: the engine's executor or the profiler) drives; `launch` starts
ranks 1 .. N-1 as processes (``python -m validation.sharded RANK WORLD PORT DEVICE``) that serve
it. Each call of the driver's runner that touches the GPU (prepare, forward, load_decode,
replay_decode, swap, copy, warm_up, capture_decode_graphs, allreduce_seconds) is first broadcast to
the workers over a gloo group, and every rank then runs it, so the ranks issue the same
collectives in the same order (CUDA-graph captures included). A worker times each eager segment
with the same `SegmentTimer` sleep as the driver, so the ranks reach each all-reduce together.
Every process gets NVLink multicast off (`NO_MULTICAST_ENV`).

Accounting: `CommLog` counts the all-reduces and their bytes; a replayed CUDA graph adds those of
its capture (``2 * layers`` messages of ``padded batch * hidden`` elements).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from validation.model import NO_TIMER, PARTS, EventTimer, ModelDims, ModelRunner, SegmentTimer

#: Set in every process of a tensor-parallel group: NVLink SHARP / multicast stays off.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
#: Message sizes of the profile's all-reduce table: 1 KiB to 256 MiB (a step of 1 to 16384 tokens
#: of a 4096- or 8192-wide model in 16 bits).
ALLREDUCE_BYTES = tuple(2 ** k for k in range(10, 29))
ALLREDUCE_ITERS = 20   # back-to-back all-reduces per timed round
ALLREDUCE_ROUNDS = 5   # timed rounds per size (median)
TIMEOUT = _dt.timedelta(minutes=10)
ROOT = Path(__file__).resolve().parents[1]


class ShardError(ValueError):
    """A model that cannot be split over the given number of ranks."""


def shard_dims(dims: ModelDims, tp: int) -> ModelDims:
    """One rank's dimensions: heads and the MLP's width divided by `tp`, KV heads divided (at least one)."""
    if dims.num_heads % tp or dims.intermediate_size % tp:
        raise ShardError(f"{dims.name}: {dims.num_heads} heads and MLP width {dims.intermediate_size} must divide "
                         f"by tensor_parallel {tp}")
    if dims.num_kv_heads % tp and tp % dims.num_kv_heads:
        raise ShardError(f"{dims.name}: {dims.num_kv_heads} KV heads and tensor_parallel {tp}: "
                         f"one must divide the other")
    return replace(dims, num_heads=dims.num_heads // tp, num_kv_heads=max(1, dims.num_kv_heads // tp),
                   intermediate_size=dims.intermediate_size // tp)


def per_rank_dims(dims: ModelDims, tp: int) -> ModelDims:
    """What one GPU holds of the model: `dims` itself on one GPU, else `shard_dims`."""
    return shard_dims(dims, tp) if tp > 1 else dims


def make_runner(dims: ModelDims, tp: int, device: str, **kw) -> ModelRunner:
    """The model on `device` (tp 1), or split over one process per GPU with this process as rank 0,
    whose runner drives the others (`launch`); `kw` as `ModelRunner` takes them."""
    if tp > 1:
        return launch(tp, device).runner(dims, **kw)
    return ModelRunner(dims, device=device, **kw)


def head_ranges(dims: ModelDims, tp: int, rank: int) -> tuple[range, range]:
    """(query heads, KV heads) of the whole model that `rank` holds."""
    hq = dims.num_heads // tp
    if dims.num_kv_heads >= tp:
        hk = dims.num_kv_heads // tp
        return range(rank * hq, (rank + 1) * hq), range(rank * hk, (rank + 1) * hk)
    kv = rank * dims.num_kv_heads // tp  # the KV head that this rank's query heads read
    return range(rank * hq, (rank + 1) * hq), range(kv, kv + 1)


class CommLog:
    """All-reduces issued (count) and their bytes, since the last `reset`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.bytes = 0

    def add(self, nbytes: int, count: int = 1) -> None:
        self.count += count
        self.bytes += nbytes * count


def _lead(timer) -> float | None:
    """The sleep a worker queues before each segment to keep pace with the driver's `timer` (None:
    no sleep; an `EventTimer` only records events)."""
    return timer.lead_s if isinstance(timer, SegmentTimer) and not isinstance(timer, EventTimer) else None


def _timer(lead: float | None):
    return SegmentTimer(lead) if lead is not None else NO_TIMER


class ShardedModelRunner(ModelRunner):
    """A `ModelRunner` holding rank `rank`'s shards of `dims` (the whole model's dimensions), its
    row-parallel outputs all-reduced over `group`. On the driver (`channel` given) each GPU call
    is broadcast to the workers first."""

    def __init__(self, dims: ModelDims, *, tp: int, rank: int, group=None, channel: "Channel | None" = None,
                 from_full: bool = False, seed: int = 0, **kw) -> None:
        self.full_dims, self.tp, self.rank, self.group = dims, tp, rank, group
        self.channel = channel
        self.from_full = from_full
        self.seed = seed
        self.comm_log = CommLog()
        self.communicate = True
        self._depth = 0          # > 0 inside a call already broadcast (its inner calls are not)
        self._next_id = 0
        self._graph_comm: dict[tuple, bool] = {}  # (padded batch, parts) -> the captured graph all-reduces
        super().__init__(shard_dims(dims, tp), seed=seed, **kw)

    # --- weights --------------------------------------------------------------------------------------
    def _init_weights(self, g) -> None:
        if self.from_full:
            shard = self.dims
            self.dims = self.full_dims
            try:
                super()._init_weights(g)
            finally:
                self.dims = shard
            self._slice()
            return
        super()._init_weights(torch.Generator(device=self.device).manual_seed(self.seed * 1009 + 1 + self.rank))
        g0 = torch.Generator(device=self.device).manual_seed(self.seed)  # replicated: equal on every rank
        d = self.dims
        self.embed = self._param(g0, d.vocab_size, d.hidden_size, fan_in=1)
        self.lm_head = self._param(g0, d.vocab_size, d.hidden_size)

    def _slice(self) -> None:
        """Keep this rank's rows and columns of the whole model's weights."""
        d, D = self.full_dims, self.full_dims.head_size
        q, kv = head_ranges(d, self.tp, self.rank)
        heads = lambda r, base: torch.arange(base + r.start * D, base + r.stop * D)  # noqa: E731
        qkv_rows = torch.cat([heads(q, 0), heads(kv, d.num_heads * D), heads(kv, (d.num_heads + d.num_kv_heads) * D)])
        i = d.intermediate_size // self.tp
        lo = self.rank * i
        up = d.intermediate_size + lo  # gate rows first, then up rows
        mlp_rows = torch.cat([torch.arange(lo, lo + i), torch.arange(up, up + i)])
        for w in self.layers:
            w["qkv"] = w["qkv"][qkv_rows.to(self.device)].contiguous()
            w["o"] = w["o"][:, q.start * D:q.stop * D].contiguous()
            w["gate_up"] = w["gate_up"][mlp_rows.to(self.device)].contiguous()
            w["down"] = w["down"][:, lo:lo + i].contiguous()

    # --- communication --------------------------------------------------------------------------------
    def _reduce(self, y):
        if self.communicate and self.tp > 1:
            dist.all_reduce(y, group=self.group)
            self.comm_log.add(y.numel() * y.element_size())
        return y

    def _tell(self, op: str, *args) -> bool:
        """Broadcast a call to the workers (driver only, outermost calls only); True when sent."""
        if self.channel is None or self._depth:
            return False
        self.channel.send((op, args))
        return True

    @contextlib.contextmanager
    def _outer(self, op: str, *args):
        """A call broadcast whole: the workers repeat its inner calls by themselves."""
        self._tell(op, *args)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def set_communicate(self, on: bool) -> None:
        """All-reduce the row-parallel outputs (True) or not (components timed without communication)."""
        self._tell("communicate", on)
        self.communicate = on

    # --- the GPU calls, mirrored on the workers --------------------------------------------------------
    def prepare(self, batch):
        inp_id = self._next_id
        self._next_id += 1
        self._tell("prepare", inp_id, batch)
        inp = super().prepare(batch)
        inp["_id"] = inp_id
        return inp

    def forward(self, inp: dict, parts=PARTS, timer=NO_TIMER, num_layers: int | None = None, attn_timer=NO_TIMER):
        self._tell("forward", inp.get("_id"), tuple(parts), _lead(timer), num_layers)
        return super().forward(inp, parts, timer, num_layers, attn_timer)

    def load_decode(self, batch, padded: int) -> None:
        self._tell("load_decode", batch, padded)
        super().load_decode(batch, padded)

    def replay_decode(self, padded: int, parts=PARTS):
        self._tell("replay_decode", padded, tuple(parts))
        if self._graph_comm.get((padded, tuple(sorted(parts)))):  # the all-reduces captured in the graph
            self.comm_log.add(padded * self.dims.hidden_size * self.embed.element_size(), 2 * self.dims.num_layers)
        return super().replay_decode(padded, parts)

    def swap(self, mapping, to_gpu: bool, timer=NO_TIMER) -> None:
        if len(mapping):
            self._tell("swap", np.asarray(mapping), to_gpu, _lead(timer))
        super().swap(mapping, to_gpu, timer)

    def copy(self, mapping, timer=NO_TIMER) -> None:
        if len(mapping):
            self._tell("copy", np.asarray(mapping), _lead(timer))
        super().copy(mapping, timer)

    def warm_up(self, max_tokens: int) -> None:
        with self._outer("warm_up", max_tokens):
            super().warm_up(max_tokens)

    def capture_decode_graphs(self, max_batch: int, sizes=None, parts=PARTS) -> list[int]:
        from validation.model import GRAPH_BATCH_SIZES
        sizes = tuple(sizes or GRAPH_BATCH_SIZES)
        with self._outer("capture", max_batch, sizes, tuple(parts)):
            done = super().capture_decode_graphs(max_batch, sizes, parts)
        holds = self.communicate and self.tp > 1 and "linear" in parts
        for b in done:  # whether each new graph holds all-reduces (an earlier capture of a size stays)
            self._graph_comm.setdefault((b, tuple(sorted(parts))), holds)
        return done

    def allreduce_seconds(self, sizes=ALLREDUCE_BYTES, iters: int = ALLREDUCE_ITERS,
                          rounds: int = ALLREDUCE_ROUNDS) -> list[float]:
        """Seconds of one all-reduce of each size in bytes among the ranks, in the model's dtype:
        the median over `rounds` of the mean of `iters` back-to-back all-reduces (as nccl-tests
        times them; a round starts after a barrier, so the ranks start together)."""
        self._tell("allreduce_seconds", tuple(sizes), iters, rounds)
        out = []
        elt = torch.tensor([], dtype=self.dtype).element_size()
        for nbytes in sizes:
            buf = torch.zeros(max(1, nbytes // elt), dtype=self.dtype, device=self.device)
            for _ in range(3):
                dist.all_reduce(buf, group=self.group)
            vals = []
            for _ in range(rounds):
                dist.barrier(group=self.group)
                if self.cuda:
                    torch.cuda.synchronize()
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    for _ in range(iters):
                        dist.all_reduce(buf, group=self.group)
                    b.record()
                    b.synchronize()
                    vals.append(a.elapsed_time(b) / 1e3 / iters)
                else:
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        dist.all_reduce(buf, group=self.group)
                    vals.append((time.perf_counter() - t0) / iters)
            out.append(float(np.median(vals)))
            del buf
        return out


# --- processes --------------------------------------------------------------------------------------------
class Channel:
    """The driver's calls, broadcast from rank 0 over a gloo group."""

    def __init__(self, group) -> None:
        self.group = group

    def send(self, msg) -> None:
        try:
            dist.broadcast_object_list([msg], src=0, group=self.group)
        except RuntimeError as e:
            raise ShardError(f"a tensor-parallel worker rank stopped (its error is printed above): {e}") from None

    def recv(self):
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world: int, port: int, device: str):
    os.environ.update(NO_MULTICAST_ENV)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    return dist.group.WORLD, dist.new_group(backend="gloo", timeout=TIMEOUT)


def _device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else "cpu"


def _serve(rank: int, world: int, port: int, device: str) -> None:
    """A worker rank: repeat the driver's calls until it says stop."""
    try:
        group, ctrl = _init(rank, world, port, device)
        channel = Channel(ctrl)
        runner, inps = None, {}
        while True:
            op, args = channel.recv()
            if op == "stop":
                break
            if op == "build":
                dims, kw = args
                runner, inps = None, {}
                runner = ShardedModelRunner(dims, tp=world, rank=rank, group=group, device=_device(device, rank), **kw)
                dist.barrier(group=ctrl)  # built: the driver goes on
            elif op == "prepare":
                inp_id, batch = args
                inps[inp_id] = runner.prepare(batch)
                for old in [k for k in inps if k < inp_id - 16]:
                    del inps[old]
            elif op == "forward":
                inp_id, parts, lead, num_layers = args
                t = _timer(lead)
                runner.forward(inps[inp_id], parts, t, num_layers)
                if lead is not None:
                    t.seconds()
            elif op in ("swap", "copy"):
                t = _timer(args[-1])
                runner.swap(args[0], args[1], t) if op == "swap" else runner.copy(args[0], t)
                if args[-1] is not None:
                    t.seconds()
            elif op == "load_decode":
                runner.load_decode(*args)
            elif op == "replay_decode":
                runner.replay_decode(*args)
            elif op == "warm_up":
                runner.warm_up(*args)
            elif op == "capture":
                runner.capture_decode_graphs(*args)
            elif op == "communicate":
                runner.set_communicate(*args)
            elif op == "allreduce_seconds":
                runner.allreduce_seconds(*args)
            else:
                raise RuntimeError(f"unknown call {op!r}")
        dist.destroy_process_group()
    except BaseException:
        print(f"tensor-parallel rank {rank}: failed\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)


@dataclass
class Driver:
    """Rank 0 of a running tensor-parallel group: `runner` builds a sharded model on every rank."""

    world: int
    device: str
    group: object
    channel: Channel
    procs: list

    def runner(self, dims: ModelDims, **kw) -> ShardedModelRunner:
        """The driver's `ShardedModelRunner` of `dims` (the whole model's); the workers build theirs."""
        self.channel.send(("build", (dims, kw)))
        runner = ShardedModelRunner(dims, tp=self.world, rank=0, group=self.group, channel=self.channel,
                                    device=_device(self.device, 0), **kw)
        try:
            dist.barrier(group=self.channel.group)
        except RuntimeError as e:  # a worker that failed exits; its error is on stderr
            raise ShardError(f"tensor_parallel {self.world}: a worker rank failed to build {dims.name} "
                             f"(its error is printed above): {e}") from None
        return runner

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def close(self) -> None:
        global _current
        healthy = self.alive()
        if healthy:
            try:
                self.channel.send(("stop", ()))
            except ShardError:
                healthy = False
        for p in self.procs:
            try:
                p.wait(timeout=60 if healthy else 1)
            except subprocess.TimeoutExpired:
                p.kill()
        if healthy and dist.is_initialized():
            dist.destroy_process_group()
        if _current is self:
            _current = None


_current: Driver | None = None


def launch(world: int, device: str = "cuda") -> Driver:
    """This process as rank 0 of `world` ranks, ranks 1 .. world-1 spawned; an open group of the same
    size and device is reused (one group per process)."""
    global _current
    if _current is not None:
        if _current.world == world and _current.device == device and _current.alive():
            return _current
        _current.close()
    if device.startswith("cuda") and torch.cuda.device_count() < world:
        raise ShardError(f"tensor_parallel {world}: this machine has {torch.cuda.device_count()} GPUs")
    os.environ.update(NO_MULTICAST_ENV)
    port = _free_port()
    env = {**os.environ, **NO_MULTICAST_ENV,
           "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)}
    procs = [subprocess.Popen([sys.executable, "-m", "validation.sharded", str(r), str(world), str(port), device],
                              env=env, cwd=ROOT) for r in range(1, world)]
    group, ctrl = _init(0, world, port, device)
    _current = Driver(world, device, group, Channel(ctrl), procs)
    return _current


@atexit.register
def _close_at_exit() -> None:
    if _current is not None:
        _current.close()


if __name__ == "__main__":  # a worker rank, started by `launch`
    _serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

__all__ = ["ALLREDUCE_BYTES", "CommLog", "Driver", "NO_MULTICAST_ENV", "ShardError", "ShardedModelRunner",
           "head_ranges", "launch", "shard_dims"]

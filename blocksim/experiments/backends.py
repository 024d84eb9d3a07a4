"""Running points: the local and Ray backends, and the driver loop that feeds them.

`run_jobs` is the one way points run, for sweeps (`blocksim.experiments.sweep`) and comparisons
(`blocksim.experiments.compare`). The driver (`drive`) hands jobs to a backend, at most
``backend.capacity`` at a time, reuses complete run directories from earlier runs
(`points.cached_row`), and retries a point whose worker process died once; a point that raises is
reported failed and does not stop the others.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from blocksim.experiments.points import (
    RunLayout,
    cached_row,
    error_outcome,
    install_run_dir,
    run_point_into,
    simulate_point,
    write_error,
)
from blocksim.experiments.spec import Point

MAX_ATTEMPTS = 2  # a crashed worker's point runs at most twice
BACKENDS = ("local", "ray")


# ---------------------------------------------------------------- local backend

_WORKER: dict = {}


def _init_worker(layout: RunLayout, traces: dict, runner: Callable, slo_text: str) -> None:
    """Process-pool initializer: each worker receives the loaded traces once."""
    _WORKER.update(layout=layout, traces=traces, runner=runner, slo=slo_text)


def _init_pool_worker(*args) -> None:
    """Pool initializer: Ctrl-C is the driver's to handle (it stops the workers), so a worker
    ignores SIGINT instead of printing its own traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _init_worker(*args)


def _local_task(name: str, point: Point) -> tuple:
    w = _WORKER
    return run_point_into(w["layout"], name, point, w["traces"][point.trace], w["slo"], w["runner"])


@dataclass
class Job:
    name: str
    point: Point
    attempts: int = 0
    order: tuple = ()  # where its row goes in the sweep table
    tag: object = None  # the job source's bookkeeping (e.g. which search it belongs to)


class LocalBackend:
    """A process pool over the local cores; ``workers=1`` runs points in this process."""

    crashes_are_shared = True  # a dying worker breaks the whole pool: every running point is suspect

    def __init__(self, layout: RunLayout, traces: dict, runner: Callable, slo_text: str, workers: int):
        self.args = (layout, traces, runner, slo_text)
        self.capacity = max(1, workers)
        self.pool: ProcessPoolExecutor | None = None
        self.futures: dict = {}
        self.serial: deque = deque()
        if self.capacity == 1:
            _init_worker(*self.args)

    def submit(self, job: Job) -> None:
        if self.capacity == 1:
            self.serial.append(job)
            return
        if self.pool is None:
            self.pool = ProcessPoolExecutor(self.capacity, initializer=_init_pool_worker, initargs=self.args)
        self.futures[self.pool.submit(_local_task, job.name, job.point)] = job

    def wait(self) -> list[tuple[Job, tuple]]:
        if self.serial:
            job = self.serial.popleft()
            return [(job, _local_task(job.name, job.point))]
        done, _ = wait(list(self.futures), return_when=FIRST_COMPLETED)
        out, broken = [], False
        for f in done:
            job = self.futures.pop(f)
            try:
                out.append((job, f.result()))
            except BrokenProcessPool as exc:
                broken = True
                out.append((job, ("crash", f"worker process died ({type(exc).__name__})")))
            except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
                out.append((job, error_outcome(exc)))
        if broken:  # the pool is unusable: every other running point failed with it
            out += [(job, ("crash", "worker process died (BrokenProcessPool)")) for job in self.futures.values()]
            self.futures.clear()
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        return out

    def close(self) -> None:
        """Shut the pool down; points still running (the driver was interrupted) are stopped."""
        if self.pool is None:
            return
        if any(not f.done() for f in self.futures):
            for process in list(getattr(self.pool, "_processes", {}).values()):
                process.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------- Ray backend

def _ray_task(point: Point, traces: dict, runner: Callable, slo_text: str) -> tuple:
    """Run one point on a Ray worker in a scratch directory; return its files to the driver."""
    with tempfile.TemporaryDirectory(prefix="blocksim-sweep-") as tmp:
        dest = Path(tmp) / "run"
        try:
            metrics = simulate_point(point, traces[point.trace], dest, slo_text, runner)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported in the sweep table
            return error_outcome(exc)
        files = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
        return ("ok", metrics, files)


class RayBackend:
    """Points as Ray tasks (one CPU each). Traces go to the object store once; results come back
    to the driver, which writes the run directories, so workers need no shared file system."""

    crashes_are_shared = False  # Ray isolates tasks: a crash is the crashing point's own

    def __init__(self, layout: RunLayout, traces: dict, runner: Callable, slo_text: str, workers: int | None,
                 address: str | None):
        try:
            import ray  # optional dependency: imported only when this backend is chosen
        except ImportError:
            raise RuntimeError("--backend ray needs Ray: pip install 'blocksim[ray]'") from None
        self.ray, self.layout, self.slo_text = ray, layout, slo_text
        self.args = (traces, runner, workers, address)
        self.started = False
        self._capacity: int | None = None
        self.refs: dict = {}

    def _connect(self) -> None:
        """Start or join Ray on first use (a rerun whose points are all complete never does)."""
        if self._capacity is not None:
            return
        traces, runner, workers, address = self.args
        ray = self.ray
        if not ray.is_initialized():
            kwargs = {"address": address} if address else {"num_cpus": workers or os.cpu_count(),
                                                           "include_dashboard": False}
            ray.init(log_to_driver=False, configure_logging=False, **kwargs)
            self.started = True
        self._capacity = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.traces_ref = ray.put(traces)
        self.runner_ref = ray.put(runner)
        self.task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)

    @property
    def capacity(self) -> int:
        self._connect()
        return self._capacity

    def submit(self, job: Job) -> None:
        self._connect()
        self.refs[self.task.remote(job.point, self.traces_ref, self.runner_ref, self.slo_text)] = job

    def wait(self) -> list[tuple[Job, tuple]]:
        ready, _ = self.ray.wait(list(self.refs), num_returns=1)
        out = []
        for ref in ready:
            job = self.refs.pop(ref)
            try:
                result = self.ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the worker died or the task was lost
                out.append((job, ("crash", " ".join(f"{type(exc).__name__}: {exc}".split())[:500])))
                continue
            if result[0] == "ok":
                result = self._install(job, result)
            else:
                write_error(self.layout.run_dir(job.name), result[2])
            out.append((job, result))
        return out

    def _install(self, job: Job, result: tuple) -> tuple:
        tmp = self.layout.partial / f"{job.name}.driver"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for fname, data in result[2].items():
            (tmp / fname).write_bytes(data)
        install_run_dir(tmp, self.layout.run_dir(job.name))
        return ("ok", result[1])

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


# ---------------------------------------------------------------- driver

class GridSource:
    """Jobs of a fixed grid (no follow-ups)."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    def initial(self) -> list[Job]:
        return list(self.jobs)

    def estimated_total(self) -> int:
        return len(self.jobs)

    def on_result(self, job: Job, row: dict) -> list[Job]:
        return []


def make_backend(name: str, layout: RunLayout, traces: dict, runner: Callable, slo_text: str,
                 workers: int | None, address: str | None, n_jobs: int):
    """The ``local`` backend (``workers`` processes, default the local cores, at most ``n_jobs``)
    or the ``ray`` backend (``address``: a cluster to join; default a local Ray)."""
    if name == "local":
        return LocalBackend(layout, traces, runner, slo_text, min(workers or os.cpu_count() or 1, max(1, n_jobs)))
    if name == "ray":
        return RayBackend(layout, traces, runner, slo_text, workers, address)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def run_jobs(source, layout: RunLayout, traces: dict, runner: Callable, slo_text: str, *,
             backend: str = "local", workers: int | None = None, address: str | None = None,
             progress: bool = False, desc: str = "sweep") -> list[dict]:
    """Run a job source's points on the named backend; one row per job, sorted by ``job.order``.

    ``traces`` maps each point's ``trace`` label to its loaded trace; ``runner`` has the signature
    of ``blocksim.experiments.runner.replay`` (and must pickle for a process pool or Ray).
    """
    be = make_backend(backend, layout, traces, runner, slo_text, workers, address, source.estimated_total())
    rows = drive(source, be, layout, slo_text, progress=progress, desc=desc)
    return sorted(rows, key=lambda r: r["_job"].order)


def drive(source, backend, layout: RunLayout, slo_text: str, *, progress: bool = False,
          desc: str = "sweep") -> list[dict]:
    """Run the source's jobs on the backend until none are left; return one row per job.

    A row has ``name``, ``status`` (``ok`` / ``failed``), ``error``, ``attempts`` (0: result
    reused from an earlier run), ``run_dir`` (relative to ``layout.root``), the metrics, and
    ``_job``. Crashed points are retried once; with a local pool the retry runs alone, so the
    point that kills its worker is the one reported.
    """
    pending = deque(source.initial())
    suspects: deque = deque()
    rows: list[dict] = []
    counts = {"ok": 0, "failed": 0, "cached": 0}
    running = 0
    bar = tqdm(total=source.estimated_total(), desc=desc, unit="run", 
               disable=None if progress else True, smoothing=0.05)  # None: only on a terminal

    def finish(job: Job, outcome: tuple) -> None:
        row = {"name": job.name, "status": "ok" if outcome[0] == "ok" else "failed", "error": "",
               "attempts": job.attempts, "run_dir": layout.relative(job.name), "_job": job}
        if outcome[0] == "ok":
            row.update({k: v for k, v in outcome[1].items() if k not in row})
        else:
            row["error"] = outcome[1]
        rows.append(row)
        counts["cached" if outcome[0] == "ok" and job.attempts == 0 else row["status"]] += 1
        follow = source.on_result(job, row)
        pending.extend(follow)
        if bar.total is not None and len(rows) + len(pending) + running > bar.total:
            bar.total = len(rows) + len(pending) + running
        bar.update()

    def start(job: Job) -> None:
        nonlocal running
        job.attempts += 1
        backend.submit(job)
        running += 1

    try:
        while pending or suspects or running:
            if suspects and running == 0:
                start(suspects.popleft())
            while pending and not suspects:
                job = pending[0]
                cached = cached_row(layout.run_dir(job.name), job.point, slo_text) if not job.attempts else None
                if cached is not None:  # complete from an earlier sweep: no backend needed
                    pending.popleft()
                    finish(job, ("ok", cached))
                    continue
                if running >= backend.capacity:
                    break
                start(pending.popleft())
            if running == 0:
                continue
            for job, outcome in backend.wait():
                running -= 1
                if outcome[0] == "crash" and job.attempts < MAX_ATTEMPTS:
                    (suspects if backend.crashes_are_shared else pending).appendleft(job)
                    continue
                if outcome[0] == "crash":
                    outcome = ("error", f"{outcome[1]}; failed again on retry", "")
                    write_error(layout.run_dir(job.name), outcome[1] + "\n")
                finish(job, outcome)
            bar.set_postfix(done=counts["ok"], failed=counts["failed"], running=running,
                            reused=counts["cached"], refresh=False)
    finally:
        bar.close()
        backend.close()
        shutil.rmtree(layout.partial, ignore_errors=True)
    return rows


def add_backend_options(p) -> None:
    """``--backend``, ``--workers`` and ``--address`` on an argparse parser of a command that runs a grid."""
    p.add_argument("--backend", choices=BACKENDS, default="local",
                   help="local: a process pool (default); ray: Ray tasks (pip install 'blocksim[ray]')")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel runs (default: local cores; with ray: the cluster's CPUs)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (e.g. ray://host:10001 or auto); default: start a local Ray")

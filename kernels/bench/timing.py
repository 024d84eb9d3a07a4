"""Timing on the GPU: CUDA-graph replays (``graph_ms``), eager calls between CUDA events
(``median_ms``), the device's copy bandwidth, and torch's SDPA backends (which run a shape, the
fastest, the one torch picks by default)."""

from __future__ import annotations

import statistics
import warnings

import torch
import torch.nn.functional as F


def median_ms(fns, warmup: int, iters: int) -> float:
    """Median time of one call, cycling through ``fns`` (one closure per input set), each call
    between two CUDA events (eager launches)."""
    for i in range(warmup):
        fns[i % len(fns)]()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def graph_ms(fns, warmup: int, iters: int) -> float:
    """Median time of one call: a CUDA graph calls every closure of ``fns`` once; the median
    replay time is divided by ``len(fns)``."""
    for f in fns:  # eager first: builds, handles, lazy initialisation stay out of the capture
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(warmup):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / len(fns)
    del graph
    return ms


def copy_bandwidth_gbs(nbytes: int = 2 << 30, warmup: int = 3, iters: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty_like(src)
    ms = median_ms([lambda: dst.copy_(src)], warmup, iters)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def sdpa_backends():
    from torch.nn.attention import SDPBackend

    return [(name, getattr(SDPBackend, name)) for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
            if hasattr(SDPBackend, name)]


def sdpa(q, k, v, backend):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


def backend_label(name: str) -> str:
    """"flash", "cudnn", "efficient", "math" for an ``SDPBackend`` member name."""
    return name.split("_")[0].lower()


def sdpa_runs(q, k, v, backend) -> bool:
    """Whether the SDPA ``backend`` runs these inputs (a backend that refuses a shape raises)."""
    try:
        with warnings.catch_warnings():  # a backend that refuses the shape explains why at length
            warnings.simplefilter("ignore")
            sdpa(q, k, v, backend)
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return True


def best_sdpa(q_sets, k, v, warmup, iters):
    """(name, backend, ms) of the fastest fused SDPA backend that runs this shape."""
    best = ("none", None, float("nan"))
    for name, backend in sdpa_backends():
        if not sdpa_runs(q_sets[0], k, v, backend):
            continue
        try:
            ms = graph_ms([lambda q=q: sdpa(q, k, v, backend) for q in q_sets], warmup, iters)
        except RuntimeError:
            continue
        if not ms >= best[2]:
            best = (backend_label(name), backend, ms)
    return best


def default_sdpa_backend(q, k, v) -> str:
    """The backend torch's SDPA dispatch picks for these inputs without an ``sdpa_kernel`` context,
    named as ``best_sdpa`` names them ("flash", "cudnn", "efficient", "math"); "unknown" where this
    torch does not say."""
    from torch.nn.attention import SDPBackend

    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None:
        return "unknown"
    try:
        return backend_label(SDPBackend(choice(q, k, v, enable_gqa=q.shape[1] != k.shape[1])).name)
    except (RuntimeError, TypeError, ValueError):
        return "unknown"


def gbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9

"""Request traces for blocksim: read production trace formats, shape and synthesize workloads.

The canonical form is :class:`Trace` (a sorted, columnar table of requests). Formats,
options and the command line are described in ``traces/FORMATS.md``.
"""

from .bundled import bundled, bundled_names
from .errors import ReadReport, TraceError, TraceWarning
from .read import read_trace
from .shaping import (
    clip_to_max_len,
    head,
    poisson_retime,
    scale_rate,
    subsample,
    window,
)
from .trace import Trace
from .write import write_trace

__all__ = [
    "ReadReport", "Trace", "TraceError", "TraceWarning", "bundled", "bundled_names", "clip_to_max_len",
    "head", "poisson_retime", "read_trace", "scale_rate", "subsample", "window", "write_trace",
]

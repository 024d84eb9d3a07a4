"""The SimPy engine: the arrival process and the step loop (`engine`), and the spans of
identical decode steps it advances in one jump (`spans`)."""

from blocksim.engine.engine import Engine, EngineError, requests_frame
from blocksim.engine.spans import MAX_SPAN_STEPS

__all__ = ["MAX_SPAN_STEPS", "Engine", "EngineError", "requests_frame"]

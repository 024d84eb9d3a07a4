"""The SimPy engine: the arrival process and the step loop."""

from blocksim.engine.engine import MAX_SPAN_STEPS, Engine, EngineError, requests_frame

__all__ = ["MAX_SPAN_STEPS", "Engine", "EngineError", "requests_frame"]

"""The SimPy engine (`engine`) and the cost model that prices its steps (`cost`)."""

from blocksim.engine.engine import MAX_SPAN_STEPS, Engine, EngineError, requests_frame

__all__ = ["MAX_SPAN_STEPS", "Engine", "EngineError", "requests_frame"]
